"""The dashboard's layout and wording: every page fits a phone, the trace's counts agree with
its turns' in the right plurals, and an MCP reload says what it did. Then a session's page
against a daemon whose model is the fake provider server (scripted replies: a tool call with
any input a test needs, a reply of any length): tool and confirmation cards, messages too long
to render, the draft in the message box, text written right to left, and the layout that keeps
the message box in view.

The browser is per module (conftest): each module of browser tests costs every worker that
runs one of its tests a Chromium, so these share one."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metis.core.routing.predicates import PREDICATE_KEYS
from metis.dashboard.routes import MAX_RENDER_CHARS
from metis.testing.bench import bench_models_yaml
from metis.testing.fake_provider import FakeProviderServer, FakeReply
from tests.core.tools.mcp_servers import DEMO
from tests.dashboard.conftest import SLOW_MODELS, DaemonThread, events_of, logged_in_page, rest
from tests.dashboard.test_browser import open_session, send, wait_idle
from tests.e2e.test_turn_endings import CUT_OFF_REPLIES
from tests.helpers import insert_running_turn

PHONE = (390, 844)
# an MCP tool whose name is longer than a phone is wide, as the model is offered it
LONG_TOOL = "add_two_integers_and_tell_the_sum_in_words_to_whoever_asked_for_it"
PLACEHOLDER = "Select an event to see its JSON."


def start_session(served: DaemonThread, workspace: Path) -> str:
    status, body = rest(served, "POST", "/sessions", {"workspace_path": str(workspace)})
    assert status == 201, body
    return str(body["id"])


def send_turn(served: DaemonThread, session_id: str, text: str) -> None:
    turn = {"content": [{"type": "text", "text": text}]}
    status, body = rest(served, "POST", f"/sessions/{session_id}/turns", turn)
    assert status == 202, body


def session_once(served: DaemonThread, session_id: str, done: Any) -> dict[str, Any]:
    """The session as soon as `done(session)` holds (30 s at most)."""
    for _ in range(300):
        status, session = rest(served, "GET", f"/sessions/{session_id}")
        assert status == 200, session
        if done(session):
            return dict(session)
        time.sleep(0.1)
    raise AssertionError(f"session {session_id} never got there: {session}")


@pytest.mark.daemon_config(
    {
        "mcp": {
            "servers": {
                "demo": {
                    "command": sys.executable,
                    "args": [str(DEMO)],
                    "env": {"MCP_DEMO_ALIAS": LONG_TOOL},
                    "policy": "prompt",
                }
            }
        }
    }
)
def test_no_page_is_wider_than_a_phone(browser: Any, served: DaemonThread, workspace: Path) -> None:
    assert served.daemon is not None
    demo = served.daemon.core.mcp.servers["demo"]
    for _ in range(300):  # its tools are offered once it is ready
        if demo.state == "ready":
            break
        time.sleep(0.1)
    session_id = start_session(served, workspace)
    send_turn(served, session_id, "hello")
    session_once(served, session_id, lambda s: s["current_turn_id"] is None)
    send_turn(served, session_id, "use all tools")
    # a confirmation card naming the long tool waits above the composer
    session_once(
        served,
        session_id,
        lambda s: any("mcp__demo__add_two" in p["tool_name"] for p in s["pending_confirmations"]),
    )
    pages = {
        "#/": "table.sessions tbody tr",
        f"#/s/{session_id}": ".confirm-card:has-text('mcp__demo__add_two')",
        f"#/s/{session_id}/trace": "#trace .turn",
        "#/routing": "#models tbody tr",
        "#/mcp": ".mcp-server[data-name=demo] table.mcp-tools",
        "#/costs": "#costs svg.chart .tick",
    }
    with logged_in_page(browser, served, *PHONE) as pg:
        for fragment, shown in pages.items():
            pg.goto(f"{served.url}/{fragment}")
            pg.wait_for_selector(shown)
            width = pg.evaluate("document.documentElement.scrollWidth")
            assert width <= PHONE[0], f"{fragment} is {width} px wide"
        # the day chart is drawn at the phone's scale: its labels are as tall as on a desktop
        ticks = pg.eval_on_selector_all(
            "#costs svg.chart .tick", "ts => ts.map(t => t.getBoundingClientRect().height)"
        )
        assert min(ticks) >= 10, ticks
        # a session's bar is named by its title and leads to it
        bar = pg.locator("ul.hbars a", has_text="hello")
        assert bar.get_attribute("href") == f"#/s/{session_id}"
        # the nav keeps to one row down to the narrowest phones (at 360 px: shorter names);
        # last, as a resize redraws the charts
        for narrow in (PHONE[0], 360):
            pg.set_viewport_size({"width": narrow, "height": PHONE[1]})
            tops = pg.eval_on_selector_all(
                "header nav a", "links => links.map(a => a.getBoundingClientRect().top)"
            )
            assert len(set(tops)) == 1, f"the nav takes {len(set(tops))} rows at {narrow} px"


def test_trace_counts_tool_calls_as_its_turns_do_in_plain_plurals(
    page: Any, served: DaemonThread, workspace: Path
) -> None:
    session_id = start_session(served, workspace)
    send_turn(served, session_id, "hello")
    session_once(served, session_id, lambda s: s["current_turn_id"] is None)
    send_turn(served, session_id, "use all tools")
    denied: set[str] = set()

    def deny_all(session: dict[str, Any]) -> bool:
        for p in session["pending_confirmations"]:
            if p["confirmation_request_id"] not in denied:
                denied.add(p["confirmation_request_id"])
                path = (
                    f"/sessions/{session_id}/turns/{p['turn_id']}/confirmations/"
                    f"{p['confirmation_request_id']}"
                )
                rest(served, "POST", path, {"decision": "deny", "scope": "once"})
        return session["current_turn_id"] is None

    session_once(served, session_id, deny_all)
    assert denied
    called = events_of(served, session_id, "tool.called")
    ran = {e["payload"]["tool_use_id"] for e in called}
    failed = events_of(served, session_id, "tool.failed")
    not_run = [e for e in failed if e["payload"]["tool_use_id"] not in ran]
    assert len(not_run) == len(denied)
    page.goto(f"{served.url}/#/s/{session_id}/trace")
    page.wait_for_selector("#trace .turn")
    summary = page.inner_text("#trace-summary")
    assert re.fullmatch(
        rf"\d+ events · 2 turns · 3 LLM calls · {len(ran)} tool calls run · {len(denied)} not run",
        summary,
    ), summary
    # each turn's own count is the same thing, said the same way (figures never split)
    first, second = (
        t.replace("\u00a0", " ")
        for t in page.locator("#trace .ev.span-turn .ev-extra").all_inner_texts()
    )
    assert " · 1 LLM call · 0 tool calls run · " in first and "not run" not in first
    assert f" · 2 LLM calls · {len(ran)} tool calls run · {len(denied)} not run · " in second
    # a filter that hides the selected event empties the panel; one that keeps it, keeps it
    page.locator("#trace .ev.span-tool").first.click()
    assert '"type": "tool.' in page.inner_text("#event-json")
    # the filter's choices are said in words
    choices = page.locator("#trace-filter option").all_inner_texts()
    assert choices == [
        "All events",
        "Turns",
        "Route decisions",
        "LLM calls",
        "Tool calls",
        "Session events",
    ]
    page.select_option("#trace-filter", "llm")
    assert page.inner_text("#event-json") == PLACEHOLDER
    assert page.locator("#trace .ev.selected").count() == 0
    page.locator("#trace .ev.span-llm").first.click()
    page.select_option("#trace-filter", "all")
    assert page.locator("#trace .ev.span-llm.selected").count() == 1
    assert '"type": "llm.' in page.inner_text("#event-json")


SPARE = "    spare: {command: /bin/true, enabled: false}\n"
ADDED = "    notes: {command: /no/such/mcp-server}\n"


@pytest.fixture
def mcp_yaml(dash_home: Path) -> Path:
    """config.yaml with a disabled MCP server, written before the daemon starts (a test lists
    it before `page`): a reload reads this file."""
    path = dash_home / "config.yaml"
    path.write_text("mcp:\n  servers:\n" + SPARE)
    return path


def test_an_mcp_reload_says_what_it_did_over_an_older_refusal(
    mcp_yaml: Path, page: Any, served: DaemonThread
) -> None:
    page.goto(f"{served.url}/#/mcp")
    spare = page.locator(".mcp-server[data-name=spare]")
    assert "it is disabled in config.yaml" in spare.inner_text()
    mcp_yaml.write_text("mcp:\n  servers:\n" + SPARE + ADDED)
    page.click("#mcp-reload")
    page.wait_for_selector("#toast.ok:has-text('Reloaded config.yaml: added notes')")
    page.wait_for_selector(".mcp-server[data-name=notes]")
    mcp_yaml.write_text("mcp: [unclosed\n")
    page.click("#mcp-reload")
    page.wait_for_selector("#toast:not(.ok):has-text('config.yaml')")
    mcp_yaml.write_text("mcp:\n  servers:\n" + SPARE)
    page.click("#mcp-reload")
    # the success replaces the refusal at once, rather than waiting for it to go
    page.wait_for_selector("#toast.ok:has-text('Reloaded config.yaml: removed notes')")


# a provider with a key of its own (never used: the test says it refused it)
KEYED_MODELS = SLOW_MODELS.replace(
    "models:\n",
    '  keyed: {adapter: anthropic, base_url: "http://127.0.0.1:9", api_key: "k"}\n'
    "models:\n"
    "  - id: keyed:claude-haiku-4-5\n"
    "    capabilities: {max_context_tokens: 200000, max_output_tokens: 8192}\n"
    '    pricing: {input_per_mtok: "1", output_per_mtok: "5"}\n',
    1,
)


@pytest.fixture
def keyed_models(dash_home: Path) -> Path:
    """models.yaml with a keyed provider, written before the daemon starts (a test lists it
    before `served`)."""
    path = dash_home / "models.yaml"
    path.write_text(KEYED_MODELS)
    return path


def test_the_routing_page_says_in_words_why_a_model_is_out_and_its_reset_is_in_reach(
    keyed_models: Path, browser: Any, served: DaemonThread, workspace: Path
) -> None:
    assert served.daemon is not None
    core = served.daemon.core

    async def refuse_the_key() -> None:
        core.availability.record_failure("keyed:claude-haiku-4-5", "auth")

    served.run(refuse_the_key())
    session_id = start_session(served, workspace)
    turn = {"content": [{"type": "text", "text": "@keyed:claude-haiku-4-5 hello"}]}
    status, body = rest(served, "POST", f"/sessions/{session_id}/turns", turn)
    assert (status, body["error"]["code"]) == (503, "routing_failed"), body
    for width, height in ((1280, 800), PHONE):
        with logged_in_page(browser, served, width, height) as pg:
            pg.goto(f"{served.url}/#/routing")
            row = pg.locator("#models tr[data-model='keyed:claude-haiku-4-5']")
            row.locator("button:text-is('Reset')").wait_for()
            text = row.inner_text()
            # words, not the detail's JSON nor the availability's code
            assert "unavailable" in text and "provider_unavailable" not in text, text
            assert "{" not in text and "keyed refused the key from" in text, text
            assert "all of keyed's models are out; routing tries again at" in text, text
            # the whole row is on the screen: nothing to scroll sideways to reach its Reset
            for cell in row.locator("td").all():
                box = cell.bounding_box()
                assert box is None or box["x"] + box["width"] <= width, (width, cell.inner_text())
            # a turn no model could take says so, and which was refused, in the decisions
            refused = pg.locator("#decisions tr", has_text="could not take it").first
            assert "none" in refused.inner_text() and "keyed" in refused.inner_text()
            status_line = pg.inner_text("#policy-state")
            assert "routing.yaml" in status_line and "is in force" in status_line
            if width == PHONE[0]:
                continue
            row.locator("button:text-is('Reset')").focus()
            pg.keyboard.press("Enter")
            pg.wait_for_selector("#toast.ok:has-text('Available again: keyed:claude-haiku-4-5')")
            pg.wait_for_selector("#models tr[data-model='keyed:claude-haiku-4-5'] .badge.ok")
            assert row.locator("button").count() == 0
            # its Reset went with it: the keyboard is on Reset all, not on the page's body
            assert pg.evaluate("document.activeElement.id") == "reset-all"
            served.run(refuse_the_key())
    # a routing.yaml with an error: the page says which file is in force instead, in red
    (served.home / "routing.yaml").write_text("rules:\n  - when: {nope: 1}\n    use: x\n")
    assert rest(served, "POST", "/routing/reload")[0] == 200
    with logged_in_page(browser, served, 1280, 800) as pg:
        pg.goto(f"{served.url}/#/routing")
        state = pg.wait_for_selector("#policy-state.error")
        assert "routing.yaml has errors; the shipped default" in state.inner_text()


def test_a_sessions_turn_count_says_what_it_counts_on_a_phone(
    browser: Any, served: DaemonThread, workspace: Path
) -> None:
    """The table's head names the column on a desktop; a phone hides the head, and the count
    names itself ("1 turn" rather than a bare 1 beside the cost)."""
    session_id = start_session(served, workspace)
    send_turn(served, session_id, "hello")
    session_once(served, session_id, lambda s: s["current_turn_id"] is None)
    for (width, height), shown in (((1280, 800), "1"), (PHONE, "1 turn")):
        with logged_in_page(browser, served, width, height) as pg:
            cell = pg.locator(f"table.sessions tr[data-id='{session_id}'] td.turns")
            cell.wait_for()
            assert cell.inner_text() == shown


def test_the_sessions_list_never_scrolls_sideways_and_keeps_its_buttons_in_view_on_a_laptop(
    browser: Any, served: DaemonThread, tmp_path: Path
) -> None:
    """Between a phone and a wide desktop (a 1024 px laptop, half a screen) the list's nine
    columns did not fit: the table scrolled sideways, Purge was cut off at its right edge and a
    workspace path broke every ten characters. Up to 1200 px each session is a block."""
    deep = tmp_path / "a-rather-long-workspace-folder-name" / "with" / "nested" / "project-dir"
    deep.mkdir(parents=True)
    session_id = start_session(served, deep)
    send_turn(served, session_id, "hello")
    session_once(served, session_id, lambda s: s["current_turn_id"] is None)
    with logged_in_page(browser, served, 1024, 800) as pg:
        purge = pg.locator(f"tr[data-id='{session_id}'] button[data-control=purge]")
        purge.wait_for()
        for width in (900, 1024, 1201, 1280):
            pg.set_viewport_size({"width": width, "height": 800})
            wrap = pg.locator(".table-wrap")
            sideways = wrap.evaluate("w => w.scrollWidth - w.clientWidth")
            assert sideways <= 0, f"at {width} px the list scrolls {sideways} px sideways"
            right = purge.evaluate("b => b.getBoundingClientRect().right")
            assert right <= wrap.evaluate("w => w.getBoundingClientRect().right"), width
            # the path has room to be read (at 1024 px its column was 80 px wide)
            cell = pg.locator(f"tr[data-id='{session_id}'] td.workspace")
            wide = cell.evaluate("td => td.getBoundingClientRect().width")
            assert wide >= 150, f"at {width} px the workspace is {wide} px wide"


def test_on_a_phone_a_route_decision_shows_the_model_it_chose(
    phone: Any, served: DaemonThread, workspace: Path
) -> None:
    """The last route decisions were a six-column table that scrolled sideways on a phone: the
    model chosen, what a reader comes for, was past the screen's right edge."""
    session_id = start_session(served, workspace)
    send_turn(served, session_id, "hello")
    session_once(served, session_id, lambda s: s["current_turn_id"] is None)
    phone.goto(f"{served.url}/#/routing")
    chosen = phone.locator("#decisions tbody td:nth-child(3)").first
    chosen.wait_for()
    assert chosen.inner_text() == "local:scripted"
    right = chosen.evaluate("td => td.getBoundingClientRect().right")
    assert right <= phone.viewport_size["width"], right
    wrap = phone.locator("#decisions").locator("xpath=..")
    assert wrap.evaluate("w => w.scrollWidth <= w.clientWidth")


