"""In-memory state of the sessions this process is serving: history cache, tool ids, flags.

Reading a session's whole history from SQLite for every turn would make turn 100 slower than
turn 1; the cache is loaded once per process and appended to as messages are committed, so a
turn's context costs the same however long the session is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from metis.core.canonical.content import ToolUseBlock
from metis.core.canonical.messages import Message
from metis.core.providers.base import ToolIdMap
from metis.core.store.messages import MessageStore


@dataclass
class CachedSession:
    """One served session's history (loaded once, then appended to), its tool id map, the context of
    its last call, how its providers count tokens against the estimate and whether its resume
    was announced."""

    session_id: str
    history: list[Message]
    tool_ids: ToolIdMap = field(default_factory=ToolIdMap)
    last_context: list[Message] = field(default_factory=list)
    # per model: the most tokens its provider counted per estimated one (metis/core/turns/context.py)
    token_scales: dict[str, float] = field(default_factory=dict)
    resumed: bool = False
    _tool_use_seen: bool = False
    _scanned: int = 0  # how many history messages `has_tool_calls` has looked at

    def has_tool_calls(self) -> bool:
        """Whether an assistant message of the history used a tool (a routing fact).

        The history only grows, so each message is looked at once, not once per turn.
        """
        if not self._tool_use_seen:
            self._tool_use_seen = any(
                isinstance(b, ToolUseBlock)
                for m in self.history[self._scanned :]
                if m.role == "assistant"
                for b in m.content
            )
            self._scanned = len(self.history)
        return self._tool_use_seen


class SessionCache:
    """The history of every session this process serves, read from the store once and then
    appended to as messages commit (every commit path calls `committed`)."""

    def __init__(self, messages: MessageStore) -> None:
        self._messages = messages
        self._sessions: dict[str, CachedSession] = {}
        self._created_here: set[str] = set()

    def created_here(self, session_id: str) -> None:
        """A session this process just created: it never gets `session.resumed`, and its
        history starts empty here (nothing can have committed a message for an id no one
        knew), so its first turn reads nothing back from the store."""
        self._created_here.add(session_id)
        self._sessions.setdefault(session_id, CachedSession(session_id, []))

    def needs_resume_event(self, session_id: str) -> bool:
        """True once, at the first turn of a session this process did not create."""
        if session_id in self._created_here:
            return False
        self._created_here.add(session_id)
        return True

    def resume_not_announced(self, session_id: str) -> None:
        """The turn that was to announce the resume was refused: the next one announces it."""
        self._created_here.discard(session_id)

    async def get(self, session_id: str) -> CachedSession:
        """The cached session, its history read from the store on first use in this process."""
        cached = self._sessions.get(session_id)
        if cached is None:
            history = await self._messages.all_for_session(session_id)
            cached = self._sessions.setdefault(session_id, CachedSession(session_id, history))
        return cached

    def committed(self, session_id: str, *messages: Message) -> None:
        """Append messages just committed (callers commit in id order)."""
        cached = self._sessions.get(session_id)
        if cached is not None:
            cached.history.extend(messages)

    def token_scale(self, session_id: str, model: str) -> float:
        """How many tokens `model`'s provider counted per estimated one in this session so far
        (1.0 before any count: `metis.core.turns.context.count_observed`)."""
        cached = self._sessions.get(session_id)
        return cached.token_scales.get(model, 1.0) if cached is not None else 1.0

    def forget(self, session_id: str) -> None:
        """The session is over (ended or purged): its history is read from the store again."""
        self._sessions.pop(session_id, None)
        self._created_here.discard(session_id)

    def holds(self, session_id: str) -> bool:
        """Whether anything of the session is cached; the memory test checks that an ended session
        leaves nothing."""
        return session_id in self._sessions or session_id in self._created_here
