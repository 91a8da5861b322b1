"""The sessions' search text, table `session_search_text`, and the SQL that searches it.

A person finds a session by words they remember of it, wherever in the conversation they
were: in a prompt, in a reply, in the title they gave it. So every user or assistant message
holding text has a row here with that text in caseless form (`canonical.text`), and a set
title has one (source `title`); a search is then a SQL scan (`instr` per word) that never
decodes a stored message. Tool results, tool inputs and thinking get no row: they are the
machine's working, often large, and words in them would find sessions the person never read
them in.

Rows are written in the transaction that stores their message or sets the title, and go with
their session (foreign key, cascade). Schema v4 created the table and filled it from the
messages and titles already stored (`register_functions` gives that migration the rule).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Literal

import aiosqlite

from metis.core.canonical.messages import Message
from metis.core.canonical.text import blocks_text, caseless, stored_text

SEARCHED_ROLES = ("user", "assistant")
TITLE_SOURCE = "title"
"""The `source` of a set title's row (a message's row has the message id, a ULID)."""

INSERT_SEARCH_TEXT_SQL = "INSERT INTO session_search_text (session_id, source, text) VALUES (?,?,?)"


def message_search_row(message: Message) -> tuple[str, str, str] | None:
    """The `INSERT_SEARCH_TEXT_SQL` parameters of a stored message; None when a search has
    nothing to find in it (another role, or no text)."""
    if message.role not in SEARCHED_ROLES:
        return None
    text = blocks_text(message.content)
    return (message.session_id, message.id, caseless(text)) if text else None


def set_title_statements(
    session_id: str, title: str | None
) -> list[tuple[str, tuple[object, ...]]]:
    """The writes that keep a session's title row as its title is set (or cleared: None)."""
    clear = (
        "DELETE FROM session_search_text WHERE session_id = ? AND source = ?",
        (session_id, TITLE_SOURCE),
    )
    if title is None:
        return [clear]
    return [
        clear,
        (
            "INSERT INTO session_search_text (session_id, source, text) "
            "SELECT ?, ?, ? WHERE EXISTS (SELECT 1 FROM sessions WHERE id = ?)",
            (session_id, TITLE_SOURCE, caseless(title), session_id),
        ),
    ]


def _stored_search_text(content_json: str) -> str | None:
    text = stored_text(content_json)
    return caseless(text) if text else None


def _stored_caseless(text: object) -> str | None:
    return caseless(text) if isinstance(text, str) else None  # a row of any release: no error


async def register_functions(conn: aiosqlite.Connection) -> None:
    """The SQL functions schema v4 fills the table with, from rows an earlier release stored:
    `metis_search_text(content_json)` (NULL for a message with no text or none readable) and
    `metis_caseless(text)` (NULL for a value that is not text)."""
    await conn.create_function("metis_search_text", 1, _stored_search_text, deterministic=True)
    await conn.create_function("metis_caseless", 1, _stored_caseless, deterministic=True)


@dataclass(frozen=True)
class SessionSearch:
    """A text search of the sessions (the rule is the core's, `core/sessions/search.py`): a
    session matches when its id starts with `id_prefix`, or when every one of `words` (in
    caseless form) is inside its title or the text of one of its messages."""

    words: tuple[str, ...]
    id_prefix: str

    def condition(self) -> tuple[str, tuple[object, ...]]:
        """The SQL condition on a `sessions` row, and its parameters."""
        word = (
            "EXISTS (SELECT 1 FROM session_search_text AS t "
            "WHERE t.session_id = sessions.id AND instr(t.text, ?) > 0)"
        )
        every_word = " AND ".join([word] * len(self.words))
        return (
            f"(substr(sessions.id, 1, ?) = ? OR ({every_word}))",
            (len(self.id_prefix), self.id_prefix, *self.words),
        )

    def hit(self, conn: sqlite3.Connection, session_id: str, title: str | None) -> SearchHit | None:
        """Where a matched session says the searched words, to show a person why it matched:
        the title or message holding the most of them (the title first, then the oldest
        message, among equals), as written; None when none holds one (the id matched) or
        the message cannot be decoded any more."""
        held = " + ".join(["(instr(t.text, ?) > 0)"] * len(self.words))
        row = conn.execute(
            f"SELECT t.source, m.role, m.content_json FROM session_search_text AS t "
            f"LEFT JOIN messages AS m ON m.id = t.source WHERE t.session_id = ? "
            f"AND ({held}) > 0 ORDER BY ({held}) DESC, t.source = ? DESC, t.source LIMIT 1",
            (session_id, *self.words, *self.words, TITLE_SOURCE),
        ).fetchone()
        if row is None:
            return None
        if row["source"] == TITLE_SOURCE:
            return None if title is None else SearchHit("title", title, None)
        text = None if row["content_json"] is None else stored_text(row["content_json"])
        return None if not text else SearchHit(row["role"], text, row["source"])


@dataclass(frozen=True)
class SearchHit:
    """The text of a matched session that holds the searched words: its title, or a prompt
    (`user`) or reply (`assistant`) as stored, with the message's id."""

    where: Literal["title", "user", "assistant"]
    text: str
    message_id: str | None
