"""Typed domain errors raised by core.

Core never knows which surface called it; each surface maps these classes to its own wire
errors in exactly one table (`metis/server/errors.py`, `metis/aap/errors.py`). `details` holds
the machine-readable facts a surface may render; it never contains secrets.
"""

from __future__ import annotations

import sqlite3
from typing import Any


class DomainError(Exception):
    """Base of every expected failure of a core operation."""

    def __init__(self, message: str = "", **details: Any) -> None:
        super().__init__(message or self.__class__.__name__)
        self.message = message or self.__class__.__name__
        self.details: dict[str, Any] = details


class ConfigError(DomainError):
    """A configuration file is invalid; `message` names file, line and key."""


class InvalidContent(DomainError):
    """Message content that fails validation; `errors` lists every problem found (index and msg),
    not just the first (400 `invalid_content` on every surface)."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        text = "; ".join(e["msg"] for e in errors[:5])
        super().__init__(f"invalid content: {text}", errors=errors)
        self.errors = errors


class SessionNotFound(DomainError):
    """A session id that no row holds (404 on REST; AAP answers the same for a session of another
    surface)."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id} not found", session_id=session_id)


class SessionAlreadyEnded(DomainError):
    """A write to a session that has been ended; `ended_at` tells since when (409)."""

    def __init__(self, session_id: str, ended_at: str | None = None) -> None:
        details = {"ended_at": ended_at} if ended_at else {}
        super().__init__(f"session {session_id} has ended", **details)


# What each workspace refusal's `reason` means, in the message a person reads (the reason
# itself stays in the details for programs).
_WORKSPACE_REASONS = {
    "not_found": "no such directory",
    "not_absolute": "a relative path (give an absolute one, or one starting with ~)",
    "not_a_directory": "not a directory",
    "not_accessible": "the daemon may not read it (permission denied)",
    "home_directory_unknown": "no user of this machine has that home directory",
}


def _workspace_reason(reason: str) -> str:
    return _WORKSPACE_REASONS.get(reason, reason)


class WorkspaceNotFound(DomainError):
    """A workspace path that is not an accessible directory; `reason` says which check failed
    (not_found, not_absolute, not_a_directory, not_accessible). `why` words a reason whose code
    covers more than one cause (a directory outside the allowed roots is `not_accessible` too,
    but not for want of permission)."""

    def __init__(self, path: str, reason: str, why: str | None = None) -> None:
        super().__init__(
            f"workspace {path!r} is not usable: {why or _workspace_reason(reason)}", reason=reason
        )


class WorkspaceInvalid(DomainError):
    """A value that names no directory at all: `~user` for a user this machine does not know
    (or a `~` whose home directory cannot be determined)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(
            f"workspace {path!r} is not a valid path: {_workspace_reason(reason)}", reason=reason
        )


class WorkspaceRefused(DomainError):
    """An existing directory no session may use unless it is listed explicitly as an allowed
    root: `/`, the user's home, a system directory (`protected_workspaces`), one that `holds`
    METIS_HOME. One inside METIS_HOME (`metis_home`) is refused whatever the roots."""

    def __init__(
        self, path: str, resolved: str, *, holds: str | None = None, metis_home: str | None = None
    ) -> None:
        if metis_home is not None:
            message = (
                f"workspace {path!r} lies inside METIS_HOME ({metis_home}), where the daemon "
                "keeps its key and database; no session may use it"
            )
            reason = "metis_home"
        elif holds is not None:
            message = (
                f"workspace {path!r} holds METIS_HOME ({holds}), where the daemon keeps its key "
                "and database; list it explicitly among the allowed workspace roots to use it "
                "(its tools still never reach METIS_HOME)"
            )
            reason = "metis_home"
        else:
            message = (
                f"workspace {path!r} is a system or home directory; list it explicitly among "
                "the allowed workspace roots to use it"
            )
            reason = "protected_directory"
        super().__init__(message, reason=reason, path=resolved)


class ModelNotConfigured(DomainError):
    """An explicit model reference that cannot be used (unknown, no key, offline forced)."""


class McpServerNotFound(DomainError):
    """A name that no server of `mcp.servers` has (404)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no MCP server named {name!r} is configured (mcp.servers)", name=name)