def test_the_purge_dialog_names_the_session_and_keeps_clear_of_a_phones_edges(
    browser: Any, served: DaemonThread, workspace: Path
) -> None:
    session_id = start_session(served, workspace)
    send_turn(served, session_id, "hello")
    session_once(served, session_id, lambda s: s["current_turn_id"] is None)
    with logged_in_page(browser, served, *PHONE) as pg:
        pg.locator(f"table.sessions tr[data-id='{session_id}'] button.danger").click()
        dialog = pg.wait_for_selector("dialog[open]")
        text = dialog.inner_text()
        assert f"every message and event of hello ({session_id})." in text, text
        box = dialog.bounding_box()
        assert box is not None
        assert box["x"] >= 8 and box["x"] + box["width"] <= PHONE[0] - 8, box
        pg.keyboard.press("Escape")
        pg.wait_for_selector("dialog", state="detached")


def test_the_login_pages_keep_clear_of_a_phones_edges(browser: Any, served: DaemonThread) -> None:
    """The page that says how to log in, and the one of a spent link: a card whose frame is
    whole on a phone, not cut by the screen's edges."""
    context = browser.new_context(viewport={"width": PHONE[0], "height": PHONE[1]})
    pg = context.new_page()
    for link in (served.url + "/", served.url + "/login?token=spent"):
        pg.goto(link)
        card = pg.wait_for_selector("#login:visible")
        box = card.bounding_box()
        assert box is not None
        assert box["x"] >= 8 and box["x"] + box["width"] <= PHONE[0] - 8, (link, box)
    context.close()


