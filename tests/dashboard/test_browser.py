"""The dashboard in a real Chromium against a real daemon (scripted model, offline)."""

from __future__ import annotations

import json
import re
import sys
import threading
import urllib.error
import urllib.request
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from tests.core.tools.mcp_servers import DEMO, MALFORMED
from tests.dashboard.conftest import ARTIFACTS, DaemonThread, events_of, rest
from tests.helpers import insert_running_turn

# a reply streamed for ~2 s (6 characters a delta, 20 ms apart): long enough to watch and cancel
LONG = "please stream this slowly " + "word " * 120


def open_session(page: Any, workspace: Path) -> str:
    page.fill("#new-workspace", str(workspace))
    page.click("form.new-session button[type=submit]")
    page.wait_for_selector("#composer-input")
    page.wait_for_selector("[data-conn=live]")
    match = re.search(r"#/s/(sess_\w+)", page.url)
    assert match, page.url
    return match.group(1)


def send(page: Any, text: str) -> None:
    """Send from the composer and wait until the daemon has taken the turn (the page then
    empties the composer and shows the turn): until its POST is answered the badge still says
    "idle", so a `wait_idle` right after the click could return before the turn even began."""
    page.fill("#composer-input", text)
    page.click("#send")
    page.wait_for_function("() => document.querySelector('#composer-input').value === ''")


def wait_idle(page: Any) -> None:
    page.wait_for_selector("#turn-state:text-is('idle')")


def test_login_page_without_a_session_then_login_url(browser: Any, served: DaemonThread) -> None:
    context = browser.new_context()
    pg = context.new_page()
    response = pg.goto(served.url + "/")
    assert response is not None and response.status == 200
    headers = response.headers
    csp = headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp
    assert "'unsafe-inline'" not in csp
    assert f"ws://127.0.0.1:{served.port}" in csp
    assert headers["x-frame-options"] == "DENY"
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "no-referrer"
    pg.wait_for_selector("#login:visible")
    assert "metis open" in pg.inner_text("#login")
    assert not pg.locator("header.top").is_visible() and not pg.locator("#app").is_visible()
    assert served.key not in pg.content()
    url = served.login_url()
    pg.goto(url)
    pg.wait_for_selector("#app[data-ready]")
    assert pg.locator("h1", has_text="Sessions").is_visible()
    # the secret came in the fragment and left the URL at once; it is kept in storage, and no
    # cookie exists to be sent to other ports
    assert pg.url == served.url + "/"
    assert pg.evaluate("localStorage.getItem('metis.session')")
    assert context.cookies() == []
    # the one-time token is spent: opened again in this logged-in browser it leads to the app
    again = context.new_page()
    again.goto(url)
    again.wait_for_selector("#app[data-ready]")
    assert again.url == served.url + "/"
    context.close()


def test_a_used_or_invalid_login_link_shows_how_to_get_a_new_one(
    browser: Any, served: DaemonThread, shot: Any
) -> None:
    url = served.login_url()
    first = browser.new_context()
    first.new_page().goto(url)
    first.close()
    context = browser.new_context()
    pg = context.new_page()
    for link in (url, served.url + "/login?token=guess", served.url + "/login"):
        response = pg.goto(link)
        assert response is not None and response.status == 401, link
        assert response.headers["content-security-policy"].startswith("default-src 'self'")
        text = pg.inner_text("#login")
        assert "already used, it expired" in text and "metis open" in text, link
        assert "metis serve" in text
        pg.wait_for_load_state("networkidle")
        assert pg.url == link  # no stored session: the page stays
    shot(pg, "login-link-used")
    response = pg.goto(served.url + "/dashbaord")  # a typo: a page, not the API's JSON
    assert response is not None and response.status == 404
    assert "There is no page at this address." in pg.inner_text("main")
    shot(pg, "no-page")
    pg.click("text=the daemon's root")
    pg.wait_for_selector("#login")
    assert pg.url == served.url + "/"
    assert context.cookies() == []
    context.close()


def test_the_session_stays_with_the_daemons_origin_and_logs_out(
    browser: Any, served: DaemonThread
) -> None:
    # another local listener: the browser must send it nothing of the daemon's session
    seen: list[dict[str, str]] = []

    class Spy(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append({k.lower(): v for k, v in self.headers.items()})
            body = b"<!doctype html><title>another local server</title><p>hello"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    spy = ThreadingHTTPServer(("127.0.0.1", 0), Spy)
    threading.Thread(target=spy.serve_forever, daemon=True).start()
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        pg = context.new_page()
        pg.goto(served.login_url())
        pg.wait_for_selector("#app[data-ready]")
        secret = pg.evaluate("localStorage.getItem('metis.session')")
        assert secret
        elsewhere = context.new_page()
        elsewhere.goto(f"http://127.0.0.1:{spy.server_port}/")
        assert seen and all("cookie" not in h and "authorization" not in h for h in seen), seen
        assert elsewhere.evaluate("localStorage.length") == 0  # storage is per origin (port)
        second_tab = context.new_page()
        # a link to the dashboard with a secret the daemon refuses (a model can write one in a
        # reply): the session in use stays, in this tab and the others
        second_tab.goto(served.url + "/#login=AAAAnotasecret")
        second_tab.wait_for_selector("#app[data-ready]")
        assert second_tab.evaluate("localStorage.getItem('metis.session')") == secret
        second_tab.goto(served.url + "/#/costs")
        second_tab.wait_for_selector("#app[data-ready]")
        # the header's Log out ends the session there, on the daemon and in the tab the login
        # link opened
        logout = second_tab.locator("#logout")
        assert logout.is_visible() and logout.inner_text() == "Log out"
        ARTIFACTS.mkdir(exist_ok=True)
        second_tab.locator("header.top").screenshot(path=str(ARTIFACTS / "header-logout.png"))
        logout.click()
        second_tab.wait_for_selector("#login:visible")
        assert "metis open" in second_tab.inner_text("#login")
        assert second_tab.url == served.url + "/"
        assert second_tab.evaluate("localStorage.getItem('metis.session')") is None
        pg.wait_for_selector("#login:visible")
        req = urllib.request.Request(served.url + "/sessions")
        req.add_header("Authorization", f"Bearer {secret}")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=10)
        assert refused.value.code == 401  # revoked on the daemon, not only forgotten
    finally:
        context.close()
        spy.shutdown()
        spy.server_close()


def test_create_session_and_stream_deltas(
    page: Any, served: DaemonThread, workspace: Path, shot: Any
) -> None:
    # an empty list says how to make the first session
    empty = page.wait_for_selector("#sessions-empty")
    assert "create one above" in empty.inner_text() and "metis chat" in empty.inner_text()
    page.fill("#new-workspace", "/no/such/dir")
    page.click("form.new-session button[type=submit]")
    refused = page.wait_for_selector("#new-error:has-text('orkspace')").inner_text()
    # the daemon's message as a sentence; its code (workspace_not_found) is for scripts
    assert refused[0].isupper() and "_" not in refused and "/no/such/dir" in refused, refused
    shot(page, "sessions-error")
    (workspace / "AGENTS.md").write_text("Use tabs.\n")
    session_id = open_session(page, workspace)
    # a new session's message box has the keys: typing goes straight into it
    page.wait_for_function("() => document.activeElement.id === 'composer-input'")
    # the project instructions the next turn will use, then the ones it used
    assert page.inner_text("#session-meta").endswith(" · metis · instructions: AGENTS.md")
    (workspace / "AGENTS.md").unlink()
    (workspace / "CLAUDE.md").write_text("x" * 40_000)
    send(page, LONG)
    page.wait_for_function(
        "s => document.getElementById('session-meta').textContent.endsWith(s)",
        arg=" · instructions: CLAUDE.md (too long: the model gets its beginning)",
    )
    streaming = page.wait_for_selector(".msg.assistant.streaming .stream-text")
    first = streaming.inner_text()
    page.wait_for_function(
        "n => { const e = document.querySelector('.msg.assistant.streaming .stream-text');"
        " return e && e.innerText.length > n; }",
        arg=len(first) + 6,
    )
    shot(page, "session-streaming")
    wait_idle(page)
    final = page.inner_text(".msg.assistant .md")
    assert final.startswith('You said: "please stream this slowly')
    assert page.locator(".msg.assistant").count() == 1
    assert page.locator(".msg.user").count() == 1
    # the session as a file, named after it, as the daemon renders it
    for fmt in ("md", "json"):
        with page.expect_download() as downloading:
            page.click(f"#export-{fmt}")
        download = downloading.value
        assert download.suggested_filename == f"{session_id}.{fmt}"
        saved = Path(download.path()).read_text()
        if fmt == "md":
            assert saved.startswith("# please stream this slowly")
            assert 'You said: "please stream this slowly' in saved
        else:
            assert [m["role"] for m in json.loads(saved)["messages"]] == ["user", "assistant"]
    page.goto(served.url + "/#/")
    row = page.wait_for_selector(f"tr[data-id='{session_id}']")
    assert "please stream this slowly" in row.inner_text()
    assert "metis" in row.inner_text()
    # the long first prompt is clamped to two lines with an ellipsis; the tooltip has all of it
    link = page.locator(f"tr[data-id='{session_id}'] td.title a")
    _, listed = rest(served, "GET", f"/sessions/{session_id}")
    assert listed["title"].startswith("please stream this slowly word word")
    assert link.get_attribute("title") == listed["title"]
    box = link.evaluate(
        "a => ({h: a.clientHeight, full: a.scrollHeight,"
        " line: parseFloat(getComputedStyle(a).lineHeight)})"
    )
    assert box["h"] <= 2 * box["line"] + 1 and box["full"] > box["h"], box
    shot(page, "sessions")


