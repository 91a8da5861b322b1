"""A session's page in a real Chromium against a real daemon whose model is the fake provider
server (scripted replies: a tool call with any input a test needs, a reply of any length): tool
and confirmation cards, messages too long to render, the draft in the message box, text
written right to left, and the layout that keeps the message box in view.

One module, so that a worker starts one Chromium for all of them (the browser is per module)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metis.dashboard.routes import MAX_RENDER_CHARS
from metis.testing.fake_provider import FakeProviderServer
from tests.dashboard.conftest import DaemonThread, logged_in_page, rest
from tests.dashboard.test_browser import open_session, send, wait_idle
from tests.helpers import insert_running_turn

FAKE_MODELS = """
pricing_version: "test"
providers:
  anthropic: {{adapter: anthropic, base_url: "{url}", api_key: "ak-test"}}
models:
  - id: anthropic:claude-haiku-4-5
    capabilities: {{max_context_tokens: 200000, max_output_tokens: 8192}}
    pricing: {{input_per_mtok: "1", output_per_mtok: "5"}}
"""


class Faked:
    """A daemon whose one model is the fake provider's, served on the daemon's own loop."""

    def __init__(self, served: DaemonThread, fake: FakeProviderServer) -> None:
        self.served = served
        self.fake = fake

    def reply(self, *replies: dict[str, Any]) -> None:
        """The model's next replies, in order (then the fake's default one)."""
        self.served.loop.call_soon_threadsafe(self.fake.enqueue, "any", *replies)


@pytest.fixture
def faked(dash_home: Path, browser_path: str) -> Iterator[Faked]:
    served = DaemonThread(dash_home)
    fake = FakeProviderServer(expected_keys={"anthropic": "ak-test"})
    served.run(fake.start())
    (dash_home / "models.yaml").write_text(FAKE_MODELS.format(url=fake.anthropic_base_url))
    try:
        served.start()
        yield Faked(served, fake)
    finally:
        served.run(fake.stop())
        served.close()


@pytest.fixture
def fpage(browser: Any, faked: Faked) -> Iterator[Any]:
    """A logged-in page (1280×800) of the fake-provider daemon."""
    with logged_in_page(browser, faked.served, 1280, 800) as pg:
        yield pg


def diff_lines(card: Any) -> list[str]:
    return card.locator("pre.diff > span").evaluate_all(
        "spans => spans.map(s => s.textContent.replace(/\\n$/, ''))"
    )


def test_a_diff_shows_the_lines_of_the_change_and_no_more(
    fpage: Any, faked: Faked, workspace: Path
) -> None:
    """A text's final newline starts no line of its own: a write of "one\\ntwo\\n" is two added
    lines, a patch of one line one removed and one added (in the confirmation and the card)."""
    (workspace / "a.py").write_text("a = 1\n")
    faked.reply(
        {
            "tool_calls": [
                {"name": "write_file", "input": {"path": "two.txt", "content": "one\ntwo\n"}},
                {
                    "name": "patch_file",
                    "input": {"path": "a.py", "old_text": "a = 1\n", "new_text": "a = 2\n"},
                },
            ]
        },
        {"text": "done"},
    )
    open_session(fpage, workspace)
    send(fpage, "write and patch")
    write = fpage.locator(".confirm-card", has_text="write_file")
    write.wait_for()
    assert diff_lines(write) == ["+++ two.txt", "+one", "+two"]
    write.locator("button.allow-once").click()
    patch = fpage.locator(".confirm-card:not(.resolved)", has_text="patch_file")
    patch.wait_for()
    assert diff_lines(patch) == ["--- a.py", "+++ a.py", "-a = 1", "+a = 2"]
    patch.locator("button.allow-once").click()
    fpage.wait_for_selector("#turn-state:text-is('idle')")
    assert (workspace / "a.py").read_text() == "a = 2\n"
    cards = fpage.locator(".tool-card")
    assert diff_lines(cards.nth(0)) == ["+++ two.txt", "+one", "+two"]
    assert diff_lines(cards.nth(1)) == ["--- a.py", "+++ a.py", "-a = 1", "+a = 2"]


# The longest text the streaming input of a card held, and how many times it was drawn.
WATCH_PARTIAL = """
window.partialSeen = { longest: 0, draws: 0 };
new MutationObserver(() => {
  const pre = document.querySelector('.tool-input pre.partial');
  if (!pre) return;
  window.partialSeen.draws += 1;
  window.partialSeen.longest = Math.max(window.partialSeen.longest, pre.textContent.length);
}).observe(document.getElementById('transcript'), { childList: true, subtree: true });
"""


def test_a_large_tool_input_streams_without_freezing_and_its_diff_scrolls_under_its_buttons(
    fpage: Any, faked: Faked, workspace: Path, shot: Any
) -> None:
    """An 800-line write_file (some 26,000 characters in 3,000 pieces): its card shows the
    last characters of its input while it streams, drawn once a frame, not at every piece
    (each piece redrew the whole input: a 2,500-line file's confirmation came 98.8 s after the
    daemon asked); the diff scrolls in a box of its own, so the card's buttons are close under
    its title."""
    lines = 800
    content = "".join(f"line {i} of the generated file\n" for i in range(lines))
    faked.reply(
        {
            "chunk_chars": 8,
            "tool_calls": [
                {"name": "write_file", "input": {"path": "big.txt", "content": content}}
            ],
        },
        {"text": "written"},
    )
    pieces = len(json.dumps({"path": "big.txt", "content": content})) // 8
    open_session(fpage, workspace)
    fpage.evaluate(WATCH_PARTIAL)
    send(fpage, "write a big file")
    card = fpage.locator(".confirm-card", has_text="write_file")
    card.wait_for(timeout=30_000)
    seen = fpage.evaluate("window.partialSeen")
    assert seen["longest"] <= 1100, seen  # the tail only
    assert seen["draws"] >= 1 and seen["draws"] * 10 < pieces, (seen, pieces)  # a frame's worth
    assert len(diff_lines(card)) == 1 + lines
    diff = card.locator("pre.diff")
    height = diff.evaluate("e => [e.clientHeight, e.scrollHeight]")
    assert height[0] <= 330 and height[1] > 10 * height[0], height
    allow = card.locator("button.allow-once").bounding_box()
    top = card.bounding_box()
    assert allow is not None and top is not None
    assert allow["y"] - top["y"] < 500, (allow, top)
    # shown, not clipped by the cards' own scrolling box: a click at its middle reaches it
    assert fpage.eval_on_selector(
        ".confirm-card button.allow-once",
        "e => { const r = e.getBoundingClientRect();"
        " return e.contains(document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2)); }",
    )
    shot(fpage, "confirmation-large-diff")
    card.locator("button.allow-once").click()
    fpage.wait_for_selector("#turn-state:text-is('idle')")
    assert (workspace / "big.txt").read_text() == content
    tool = fpage.locator(".tool-card", has_text="write_file")
    assert tool.locator("pre.partial").count() == 0
    assert tool.locator("pre.diff").evaluate("e => e.clientHeight") <= 270
    status = tool.locator(".tool-status").bounding_box()
    result = tool.locator(".tool-result").bounding_box()
    assert status is not None and result is not None and result["y"] - status["y"] < 400


async def killed_under_a_tool_call(core: Any, session_id: str) -> None:
    """What a daemon killed while a shell call ran leaves: its turn `running`, the reply that
    asked for the call stored, the call without a result (the next start-up settles them)."""
    from metis.core.canonical.content import ToolUseBlock
    from metis.core.canonical.ids import new_tool_use_id, new_ulid
    from metis.core.canonical.messages import Message, MessageMetadata
    from metis.core.canonical.times import now_us
    from metis.core.store.messages import NewToolCall

    turn_id = await insert_running_turn(core.db, session_id, "anthropic:claude-haiku-4-5")
    call = ToolUseBlock(id=new_tool_use_id(), name="shell", input={"command": "sleep 30"})
    reply = Message(
        id=new_ulid(),
        session_id=session_id,
        turn_id=turn_id,
        role="assistant",
        content=[call],
        created_at_us=now_us(),
        metadata=MessageMetadata(
            model="anthropic:claude-haiku-4-5",
            provider="anthropic",
            usage={},
            routing={},
            stop_reason="tool_use",
        ),
    )
    row = NewToolCall(
        call.id, session_id, turn_id, reply.id, None, "shell", "execute", "builtin", "-", now_us()
    )
    async with core.store.transaction() as tx:
        tx.messages.insert(reply)
        tx.messages.insert_tool_calls([row])


def test_a_cancelled_or_interrupted_tool_call_says_so_and_is_not_shown_failed(
    fpage: Any, faked: Faked, workspace: Path
) -> None:
    """A call its turn's cancel stopped reads "cancelled", live and after a reload; one the
    daemon was killed under reads "interrupted" once it starts again (a daemon stopped under a
    call cancels its turn: "cancelled") — neither in red as a failure."""
    faked.reply({"tool_calls": [{"name": "shell", "input": {"command": "sleep 30"}}]})
    session_id = open_session(fpage, workspace)
    card = fpage.locator(".tool-card").last

    def shown() -> tuple[str, str, str]:
        return card.evaluate(
            "c => [c.querySelector('.tool-status').textContent,"
            " getComputedStyle(c).borderTopColor,"
            " getComputedStyle(c.querySelector('.tool-status')).color]"
        )

    send(fpage, "sleep")
    fpage.locator(".confirm-card button.allow-once").click()
    fpage.wait_for_selector(".tool-card .tool-status:text-is('running')")
    fpage.click("#cancel")
    fpage.wait_for_selector("#turn-state:text-is('cancelled')")
    fpage.wait_for_selector(".tool-card .tool-status:text-is('cancelled')")
    red = fpage.evaluate("getComputedStyle(document.querySelector('#cancel')).color")
    status, border, colour = shown()
    assert status == "cancelled" and red not in (border, colour), (status, border, colour, red)
    fpage.reload()
    fpage.wait_for_selector(".tool-card .tool-status:text-is('cancelled')")
    assert shown()[0] == "cancelled"
    # killed under it: the daemon stores an "interrupted" result when it starts again
    assert faked.served.daemon is not None
    faked.served.run(killed_under_a_tool_call(faked.served.daemon.core, session_id))
    faked.served.restart()
    fpage.wait_for_selector(".tool-card .tool-status:text-is('interrupted')", timeout=30_000)
    status, border, colour = shown()
    assert status == "interrupted" and red not in (border, colour), (status, border, colour)
    fpage.reload()
    fpage.wait_for_selector(".tool-card .tool-status:text-is('interrupted')")
    assert fpage.locator(".tool-card .tool-status", has_text="failed").count() == 0


def test_leaving_a_session_page_before_it_connects_leaves_no_socket_behind(
    page: Any, served: DaemonThread, workspace: Path
) -> None:
    """The session's page asks the daemon for the session, then opens its stream: left while
    the daemon answers, it opens none (the dead page would follow the session unseen)."""
    status, created = rest(served, "POST", "/sessions", {"workspace_path": str(workspace)})
    assert status == 201, created
    session_id = created["id"]
    sockets: list[str] = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
    held: list[Any] = []
    page.route(f"**/sessions/{session_id}", lambda route: held.append(route))
    page.evaluate(f"location.hash = '#/s/{session_id}'")
    page.wait_for_function("() => document.querySelector('#composer-input')")
    while not held:
        page.wait_for_timeout(20)
    page.evaluate("location.hash = '#/costs'")
    page.wait_for_selector("h1:text-is('Costs')")
    for route in held:
        route.continue_()
    page.unroute(f"**/sessions/{session_id}")
    page.wait_for_timeout(800)
    assert sockets == []
    # back on the page, it follows the session with one socket
    page.evaluate(f"location.hash = '#/s/{session_id}'")
    page.wait_for_selector("[data-conn=live]")
    assert len(sockets) == 1 and session_id in sockets[0], sockets


def in_view(pg: Any, selector: str) -> bool:
    return pg.eval_on_selector(
        selector,
        "e => { const r = e.getBoundingClientRect();"
        " return r.height > 0 && r.top >= 0 && r.bottom <= innerHeight; }",
    )


@pytest.mark.daemon_config({"websocket": {"snapshot_messages": 4}})
def test_the_composer_stays_in_view_whatever_sits_above_it(
    browser: Any, page: Any, served: DaemonThread, workspace: Path, shot: Any
) -> None:
    """At 1280×800 the session's page fills the screen and the transcript is what scrolls: "Load
    earlier messages", a two-line title and a confirmation card take room from the transcript,
    never push the message box below the fold. A phone's page scrolls as a whole, no wider than
    the screen."""
    long = "please look at every file of this project and tell me " * 3
    session_id = open_session(page, workspace)
    for n in range(2):
        send(page, f"{long}{n}")
        page.wait_for_selector(f".msg.assistant .md:has-text('{n}')")
        page.wait_for_selector("#turn-state:text-is('idle')")
    send(page, "use all tools")
    page.locator(".confirm-card", has_text="write_file").wait_for()
    page.reload()  # a fresh view: the snapshot's newest 4 messages, then "Load earlier"
    page.wait_for_selector(".confirm-card:has-text('write_file')")
    page.wait_for_selector("#load-earlier:visible")
    title = page.eval_on_selector(".session-title", "e => e.getBoundingClientRect().height")
    assert title > 40, title  # two lines
    shot(page, "session-1280-everything-above")
    for selector in ("#composer-input", "#send", ".confirm-card button.allow-once", "#transcript"):
        assert in_view(page, selector), selector
    assert page.evaluate("scrollY") == 0
    # the transcript scrolls, at its end: the newest content in view
    assert page.eval_on_selector(
        "#transcript",
        "e => e.scrollHeight > e.clientHeight && e.scrollHeight - e.scrollTop - e.clientHeight < 2",
    )
    with logged_in_page(browser, served, 390, 844) as phone:
        phone.goto(f"{served.url}/#/s/{session_id}")
        phone.wait_for_selector(".confirm-card:has-text('write_file')")
        assert phone.evaluate("document.documentElement.scrollWidth") <= 390
        phone.set_viewport_size({"width": 360, "height": 740})
        assert phone.evaluate("document.documentElement.scrollWidth") <= 360
        phone.set_viewport_size({"width": 390, "height": 844})
        phone.evaluate("scrollTo(0, document.documentElement.scrollHeight)")
        assert in_view(phone, "#composer-input")
        shot(phone, "session-390-end")


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
    browser: Any, faked: Faked, workspace: Path, shot: Any
) -> None:
    served = faked.served
    usage = {"input_tokens": 10, "output_tokens": 20}
    line = "y" * 79 + "\n"
    big = (line * (MAX_RENDER_CHARS // len(line) + 1))[: MAX_RENDER_CHARS + 1]
    faked.reply(
        {"text": "a **small** one", "usage": usage},
        {"text": big, "usage": usage, "chunk_chars": 100_000},  # a few large deltas
        {"text": "another **small** one", "usage": usage},
    )
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