def test_on_a_phone_an_events_json_opens_under_its_row(
    browser: Any, served: DaemonThread, workspace: Path
) -> None:
    """The panel is under the whole timeline there: it moves under the row clicked, stays
    there through a filter's redraw, and goes back beside the timeline on a wide screen."""
    session_id = start_session(served, workspace)
    for text in ("hello", "again", "and again"):
        send_turn(served, session_id, text)
        session_once(served, session_id, lambda s: s["current_turn_id"] is None)
    under_row = (
        "() => { const p = document.querySelector('.event-panel');"
        " const r = p.previousElementSibling;"
        " return !!r && r.classList.contains('selected'); }"
    )
    with logged_in_page(browser, served, *PHONE) as pg:
        pg.goto(f"{served.url}/#/s/{session_id}/trace")
        pg.wait_for_selector("#trace .turn")
        pg.locator("#trace .ev.span-llm").first.click()
        assert pg.evaluate(under_row)
        box = pg.locator(".event-panel").bounding_box()
        assert box is not None and box["y"] < PHONE[1], box  # on the screen, not below it all
        assert '"type": "llm.call_completed"' in pg.inner_text("#event-json")
        pg.select_option("#trace-filter", "llm")
        assert pg.evaluate(under_row)
        pg.set_viewport_size({"width": 1280, "height": 800})
        pg.wait_for_function(
            "() => document.querySelector('.event-panel').parentElement"
            ".classList.contains('trace-layout')"
        )
        assert '"type": "llm.call_completed"' in pg.inner_text("#event-json")


