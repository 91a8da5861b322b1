"""The title rule, as pure functions: what a client may set, and what a first prompt gives."""

from __future__ import annotations

import pytest

from metis.core.sessions.titles import TITLE_CHARS, title_from_prompt, title_problem


@pytest.mark.parametrize(
    "title",
    [
        "Fix the build",
        "✓",
        "👩‍💻",
        "\ue0a0 branch",
        "x" * TITLE_CHARS,
        "e\u0301",
        "❤\ufe0f",
        "한글",
    ],
)
def test_a_line_with_something_to_see_is_a_title(title: str) -> None:
    assert title_problem(title) is None


@pytest.mark.parametrize("title", ["", " ", "\u00a0\u3000", "\u200b", "\u00ad\ufeff\u2060\u200d"])
def test_white_space_and_invisible_format_characters_alone_are_no_title(title: str) -> None:
    assert title_problem(title) == "a title needs at least one visible character"


@pytest.mark.parametrize(
    "title",
    [
        "\u3164",  # Hangul filler
        "\u115f\u1160\uffa0",  # the other Hangul fillers
        "\u2800",  # blank braille pattern
        "\U0001d159",  # musical null notehead
        "\ufe0f",  # a variation selector with nothing to vary
        "\u0301\u20dd\u034f",  # combining marks (acute, enclosing circle, grapheme joiner) alone
        " \u3164\u200b\u2800 ",
    ],
)
def test_blank_look_alikes_and_marks_without_a_base_are_no_title(title: str) -> None:
    assert title_problem(title) == "a title needs at least one visible character"


def test_a_prompt_gives_its_first_line_that_shows_something() -> None:
    assert title_from_prompt("\u200b\n \ufeff \nRefactor the parser\nmore") == "Refactor the parser"
    assert title_from_prompt("\u200b\n\u00ad") is None
    assert title_from_prompt("\u3164\n\u2800\ufe0f\nName it") == "Name it"
    assert title_from_prompt("\u3164 \u0301") is None
