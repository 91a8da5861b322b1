"""Tool cards and confirmation cards in a real Chromium, against a real daemon whose model is the
fake provider server (scripted replies: a tool call with any input the test needs)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metis.testing.fake_provider import FakeProviderServer
from tests.dashboard.conftest import DaemonThread, logged_in_page, rest
from tests.dashboard.test_browser import open_session, send
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
    """A 2,500-line write_file (some 80,000 characters in 10,000 pieces): its card shows the
    last characters of its input while it streams, drawn once a frame, and its confirmation
    comes as soon as the daemon asks; the diff scrolls in a box of its own, so the card's
    buttons are close under its title."""
    lines = 2500
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
    open_session(fpage, workspace)
    fpage.evaluate(WATCH_PARTIAL)
    started = time.monotonic()
    send(fpage, "write a big file")
    card = fpage.locator(".confirm-card", has_text="write_file")
    card.wait_for(timeout=30_000)
    took = time.monotonic() - started
    seen = fpage.evaluate("window.partialSeen")
    assert seen["draws"] >= 1 and seen["longest"] <= 1100, seen
    assert took < 15, took  # 98.8 s when every piece redrew the whole input
    assert len(diff_lines(card)) == 1 + lines
    diff = card.locator("pre.diff")
    height = diff.evaluate("e => [e.clientHeight, e.scrollHeight]")
    assert height[0] <= 330 and height[1] > 10 * height[0], height
    allow = card.locator("button.allow-once").bounding_box()
    top = card.bounding_box()
    assert allow is not None and top is not None
    assert allow["y"] - top["y"] < 500, (allow, top)
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