def test_confirmations_allow_writes_file_and_deny_with_reason(
    page: Any, served: DaemonThread, workspace: Path, shot: Any
) -> None:
    session_id = open_session(page, workspace)
    send(page, "use all tools")
    write = page.locator(".confirm-card", has_text="write_file")
    write.wait_for()
    assert "metis-demo.txt" in write.inner_text()
    assert write.locator("pre.diff .d-add").count() >= 1
    shot(page, "confirmation")
    write.locator("button.allow-once").click()
    page.wait_for_selector(".confirm-card.resolved:has-text('Allowed once')")
    patch = page.locator(".confirm-card:not(.resolved)", has_text="patch_file")
    patch.wait_for()
    assert patch.locator("input.reason").get_attribute("dir") == "auto"  # Hebrew reads right
    patch.locator("input.reason").fill("not in this repo")
    patch.locator("button.deny").click()
    page.wait_for_selector(".confirm-card.resolved:has-text('Denied: not in this repo')")
    shell = page.locator(".confirm-card:not(.resolved)", has_text="shell")
    shell.wait_for()
    assert shell.locator("pre.command").count() == 1
    shell.locator("button.allow-once").click()
    wait_idle(page)
    assert (workspace / "metis-demo.txt").read_text() == "conformance"
    resolved = events_of(served, session_id, "tool.confirmation_resolved")
    by_reason = {e["payload"]["reason"]: e["payload"]["decision"] for e in resolved}
    assert by_reason.get("not in this repo") == "deny"
    card = page.locator(".tool-card", has_text="shell")
    card.locator(".exit").wait_for()
    assert re.match(r"exit \d+", card.locator(".exit").inner_text())
    # the badge says the exit code; the output is what the command printed, without it
    assert not card.locator("pre.output").inner_text().startswith("exit_code:")
    # the command and its output each copy as they are (no "$ " prompt)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=served.url)
    command = card.locator(".tool-input pre.command").inner_text().removeprefix("$ ")
    card.locator(".tool-input .code-box").hover()
    card.locator(".tool-input button.copy").click()
    assert page.evaluate("navigator.clipboard.readText()") == command
    card.locator(".tool-result .code-box").hover()
    card.locator(".tool-result button.copy").click()
    assert (
        page.evaluate("navigator.clipboard.readText()") == card.locator("pre.output").inner_text()
    )
    assert page.locator(".tool-card .tool-status", has_text="denied").count() >= 1
    shot(page, "session-tools")


def test_answer_given_elsewhere_updates_the_card(
    page: Any, served: DaemonThread, workspace: Path
) -> None:
    session_id = open_session(page, workspace)
    send(page, "use all tools")
    page.wait_for_selector(".confirm-card:has-text('write_file')")
    _, session = rest(served, "GET", f"/sessions/{session_id}")
    pending = session["pending_confirmations"][0]
    status, _ = rest(
        served,
        "POST",
        f"/sessions/{session_id}/turns/{pending['turn_id']}/confirmations/"
        f"{pending['confirmation_request_id']}",
        {"decision": "deny", "scope": "once", "reason": "from the terminal"},
    )
    assert status == 200
    page.wait_for_selector(".confirm-card.resolved:has-text('Denied: from the terminal')")


def test_cancel_mid_stream(page: Any, served: DaemonThread, workspace: Path) -> None:
    session_id = open_session(page, workspace)
    send(page, LONG)
    page.wait_for_selector(".msg.assistant.streaming .stream-text")
    # Ctrl+Enter sends no more than the disabled Send button does while the turn runs, and
    # says why nothing was sent (it did nothing at all) until the turn is over
    posted: list[str] = []
    page.on("request", lambda r: posted.append(r.url) if r.method == "POST" else None)
    page.fill("#composer-input", "and another thing")
    page.press("#composer-input", "Control+Enter")
    page.wait_for_timeout(300)
    assert posted == []
    assert "the reply is still coming" in page.inner_text("#composer-error")
    assert page.input_value("#composer-input") == "and another thing"  # kept for later
    # the faded Send button says why to a mouse pointing at it
    assert "still coming" in (page.get_attribute("#send", "title") or "")
    page.click("#cancel")
    page.wait_for_selector("#turn-state:text-is('cancelled')")
    assert page.locator("#cancel").is_hidden()
    assert page.get_attribute("#send", "title") == ""
    assert page.inner_text("#composer-error") == ""
    assert events_of(served, session_id, "turn.cancelled")
    text = page.inner_text(".msg.assistant")
    assert len(text) < len(LONG)


def test_a_failed_or_cancelled_turn_says_so_where_it_ended(
    page: Any, served: DaemonThread, workspace: Path, shot: Any
) -> None:
    """Live, after a reload (from the stored events) and once the session has ended; an ended
    session shows its tokens too."""
    session_id = open_session(page, workspace)
    send(page, "hello")
    wait_idle(page)
    send(page, LONG)
    page.wait_for_selector(".msg.assistant.streaming .stream-text")
    page.click("#cancel")
    assert page.wait_for_selector(".turn-end.cancelled").inner_text() == "Turn cancelled"
    assert served.daemon is not None
    served.run(insert_running_turn(served.daemon.core.db, session_id))
    served.restart()  # the turn left running, as by a crash, is failed by the recovery
    failed = page.wait_for_selector(".turn-end.failed", timeout=30_000)
    assert failed.inner_text() == "Turn failed: metis stopped while this turn was running"
    shot(page, "turn-ends")

    def shown() -> list[str]:
        return page.eval_on_selector_all(
            "#transcript > *", "els => els.map(e => e.className.split(' ').slice(0, 2).join(' '))"
        )

    live = shown()
    assert live[-2:] == ["turn-end cancelled", "turn-end failed"], live
    page.reload()
    page.wait_for_selector(".turn-end.failed")
    assert shown() == live
    tokens = page.inner_text("#tokens")
    assert rest(served, "DELETE", f"/sessions/{session_id}")[0] == 200
    page.reload()
    page.wait_for_selector(".conn-state:text-is('ended')")
    page.wait_for_selector(".turn-end.failed")
    assert shown() == live
    page.wait_for_function(f"document.querySelector('#tokens').textContent === {tokens!r}")
    assert tokens != "Tokens 0 in · 0 out"
    # the trace says why under the failed turn's bar (a cancel the user asked for needs no words)
    page.goto(f"{served.url}/#/s/{session_id}/trace")
    page.wait_for_selector("#trace .turn")
    whys = page.locator("#trace .turn-why").all_inner_texts()
    assert whys == ["metis stopped while this turn was running"], whys
    assert page.locator("#trace .turn-why.failed").count() == 1


