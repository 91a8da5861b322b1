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

from metis.core.canonical.text import caseless
from metis.core.store.search import SessionSearch

SEARCH_CHARS = 200
"""The longest search text: longer than any title, short enough to stay a search."""


def session_search(text: str) -> SessionSearch | None:
    """The search for `text`; None when it holds no word (nothing to narrow by)."""
    words = caseless(text).split()
    if not words:
        return None
    return SessionSearch(words=tuple(dict.fromkeys(words)), id_prefix=text.strip())