def test_an_events_json_closes_with_escape_or_a_second_press_of_its_row(
    browser: Any, served: DaemonThread, workspace: Path
) -> None:
    """On a phone the JSON is a long block under its row, and nothing put it away but opening
    another event's: Escape (the keyboard back on the row) or pressing the row again does."""
    session_id = start_session(served, workspace)
    send_turn(served, session_id, "hello")
    session_once(served, session_id, lambda s: s["current_turn_id"] is None)
    with logged_in_page(browser, served, *PHONE) as pg:
        pg.goto(f"{served.url}/#/s/{session_id}/trace")
        row = pg.locator("#trace .ev.span-llm").first
        row.focus()
        pg.keyboard.press("Enter")
        assert row.get_attribute("aria-pressed") == "true"
        assert '"type": "llm.call_completed"' in pg.inner_text("#event-json")
        pg.keyboard.press("Escape")
        assert pg.inner_text("#event-json") == PLACEHOLDER
        assert row.get_attribute("aria-pressed") == "false"
        assert row.evaluate("r => r === document.activeElement")
        row.click()
        assert pg.locator(".ev.selected + .event-panel").is_visible()
        # an Escape on the filter's choices is theirs: the open event stays
        pg.locator("#trace-filter").focus()
        pg.keyboard.press("Escape")
        assert row.get_attribute("aria-pressed") == "true"
        row.click()
        assert pg.locator(".ev.selected").count() == 0
        assert pg.inner_text("#event-json") == PLACEHOLDER


