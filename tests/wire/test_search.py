"""`where_said`: how a client words a search result's match."""

from __future__ import annotations

from metis.wire.search import where_said


def test_words_said_in_a_prompt_or_a_reply_are_shown_with_where() -> None:
    assert where_said({"where": "user", "excerpt": "…the flaky test"}) == (
        "in a prompt",
        "…the flaky test",
    )
    assert where_said({"where": "assistant", "excerpt": "fixed"}) == ("in a reply", "fixed")


def test_a_title_match_an_id_match_and_no_search_show_nothing_more() -> None:
    assert where_said({"where": "title", "excerpt": "Parser work"}) is None
    assert where_said(None) is None
    assert where_said({"where": "something new", "excerpt": "x"}) is None
