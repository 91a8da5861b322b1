"""A session's page in a real Chromium against a real daemon: what it shows of messages too
long to render, the draft in its message box, text written right to left."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metis.dashboard.routes import MAX_RENDER_CHARS
from metis.testing import FakeProviderServer
from tests.dashboard.conftest import DaemonThread, logged_in_page, rest
from tests.dashboard.test_browser import open_session, send, wait_idle

# A model served by the fake provider, which sends a long reply in a few large deltas (the
# scripted model streams at most 256 characters a delta, and echoes the prompt).
FAKE_MODELS = """
pricing_version: "test"
providers:
  anthropic: {{adapter: anthropic, base_url: "{url}", api_key: "fake-key"}}
models:
  - id: anthropic:claude-haiku-4-5
    capabilities: {{max_context_tokens: 200000, max_output_tokens: 8192}}
    pricing: {{input_per_mtok: "1", output_per_mtok: "5"}}
"""


@pytest.fixture
def faked(dash_home: Path, browser_path: str) -> Iterator[tuple[DaemonThread, FakeProviderServer]]:
    """A daemon whose one model is the fake provider's, and that provider."""
    d = DaemonThread(dash_home)
    fake = FakeProviderServer()
    d.run(fake.start())
    (dash_home / "models.yaml").write_text(FAKE_MODELS.format(url=fake.base_url))
    d.start()
    try:
        yield d, fake
    finally:
        d.run(fake.stop())
        d.close()


def tokens_counted(page: Any) -> None:
    page.wait_for_function(
        "() => /^Tokens [1-9]/.test(document.getElementById('tokens').textContent)"
    )


def run_turns(served: DaemonThread, workspace: Path, *prompts: str) -> str:
    """A new session with a turn for each prompt, each run to its end, over REST."""
    status, created = rest(served, "POST", "/sessions", {"workspace_path": str(workspace)})
    assert status == 201, created
    session_id = created["id"]
    for text in prompts:
        path = f"/sessions/{session_id}/turns"
        assert rest(served, "POST", path, {"content": [{"type": "text", "text": text}]})[0] == 202
        deadline = time.monotonic() + 15
        while rest(served, "GET", f"/sessions/{session_id}")[1]["current_turn_id"]:
            assert time.monotonic() < deadline, "the turn did not end"
            time.sleep(0.05)
    return session_id


