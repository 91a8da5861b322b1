"""What a session title may hold: one line of visible text, whoever writes it.

A title is shown on one line in lists, the terminal's session picker and `metis sessions`, and
printed as is by the command line. So it holds no line break (nor Unicode's line and paragraph
separators), no control character (an escape sequence would rewrite the user's terminal) and no
bidi override or isolate (which can make a title read as another), and at least one visible
character: neither white space, nor an invisible format character (a zero-width space, a soft
hyphen, a byte order mark), nor a combining mark with no base to sit on (a lone variation
selector, a combining grapheme joiner), nor a letter or symbol drawn as a blank (the Hangul
fillers, the blank braille pattern), which alone would list as an empty title. A title a client sets
must follow the rule (`title_problem`); the fallback taken from a session's first prompt is
made to (`title_from_prompt`).
"""

from __future__ import annotations

import re
import unicodedata

TITLE_CHARS = 200
"""The longest title: one a client sets, and the first-line fallback cut to it."""

_NOT_IN_A_TITLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


_DRAWN_BLANK = frozenset("\u115f\u1160\u3164\uffa0\u2800\U0001d159")
"""Characters of visible categories (letters, symbols) that fonts draw as nothing: the Hangul
choseong, jungseong and (halfwidth) fillers, the blank braille pattern, the musical null
notehead. Alone they make a title that lists as empty, as white space would."""

_NOT_SHOWN_CATEGORIES = frozenset(("Cf", "Mn", "Me"))
"""Format characters draw nothing; a nonspacing or enclosing mark draws only on a base
character, so marks alone (no base among them) show nothing either."""


def _shows(char: str) -> bool:
    return not (
        char.isspace()
        or char in _DRAWN_BLANK
        or unicodedata.category(char) in _NOT_SHOWN_CATEGORIES
    )


def _shows_something(text: str) -> bool:
    """At least one character draws something: a base for any marks, or a mark-free glyph."""
    return any(_shows(c) for c in text)


def title_problem(title: str) -> str | None:
    """Why `title` cannot be a title (None when it can)."""
    if _NOT_IN_A_TITLE.search(title):
        return "a title is one line of text: no line breaks, control or bidi characters"
    if not _shows_something(title):
        return "a title needs at least one visible character"
    if len(title) > TITLE_CHARS:
        return f"at most {TITLE_CHARS} characters"
    return None


def title_from_prompt(text: str) -> str | None:
    """A prompt's first non-blank line, without what a title may not hold, stripped and cut to
    `TITLE_CHARS` (None if nothing is left)."""
    for line in text.splitlines():  # splits at \u2028 and \u2029 too
        visible = _NOT_IN_A_TITLE.sub("", line).strip()
        if _shows_something(visible):
            return visible[:TITLE_CHARS]
    return None
