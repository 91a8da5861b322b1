"""`GET /sessions?q=`: finding a session by what one remembers of it.

- Every word of the text, in any order and any case (Unicode case folding), somewhere in the set
  title or the text of the prompts and replies; or the text is the start of the session's id.
- It narrows the other filters and pages like the plain listing: a cursor walk sees each match
  once. A blank text narrows nothing; a text longer than `SEARCH_CHARS` is a 400.
- A stored prompt that cannot be decoded any more lists without a title, not a 500; a search
  still finds it by the words it had when it was stored.
- The store reads a search's candidates a batch a round trip (the reader is free between two).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from metis.core.application import SEARCH_CHARS
from metis.core.store import sessions as store_sessions
from metis.server.runner import Daemon
from tests.api import Api


async def _results(api: Api, **query: Any) -> list[dict[str, Any]]:
    """The sessions `GET /sessions` lists for `query` (a search with `q`)."""
    status, body = await api.call("GET", "/sessions", params=query)
    assert status == 200, body
    sessions: list[dict[str, Any]] = body["sessions"]
    return sessions


async def _found(api: Api, q: str, **query: Any) -> list[str]:
    return [s["id"] for s in await _results(api, q=q, **query)]


async def test_words_of_the_first_prompt_or_the_title_or_the_id_find_a_session(
    http: aiohttp.ClientSession, workspace: Path
) -> None:
    api = Api(http)
    flaky = (await api.create_session(workspace))["id"]
    await api.run_turn(flaky, "Fix the flaky test\nin the Authentication module, 100% of runs")
    street = (await api.create_session(workspace))["id"]
    await api.run_turn(street, "rename the Straße column")
    titled = (await api.create_session(workspace))["id"]
    await api.run_turn(titled, "something else entirely")
    status, _ = await api.call("PATCH", f"/sessions/{titled}", {"title": "Parser work"})
    assert status == 200

    assert await _found(api, "flaky") == [flaky]
    assert await _found(api, "AUTH   fix") == [flaky]  # any order, any case, inside a word
    assert await _found(api, "module, 100%") == [flaky]  # a later line, taken literally
    assert await _found(api, "flaky parser") == []  # every word must be there
    assert await _found(api, "strasse") == [street]  # Unicode case folding
    assert await _found(api, "STRAẞE") == [street]  # the capital sharp s
    decomposed = (await api.create_session(workspace))["id"]
    await api.run_turn(decomposed, "the cafe\u0301 menu")  # é as e and a combining accent
    assert await _found(api, "café") == [decomposed]  # typed as one letter
    assert await _found(api, "parser") == [titled]  # the set title
    assert await _found(api, "entirely") == [titled]  # its first prompt still counts
    assert await _found(api, flaky) == [flaky]
    assert await _found(api, flaky[:-4]) == [flaky]  # a copied id's start
    assert await _found(api, "  ") == [decomposed, titled, street, flaky]  # nothing to narrow


async def test_a_search_narrows_the_filters_and_pages_each_match_once(
    http: aiohttp.ClientSession, workspace: Path, tmp_path: Path
) -> None:
    api = Api(http)
    other = tmp_path / "other"
    other.mkdir()
    matching: list[str] = []
    for i in range(7):
        sid = (await api.create_session(workspace))["id"]
        await api.run_turn(sid, f"{'deploy' if i % 2 else 'review'} step {i}")
        if i % 2:
            matching.append(sid)
    elsewhere = (await api.create_session(other))["id"]
    await api.run_turn(elsewhere, "deploy from the other tree")
    ended = (await api.create_session(workspace))["id"]
    await api.run_turn(ended, "deploy, then stop")
    status, _ = await api.call("DELETE", f"/sessions/{ended}")
    assert status == 200

    walked: list[str] = []
    query: dict[str, Any] = {"q": "deploy", "limit": 2, "workspace_path": str(workspace)}
    query["status"] = "active"
    while True:
        status, page = await api.call("GET", "/sessions", params=query)
        assert status == 200 and len(page["sessions"]) <= 2, page
        walked += [s["id"] for s in page["sessions"]]
        if page["next_cursor"] is None:
            break
        query["cursor"] = page["next_cursor"]
    assert walked == matching[::-1]
    assert await _found(api, "deploy", status="ended") == [ended]
    assert await _found(api, "deploy", workspace_path=str(other)) == [elsewhere]


async def test_a_search_too_long_is_400(http: aiohttp.ClientSession) -> None:
    api = Api(http)
    status, body = await api.call("GET", "/sessions", params={"q": "x" * (SEARCH_CHARS + 1)})
    assert status == 400 and body["error"]["code"] == "validation_error"
    assert body["error"]["details"]["errors"][0]["loc"] == ["query", "q"]
    assert await _found(api, "x" * SEARCH_CHARS) == []


async def test_words_of_later_prompts_and_of_replies_find_a_session(
    http: aiohttp.ClientSession, workspace: Path
) -> None:
    api = Api(http)
    canary = (await api.create_session(workspace))["id"]
    await api.run_turn(canary, "first, look around")
    await api.run_turn(canary, "then roll out the canary build")
    quiet = (await api.create_session(workspace))["id"]
    await api.run_turn(quiet, "first, look around")
    unused = (await api.create_session(workspace))["id"]

    assert await _found(api, "canary") == [canary]  # a later prompt
    assert await _found(api, "around canary") == [canary]  # words of different prompts
    # the scripted model answers `You said: "…"`: words of a reply
    assert await _found(api, "you said") == [quiet, canary]
    assert await _found(api, "said canary") == [canary]  # a reply's word and a prompt's
    assert await _found(api, "first") == [quiet, canary]  # not the session with no turn
    assert [
        s["match"] for s in await _results(api, q="look around")
    ] == [  # the title shows it: a title match
        {"where": "title", "excerpt": "first, look around", "message_id": None}
    ] * 2
    assert await _found(api, unused) == [unused]


async def test_each_result_says_where_the_words_are_said(
    http: aiohttp.ClientSession, workspace: Path
) -> None:
    api = Api(http)
    long_prompt = (
        " ".join(f"filler{n}" for n in range(60))
        + " mention the Zephyr build "
        + ("and more " * 30)
    )
    prompt = (await api.create_session(workspace))["id"]
    await api.run_turn(prompt, long_prompt)
    titled = (await api.create_session(workspace))["id"]
    await api.run_turn(titled, "zephyr notes")
    status, _ = await api.call("PATCH", f"/sessions/{titled}", {"title": "Zephyr plan"})
    assert status == 200

    [found] = await _results(api, q="zephyr build")
    # the prompt and the reply quoting it both hold the two words: the older one is shown
    assert found["id"] == prompt and found["match"]["where"] == "user"
    messages = (await api.messages(prompt))["messages"]
    assert found["match"]["message_id"] == messages[0]["id"]  # the prompt
    shown = found["match"]["excerpt"]
    assert "mention the Zephyr build" in shown and shown.startswith("…") and shown.endswith("…")
    assert len(shown) <= 162

    assert [(s["id"], s["match"]) for s in await _results(api, q="ZEPHYR plan")] == [
        (titled, {"where": "title", "excerpt": "Zephyr plan", "message_id": None})
    ]
    found_by = await _results(api, q="you said notes")
    assert [(s["id"], s["match"]["where"]) for s in found_by] == [(titled, "assistant")]
    found_by = await _results(api, q=titled)
    assert [(s["id"], s["match"]) for s in found_by] == [(titled, None)]  # by its id
    assert all("match" not in s for s in await _results(api))  # no search, no match


async def test_a_prompt_that_cannot_be_decoded_lists_untitled_and_is_found_by_its_words(
    daemon: Daemon, http: aiohttp.ClientSession, workspace: Path
) -> None:
    api = Api(http)
    broken = (await api.create_session(workspace))["id"]
    await api.run_turn(broken, "needle in the broken one")
    kept = (await api.create_session(workspace))["id"]
    await api.run_turn(kept, "needle in the sound one")
    with sqlite3.connect(daemon.settings.home / "metis.db") as db:
        db.execute(
            "UPDATE messages SET content_json = '[{not json' WHERE session_id = ? AND role = 'user'",
            (broken,),
        )
    assert [(s["id"], s["title"]) for s in await _results(api, q="needle")] == [
        (kept, "needle in the sound one"),
        (broken, None),
    ]
    assert await _found(api, broken) == [broken]  # its id finds it too


async def test_a_purged_session_and_a_cleared_title_are_found_no_more(
    daemon: Daemon, http: aiohttp.ClientSession, workspace: Path
) -> None:
    api = Api(http)
    sid = (await api.create_session(workspace))["id"]
    await api.run_turn(sid, "tidy the logs")
    for title, found in (("Release notes", [sid]), ("Other name", []), (None, [])):
        status, _ = await api.call("PATCH", f"/sessions/{sid}", {"title": title})
        assert status == 200
        assert await _found(api, "release") == found
    assert await _found(api, "tidy") == [sid]
    status, _ = await api.call("DELETE", f"/sessions/{sid}", params={"purge": "true"})
    assert status == 200
    assert await _found(api, "tidy") == []
    with sqlite3.connect(daemon.settings.home / "metis.db") as db:
        left = db.execute("SELECT COUNT(*) FROM session_search_text WHERE session_id = ?", (sid,))
        assert left.fetchone() == (0,)


async def test_a_search_reads_in_batches_and_still_finds_every_match_in_order(
    http: aiohttp.ClientSession, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store looks through a few sessions a round trip to the reader (so a search through
    many never holds the reader long); matches straddling batches come out whole and newest
    first."""
    monkeypatch.setattr(store_sessions, "SEARCH_BATCH", 2)
    api = Api(http)
    matching: list[str] = []
    for i in range(7):
        sid = (await api.create_session(workspace))["id"]
        status, _ = await api.call("PATCH", f"/sessions/{sid}", {"title": f"job {i % 3}"})
        assert status == 200
        if i % 3 == 0:
            matching.append(sid)
    assert await _found(api, "job 0") == matching[::-1]
    assert await _found(api, "job 0", limit=1) == matching[-1:]
    assert await _found(api, "nothing like it") == []