def test_aap_session_appears_and_streams(
    page: Any, served: DaemonThread, workspace: Path, shot: Any
) -> None:
    status, created = rest(
        served,
        "POST",
        "/aap/sessions",
        {"agent": {"name": "metis", "options": {"workspace": "demo"}}},
    )
    assert status == 201, created
    sid = created["sessionId"]
    row = page.wait_for_selector(f"tr[data-id='{sid}']")
    assert "aap" in row.inner_text()
    page.click(f"tr[data-id='{sid}'] td.title a")
    page.wait_for_selector("[data-conn=live]")
    done: list[Any] = []
    turn = threading.Thread(
        target=lambda: done.append(
            rest(
                served,
                "POST",
                f"/aap/sessions/{sid}/turns",
                {"messages": [{"role": "user", "content": LONG}]},
            )
        )
    )
    turn.start()
    page.wait_for_selector(".msg.assistant.streaming .stream-text")
    page.wait_for_selector(".msg.user:has-text('please stream this slowly')")
    wait_idle(page)
    turn.join(30)
    assert done and done[0][0] == 200
    assert page.inner_text(".msg.assistant .md").startswith("You said:")
    shot(page, "session-aap")


def test_an_aap_sessions_tool_requests_wait_for_its_client_and_the_list_shows_them(
    page: Any, served: DaemonThread, shot: Any
) -> None:
    """An AAP client answers its session's requests (the daemon refuses an answer from the
    dashboard): the page offers no buttons and no composer, and the card stays open past the
    suspended turn until the client answers."""
    agent = {"name": "metis", "options": {"workspace": "demo"}, "tools": [{"name": "list_dir"}]}
    status, created = rest(served, "POST", "/aap/sessions", {"agent": agent})
    assert status == 201, created
    sid = created["sessionId"]
    asked = {"messages": [{"role": "user", "content": "please use server tool"}]}
    status, body = rest(served, "POST", f"/aap/sessions/{sid}/turns", asked)
    assert status == 200 and body["stopReason"] == "tool_use", body
    page.wait_for_selector(f"tr[data-id='{sid}'] .badge:text-is('1 to confirm')")
    shot(page, "sessions-waiting")
    page.click(f"tr[data-id='{sid}'] td.title a")
    card = page.locator(".confirm-card", has_text="list_dir")
    card.wait_for()
    page.wait_for_selector("#turn-state:text-is('idle')")
    assert card.locator("button").count() == 0
    assert "Waiting for the AAP client" in card.inner_text()
    assert "null" not in card.inner_text()
    assert not card.evaluate("el => el.classList.contains('resolved')")
    assert page.locator("#composer-input").is_hidden()
    assert page.locator("#aap-note").is_visible()
    shot(page, "session-aap-pending")
    _, session = rest(served, "GET", f"/sessions/{sid}")
    call = session["pending_confirmations"][0]["tool_use_id"]
    answer = {"messages": [{"role": "tool_permission", "toolCallId": call, "granted": True}]}
    status, body = rest(served, "POST", f"/aap/sessions/{sid}/turns", answer)
    assert status == 200, body
    page.wait_for_selector(".confirm-card.resolved:has-text('Allowed')")
    page.click("a:has-text('← Sessions')")
    page.wait_for_selector(f"tr[data-id='{sid}']")
    assert page.locator(f"tr[data-id='{sid}'] .badge:has-text('to confirm')").count() == 0


