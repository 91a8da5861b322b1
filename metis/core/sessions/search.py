"""What a text search of the sessions finds (`GET /sessions?q=`, `metis sessions list --search`,
the dashboard's search box).

A person looks a session up by what they remember of it: words of its title or of what they
first asked, or its id copied from a log or another terminal. So a session matches when every
word of the text is in its set title or its first prompt (the whole prompt, not only the line a
title shows), compared as Unicode's caseless matching has it (compatibility-normalised, then
case-folded: `strasse` finds `Straße`, and an accent typed as its own mark finds the accented
letter a prompt pasted whole), or when its id starts with the text. Words may come in any order and match inside longer words (`auth`
finds `authentication`), as in a search box.
"""

from __future__ import annotations

import unicodedata

from metis.core.store.sessions import SessionMatcher

SEARCH_CHARS = 200
"""The longest search text: longer than any title, short enough to stay a search."""


def session_matcher(text: str) -> SessionMatcher | None:
    """The search for `text`; None when it holds no word (nothing to narrow by)."""
    words = _caseless(text).split()
    if not words:
        return None
    prefix = text.strip()

    def matches(session_id: str, title: str | None, prompt: str | None) -> bool:
        if session_id.startswith(prefix):
            return True
        searched = _caseless("\n".join(part for part in (title, prompt) if part))
        return all(word in searched for word in words)

    return matches


def _caseless(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()