def test_the_routing_page_follows_the_models_and_the_decisions(
    keyed_models: Path, page: Any, served: DaemonThread, workspace: Path
) -> None:
    assert served.daemon is not None
    core = served.daemon.core
    page.goto(f"{served.url}/#/routing")
    row = page.locator("#models tr[data-model='keyed:claude-haiku-4-5']")
    row.locator(".badge.ok").wait_for()
    # no global_default in force: the model a turn no rule picks is named all the same
    assert page.inner_text("#policy-default") == (
        "keyed:claude-haiku-4-5 — none set: the first configured model"
    )
    page.locator("#reset-all").focus()

    async def refuse_the_key() -> None:
        core.availability.record_failure("keyed:claude-haiku-4-5", "auth")

    served.run(refuse_the_key())
    row.locator(".badge.bad:text-is('unavailable')").wait_for()  # no reload
    session_id = start_session(served, workspace)
    # no model can take it now (keyed is the default and out): a decision all the same
    turn = {"content": [{"type": "text", "text": "hello"}]}
    assert rest(served, "POST", f"/sessions/{session_id}/turns", turn)[0] == 503
    page.locator(f"#decisions a[title='{session_id}']").first.wait_for()
    # the refreshes that changed nothing near it left the keyboard where it was
    assert page.evaluate("document.activeElement.id") == "reset-all"
    # a rule as its file says it (name, model, line, what it is for, when in words)
    (served.home / "routing.yaml").write_text(
        "rules:\n  - name: quick\n    description: Greetings are cheap\n"
        "    when: {message_length_lt: 20}\n    use: local:scripted\n"
        "  - name: always\n    when: {}\n    use: local:scripted\n"
    )
    assert rest(served, "POST", "/routing/reload")[0] == 200
    quick = page.locator("ol.rules li[data-rule=quick]")
    quick.wait_for()  # no reload: the page follows the policy too
    assert quick.inner_text().splitlines() == [
        "quick → local:scripted · line 2",
        "Greetings are cheap",
        "when the message is shorter than 20 characters",
    ]
    always = page.locator("ol.rules li[data-rule=always]").inner_text()
    assert always.splitlines()[-1] == "on every turn"


def test_the_last_page_of_a_trace_leaves_the_keyboard_on_what_it_added(
    page: Any, served: DaemonThread, workspace: Path
) -> None:
    session_id = start_session(served, workspace)
    for i in range(205):  # each change of the model is an event: more than a page of 200
        body = {"active_model": None if i % 2 else "local:scripted"}
        assert rest(served, "PATCH", f"/sessions/{session_id}", body)[0] == 200
    status, first = rest(served, "GET", f"/sessions/{session_id}/events?limit=200")
    assert status == 200 and first["next_cursor"]
    status, second = rest(
        served, "GET", f"/sessions/{session_id}/events?limit=200&cursor={first['next_cursor']}"
    )
    assert status == 200
    page.goto(f"{served.url}/#/s/{session_id}/trace")
    page.wait_for_selector("#trace-more:visible")
    page.locator("#trace-more").focus()
    page.keyboard.press("Enter")
    page.wait_for_selector("#trace-more", state="hidden")
    page.wait_for_function(
        "id => document.activeElement.dataset.id === id", arg=second["events"][0]["id"]
    )


def every_condition_kind(workspace: Path) -> str:
    """A routing.yaml with each predicate and combinator of docs/configuration.md, a workspace
    scope, tiers and the reserved pattern block; its regexes in single quotes, as written."""
    return rf"""schema_version: 1
tiers: {{fast: local:scripted, balanced: haiku, deep: haiku}}
rules:
  - name: regex
    when: {{message_matches: '(?i)\bfix\b'}}
    use: local:scripted
  - name: words
    when: {{message_contains_any: ["<b>wip</b>", todo]}}
    use: local:scripted
  - name: sizes
    when:
      message_length_gt: 10
      message_length_lt: 1
      estimated_input_tokens_gt: 2000
      estimated_input_tokens_lt: 9000
      turn_index_gt: 2
      turn_index_lt: 5
    use: local:scripted
  - name: flags
    when: {{has_images: true, has_tool_calls_in_history: false, tool_use_in_progress: true}}
    use: local:scripted
  - name: files
    when: {{mentions_file_extension: [.TOML, yaml]}}
    use: local:scripted
  - name: places
    when: {{workspace_path_glob: ["{workspace}/**", "/srv/*/api"]}}
    use: local:scripted
  - name: money and night
    when: {{session_cost_usd_gt: "0.50", time_of_day_between: ["22:00", "06:00"]}}
    use: local:scripted
  - name: combined
    when:
      any_of:
        - all_of: [{{has_images: true}}, {{turn_index_gt: 1}}]
        - not: {{has_tool_calls_in_history: true}}
        - not: {{any_of: [{{message_matches: 'x'}}, {{has_images: false}}]}}
        - not: {{message_length_gt: 5, has_images: true}}
        - not: {{message_matches: '^\s*$'}}
    use: local:scripted
  - name: always
    when: {{}}
    use: local:scripted
workspaces:
  "{workspace}":
    default: haiku
    tiers: {{fast: local:scripted, balanced: local:scripted, deep: haiku}}
    rules:
      - name: deploys
        when: {{message_matches: '\bdeploy\b'}}
        use: local:scripted
pattern: {{enabled: true, cost_weight: 0.1, min_confidence: 0.2, min_sample_size: 7}}
"""


