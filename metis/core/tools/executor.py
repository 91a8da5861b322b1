"""Run one tool call: effective timeout, cancellation, abandonment, error classes, cap.

This is the execute and result steps of the dispatch pipeline without events or storage: the dispatcher emits
`tool.called` with `timeout_for()`, awaits `run()`, and turns the `ToolOutcome` into the
stored result and the terminal event. `run()` never raises for a tool's failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Mapping
from typing import Any

from metis.core.canonical.content import ImageBlock, TextBlock
from metis.core.tools.base import (
    Tool,
    ToolCancelled,
    ToolContext,
    ToolInterrupted,
    ToolLimits,
    ToolOutput,
    ToolTimedOut,
)
from metis.core.tools.builtins.shell import ShellTool
from metis.core.tools.bwrap import ShellSandbox
from metis.core.tools.groups import ProcessGroupLedger
from metis.core.tools.registry import RegisteredTool
from metis.core.tools.results import (
    ToolOutcome,
    cancelled_text,
    completed,
    expected_failure,
    failed,
    internal_error_text,
    timeout_text,
)
from metis.core.tools.sandbox import Sandbox
from metis.core.tools.settings import ToolsSettings, limits_from_settings
from metis.core.tools.timeouts import effective_timeout, hard_limit

log = logging.getLogger(__name__)


class ToolExecutor:
    """Runs one tool call with its timeout, cancellation and result cap; holds the shell sandbox and
    the process group ledger the shell needs."""

    def __init__(
        self,
        settings: ToolsSettings,
        limits: ToolLimits | None = None,
        *,
        groups: ProcessGroupLedger | None = None,
        shell_sandbox: ShellSandbox | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.settings = settings
        self.limits = limits if limits is not None else limits_from_settings(settings)
        self.groups = groups
        self.shell_sandbox = shell_sandbox
        self.log = logger or log
        self._abandoned: set[asyncio.Future[Any]] = set()

    def unsandboxed(self, entry: RegisteredTool) -> bool:
        """Whether this call is the builtin shell running without a sandbox (always asked)."""
        return self.shell_sandbox is None and entry.factory is ShellTool

    def timeout_for(self, entry: RegisteredTool, input: Mapping[str, Any]) -> float:
        """The effective timeout, also the value of `tool.called.timeout_seconds`."""
        return effective_timeout(entry, input, self.settings.timeouts)

    async def run(
        self,
        entry: RegisteredTool,
        input: dict[str, Any],
        *,
        sandbox: Sandbox,
        tool_use_id: str,
        cancel_event: asyncio.Event | None = None,
        session_id: str | None = None,
        turn_id: str | None = None,
        timeout_seconds: float | None = None,
    ) -> ToolOutcome:
        """Execute a validated, pre-checked, confirmed call and classify how it ended.

        `cancel_event` is the caller's (turn) cancel signal; the tool gets its own event, set
        on that signal or on timeout, so a timeout never cancels sibling calls.
        """
        timeout = self.timeout_for(entry, input) if timeout_seconds is None else timeout_seconds
        started = time.monotonic()

        def elapsed_ms() -> int:
            return int((time.monotonic() - started) * 1000)

        if cancel_event is not None and cancel_event.is_set():
            return failed("cancelled", cancelled_text(), max_bytes=self._cap)
        call_cancel = asyncio.Event()
        ctx = ToolContext(
            tool_use_id=tool_use_id,
            workspace=sandbox,
            cancel_event=call_cancel,
            deadline=started + timeout,
            limits=self.limits,
            session_id=session_id,
            turn_id=turn_id,
            groups=self.groups,
            shell_sandbox=self.shell_sandbox,
            log=logging.LoggerAdapter(
                self.log, {"session_id": session_id, "tool_use_id": tool_use_id}
            ),
        )
        try:
            tool = entry.factory()
            task = asyncio.ensure_future(tool.run(input, ctx))
        except Exception as exc:
            return self._internal(entry, tool_use_id, exc, elapsed_ms())
        watcher = asyncio.ensure_future(cancel_event.wait()) if cancel_event else None
        try:
            await asyncio.wait(
                {task} if watcher is None else {task, watcher},
                timeout=hard_limit(entry, timeout),
                return_when=asyncio.FIRST_COMPLETED,
            )
        except asyncio.CancelledError:
            call_cancel.set()
            task.cancel()
            raise
        finally:
            if watcher is not None:
                watcher.cancel()
        if task.done():
            return self._finished(entry, tool_use_id, task, timeout, elapsed_ms())
        turn_cancelled = cancel_event is not None and cancel_event.is_set()
        partial = await self._stop(entry, tool_use_id, tool, task, call_cancel)
        if turn_cancelled:
            return failed(
                "cancelled", cancelled_text(partial), duration_ms=elapsed_ms(), max_bytes=self._cap
            )
        text = timeout_text(timeout, partial)
        return failed("timeout", text, duration_ms=elapsed_ms(), max_bytes=self._cap)

    @property
    def _cap(self) -> int:
        return self.settings.max_result_bytes

    async def _stop(
        self,
        entry: RegisteredTool,
        tool_use_id: str,
        tool: Tool,
        task: asyncio.Future[ToolOutput],
        call_cancel: asyncio.Event,
    ) -> str | None:
        """Ask the tool to stop, wait up to `abandon_after_seconds`; its partial output, if any.

        A tool still running then is abandoned: logged at WARNING, nudged with
        `Task.cancel()`, and whatever it returns later is discarded.
        """
        call_cancel.set()
        budget = self.settings.abandon_after_seconds
        deadline = time.monotonic() + budget
        cancel = getattr(tool, "cancel", None)
        if callable(cancel):
            try:
                result = cancel()
                if inspect.isawaitable(result):
                    await asyncio.wait_for(result, timeout=budget)
            except Exception:
                self.log.warning(
                    "tool %s (%s): cancel() failed", entry.name, tool_use_id, exc_info=True
                )
        await asyncio.wait({task}, timeout=max(0.0, deadline - time.monotonic()))
        if not task.done():
            self.log.warning(
                "tool %s (%s) still running %s s after it was told to stop; abandoned",
                entry.name,
                tool_use_id,
                budget,
            )
            self._abandoned.add(task)
            task.add_done_callback(self._discard)
            task.cancel()
            return None
        if task.cancelled():
            return None
        exc = task.exception()
        return exc.partial_output if isinstance(exc, ToolInterrupted) else None

    def _discard(self, task: asyncio.Future[Any]) -> None:
        """Late output of an abandoned tool is dropped; its exception is retrieved."""
        self._abandoned.discard(task)
        if not task.cancelled():
            with contextlib.suppress(BaseException):
                task.exception()

    def _finished(
        self,
        entry: RegisteredTool,
        tool_use_id: str,
        task: asyncio.Future[ToolOutput],
        timeout: float,
        duration_ms: int,
    ) -> ToolOutcome:
        if task.cancelled():
            return failed(
                "cancelled", cancelled_text(), duration_ms=duration_ms, max_bytes=self._cap
            )
        exc = task.exception()
        if exc is None:
            output = task.result()
            if not _valid_output(output):
                error = TypeError(f"{entry.name} returned {type(output).__name__}, not ToolOutput")
                return self._internal(entry, tool_use_id, error, duration_ms)
            return completed(output, duration_ms=duration_ms, max_bytes=self._cap)
        if isinstance(exc, ToolTimedOut):
            text = timeout_text(timeout, exc.partial_output)
            return failed("timeout", text, duration_ms=duration_ms, max_bytes=self._cap)
        if isinstance(exc, ToolCancelled):
            text = cancelled_text(exc.partial_output)
            return failed("cancelled", text, duration_ms=duration_ms, max_bytes=self._cap)
        expected = expected_failure(exc, duration_ms=duration_ms, max_bytes=self._cap)
        if expected is not None:
            return expected
        return self._internal(entry, tool_use_id, exc, duration_ms)

    def _internal(
        self, entry: RegisteredTool, tool_use_id: str, exc: BaseException, duration_ms: int
    ) -> ToolOutcome:
        """The traceback goes to the log at ERROR; the model only gets the generic text."""
        self.log.error("tool %s (%s) failed", entry.name, tool_use_id, exc_info=exc)
        text = internal_error_text(entry.name, tool_use_id)
        return failed("internal_error", text, duration_ms=duration_ms, max_bytes=self._cap)


def _valid_output(output: Any) -> bool:
    return isinstance(output, ToolOutput) and all(
        isinstance(b, TextBlock | ImageBlock) for b in output.content
    )
