"""What every tool shares: the context of one run, what a run returns, and how it may fail.

The dispatcher owns events and storage; a tool only sees a `ToolContext` and answers with a
`ToolOutput` or one of the exceptions below. The exception class decides the `error_class`, so
a tool never has to know how failures are reported.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from metis.core.canonical.content import ImageBlock, TextBlock
from metis.core.errors import DomainError

if TYPE_CHECKING:
    from metis.core.tools.bwrap import ShellSandbox
    from metis.core.tools.groups import ProcessGroupLedger
    from metis.core.tools.sandbox import Sandbox

KIB = 1024
MIB = 1024 * KIB

DEFAULT_MAX_RESULT_BYTES = 256 * KIB
NOTE_ROOM_BYTES = 256
"""Room a tool keeps under the result cap for its own lines around the output (the shell's
`exit_code:` and omission marker, read_file's notes), so the cap never cuts them away."""
ResultBlock = TextBlock | ImageBlock


def shell_keep_bytes(max_result_bytes: int) -> int:
    """How much head, and how much tail, of its output the shell keeps (128 KiB each).

    Less the room of the `exit_code:` line and the omission marker, so the shell's whole
    result fits the result cap and its tail is not cut away by it.
    """
    return max(1, min(128 * KIB, (max_result_bytes - NOTE_ROOM_BYTES) // 2))


# ---------------------------------------------------------------------------------------------
# Limits and context
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolLimits:
    """Numbers a tool needs while running; built from `ToolsSettings` by `limits_from_settings`.

    The shell's kill grace and pipe wait are fixed by the contract (5 s, 2 s) and not config
    keys; they live here so tests can lower them without sleeping.
    """

    max_write_bytes: int = 5 * MIB
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    env_passthrough: tuple[str, ...] = ()
    forbidden_env: frozenset[str] = frozenset({"METIS_API_KEY"})
    shell_head_bytes: int = shell_keep_bytes(DEFAULT_MAX_RESULT_BYTES)
    shell_tail_bytes: int = shell_keep_bytes(DEFAULT_MAX_RESULT_BYTES)
    shell_kill_grace_seconds: float = 5.0
    shell_pipe_wait_seconds: float = 2.0


@dataclass
class ToolContext:
    """Everything one run may use. `deadline` is on the `time.monotonic()` clock."""

    tool_use_id: str
    workspace: Sandbox
    cancel_event: asyncio.Event
    deadline: float
    limits: ToolLimits = field(default_factory=ToolLimits)
    session_id: str | None = None
    turn_id: str | None = None
    groups: ProcessGroupLedger | None = None  # notes running shell groups (crash guard)
    shell_sandbox: ShellSandbox | None = None  # None: the shell runs unsandboxed
    log: logging.Logger | logging.LoggerAdapter[logging.Logger] = field(
        default_factory=lambda: logging.getLogger("metis.core.tools")
    )

    def remaining(self) -> float:
        """Seconds left before the deadline (never negative)."""
        return max(0.0, self.deadline - time.monotonic())

    def raise_if_cancelled(self) -> None:
        """File tools call this before writing and between files."""
        if self.cancel_event.is_set():
            raise ToolCancelled()


@dataclass
class ToolOutput:
    """A tool's answer. `is_error` marks a run that reports failure (a non-zero shell exit)."""

    content: list[ResultBlock]
    is_error: bool = False
    files_modified: list[str] | None = None
    exit_code: int | None = None
    truncated: bool = False

    @classmethod
    def text(cls, text: str, **kwargs: Any) -> ToolOutput:
        return cls(content=[TextBlock(text=text)], **kwargs)


class Tool(Protocol):
    """A builtin. A fresh instance serves each dispatch, so instance state is per call.

    A tool MAY also define `cancel()` (sync or async); the executor calls it after setting
    `ctx.cancel_event` on a timeout or a turn cancel.
    """

    async def run(self, input: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        """Run one call; answer with a `ToolOutput` or raise one of the exceptions of this module,
        whose class becomes the error class."""


# ---------------------------------------------------------------------------------------------
# Failures a tool may raise
# ---------------------------------------------------------------------------------------------


class ToolError(Exception):
    """An expected failure; `message` reaches the model verbatim (`tool_error`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class PermissionDenied(Exception):
    """Base of the sandbox refusals (`permission_denied`)."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.message = message
        self.path = path


class PathOutsideWorkspace(PermissionDenied):
    """A path that resolves (symlinks followed) outside the session's workspace."""

    def __init__(self, path: str) -> None:
        super().__init__(f'Path "{path}" is outside the workspace.', path)


class ProtectedPath(PermissionDenied):
    """A write under a protected directory of the workspace (`tools.sandbox.protected_dirs`, `.git`
    by default); reading there is allowed."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f'Path "{path}" is inside a protected directory and cannot be modified.', path
        )


class WorkspaceRootPath(ProtectedPath):
    """A write to the workspace root itself (`.`, `sub/..`): a directory, never a file a tool
    may replace. Said as such: it is no protected directory like `.git`."""

    def __init__(self, path: str) -> None:
        PermissionDenied.__init__(
            self, f'Path "{path}" is the workspace root, a directory; name a file inside it.', path
        )


class MetisHomePath(PermissionDenied):
    """A path inside METIS_HOME (the daemon's key and database), which no tool reaches, even
    from a workspace that holds it (one created before such workspaces were refused)."""

    def __init__(self, path: str) -> None:
        super().__init__(f'Path "{path}" is inside METIS_HOME, which tools may not access.', path)


class ToolInterrupted(Exception):
    """A run stopped early; `partial_output` (shell) is appended to the result text."""

    def __init__(self, partial_output: str | None = None) -> None:
        super().__init__(partial_output or "")
        self.partial_output = partial_output


class ToolCancelled(ToolInterrupted):
    """The run noticed `cancel_event` and stopped (`cancelled`)."""


class ToolTimedOut(ToolInterrupted):
    """The tool enforced its own timeout, as the shell does (`timeout`)."""


class ToolRegistrationError(ValueError):
    """A tool definition that may not be registered (bad name, duplicate, schema outside the supported subset)."""


class ToolNameConflict(DomainError):
    """An application tool declared under the name of an enabled builtin."""

    def __init__(self, name: str) -> None:
        super().__init__(f'application tool "{name}" conflicts with a builtin tool', name=name)
        self.name = name