# each rule's `when` as the page says it, a line per condition (nested ones under theirs)
IN_WORDS = {
    "regex": [r"when the message matches (?i)\bfix\b (in any case)"],
    "words": ["when the message contains <b>wip</b> or todo (in any case)"],
    "sizes": [
        "when all of these hold:",
        "the message is longer than 10 characters",
        "the message is shorter than 1 character",
        "the input is estimated at more than 2,000 tokens",
        "the input is estimated at fewer than 9,000 tokens",
        "the turn comes after the session's turn 2",
        "the turn comes before the session's turn 5",
    ],
    "flags": [
        "when all of these hold:",
        "the message has images",
        "the session has not called tools yet",
        "the turn brings the results of tool calls in progress",
    ],
    "files": ["when the message mentions a .toml or .yaml file"],
    "places": ["when the workspace matches {workspace}/** or /srv/*/api"],
    "money and night": [
        "when all of these hold:",
        "the session has cost more than $0.50",
        "the daemon's local time is from 22:00 until 06:00 (overnight)",
    ],
    "combined": [
        "when any of these holds:",
        "all of these hold:",
        "the message has images",
        "the turn comes after the session's turn 1",
        "the session has not called tools yet",
        "none of these holds:",
        "the message matches x",
        "the message has no images",
        "not all of these hold:",
        "the message is longer than 5 characters",
        "the message has images",
        r"not: the message matches ^\s*$",
    ],
    "always": ["on every turn"],
}


def test_the_routing_page_says_each_rules_conditions_in_words(
    browser: Any, served: DaemonThread, workspace: Path, shot: Any
) -> None:
    (served.home / "routing.yaml").write_text(every_condition_kind(workspace))
    status, body = rest(served, "POST", "/routing/reload")
    assert status == 200 and body["valid"], body
    status, policy = rest(served, "GET", "/routing/policy")
    assert status == 200
    # the daemon's JSON has each kind, so the page has each kind to say
    kinds: set[str] = set()

    def keys_of(when: Any) -> None:
        for key, value in when.items():
            kinds.add(key)
            for item in value if key in ("all_of", "any_of") else [value] if key == "not" else []:
                keys_of(item)

    for rule in policy["rules"]:
        keys_of(rule["when"])
    assert kinds == set(PREDICATE_KEYS), sorted(set(PREDICATE_KEYS) - kinds)

    for width, height in ((1280, 800), PHONE):
        with logged_in_page(browser, served, width, height) as pg:
            pg.goto(f"{served.url}/#/routing")
            policy_box = pg.locator("#policy")
            policy_box.locator("ol.rules li[data-rule=always]").wait_for()
            for name, lines in IN_WORDS.items():
                rule = policy_box.locator(f"ol.rules li[data-rule='{name}'] > .when")
                expected = [line.format(workspace=workspace) for line in lines]
                assert rule.inner_text().splitlines() == expected, name
            # the regex as routing.yaml has it: one backslash, not JSON's two
            regex = policy_box.locator("li[data-rule=regex] code.val")
            assert regex.inner_text() == r"(?i)\bfix\b"
            text = policy_box.inner_text()
            assert "\\\\" not in text and '{"' not in text, text
            # a value from the file is text, never markup
            assert policy_box.locator("li[data-rule=words] b").count() == 0
            assert policy_box.locator("#policy-tiers").inner_text().splitlines() == [
                "fast: local:scripted",
                "balanced: anthropic:claude-haiku-4-5",
                "deep: anthropic:claude-haiku-4-5",
            ]
            pattern = policy_box.locator("#policy-pattern").inner_text()
            assert pattern.startswith("on in routing.yaml, but not used yet"), pattern
            assert "cost weight 0.1, minimum confidence 0.2, minimum sample size 7" in pattern
            scope = policy_box.locator(f"section.scope[data-workspace='{workspace}']")
            assert scope.locator("h4").inner_text() == f"In {workspace} and below"
            assert scope.locator("dl.kv").inner_text().splitlines() == [
                "Default",
                "anthropic:claude-haiku-4-5",
                "Tiers",
                "fast: local:scripted",
                "balanced: local:scripted",
                "deep: anthropic:claude-haiku-4-5",
            ]
            deploys = scope.locator("li[data-rule=deploys] > .when").inner_text()
            assert deploys == r"when the message matches \bdeploy\b"
            # no line of the policy is wider than the screen (a warning naming a long path too)
            overflow = pg.evaluate("document.documentElement.scrollWidth - innerWidth")
            assert overflow <= 0, (width, overflow)
            policy_box.locator("li[data-rule=combined]").scroll_into_view_if_needed()
            shot(pg, f"routing-conditions-{width}")
            # a condition a later daemon may know and this page does not is still shown
            unknown = pg.evaluate(
                """async () => {
                    const { condition } = await import("/static/js/views/routing.js");
                    const { h } = await import("/static/js/dom.js");
                    return h("div", {}, condition("future_key", { a: 1 })).textContent;
                }"""
            )
            assert unknown == 'future_key: {"a":1}'


