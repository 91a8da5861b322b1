"""`excerpt`: the words around where a matched text says what was searched, on one line."""

from __future__ import annotations

from metis.core.sessions.search import excerpt


def test_a_short_text_is_shown_whole_on_one_line() -> None:
    assert excerpt("Fix the\n\n  flaky   test", ["flaky"]) == "Fix the flaky test"


def test_a_long_text_is_cut_around_the_first_word_found_between_words() -> None:
    text = " ".join(f"w{n}" for n in range(100)) + " the Needle here " + "x" * 5 + " tail" * 60
    shown = excerpt(text, ["nothing", "needle"], width=60)
    assert shown.startswith("…") and shown.endswith("…")
    assert "the Needle here" in shown
    body = shown.strip("…")
    assert len(body) <= 60
    assert text.startswith(body) or f" {body} " in f" {text} "  # whole words only


def test_the_start_and_the_end_of_a_text_are_not_marked_as_cut() -> None:
    words = " ".join(f"w{n}" for n in range(60))
    assert excerpt("needle " + words, ["needle"], width=40).startswith("needle w0")
    tail = excerpt(words + " needle", ["needle"], width=40)
    assert tail.startswith("…") and tail.endswith(" needle")


def test_words_are_found_as_caseless_text() -> None:
    text = "a" * 200 + " die STRASSE ist lang " + "b" * 200
    assert "die STRASSE ist lang" in excerpt(text, ["straße".casefold()], width=60)
    shown = excerpt("c" * 300 + " Größe " + "d" * 300, ["grösse"], width=30)
    assert "Größe" in shown


def test_a_word_found_nowhere_as_written_shows_the_start() -> None:
    text = "start of it " + "y" * 400
    assert excerpt(text, ["absent"], width=40).startswith("start of it")