def test_the_workspace_filter_follows_the_field_and_a_refused_one_lists_nothing(
    page: Any, served: DaemonThread, workspace: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other-project"
    other.mkdir()
    ids = {}
    for where in (workspace, other):
        status, body = rest(served, "POST", "/sessions", {"workspace_path": str(where)})
        assert status == 201, body
        ids[where] = body["id"]
    rows = "document.querySelectorAll('table.sessions tbody tr').length"
    page.reload()
    page.wait_for_function(f"() => {rows} === 2")
    assert page.inner_text("#sessions-count") == "2 sessions."
    page.fill("#f-workspace", str(other))  # applied as typed, no Enter needed
    page.wait_for_function(f"() => {rows} === 1")
    assert page.locator(f"tr[data-id='{ids[other]}']").is_visible()
    assert page.inner_text("#sessions-count") == "1 session shown."
    page.fill("#f-workspace", "")  # as the field's × does
    page.wait_for_function(f"() => {rows} === 2")
    assert page.evaluate("location.hash") == "#/"
    page.fill("#f-workspace", "relative/path")
    page.wait_for_selector("p.error:has-text('No sessions listed')")
    assert page.evaluate(f"{rows}") == 0
    assert page.get_attribute("#f-workspace", "aria-invalid") == "true"
    page.fill("#f-workspace", "")
    page.wait_for_function(f"() => {rows} === 2")
    # End asks first, as Purge does: Escape keeps the session
    page.click(f"tr[data-id='{ids[other]}'] [data-control=end]")
    page.wait_for_selector("dialog.confirm[open]:has-text('End session?')")
    page.keyboard.press("Escape")
    page.wait_for_selector("dialog.confirm", state="detached")
    _, kept = rest(served, "GET", f"/sessions/{ids[other]}")
    assert kept["ended_at"] is None
    page.click(f"tr[data-id='{ids[other]}'] [data-control=end]")
    page.click("dialog.confirm button.danger")
    page.wait_for_selector(f"tr[data-id='{ids[other]}'] .badge.ended")


def test_reconnects_after_daemon_restart(page: Any, served: DaemonThread, workspace: Path) -> None:
    # auth is required: the browser session outlives the daemon (METIS_HOME/browser_sessions.json)
    # and the socket resumes with `since`, so the page keeps working without a new login
    assert served.daemon is not None and served.daemon.state.auth is not None
    assert served.daemon.state.auth.required
    session_id = open_session(page, workspace)
    send(page, "first turn")
    wait_idle(page)
    served.stop()
    page.fill("#composer-input", "typed while it was down")
    page.click("#send")
    page.wait_for_selector("#composer-error:has-text('The daemon is not reachable')")
    served.start()
    page.wait_for_selector("[data-conn=live]", timeout=30_000)
    # the draft is kept, and the error no longer says the daemon cannot be reached
    assert page.input_value("#composer-input") == "typed while it was down"
    assert "Send it again" in page.inner_text("#composer-error")
    page.fill("#composer-input", "")
    status, _ = rest(
        served,
        "POST",
        f"/sessions/{session_id}/turns",
        {"content": [{"type": "text", "text": "second turn from elsewhere"}]},
    )
    assert status == 202
    page.wait_for_selector(".msg.user:has-text('second turn from elsewhere')")
    page.wait_for_selector(".msg.assistant .md:has-text('second turn from elsewhere')")
    wait_idle(page)
    ids = page.eval_on_selector_all(".msg", "els => els.map(e => e.dataset.id)")
    assert len(ids) == 4 and len(set(ids)) == 4, ids
    _, stored = rest(served, "GET", f"/sessions/{session_id}/messages")
    assert ids == [m["id"] for m in stored["messages"] if m["role"] in ("user", "assistant")]
    assert page.inner_text(".msg.user >> nth=0").endswith("first turn")
    # the page itself still writes (stored session + Origin) and a reload shows the app
    send(page, "third turn from the page")
    page.wait_for_selector(".msg.assistant .md:has-text('third turn from the page')")
    wait_idle(page)
    page.reload()
    page.wait_for_selector("#app[data-ready]")
    page.wait_for_selector(".msg.user:has-text('third turn from the page')")
    assert not page.locator("#login").is_visible()


@pytest.mark.daemon_config({"websocket": {"snapshot_messages": 4}})
def test_a_long_transcript_starts_with_the_newest_messages_and_loads_earlier_ones(
    page: Any, served: DaemonThread, workspace: Path, shot: Any
) -> None:
    session_id = open_session(page, workspace)
    for n in range(3):
        send(page, f"message {n}")
        page.wait_for_selector(f".msg.assistant .md:has-text('message {n}')")
        wait_idle(page)
    page.goto("about:blank")
    page.goto(f"{served.url}/#/s/{session_id}")  # a fresh view: the snapshot's newest 4
    page.wait_for_selector("[data-conn=live]")
    page.wait_for_selector(".msg.assistant .md:has-text('message 2')")
    assert page.locator(".msg").count() == 4
    assert page.evaluate("performance.getEntriesByName('metis:transcript-rendered').length") == 1
    earlier = page.locator("#load-earlier")
    assert earlier.is_visible()
    earlier.focus()
    page.keyboard.press("Enter")
    page.wait_for_selector(".msg.user:has-text('message 0')")
    assert page.locator("#load-earlier").is_hidden()
    # the button went with the last page: the keyboard is on the transcript, not on the body
    page.wait_for_function("() => document.activeElement.id === 'transcript'")
    ids = page.eval_on_selector_all(".msg", "els => els.map(e => e.dataset.id)")
    assert len(ids) == 6 and ids == sorted(ids), ids
    assert page.locator(".msg.user").first.inner_text().endswith("message 0")
    # a search result opens at its message: the pages before the snapshot's are loaded for it
    page.goto("about:blank")
    page.goto(f"{served.url}/#/?q=said+message+0")  # the first reply
    link = page.locator(f"tr[data-id='{session_id}'] td.title a")
    link.wait_for()
    assert link.get_attribute("href") == f"#/s/{session_id}?at={ids[1]}"
    link.click()
    page.wait_for_selector(f".msg.found[data-id='{ids[1]}']")
    assert page.locator(".msg").count() == 6 and page.locator(".msg.found").count() == 1
    found = page.locator(".msg.found").bounding_box()
    shown = page.locator("#transcript").bounding_box()
    assert found is not None and shown is not None
    assert shown["y"] <= found["y"] and found["y"] + found["height"] <= shown["y"] + shown["height"]
    shot(page, "opened-at-a-search-match")
    # an ended session, read over REST instead of its stream, opens there too
    status, _ = rest(served, "DELETE", f"/sessions/{session_id}")
    assert status == 200
    page.goto("about:blank")
    page.goto(f"{served.url}/#/s/{session_id}?at={ids[1]}")
    page.wait_for_selector(f".msg.found[data-id='{ids[1]}']")
    assert page.locator(".msg").count() == 6 and page.locator("#composer-input").is_hidden()


def test_xss_probe_stays_inert(page: Any, served: DaemonThread, workspace: Path) -> None:
    open_session(page, workspace)
    probe = (
        '<script>window.__pwned = 1</script> <img src=x onerror="window.__pwned = 2"> '
        '[click me](javascript:window.__pwned=3) <a href="javascript:window.__pwned=4">a</a>'
    )
    send(page, probe)
    wait_idle(page)
    page.wait_for_selector(".msg.assistant .md")
    assert page.evaluate("window.__pwned") is None
    transcript = page.locator("#transcript")
    assert transcript.locator("script").count() == 0
    assert transcript.locator("img").count() == 0
    assert transcript.locator("[onerror]").count() == 0
    assert transcript.locator("a[href^='javascript']").count() == 0
    assert "<script>" in page.inner_text(".msg.assistant .md")
    assert page.evaluate("window.__pwned") is None


def test_a_tables_column_alignment_shows(page: Any, served: DaemonThread, workspace: Path) -> None:
    open_session(page, workspace)
    send(page, "a table\n\n| name | count | mark |\n|---|--:|:-:|\n| alpha | 1 | x |\n")
    wait_idle(page)
    cells = page.locator(".msg.assistant .md table tbody tr").first.locator("td")
    cells.first.wait_for()
    aligned = cells.evaluate_all("tds => tds.map(td => getComputedStyle(td).textAlign)")
    assert aligned == ["left", "right", "center"], aligned


def test_a_replys_headings_stay_below_the_session_title_and_a_quote_is_marked(
    page: Any, served: DaemonThread, workspace: Path
) -> None:
    """A model's "# Plan" is a section of its reply: its h1 was the browser's 2em, twice the
    size of the session's title; a blockquote was only indented. (A prompt is rendered as a
    reply is, and the scripted model quotes it rather than repeat its Markdown.)"""
    open_session(page, workspace)
    send(page, "# Plan\n\n## Steps\n\n> quoted\n")
    wait_idle(page)
    reply = page.locator(".msg.user .md")
    reply.locator("h1").wait_for()
    size = "el => parseFloat(getComputedStyle(el).fontSize)"
    title = page.locator("h1.session-title").evaluate(size)
    h1, h2 = reply.locator("h1").evaluate(size), reply.locator("h2").evaluate(size)
    assert h2 < h1 <= title, (h2, h1, title)
    quote = reply.locator("blockquote").evaluate("q => getComputedStyle(q).borderLeftWidth")
    assert quote == "3px", quote


def test_trace_shows_nested_spans(
    page: Any, served: DaemonThread, workspace: Path, shot: Any
) -> None:
    session_id = open_session(page, workspace)
    send(page, "hello")
    wait_idle(page)
    send(page, "use all tools")
    for _ in range(3):
        card = page.locator(".confirm-card:not(.resolved)").first
        card.wait_for()
        card.locator("button.allow-once").click()
        page.wait_for_timeout(200)
    wait_idle(page)
    llm = events_of(served, session_id, "llm.call_completed,llm.call_failed")
    tools = events_of(served, session_id, "tool.completed,tool.failed")
    page.click("#trace-link")
    page.wait_for_selector("#trace .turn")
    assert page.locator("#trace .turn").count() == 2
    assert page.locator("#trace .ev.span-llm").count() == len(llm) == 3
    assert page.locator("#trace .ev.span-tool").count() == len(tools) == 6
    assert page.locator("#trace .turn").nth(1).locator(".span-tool").count() == 6
    assert page.locator("#trace .ev.span-route").count() == 2
    extras = page.locator("#trace .ev.span-route .ev-extra").all_inner_texts()
    assert all(re.fullmatch(r"(offline fallback|global default) · \d+ ms", e) for e in extras), (
        extras
    )
    page.locator("#trace .ev.span-tool").first.click()
    assert '"type": "tool.' in page.inner_text("#event-json")
    shot(page, "trace")
    page.select_option("#trace-filter", "llm")
    assert page.locator("#trace .ev.span-tool").count() == 0
    assert page.locator("#trace .ev.span-llm").count() == 3


def test_routing_and_costs_views(
    page: Any, served: DaemonThread, workspace: Path, shot: Any
) -> None:
    open_session(page, workspace)
    send(page, "hello")
    wait_idle(page)
    page.goto(served.url + "/#/routing")
    page.wait_for_selector("#models tbody tr")
    assert "local:scripted" in page.inner_text("#models")
    unset = page.locator("#models tr", has_text="anthropic:claude-haiku-4-5").inner_text()
    assert "haiku" in unset and "no key: set METIS_TEST_KEY_NOBODY_SETS" in unset
    policy = page.inner_text("#policy")
    assert "Global default" in policy and "null" not in policy
    page.wait_for_selector("#decisions tbody tr td.mono")
    assert "local:scripted" in page.inner_text("#decisions")
    # what picked the model, in words (not the chain's policy codes)
    by = page.locator("#decisions tbody tr td:nth-child(4)").all_inner_texts()
    assert by and all(b in {"offline fallback", "global default"} for b in by), by
    shot(page, "routing")
    # days begin at the browser's midnight: a zone whose date is not UTC's now (of two zones
    # 25 hours apart, one always is)
    utc_day = datetime.now(UTC).strftime("%m-%d")
    zone = next(
        z
        for z in ("Pacific/Kiritimati", "Pacific/Pago_Pago")
        if datetime.now(ZoneInfo(z)).strftime("%m-%d") != utc_day
    )
    page.context.new_cdp_session(page).send("Emulation.setTimezoneOverride", {"timezoneId": zone})
    page.goto(served.url + "/#/costs")
    page.wait_for_selector("#costs svg.chart")
    assert page.locator("#costs svg.chart rect.bar").count() >= 30
    # today, the last bar, is always labelled (the labels are counted from it)
    page.wait_for_selector("#costs svg.chart text.tick")
    ticks = page.eval_on_selector_all(
        "#costs svg.chart text.tick", "ts => ts.map(t => t.textContent)"
    )
    days = [t for t in ticks if re.fullmatch(r"\d\d-\d\d", t)]
    assert days[-1] == datetime.now(ZoneInfo(zone)).strftime("%m-%d"), days
    # a session by its title, isolated so that a right-to-left one reads right
    assert page.locator("#costs a.name bdi").first.inner_text() == "hello"
    shot(page, "costs")
    page.click("nav a[data-nav=mcp]")
    page.wait_for_selector("#mcp .empty")
    assert "No MCP servers are configured" in page.inner_text("#mcp")
    assert "applies the changes without restarting the daemon" in page.inner_text("#mcp-hint")


SECRET = "s3cret-demo-token-value"


@pytest.mark.daemon_config(
    {
        "mcp": {
            "restart_initial_seconds": 0.2,
            "servers": {
                "demo": {
                    "command": sys.executable,
                    "args": [str(DEMO)],
                    "env": {"DEMO_TOKEN": SECRET},
                    "policy": "prompt",
                    "tools": {"add": {"policy": "auto"}},
                },
                "broken": {"command": "/no/such/mcp-server"},
                "spare": {"command": "/bin/true", "enabled": False},
                "wordy": {"command": sys.executable, "args": [str(MALFORMED), "long-description"]},
            },
        }
    }
)
def test_mcp_servers_show_their_state_tools_and_why_one_is_not_ready(
    page: Any, served: DaemonThread, shot: Any
) -> None:
    page.click("nav a[data-nav=mcp]")
    demo = page.locator(".mcp-server[data-name=demo]")
    demo.locator(".state:text-is('ready')").wait_for(timeout=30_000)  # polled: starts on its own
    tools = demo.locator("table.mcp-tools").inner_text()
    assert "mcp__demo__add" in tools and "mcp__demo__slow" in tools
    assert re.search(r"mcp__demo__add\s+add\s+auto\s+Add two integers\.", tools), tools
    assert re.search(r"mcp__demo__slow\s+slow\s+prompt", tools), tools
    assert "DEMO_TOKEN" in demo.inner_text() and SECRET not in page.content()
    broken = page.locator(".mcp-server[data-name=broken]")
    broken.locator(".last-error:has-text('command not found')").wait_for()
    assert broken.locator(".state").inner_text() in {"starting", "restarting", "stopped"}
    assert "No tools until it is ready" in broken.inner_text()
    assert page.locator("nav a[data-nav=mcp]").get_attribute("aria-current") == "page"
    assert "applies the changes without restarting the daemon" in page.inner_text("#mcp-hint")
    spare = page.locator(".mcp-server[data-name=spare]")
    assert spare.locator(".state").inner_text() == "disabled"
    assert spare.locator("button.restart").count() == 0  # a disabled server never runs
    # a description pages long: a few lines of it in the table, the whole on hover
    wordy = page.locator(".mcp-server[data-name=wordy]")
    wordy.locator(".state:text-is('ready')").wait_for(timeout=30_000)
    described = wordy.locator("td.description")
    assert described.inner_text().endswith("…") and len(described.inner_text()) <= 241
    assert len(described.get_attribute("title") or "") == 8_001  # as offered: cut at 8,000
    assert "description cut to 8,000" in wordy.locator(".last-error").inner_text()
    shot(page, "mcp-servers")
    # Restart: a new process now, the card follows it, the keyboard stays on the button
    assert served.daemon is not None
    server = served.daemon.core.mcp.servers["demo"]
    pid = server.pid
    demo.locator("button.restart").focus()
    page.keyboard.press("Enter")
    page.wait_for_selector("#toast.ok:has-text('Restarting demo: connecting to it again')")
    for _ in range(600):  # up to 30 s: started again by the daemon
        if server.state == "ready" and server.pid not in (None, pid):
            break
        page.wait_for_timeout(50)
    assert server.pid not in (None, pid) and server.restarts == 1
    demo.locator("dd:text-is('1')").wait_for()  # Restarts: 1, seen by the page's poll
    demo.locator(".state:text-is('ready')").wait_for()  # a poll may see it still restarting
    label = page.evaluate("document.activeElement.getAttribute('aria-label')")
    assert label == "Restart MCP server demo"
    # Reload with config.yaml as it was: nothing changed, so nothing is restarted
    with page.expect_response(lambda r: r.url.endswith("/mcp/reload")) as reloaded:
        page.click("#mcp-reload")
    assert reloaded.value.status == 200
    page.wait_for_timeout(300)
    assert server.pid not in (None, pid) and server.restarts == 1 and server.state == "ready"


def test_narrow_and_dark(browser: Any, served: DaemonThread, workspace: Path) -> None:
    context = browser.new_context(viewport={"width": 420, "height": 800}, color_scheme="dark")
    pg = context.new_page()
    pg.goto(served.login_url())
    pg.wait_for_selector("#app[data-ready]")
    pg.keyboard.press("Tab")
    assert pg.evaluate("document.activeElement.className") == "skip"
    outline = pg.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline == "solid"  # a visible focus ring
    # it skips to the view, which stays the view it was (its #app is no address of the router)
    url = pg.url
    pg.keyboard.press("Enter")
    pg.wait_for_function("() => document.activeElement.id === 'app'")
    assert pg.url == url and pg.locator("#app h1").inner_text() == "Sessions"
    open_session(pg, workspace)
    send(pg, "think about it")
    pg.wait_for_selector("#turn-state:text-is('idle')")
    pg.wait_for_selector("details.thinking")
    bg = pg.evaluate("getComputedStyle(document.body).backgroundColor")
    assert bg == "rgb(21, 22, 24)"
    width = pg.evaluate("document.documentElement.scrollWidth")
    assert width <= 420
    from tests.dashboard.conftest import ARTIFACTS

    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "session-narrow-dark.png"))
    context.close()