def test_a_message_over_the_render_limit_shows_as_plain_text_and_the_rest_of_the_session_stays(
    browser: Any, faked: tuple[DaemonThread, FakeProviderServer], workspace: Path, shot: Any
) -> None:
    served, fake = faked
    usage = {"input_tokens": 10, "output_tokens": 20}
    line = "y" * 79 + "\n"
    big = (line * (MAX_RENDER_CHARS // len(line) + 1))[: MAX_RENDER_CHARS + 1]
    fake.enqueue("any", {"text": "a **small** one", "usage": usage})
    fake.enqueue("any", {"text": big, "usage": usage, "chunk_chars": 100_000})
    fake.enqueue("any", {"text": "another **small** one", "usage": usage})
    over = run_turns(served, workspace, "a **small** one", "long")
    small = run_turns(served, workspace, "another **small** one")
    with logged_in_page(browser, served, 1280, 800) as page:
        sent: list[int] = []
        page.on(
            "request",
            lambda r: (
                sent.append(sum(map(len, json.loads(r.post_data)["markdown"])))
                if r.url.endswith("/render/markdown")
                else None
            ),
        )
        # the long reply in plain text that says why, never sent to the daemon to render; the
        # messages before it formatted, and the totals there
        page.goto(f"{served.url}/#/s/{over}")
        page.wait_for_selector(".msg.assistant .render-note")
        assert page.locator(".msg").count() == 4
        assert page.locator(".render-note").all_inner_texts() == [
            f"Shown as plain text: {MAX_RENDER_CHARS + 1:,} characters, more than the"
            f" {MAX_RENDER_CHARS:,} the dashboard formats."
        ]
        shown = page.eval_on_selector(
            ".msg.assistant .stream-text", "e => [e.textContent.length, e.textContent.slice(-81)]"
        )
        assert shown == [len(big), big[-81:]]  # all of it
        assert page.locator(".msg.user .md strong").inner_text() == "small"
        assert page.locator(".msg.assistant .md strong").inner_text() == "small"
        tokens_counted(page)
        assert page.locator("#toast").is_hidden()
        assert sent and max(sent) <= MAX_RENDER_CHARS
        page.locator(".render-note").scroll_into_view_if_needed()
        shot(page, "session-over-the-render-limit")
        # a render that fails: the messages in plain text, not an empty transcript; the totals
        page.route(
            "**/render/markdown",
            lambda route: route.fulfill(
                status=500,
                content_type="application/json",
                body='{"error": {"code": "internal_error", "message": "boom"}}',
            ),
        )
        page.goto(f"{served.url}/#/s/{small}")
        page.wait_for_selector(".msg.assistant .stream-text")
        texts = page.locator(".msg .stream-text").all_inner_texts()
        assert texts == ["another **small** one", "another **small** one"]
        assert page.locator(".md strong").count() == 0
        tokens_counted(page)


def test_the_draft_is_kept_per_session_until_sent_and_one_the_end_stopped_stays_to_copy(
    page: Any, served: DaemonThread, workspace: Path, shot: Any
) -> None:
    session_id = open_session(page, workspace)
    box = "#composer-input"
    page.fill(box, "half a thought")
    # the trace and back, a reload, another page and back: the draft is where it was
    page.click("#trace-link")
    page.wait_for_selector("#trace-summary")
    page.go_back()
    assert page.wait_for_selector(box).input_value() == "half a thought"
    page.reload()
    assert page.wait_for_selector(box).input_value() == "half a thought"
    page.click("a[data-nav=costs]")
    page.wait_for_selector("h1:text-is('Costs')")
    page.goto(f"{served.url}/#/s/{session_id}")
    assert page.wait_for_selector(box).input_value() == "half a thought"
    # another session has its own (none); sent, the draft is gone for good
    other = rest(served, "POST", "/sessions", {"workspace_path": str(workspace)})[1]["id"]
    page.goto(f"{served.url}/#/s/{other}")
    page.wait_for_selector("[data-conn=live]")
    assert page.input_value(box) == ""
    page.goto(f"{served.url}/#/s/{session_id}")
    send(page, page.wait_for_selector(box).input_value() + ", sent")
    page.wait_for_selector(".msg.user:has-text('half a thought, sent')")
    wait_idle(page)
    page.reload()
    page.wait_for_selector("[data-conn=live]")
    assert page.input_value(box) == ""
    assert page.evaluate("sessionStorage.length") == 0
    # ended elsewhere while a message is being written: it stays, read-only, to copy or discard
    page.fill(box, "words the end must not eat")
    assert rest(served, "DELETE", f"/sessions/{session_id}")[0] == 200
    page.wait_for_selector("#ended-note:visible")
    assert page.input_value(box) == "words the end must not eat"
    assert page.is_editable(box) is False and page.locator("#send").is_hidden()
    assert "Not sent: this session ended" in page.inner_text("#composer-error")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.click("#draft-copy")
    assert page.evaluate("navigator.clipboard.readText()") == "words the end must not eat"
    shot(page, "session-ended-with-a-draft")
    page.reload()  # still there after a reload, until discarded
    assert page.wait_for_selector(box).input_value() == "words the end must not eat"
    page.click("#draft-discard")
    assert page.locator("form.composer").is_hidden()
    assert page.evaluate("sessionStorage.length") == 0


def test_a_blank_message_is_not_sent_and_says_why(
    page: Any, served: DaemonThread, workspace: Path
) -> None:
    session_id = open_session(page, workspace)
    page.fill("#composer-input", "  \n\t ")
    page.focus("#composer-input")
    page.keyboard.press("Control+Enter")
    error = page.wait_for_selector("#composer-error:has-text('Nothing to send')")
    assert error.inner_text().endswith("only spaces or line breaks.")
    page.keyboard.type(" ")  # written to, the error goes; Send says it again
    page.wait_for_selector("#composer-error:empty", state="attached")
    page.click("#send")
    page.wait_for_selector("#composer-error:has-text('Nothing to send')")
    assert rest(served, "GET", f"/sessions/{session_id}/messages")[1]["messages"] == []


def test_right_to_left_text_is_laid_out_right_to_left_and_left_to_right_text_stays(
    page: Any, served: DaemonThread, workspace: Path, shot: Any
) -> None:
    def directions(selector: str) -> list[str]:
        return list(
            page.eval_on_selector_all(
                selector, "els => els.map(e => getComputedStyle(e).direction)"
            )
        )

    session_id = open_session(page, workspace)
    page.fill("#composer-input", "שלום, עולם!")
    assert directions("#composer-input") == ["rtl"]  # as it is typed
    page.fill("#composer-input", "hello")
    assert directions("#composer-input") == ["ltr"]
    # a paragraph each way, then code: each paragraph takes its own words' direction
    send(page, "שלום, **עולם**!\n\nEnglish too.\n\nתודה.\n\n```\ncode\n```")
    wait_idle(page)
    page.wait_for_selector(".msg.assistant .md pre")
    assert directions(".msg.user .md") == ["rtl"]
    assert directions(".msg.user .md p") == ["rtl", "ltr", "rtl"]
    assert directions(".msg.assistant .md") == ["ltr"]  # 'You said: "שלום…'
    assert directions(".msg.assistant .md p") == ["ltr", "ltr", "rtl"]
    assert directions(".md pre") == ["ltr", "ltr"]  # code stays left to right
    # a title keeps the page's place for it, its words in their own direction
    page.wait_for_selector("h1.session-title.named")
    assert directions("h1.session-title") == ["ltr"]
    assert directions("h1.session-title bdi") == ["rtl"]
    shot(page, "session-right-to-left")
    page.goto(f"{served.url}/#/")
    listed = f"tr[data-id='{session_id}'] td.title a bdi"
    page.wait_for_selector(listed)
    assert directions(listed) == ["rtl"]