@pytest.mark.parametrize(
    ("platform", "keys", "press"),
    [(None, "Ctrl+Enter", "Control+Enter"), ("MacIntel", "⌘+Enter", "Meta+Enter")],
)
def test_the_composer_names_the_send_key_of_the_system(
    browser: Any,
    served: DaemonThread,
    workspace: Path,
    platform: str | None,
    keys: str,
    press: str,
) -> None:
    session_id = start_session(served, workspace)
    with logged_in_page(browser, served, 1280, 800, platform=platform) as pg:
        pg.goto(f"{served.url}/#/s/{session_id}")
        pg.wait_for_selector("[data-conn=live]")
        box = pg.locator("#composer-input")
        hint = box.get_attribute("placeholder") or ""
        assert hint.startswith(f"Message ({keys} to send;"), hint
        box.fill("hello")
        box.press(press)  # the key the hint names sends
        pg.wait_for_function("() => document.querySelector('#composer-input').value === ''")
        pg.locator("#transcript .msg.user", has_text="hello").wait_for()


# -- a session's page, its model the fake provider's -----------------------------------------


class Faked:
    """A daemon whose one model is the fake provider's, served on the daemon's own loop."""

    def __init__(self, served: DaemonThread, fake: FakeProviderServer) -> None:
        self.served = served
        self.fake = fake

    def reply(self, *replies: dict[str, Any] | FakeReply) -> None:
        """The model's next replies, in order (then the fake's default one)."""
        self.served.loop.call_soon_threadsafe(self.fake.enqueue, "any", *replies)


@pytest.fixture
def faked(dash_home: Path, browser_path: str) -> Iterator[Faked]:
    served = DaemonThread(dash_home)
    fake = FakeProviderServer(expected_keys={"anthropic": "bench-key"})
    served.run(fake.start())
    (dash_home / "models.yaml").write_text(bench_models_yaml(fake.anthropic_base_url))
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


def test_a_sessions_model_breaks_after_its_provider_and_says_pinned_in_words(
    fpage: Any, faked: Faked, workspace: Path
) -> None:
    """In the Model column "anthropic:claude-" sat above "sonnet-4-6"; and a pinned model was
    marked by an emoji, a blank box where the system has no emoji font."""
    session_id = start_session(faked.served, workspace)
    pin = {"active_model": "sonnet"}
    status, body = rest(faked.served, "PATCH", f"/sessions/{session_id}", pin)
    assert status == 200, body
    cell = fpage.locator(f"tr[data-id='{session_id}'] td.model")
    cell.wait_for()
    assert cell.inner_text().replace("\n", "") == "anthropic:claude-sonnet-4-6 · pinned"
    name = cell.locator(".model-name")
    assert name.inner_text() == "claude-sonnet-4-6"
    assert name.evaluate("n => n.getClientRects().length") == 1  # on one line


def test_the_trace_keeps_a_models_name_whole_on_one_line(
    fpage: Any, faked: Faked, workspace: Path
) -> None:
    """Each turn's route row read "route → anthropic:claude-sonnet-4-" with a lone "6" below."""
    session_id = start_session(faked.served, workspace)
    faked.reply({"text": "hi"})
    send_turn(faked.served, session_id, "hello")
    session_once(faked.served, session_id, lambda s: s["current_turn_id"] is None)
    fpage.goto(f"{faked.served.url}/#/s/{session_id}/trace")
    for kind in ("route", "llm"):
        label = fpage.locator(f"#trace .ev.span-{kind} .ev-label").first
        label.wait_for()
        assert label.inner_text().endswith("anthropic:claude-sonnet-4-6")
        name = label.locator(".model-name")
        assert name.inner_text() == "claude-sonnet-4-6"
        assert name.evaluate("n => n.getClientRects().length") == 1, kind


def test_an_llm_calls_figures_in_the_trace_are_never_cut_off(
    fpage: Any, faked: Faked, workspace: Path
) -> None:
    """At 1024 px an LLM call's row ended "497 in / 535 out · $…": its cost, cut off."""
    session_id = start_session(faked.served, workspace)
    faked.reply({"text": "hi", "usage": {"input_tokens": 123456, "output_tokens": 54321}})
    send_turn(faked.served, session_id, "hello")
    session_once(faked.served, session_id, lambda s: s["current_turn_id"] is None)
    fpage.set_viewport_size({"width": 1024, "height": 800})
    fpage.goto(f"{faked.served.url}/#/s/{session_id}/trace")
    figures = fpage.locator("#trace .ev.span-llm .ev-extra").first
    figures.wait_for()
    assert figures.evaluate("e => e.scrollWidth <= e.clientWidth"), figures.inner_text()
    assert "123,456 in / 54,321 out · $" in figures.inner_text()