def test_cancel_withdraws_the_open_confirmation_cards(
    page: Any, served: DaemonThread, workspace: Path, shot: Any
) -> None:
    session_id = open_session(page, workspace)
    send(page, "use all tools")
    page.locator(".confirm-card", has_text="write_file").wait_for()
    page.click("#cancel")
    page.wait_for_selector("#turn-state:text-is('cancelled')")
    # the daemon withdraws the request without a tool.confirmation_resolved event
    assert events_of(served, session_id, "tool.confirmation_resolved") == []
    card = page.locator(".confirm-card", has_text="write_file")
    assert "d-withdrawn" in (card.get_attribute("class") or "")
    assert "Withdrawn — the turn ended" in card.inner_text()
    assert card.locator("button").count() == 0
    shot(page, "confirmation-withdrawn")


def test_a_daemon_restart_withdraws_the_open_confirmation_cards(
    page: Any, served: DaemonThread, workspace: Path
) -> None:
    open_session(page, workspace)
    send(page, "use all tools")
    page.locator(".confirm-card", has_text="write_file").wait_for()
    served.restart()
    page.wait_for_selector("[data-conn=live]", timeout=30_000)
    page.wait_for_selector(".confirm-card.d-withdrawn:has-text('write_file')")
    assert page.locator(".confirm-card:not(.resolved)").count() == 0
    assert page.locator(".confirm-card button").count() == 0


# The browser's WebSocket with every tool.confirmation_resolved frame dropped on arrival.
DROP_RESOLUTIONS = """
window.WebSocket = class extends WebSocket {
  set onmessage(handler) {
    super.onmessage = (e) => {
      const frame = JSON.parse(e.data);
      if (frame.event?.type !== "tool.confirmation_resolved") handler(e);
    };
  }
};
"""


def test_answering_a_request_settled_elsewhere_shows_how_it_was_settled(
    page: Any, served: DaemonThread, workspace: Path
) -> None:
    # the page misses the answer's event (as while its socket is away): its card stays open
    page.add_init_script(DROP_RESOLUTIONS)
    page.reload()
    page.wait_for_selector("#app[data-ready]")
    session_id = open_session(page, workspace)
    send(page, "use all tools")
    card = page.locator(".confirm-card", has_text="write_file")
    card.wait_for()
    _, s = rest(served, "GET", f"/sessions/{session_id}")
    [pending] = [c for c in s["pending_confirmations"] if c["tool_name"] == "write_file"]
    status, _ = rest(
        served,
        "POST",
        f"/sessions/{session_id}/turns/{pending['turn_id']}/confirmations/"
        f"{pending['confirmation_request_id']}",
        {"decision": "allow", "scope": "once"},
    )
    assert status == 200
    card.locator("button.deny").click()  # the daemon answers 409 confirmation_already_resolved
    # the settled card shows for a few seconds, then leaves: read it in the moment it shows
    settled = page.wait_for_function(
        """() => {
          const card = [...document.querySelectorAll('.confirm-card.resolved.d-allow')]
            .find(c => c.textContent.includes('write_file'));
          return card && {outcome: card.querySelector('.outcome').innerText,
                          buttons: card.querySelectorAll('button').length};
        }"""
    )
    assert settled.json_value() == {"outcome": "Allowed once", "buttons": 0}