class McpServerDisabled(DomainError):
    """An action on a server configured `enabled: false`, which never runs (409)."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"MCP server {name!r} is disabled (enabled: false in config.yaml)", name=name
        )


class McpConfigInvalid(DomainError):
    """config.yaml, read again to restart an MCP server, has become invalid (409): nothing is
    changed until it is fixed. `problem` names file, line and key, never a value."""

    def __init__(self, problem: str) -> None:
        super().__init__(f"config.yaml cannot be applied: {problem}", problem=problem)


class SurfaceMismatch(DomainError):
    """A turn submitted to a session created by another surface; `surface` names the owner (409 on
    REST, 404 on AAP so AAP never reveals foreign sessions)."""

    def __init__(self, message: str, surface: str) -> None:
        super().__init__(message, surface=surface)


class TurnInFlight(DomainError):
    """A turn submitted while the session's slot is held by another turn (one turn at a time per
    session)."""

    def __init__(self, session_id: str, current_turn_id: str) -> None:
        super().__init__(
            f"session {session_id} already has turn {current_turn_id} in flight",
            current_turn_id=current_turn_id,
        )


class TurnNotFound(DomainError):
    """A turn id unknown or belonging to another session: the one ownership check for cancels and
    confirmation answers."""

    def __init__(self, turn_id: str) -> None:
        super().__init__(f"turn {turn_id} not found", turn_id=turn_id)


class TurnAlreadyCompleted(DomainError):
    """A cancel for a turn that no longer holds the slot or is already ending; `status` is its
    outcome or `completing`."""

    def __init__(self, turn_id: str, status: str) -> None:
        super().__init__(f"turn {turn_id} is already {status}", status=status)


class RoutingFailed(DomainError):
    """No model can serve the turn; details list the candidates tried and why."""


class StoreBusy(DomainError, sqlite3.OperationalError):
    """A write found the session store's write lock held by another process (a `sqlite3`
    shell's open transaction, `metis trace prune`) for the whole write wait, and was not made:
    the same request succeeds once the lock is released, so each surface answers 503 with a
    `Retry-After` of `retry_after_s` rather than an internal error. It stays the
    `sqlite3.OperationalError` it replaces (SQLITE_BUSY), so the store's own callers that
    retry or log a failed write (the trace writer, checkpoints) treat it as before."""

    def __init__(self, waited_s: float, retry_after_s: int = 1) -> None:
        super().__init__(
            "the session store is locked by another process; try again",
            waited_s=waited_s,
            retry_after_s=retry_after_s,
        )
        self.retry_after_s = retry_after_s
        self.sqlite_errorcode = sqlite3.SQLITE_BUSY
        self.sqlite_errorname = "SQLITE_BUSY"


class ConfirmationNotFound(DomainError):
    """A confirmation request id that no pending or stored request holds (404)."""

    def __init__(self, request_id: str) -> None:
        super().__init__(f"confirmation {request_id} not found", request_id=request_id)


class ConfirmationAlreadyResolved(DomainError):
    """A second answer to a confirmation; `resolution`, `scope` (`once` or `session` as the first
    answer gave it, None for a timeout or a withdrawal) and `resolved_at` report the first one
    (409), so a client can show how it was settled, and see why a repeat of its decision with
    another scope is refused."""

    def __init__(self, resolution: str, resolved_at: str | None, scope: str | None) -> None:
        super().__init__(
            f"confirmation already resolved ({resolution})",
            resolution=resolution,
            scope=scope if resolution in ("allow", "deny") else None,
            resolved_at=resolved_at,
        )


class ConfirmationPolicyMismatch(DomainError):
    """A suspend-policy request answered through the wait-policy path."""


class CursorNotFound(DomainError):
    """An event cursor that names no event of the session; surfaces turn it into a validation error
    or an expired-cursor answer."""

    def __init__(self, cursor: str) -> None:
        super().__init__(f"cursor {cursor} names no event of this session", cursor=cursor)


class UnknownEventType(DomainError):
    """An emit of a type the catalog does not know; raised only by a strict bus (tests), otherwise
    the event is dropped and logged."""


class EventValidationError(DomainError):
    """An emitted payload that does not validate against its catalog model; raised only by a strict
    bus (tests), otherwise dropped and logged."""


# ---- suspend/resume (raised by metis/core/turns/resume.py) ----------------------------------------


class PendingToolCalls(DomainError):
    """A user message arrived while tool calls of a suspended turn still wait for answers."""

    def __init__(self, pending_ids: list[str]) -> None:
        super().__init__(
            "tool calls are pending; answer them before sending a new message: "
            + ", ".join(pending_ids),
            missing=list(pending_ids),
            unknown=[],
            duplicate=[],
            wrong_kind=[],
        )
        self.pending_ids = list(pending_ids)


class InvalidResolution(DomainError):
    """The answers of a resolution do not match the pending calls exactly once each.

    Raised before anything is written; the lists name the offending tool use ids.
    """

    def __init__(
        self,
        *,
        missing: list[str],
        unknown: list[str],
        duplicate: list[str],
        wrong_kind: list[str],
    ) -> None:
        parts = [
            f"{label}: {', '.join(ids)}"
            for label, ids in (
                ("missing answers", missing),
                ("unknown or not pending", unknown),
                ("answered more than once", duplicate),
                ("wrong kind of answer", wrong_kind),
            )
            if ids
        ]
        super().__init__(
            "tool answers do not match the pending calls (" + "; ".join(parts) + ")",
            missing=missing,
            unknown=unknown,
            duplicate=duplicate,
            wrong_kind=wrong_kind,
        )
        self.missing, self.unknown = missing, unknown
        self.duplicate, self.wrong_kind = duplicate, wrong_kind