def test_the_sessions_cost_counts_a_call_cut_short_and_says_it_is_estimated(
    fpage: Any, faked: Faked, workspace: Path
) -> None:
    """The page added up completed calls only, so a cancelled call the provider billed (and
    `metis sessions show` counts) was left out; now its estimated cost is in, marked `≈`, live
    and after a reload."""
    session_id = start_session(faked.served, workspace)
    faked.reply(FakeReply.hang_after(5, text="this never finishes", chunk_chars=3))
    fpage.goto(f"{faked.served.url}/#/s/{session_id}")
    send(fpage, "go")
    fpage.wait_for_selector(".msg.assistant.streaming .stream-text")
    fpage.click("#cancel")
    fpage.wait_for_selector("#turn-state:text-is('cancelled')")
    session = session_once(faked.served, session_id, lambda s: s["current_turn_id"] is None)
    cost = float(session["cost_so_far_usd"])
    assert cost > 0
    shown = f"Cost ≈${cost:.4f}"
    fpage.wait_for_selector(f"#cost:text-is('{shown}')")
    assert "estimated" in (fpage.get_attribute("#cost", "title") or "")
    fpage.reload()
    fpage.wait_for_selector(f"#cost:text-is('{shown}')")


def test_the_trace_says_why_a_tool_or_model_call_failed_in_words_not_codes(
    fpage: Any, faked: Faked, workspace: Path
) -> None:
    """A failed call's row read `✗ tool_error` or `✗ invalid_request`: the event's code, which
    its JSON still holds, where a person reads what happened."""
    session_id = start_session(faked.served, workspace)
    faked.reply(
        {"tool_calls": [{"name": "read_file", "input": {"path": "no-such-file.txt"}}]},
        {"text": "done"},
        FakeReply.fail(400),
    )
    for prompt in ("read it", "again"):
        send_turn(faked.served, session_id, prompt)
        session_once(faked.served, session_id, lambda s: s["current_turn_id"] is None)
    fpage.goto(f"{faked.served.url}/#/s/{session_id}/trace")
    failed_llm = fpage.locator("#trace .ev.span-llm.failed .ev-label")
    failed_llm.wait_for()
    assert failed_llm.inner_text().endswith("✗ request refused"), failed_llm.inner_text()
    tool = fpage.locator("#trace .ev.span-tool.failed .ev-label").inner_text()
    assert tool == "tool read_file ✗ failed", tool


def test_the_trace_says_the_tokens_read_from_the_cache_and_what_a_full_window_left_out(
    browser: Any, dash_home: Path, browser_path: str, workspace: Path
) -> None:
    """A model whose window takes 5,000 input tokens and ~2,000-token replies read mostly from
    the prompt cache: each call's row counts the cached tokens as read, and the calls past the
    window say how many earlier messages they left out."""
    served = DaemonThread(dash_home)
    fake = FakeProviderServer(expected_keys={"anthropic": "bench-key"})
    served.run(fake.start())
    window = 8192 + 5000  # the output reserve (limits.max_output_tokens_per_call) and the rest
    models = bench_models_yaml(fake.anthropic_base_url, context_tokens=window)
    (dash_home / "models.yaml").write_text(models)
    usage = {"input_tokens": 12, "cache_read_tokens": 5000, "cache_write_tokens": 300}
    try:
        served.start()
        faked = Faked(served, fake)
        session_id = start_session(served, workspace)
        for i in range(4):
            faked.reply(
                {"text": f"answer {i} " + "r" * 8000, "usage": {**usage, "output_tokens": 7}}
            )
            send_turn(served, session_id, f"question {i}")
            session_once(served, session_id, lambda s: s["current_turn_id"] is None)
        started = events_of(served, session_id, "llm.call_started")
        left_out = started[-1]["payload"]["messages_left_out"]
        assert left_out > 0 and started[0]["payload"]["messages_left_out"] == 0
        with logged_in_page(browser, served, 1280, 800) as page:
            page.goto(f"{served.url}/#/s/{session_id}/trace")
            page.wait_for_selector("#trace .ev.span-llm")
            calls = page.locator("#trace .ev.span-llm .ev-extra").all_inner_texts()
            assert len(calls) == 4 and all(" · 5,312 in / 7 out · " in c for c in calls), calls
            assert "left out" not in calls[0]
            assert calls[-1].endswith(f" · {left_out} earlier messages left out"), calls
    finally:
        served.run(fake.stop())
        served.close()


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


def test_a_reply_cut_off_by_the_output_limit_says_so_and_names_the_call_it_dropped(
    fpage: Any, faked: Faked, workspace: Path
) -> None:
    """Live, the note names the call the limit cut off (it never ran, so no card is left);
    after a reload, the stored reply still says it was cut off."""
    faked.reply(FakeReply(raw_sse=CUT_OFF_REPLIES["anthropic"]), {"text": "done"})
    open_session(fpage, workspace)
    send(fpage, "read then write")
    fpage.wait_for_selector("#turn-state:text-is('idle')")
    note = fpage.locator(".msg.assistant .cut-off").first
    assert note.text_content() == (
        "The reply was cut off by the output limit (max_tokens). The call to write_file it was"
        " writing was dropped; it did not run."
    )
    assert fpage.locator(".tool-card", has_text="write_file").count() == 0
    fpage.reload()
    fpage.locator(".msg.assistant .cut-off").first.wait_for()
    assert fpage.locator(".msg.assistant .cut-off").first.text_content() == (
        "The reply was cut off by the output limit (max_tokens)."
    )


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
    the screen, whatever the workspace's path (a long folder name has no place to break)."""
    long = "please look at every file of this project and tell me " * 3
    deep = workspace / ("a_long_project_folder_name_" * 2 + "without_a_hyphen")
    deep.mkdir()
    session_id = open_session(page, deep)
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