def test_more_than_a_page_of_sessions_are_all_reachable(
    page: Any, served: DaemonThread, workspace: Path
) -> None:
    created = []
    for _ in range(103):
        status, body = rest(served, "POST", "/sessions", {"workspace_path": str(workspace)})
        assert status == 201, body
        created.append(body["id"])
    page.reload()  # shown at once, not at the next poll
    page.wait_for_function(
        "() => document.querySelectorAll('table.sessions tbody tr').length === 100"
    )
    assert page.inner_text("#sessions-count") == "The newest 100 sessions."
    page.focus("#more-sessions")
    page.keyboard.press("Enter")
    page.wait_for_function(
        "() => document.querySelectorAll('table.sessions tbody tr').length === 103"
    )
    assert page.locator("#more-sessions").is_hidden()
    # the button went with the last page: the keyboard is on the first row it added
    page.wait_for_function(
        "id => document.activeElement.closest('tr')?.dataset.id === id", arg=created[2]
    )
    assert page.locator(f"tr[data-id='{created[0]}']").is_visible()  # the oldest one too
    status, newest = rest(served, "POST", "/sessions", {"workspace_path": str(workspace)})
    assert status == 201
    # the next poll shows it and keeps both pages
    page.wait_for_selector(f"tr[data-id='{newest['id']}']")
    assert page.locator("table.sessions tbody tr").count() == 104


_VISIBILITY = """(hidden) => {
  Object.defineProperty(document, "hidden", { value: hidden, configurable: true });
  Object.defineProperty(document, "visibilityState",
    { value: hidden ? "hidden" : "visible", configurable: true });
  document.dispatchEvent(new Event("visibilitychange"));
}"""
"""Has the page believe it was hidden (another tab in front) or shown again."""


def test_the_search_box_narrows_the_sessions_as_you_type(
    page: Any, served: DaemonThread, workspace: Path, shot: Any
) -> None:
    ids = {}
    for title in ("Fix the flaky login test", "Refactor the parser", "Straße names in the parser"):
        status, body = rest(served, "POST", "/sessions", {"workspace_path": str(workspace)})
        assert status == 201, body
        ids[title] = body["id"]
        status, body = rest(served, "PATCH", f"/sessions/{body['id']}", {"title": title})
        assert status == 200, body
    rows = "document.querySelectorAll('table.sessions tbody tr').length"
    page.reload()
    page.wait_for_function(f"() => {rows} === 3")
    page.keyboard.press("/")  # from anywhere on the list but a field
    assert page.evaluate("document.activeElement.id") == "f-search"
    page.keyboard.type("PARSER strasse", delay=20)
    page.wait_for_function(f"() => {rows} === 1")
    assert page.locator(f"tr[data-id='{ids['Straße names in the parser']}']").is_visible()
    shot(page, "sessions-search")
    # a hidden page asks nothing; shown again, it refreshes at once, the search kept
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if "/sessions?" in r.url else None)
    page.evaluate(_VISIBILITY, True)
    page.wait_for_timeout(2500)  # longer than the poll's 2 s
    assert asked == []
    with page.expect_request(lambda r: "/sessions?" in r.url) as shown:
        page.evaluate(_VISIBILITY, False)
    assert "q=PARSER+strasse" in shown.value.url
    page.wait_for_function(f"() => {rows} === 1")
    assert page.evaluate("location.hash") == "#/?q=PARSER+strasse"
    page.click(f"tr[data-id='{ids['Straße names in the parser']}'] a")  # to the session, and back
    page.wait_for_selector("#composer-input")
    page.go_back()
    page.wait_for_function(f"() => {rows} === 1")
    assert page.input_value("#f-search") == "PARSER strasse"
    page.fill("#f-search", ids["Refactor the parser"])  # a copied id
    page.wait_for_selector(f"tr[data-id='{ids['Refactor the parser']}']")
    page.wait_for_function(f"() => {rows} === 1")
    # words said deep in a prompt: the row shows them in their context, marked
    status, body = rest(served, "POST", "/sessions", {"workspace_path": str(workspace)})
    assert status == 201, body
    talked = body["id"]
    prompt = "Start with the logs. " + "Then read each module. " * 8 + "The zephyr cache is stale."
    turn = {"content": [{"type": "text", "text": prompt}]}
    status, body = rest(served, "POST", f"/sessions/{talked}/turns", turn)
    assert status == 202, body
    page.fill("#f-search", "Zephyr STALE")
    said = f"tr[data-id='{talked}'] .said"
    page.wait_for_selector(said)
    assert page.inner_text(f"{said} .muted").strip() == "in a prompt:"
    marked = page.eval_on_selector_all(f"{said} mark", "ms => ms.map((m) => m.textContent)")
    assert marked == ["zephyr", "stale"]
    assert page.inner_text(said).endswith("The zephyr cache is stale.")
    shot(page, "sessions-search-said")
    page.fill("#f-search", "no such words")
    page.wait_for_selector("p.muted:has-text('No sessions match these filters.')")
    page.fill("#f-search", "")
    page.wait_for_function(f"() => {rows} === 4")
    # nothing found: no table head over no rows, and a way back to all the sessions
    page.select_option("#f-status", "ended")
    page.fill("#f-search", "no such words")
    page.wait_for_selector("#clear-filters:visible")
    assert page.locator("table.sessions").is_hidden()
    for _ in range(8):  # from the search field, by the keyboard
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.id") == "clear-filters":
            break
    assert page.evaluate("document.activeElement.id") == "clear-filters"
    page.keyboard.press("Enter")
    page.wait_for_function(f"() => {rows} === 4")
    assert page.locator("table.sessions").is_visible()
    assert page.locator("#clear-filters").is_hidden()
    assert (page.input_value("#f-search"), page.input_value("#f-status")) == ("", "all")
    assert page.url.endswith("/#/")
    assert page.evaluate("document.activeElement.id") == "f-search"


def test_the_sessions_poll_keeps_keyboard_focus(
    page: Any, served: DaemonThread, workspace: Path
) -> None:
    status, created = rest(served, "POST", "/sessions", {"workspace_path": str(workspace)})
    assert status == 201, created
    sid = created["id"]
    purge = page.locator(f"tr[data-id='{sid}'] button.danger")
    purge.focus()

    def retitle(title: str) -> None:
        status, body = rest(served, "PATCH", f"/sessions/{sid}", {"title": title})
        assert status == 200, body
        page.wait_for_selector(f"tr[data-id='{sid}'] td.title:has-text('{title}')")

    retitle("renamed while focused")  # the poll rebuilds this row
    focused = "document.activeElement.getAttribute('aria-label')"
    assert page.evaluate(focused) == f"Purge session {sid}"
    page.keyboard.press("Enter")
    page.wait_for_selector("dialog.confirm[open]")
    retitle("renamed behind the dialog")
    page.keyboard.press("Escape")
    page.wait_for_selector("dialog.confirm", state="detached")
    assert page.evaluate(focused) == f"Purge session {sid}"
    with page.expect_response(lambda r: "/sessions?" in r.url):  # the next poll, unchanged
        pass
    page.wait_for_timeout(100)  # its answer applied
    assert page.evaluate(focused) == f"Purge session {sid}"


def test_a_model_pinned_during_a_turn_applies_after_it(
    page: Any, served: DaemonThread, workspace: Path, shot: Any
) -> None:
    session_id = open_session(page, workspace)
    send(page, LONG)
    page.wait_for_selector(".msg.assistant.streaming .stream-text")
    page.select_option("#model-select", "local:scripted")
    page.wait_for_selector("#model-note:text-is('applies after this turn')")
    page.wait_for_timeout(1000)  # the session.model_changed event re-reads the session
    assert page.input_value("#model-select") == "local:scripted"
    assert page.inner_text("#model-note") == "applies after this turn"
    shot(page, "model-queued")
    wait_idle(page)
    page.wait_for_selector("#model-note:text-is('pinned')", timeout=6000)
    assert page.input_value("#model-select") == "local:scripted"
    _, s = rest(served, "GET", f"/sessions/{session_id}")
    assert s["sticky_model"] == "local:scripted" and s["pending_swap"] is None


def test_long_words_wrap_inside_the_bubbles_on_a_phone(
    phone: Any, served: DaemonThread, workspace: Path, shot: Any
) -> None:
    open_session(phone, workspace)
    send(phone, "see https://example.org/" + "a" * 100 + "\n\n```\n" + "b = 1; " * 20 + "\n```")
    wait_idle(phone)
    phone.wait_for_selector(".msg.assistant .md")
    code = ".msg.user .md pre"
    assert phone.eval_on_selector(code, "p => p.scrollWidth > p.clientWidth")  # scrolls, unwrapped
    box = phone.evaluate(
        """() => {
          const t = document.getElementById('transcript').getBoundingClientRect();
          return [...document.querySelectorAll('.msg')].map((m) => {
            const r = m.getBoundingClientRect();
            return [r.left - t.left, t.right - r.right];
          });
        }"""
    )
    assert len(box) == 2 and all(left >= 0 and right >= 0 for left, right in box), box
    assert phone.evaluate("document.documentElement.scrollWidth") <= 400
    assert phone.evaluate(
        "(t => t.scrollWidth <= t.clientWidth)(document.getElementById('transcript'))"
    )
    shot(phone, "phone-long-words")


