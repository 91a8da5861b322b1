"""What a text search of the sessions finds (`GET /sessions?q=`, `metis sessions list --search`,
the dashboard's search box, the terminal app's session picker).

A person looks a session up by what they remember of it: words they typed, words of a reply,
the title they gave it, or its id copied from a log or another terminal. So a session matches
when every word of the text is somewhere in its conversation — its set title, or the text of
any of its prompts and replies (tool output and thinking are not searched: see
`store/search.py`) — or when its id starts with the text. Words compare as Unicode's caseless
matching has it (compatibility-normalised, then case-folded: `strasse` finds `Straße`, and an
accent typed as its own mark finds the accented letter a prompt pasted whole), may come in any
order, and match inside longer words (`auth` finds `authentication`), as in a search box.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from metis.core.canonical.text import caseless
from metis.core.store.search import SearchHit, SessionSearch

SEARCH_CHARS = 200
"""The longest search text: longer than any title, short enough to stay a search."""

EXCERPT_CHARS = 160
"""The most of a matched text a search result shows: a line or two, enough to recognise it."""

TITLE_SHOWN_CHARS = 60
"""The start of a title every listing shows whole (a terminal line, the dashboard's two lines):
words in it need no excerpt; a longer title is cut or clamped where the words may be hidden."""


@dataclass(frozen=True)
class SearchMatch:
    """Why a session is in a search's results: where it says the words searched (its title, a
    prompt: `user`, a reply: `assistant`, with the message's id) and the words around them."""

    where: str
    excerpt: str
    message_id: str | None


def session_search(text: str) -> SessionSearch | None:
    """The search for `text`; None when it holds no word (nothing to narrow by)."""
    words = caseless(text).split()
    if not words:
        return None
    return SessionSearch(words=tuple(dict.fromkeys(words)), id_prefix=text.strip())


def search_match(
    hit: SearchHit | None, words: Sequence[str], title: str | None
) -> SearchMatch | None:
    """The match a listing shows for a store's hit (None: the session's id matched), beside
    the session's `title` as listed. Words the start of the title shows already (a title made
    of the first prompt's first line, most often) are a title match: the listing says nothing
    twice."""
    if hit is None:
        return None
    if hit.where != "title" and title is not None:
        said, shown = caseless(hit.text), caseless(title[:TITLE_SHOWN_CHARS])
        held = [word for word in words if word in said]
        if held and all(word in shown for word in held):
            return SearchMatch("title", title, None)
    return SearchMatch(hit.where, excerpt(hit.text, words), hit.message_id)


def excerpt(text: str, words: Sequence[str], width: int = EXCERPT_CHARS) -> str:
    """The part of `text` from a few words before the first place it says one of `words`
    (caseless), on one line: whitespace runs become one space, the cut falls between words
    where it can, and `…` marks each end that was cut. From the start when no word is found
    as written (a word that only matched across characters Unicode normalisation joins)."""
    flat = " ".join(text.split())
    if len(flat) <= width:
        return flat
    at = _first_place(flat, words)
    start = max(0, at - width // 5)  # a few words lead up to it: it shows in a line or two
    end = min(len(flat), start + width)
    if start > 0:
        space = flat.find(" ", start, at)
        start = space + 1 if space >= 0 else start
    if end < len(flat):
        space = flat.rfind(" ", at + 1, end)
        end = space if space > start else end
    return ("…" if start > 0 else "") + flat[start:end] + ("…" if end < len(flat) else "")


def _first_place(text: str, words: Sequence[str]) -> int:
    """Where in `text` the first of `words` (caseless) begins; 0 when none is found."""
    haystack = caseless(text)
    if len(haystack) == len(text):  # nearly all text: folding kept every position
        origin = None
    else:  # a letter that folds to two (ß → ss), or a ligature: map back one by one
        forms = [caseless(char) for char in text]
        haystack = "".join(forms)
        origin = [index for index, form in enumerate(forms) for _ in form]
    found = [at for at in (haystack.find(word) for word in words) if at >= 0]
    if not found:
        return 0
    return min(found) if origin is None else origin[min(found)]
