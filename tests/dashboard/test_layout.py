"""The dashboard's layout and wording: every page fits a phone, the trace's counts agree with
its turns' in the right plurals, and an MCP reload says what it did."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from metis.core.routing.predicates import PREDICATE_KEYS
from tests.core.tools.mcp_servers import DEMO
from tests.dashboard.conftest import SLOW_MODELS, DaemonThread, events_of, logged_in_page, rest

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