def test_a_reply_and_each_code_block_copy_to_the_clipboard(
    page: Any, served: DaemonThread, workspace: Path, shot: Any
) -> None:
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=served.url)
    session_id = open_session(page, workspace)
    send(page, "run this\n\n```python\nprint('hi')\nprint(2 < 3)\n```\n\nthen stop")
    wait_idle(page)
    reply = page.locator(".msg.assistant")
    reply.locator(".md").wait_for()
    _, listed = rest(served, "GET", f"/sessions/{session_id}/messages")
    stored = next(m for m in listed["messages"] if m["role"] == "assistant")
    reply.hover()
    shot(page, "copy-buttons")
    button = reply.locator(".who button.copy")
    button.click()
    assert page.evaluate("navigator.clipboard.readText()") == stored["content"][0]["text"]
    assert button.inner_text() == "Copied"
    page.wait_for_function(
        "() => document.querySelector('.msg.assistant .who button.copy').textContent === 'Copy'"
    )
    # a code block: its code as written (the user's prompt has one, the echo another)
    assert page.locator(".msg.user .who button.copy").count() == 0
    page.locator(".msg.user .code-box").hover()
    page.locator(".msg.user .code-box button.copy").click()
    assert page.evaluate("navigator.clipboard.readText()") == "print('hi')\nprint(2 < 3)"
    assert page.locator(".msg.user pre").inner_text() == "print('hi')\nprint(2 < 3)\n"
    # a browser that refuses the clipboard: the page says so
    page.evaluate(
        "() => { navigator.clipboard.writeText = () =>"
        " Promise.reject(new DOMException('denied', 'NotAllowedError')); }"
    )
    button.click()
    page.wait_for_selector("#toast:has-text('Copy failed')")
    assert button.inner_text() == "Copy"


AT_BOTTOM = "() => scrollY + innerHeight >= document.documentElement.scrollHeight - 2"


def test_a_phone_opens_a_session_at_its_newest_message_and_follows_the_stream(
    phone: Any, served: DaemonThread, workspace: Path, shot: Any
) -> None:
    session_id = open_session(phone, workspace)
    send(phone, "- item\n" * 30)
    wait_idle(phone)
    phone.goto("about:blank")
    phone.goto(f"{served.url}/#/s/{session_id}")
    phone.wait_for_selector("[data-conn=live]")
    phone.wait_for_selector(".msg.assistant .md")
    assert phone.evaluate("document.documentElement.scrollHeight") > 2 * 800
    phone.wait_for_function(AT_BOTTOM, timeout=5000)
    shot(phone, "phone-session-opened")
    send(phone, LONG)
    phone.wait_for_function(
        "n => { const e = document.querySelector('.msg.assistant.streaming .stream-text');"
        " return e && e.innerText.length > n; }",
        arg=80,
    )
    phone.wait_for_function(
        f"() => document.querySelector('.msg.assistant.streaming') && ({AT_BOTTOM})()",
        timeout=5000,
    )
    wait_idle(phone)
    phone.wait_for_function(AT_BOTTOM, timeout=5000)


NEVER = "sess_01M7YA76RDGJRJS6TX6XK99B3P"  # well-formed, never created


def test_unknown_and_purged_sessions_say_so_without_a_composer(
    page: Any, served: DaemonThread, workspace: Path, shot: Any
) -> None:
    page.goto(f"{served.url}/#/s/{NEVER}")
    page.wait_for_selector("h1:text-is('Session not found')")
    assert page.locator("form.composer").is_hidden()
    assert page.locator("#transcript").is_hidden() and page.locator("#model-select").is_hidden()
    assert page.locator("#ended-note").is_hidden()  # it never existed: nothing ended
    shot(page, "session-not-found")
    page.goto(f"{served.url}/#/s/{NEVER}/trace")
    page.wait_for_selector("#trace-error:has-text('Session not found')")
    page.goto(f"{served.url}/#/no-such-view")
    page.wait_for_selector("h1:text-is('Page not found')")
    assert "#/no-such-view" in page.inner_text("#app")
    page.goto(f"{served.url}/#/")
    session_id = open_session(page, workspace)
    status, _ = rest(served, "DELETE", f"/sessions/{session_id}?purge=true")
    assert status == 200
    page.wait_for_selector(".conn-state:text-is('purged')")
    assert page.locator("form.composer").is_hidden()
    assert page.is_disabled("#model-select")
    assert "was purged" in page.inner_text("#ended-note")


def test_the_model_selector_reverts_on_error_and_is_disabled_once_ended(
    page: Any, served: DaemonThread, workspace: Path
) -> None:
    session_id = open_session(page, workspace)
    page.wait_for_selector("#model-select option[value='local:scripted']", state="attached")
    served.stop()
    page.wait_for_selector("#conn:text-is('daemon not reachable')")
    page.select_option("#model-select", "local:scripted")
    page.wait_for_selector("#toast:has-text('The daemon is not reachable')")
    page.wait_for_function("document.getElementById('model-select').value === ''")
    assert page.inner_text("#model-note") == "routing decides"
    served.start()
    page.wait_for_selector("[data-conn=live]", timeout=30_000)
    page.wait_for_selector("#conn:empty", state="attached")
    status, _ = rest(served, "DELETE", f"/sessions/{session_id}")
    assert status == 200
    page.wait_for_selector("#model-select:disabled")
    assert page.inner_text("#model-note") == ""  # routing decides nothing for it any more
    assert page.locator("form.composer").is_hidden()
    assert "This session has ended" in page.inner_text("#ended-note")


def test_an_ended_session_whose_transcript_cannot_be_read_says_so(
    page: Any, served: DaemonThread, workspace: Path
) -> None:
    status, created = rest(served, "POST", "/sessions", {"workspace_path": str(workspace)})
    assert status == 201
    sid = created["id"]
    assert rest(served, "DELETE", f"/sessions/{sid}")[0] == 200
    page.route(re.compile(r"/messages\?"), lambda route: route.abort())
    page.goto(f"{served.url}/#/s/{sid}")
    toast = page.wait_for_selector("#toast:has-text('the transcript could not be read')")
    assert toast.inner_text().startswith("The transcript could not be read (")  # a sentence
    assert page.inner_text(".conn-state") == "ended"  # and no unhandled rejection (fixture)


def test_trace_lists_events_in_time_order_and_counts_all_llm_calls(
    page: Any, served: DaemonThread, workspace: Path
) -> None:
    session_id = open_session(page, workspace)
    send(page, "hello")
    wait_idle(page)
    status, _ = rest(served, "PATCH", f"/sessions/{session_id}", {"active_model": "local:scripted"})
    assert status == 200
    page.wait_for_selector("#model-note:text-is('pinned')")
    send(page, "again")
    wait_idle(page)
    llm = events_of(served, session_id, "llm.call_completed,llm.call_failed")
    page.click("#trace-link")
    page.wait_for_selector("#trace .turn")
    order = page.eval_on_selector_all(
        "#trace > *",
        "els => els.map(e => e.classList.contains('turn') ? 'turn' : e.dataset.type)",
    )
    changed = order.index("session.model_changed")
    assert order[:changed].count("turn") == 1 and order[changed:].count("turn") == 1, order
    summary = page.inner_text("#trace-summary")
    assert f"{len(llm)} LLM calls" in summary
    page.select_option("#trace-filter", "tool")
    assert page.inner_text("#trace-summary") == summary


def test_the_trace_of_a_running_session_grows_as_its_turns_happen(
    page: Any, served: DaemonThread, workspace: Path
) -> None:
    """Once its pages are in, the trace follows the session: a turn sent from elsewhere shows
    up with its spans and the summary counts it, without a reload; an ended session says so."""
    session_id = open_session(page, workspace)
    send(page, "hello")
    wait_idle(page)
    page.click("#trace-link")
    page.wait_for_selector("#trace .turn")
    page.wait_for_selector("#trace-conn.live")
    turn = {"content": [{"type": "text", "text": "again"}]}
    status, body = rest(served, "POST", f"/sessions/{session_id}/turns", turn)
    assert status == 202, body
    page.wait_for_function(
        "() => document.querySelectorAll('#trace > .turn .span-turn.completed').length === 2"
    )
    assert page.locator("#trace .ev.span-llm").count() == 2
    llm = events_of(served, session_id, "llm.call_completed,llm.call_failed")
    assert f"{len(llm)} LLM calls" in page.inner_text("#trace-summary")
    status, body = rest(served, "DELETE", f"/sessions/{session_id}")
    assert status == 200, body
    page.wait_for_selector("#trace-conn:text-is('ended')")
    assert page.locator("#trace > .turn").count() == 2


def test_the_page_metis_open_writes_logs_the_browser_in(
    browser: Any, served: DaemonThread, tmp_path: Path
) -> None:
    from metis.commands.open_dashboard import write_redirect_file

    page_file = write_redirect_file(tmp_path, served.login_url())
    context = browser.new_context()
    pg = context.new_page()
    pg.goto(page_file.as_uri())
    pg.wait_for_selector("#app[data-ready]")
    assert pg.url == served.url + "/" and pg.locator("#logout").is_visible()
    context.close()


def test_answering_confirmations_from_the_keyboard_keeps_the_focus_on_them(
    page: Any, served: DaemonThread, workspace: Path
) -> None:
    """Enter on Allow once leaves the focus on the card (which says how it was settled, and is
    no button a second Enter would press); once it goes, on the next card; Tab reaches that
    card's buttons."""
    open_session(page, workspace)
    send(page, "use all tools")
    page.wait_for_function("() => document.querySelectorAll('.confirm-card').length >= 2")
    first = page.locator(".confirm-card").first
    request_id = first.get_attribute("data-request-id")
    first.locator("button.allow-once").focus()
    page.keyboard.press("Enter")
    page.wait_for_selector(f".confirm-card.resolved[data-request-id='{request_id}']")

    def focused() -> Any:
        return page.evaluate(
            "() => { const e = document.activeElement;"
            " return [e.className, e.dataset.requestId || null]; }"
        )

    assert focused() == ["confirm-card resolved d-allow", request_id]
    settled = page.locator(f".confirm-card[data-request-id='{request_id}']")
    assert settled.locator(".confirm-actions").is_hidden()  # no gap where its buttons were
    page.keyboard.press("Enter")  # nothing to press: no other request is answered
    page.wait_for_selector(f".confirm-card[data-request-id='{request_id}']", state="detached")
    then_on = focused()
    assert then_on[0] == "confirm-card" and then_on[1] != request_id, then_on
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.className") == "primary allow-once"
    assert page.locator(".confirm-card.resolved").count() == 0


def test_each_page_names_itself_in_the_tab_and_an_unknown_one_marks_no_nav_link(
    page: Any, served: DaemonThread, workspace: Path
) -> None:
    session_id = open_session(page, workspace)
    send(page, "hello tab")
    wait_idle(page)
    # the first prompt is the session's title: its header and its tab say it at once
    page.wait_for_function("() => document.title === 'hello tab · metis'")
    assert page.inner_text("h1.session-title") == "hello tab"
    # a trace names its session by its title (an unknown one by its id)
    page.goto(f"{served.url}/#/s/{session_id}/trace")
    assert page.wait_for_selector("#trace-session").inner_text() == "hello tab"
    pages = {
        "#/": "Sessions · metis",
        "#/routing": "Routing & models · metis",
        "#/costs": "Costs · metis",
        "#/mcp": "MCP servers · metis",
        f"#/s/{session_id}/trace": "Trace · hello tab · metis",
        "#/s/sess_nope/trace": "Trace · sess_nope…nope · metis",
        "#/s/sess_nope": "Session not found · metis",
        "#/no/such/page": "Page not found · metis",
    }
    for fragment, title in pages.items():
        page.goto(f"{served.url}/{fragment}")
        page.wait_for_function(f"() => document.title === {title!r}")
    # a page that is none of the nav's marks none of its links as the current one
    assert page.locator("nav [aria-current]").count() == 0
    heading = page.locator("#app h1")
    assert heading.inner_text() == "Page not found"
    size = heading.evaluate("h => getComputedStyle(h).fontSize")
    page.goto(f"{served.url}/#/costs")
    page.wait_for_function("() => document.title === 'Costs · metis'")
    assert heading.evaluate("h => getComputedStyle(h).fontSize") == size  # as every page's


def test_ending_and_purging_from_the_keyboard_keep_its_place_in_the_list(
    page: Any, served: DaemonThread, workspace: Path
) -> None:
    """End takes its button away (the session ended): the keyboard goes to its Purge; Purge
    takes its row away: the keyboard goes to the row now in its place."""
    ids = []
    for _ in range(2):
        status, created = rest(served, "POST", "/sessions", {"workspace_path": str(workspace)})
        assert status == 201, created
        ids.append(created["id"])
    newest, older = ids[1], ids[0]
    page.locator(f"tr[data-id='{older}']").wait_for()
    focused = "document.activeElement.getAttribute('aria-label')"

    def confirm(button: str) -> None:
        page.keyboard.press("Enter")
        page.wait_for_selector("dialog.confirm[open]")
        page.keyboard.press("Tab")  # from Cancel to the dialog's action
        assert page.evaluate("document.activeElement.textContent") == button
        page.keyboard.press("Enter")

    page.locator(f"tr[data-id='{newest}'] [data-control=end]").focus()
    confirm("End")
    page.wait_for_selector(f"tr[data-id='{newest}'].ended")
    page.wait_for_function(f"() => {focused} === 'Purge session {newest}'")
    confirm("Purge")
    page.wait_for_selector(f"tr[data-id='{newest}']", state="detached")
    page.wait_for_function(
        "id => document.activeElement.closest('tr')?.dataset.id === id"
        " && document.activeElement.matches('td.title a')",
        arg=older,
    )


def test_send_and_cancel_leave_the_keyboard_in_the_message_box(
    page: Any, served: DaemonThread, workspace: Path
) -> None:
    """Send is disabled while the turn runs, Cancel goes with the turn: the keyboard that was on
    either is in the message box then, not on the page's body."""
    open_session(page, workspace)
    # Send with nothing typed says so, and sends nothing
    posted: list[str] = []
    page.on("request", lambda r: posted.append(r.url) if r.method == "POST" else None)
    page.click("#send")
    assert page.eval_on_selector("#composer-input", "t => t.validationMessage") != ""
    assert posted == []
    page.fill("#composer-input", LONG)
    page.keyboard.press("Tab")  # from the message box to Send
    assert page.evaluate("document.activeElement.id") == "send"
    page.keyboard.press("Enter")
    page.wait_for_selector("#cancel:visible")
    assert page.evaluate("document.activeElement.id") == "composer-input"
    page.wait_for_selector(".msg.assistant.streaming .stream-text")
    page.keyboard.press("Tab")  # past the disabled Send, to Cancel
    assert page.evaluate("document.activeElement.id") == "cancel"
    page.keyboard.press("Enter")
    page.wait_for_selector("#turn-state:text-is('cancelled')")
    assert page.evaluate("document.activeElement.id") == "composer-input"
    # a click (a tap, on a phone) leaves the focus to the browser: no on-screen keyboard over
    # the reply
    page.fill("#composer-input", LONG)  # streamed slowly: Cancel is there long enough to see
    page.click("#send")
    page.wait_for_selector("#cancel:visible")
    assert page.evaluate("document.activeElement.id") != "composer-input"


def test_a_session_ends_from_its_own_page(page: Any, served: DaemonThread, workspace: Path) -> None:
    session_id = open_session(page, workspace)
    send(page, "hello end")
    wait_idle(page)
    page.locator("#end-session").focus()
    page.keyboard.press("Enter")
    dialog = page.wait_for_selector("dialog.confirm[open]")
    assert "hello end takes no more turns. Its transcript and trace stay" in dialog.inner_text()
    page.keyboard.press("Escape")  # not ended: back on the button
    page.wait_for_selector("dialog.confirm", state="detached")
    assert page.evaluate("document.activeElement.id") == "end-session"
    page.keyboard.press("Enter")
    page.wait_for_selector("dialog.confirm[open]")
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    page.wait_for_selector("#ended-note:visible")
    assert page.locator("#end-session").is_hidden() and page.locator("form.composer").is_hidden()
    # the button went: the keyboard is on what says the session ended
    page.wait_for_function("() => document.activeElement.id === 'ended-note'")
    status, session = rest(served, "GET", f"/sessions/{session_id}")
    assert status == 200 and session["ended_at"] is not None
