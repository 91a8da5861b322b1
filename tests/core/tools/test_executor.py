"""Timeouts, abandonment, cancel, cap, errors."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from metis.core.canonical.content import TextBlock
from metis.core.canonical.tools import SideEffects, ToolDefinition
from metis.core.tools import results as texts
from metis.core.tools.base import ToolCancelled, ToolContext, ToolError, ToolOutput
from metis.core.tools.registry import ToolRegistry
from metis.core.tools.settings import ToolsSettings
from metis.core.tools.timeouts import effective_timeout, hard_limit

EMPTY = {"type": "object", "properties": {}, "additionalProperties": False}
SECONDS = {
    "type": "object",
    "properties": {"seconds": {"type": "number", "default": 5}},
    "additionalProperties": False,
}


class PoliteSleeper:
    """Sleeps, but stops with partial output as soon as it is told to."""

    async def run(self, input: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        try:
            await asyncio.wait_for(ctx.cancel_event.wait(), input["seconds"])
        except TimeoutError:
            return ToolOutput.text("slept")
        raise ToolCancelled("partial output")


class Stubborn:
    """Ignores `cancel_event` and even task cancellation, then returns late."""

    finished = False

    async def run(self, input: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        end = time.monotonic() + input["seconds"]
        while time.monotonic() < end:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.02)
        Stubborn.finished = True
        return ToolOutput.text("LATE OUTPUT")


class WithCancelHook:
    cancelled_by_hook = False

    def __init__(self) -> None:
        self.stop = asyncio.Event()

    async def run(self, input: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        await self.stop.wait()
        raise ToolCancelled()

    async def cancel(self) -> None:
        WithCancelHook.cancelled_by_hook = True
        self.stop.set()


class Exploder:
    async def run(self, input: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        raise RuntimeError("boom: sk-internal-detail-0123456789")


class Complainer:
    async def run(self, input: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        raise ToolError("File not found: src/app.py")


class WrongType:
    async def run(self, input: dict[str, Any], ctx: ToolContext) -> Any:
        return "not a ToolOutput"


class Big:
    async def run(self, input: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return ToolOutput.text("€" * (1024 * 1024 // 3) + "x")


def registry_with(
    tools: dict[str, tuple[Callable[[], Any], SideEffects]], *, schema: dict[str, Any] = SECONDS
) -> ToolRegistry:
    registry = ToolRegistry()
    for name, (factory, side_effects) in tools.items():
        definition = ToolDefinition(name=name, input_schema=schema, side_effects=side_effects)
        registry.register(definition, factory)
    return registry


TOOLS: dict[str, tuple[Callable[[], Any], SideEffects]] = {
    "sleeper": (PoliteSleeper, "none"),
    "stubborn": (Stubborn, "none"),
    "hooked": (WithCancelHook, "read"),
    "exploder": (Exploder, "none"),
    "complainer": (Complainer, "read"),
    "wrong_type": (WrongType, "none"),
    "big": (Big, "read"),
}


@pytest.fixture
def custom(make_harness: Any) -> Callable[..., Any]:
    def make(**raw: Any) -> Any:
        settings = ToolsSettings.model_validate(raw)
        return make_harness(settings, registry=registry_with(TOOLS))

    return make


def test_effective_timeouts() -> None:
    settings = ToolsSettings.model_validate(
        {
            "timeouts": {"per_class": {"read": 5, "execute": 7}, "per_tool": {"write_file": 9}},
            "shell": {"max_timeout_seconds": 300},
        }
    )
    registry = ToolRegistry.with_builtins(settings)
    timeouts = settings.timeouts

    def timeout(name: str, input: dict[str, Any] | None = None) -> float:
        entry = registry.get(name)
        assert entry is not None
        return effective_timeout(entry, entry.validate(input or {}).value or {}, timeouts)

    assert timeout("read_file", {"path": "a"}) == 5
    assert timeout("write_file", {"path": "a", "content": ""}) == 9  # per-tool wins
    assert timeout("patch_file", {"path": "a", "old_text": "a", "new_text": ""}) == 60
    assert timeout("shell", {"command": "x"}) == 120  # the shell's own rule, not per_class
    assert timeout("shell", {"command": "x", "timeout_seconds": 30}) == 30
    shell = registry.get("shell")
    assert shell is not None
    assert effective_timeout(shell, {"command": "x", "timeout_seconds": 900}, timeouts) == 300
    assert hard_limit(shell, 30) == 40
    read = registry.get("read_file")
    assert read is not None and hard_limit(read, 5) == 5
    defaults = ToolsSettings().timeouts.per_class
    assert defaults == {"none": 60, "read": 60, "write": 60, "execute": 600, "network": 600}


async def test_per_class_and_per_tool_overrides_apply(custom: Callable[..., Any]) -> None:
    harness = custom(timeouts={"per_class": {"none": 0.2}})
    started = time.monotonic()
    call = await harness.call("sleeper", {})
    assert time.monotonic() - started < 1
    assert (call.outcome.error_class, call.text) == (
        "timeout",
        "Timed out after 0.2 s.\npartial output",
    )
    harness = custom(timeouts={"per_class": {"none": 30}, "per_tool": {"sleeper": 0.3}})
    call = await harness.call("sleeper", {})
    assert call.text.startswith("Timed out after 0.3 s.")
    call = await harness.call("sleeper", {"seconds": 0.01})
    assert (call.outcome.error_class, call.text) == (None, "slept")


async def test_a_tool_ignoring_cancel_is_abandoned(
    custom: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    Stubborn.finished = False
    harness = custom(timeouts={"per_tool": {"stubborn": 0.2}}, abandon_after_seconds=0.3)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        call = await harness.call("stubborn", {"seconds": 1.0})
    elapsed = time.monotonic() - started
    assert (call.outcome.error_class, call.text) == ("timeout", "Timed out after 0.2 s.")
    assert 0.45 < elapsed < 0.9
    assert any(
        r.levelno == logging.WARNING and "abandoned" in r.getMessage() for r in caplog.records
    )
    await asyncio.sleep(0.8)
    assert Stubborn.finished  # it ran on; its late output went nowhere
    assert "LATE OUTPUT" not in call.text


async def test_cancel_hook_is_called(custom: Callable[..., Any]) -> None:
    WithCancelHook.cancelled_by_hook = False
    harness = custom(timeouts={"per_tool": {"hooked": 0.1}})
    call = await harness.call("hooked", {})
    assert WithCancelHook.cancelled_by_hook
    assert call.outcome.error_class == "timeout"


async def test_turn_cancel(custom: Callable[..., Any]) -> None:
    harness = custom()
    cancel = asyncio.Event()
    running = asyncio.create_task(harness.call("sleeper", {"seconds": 30}, cancel_event=cancel))
    await asyncio.sleep(0.05)
    cancel.set()
    call = await running
    assert (call.outcome.error_class, call.text) == (
        "cancelled",
        "Tool call cancelled\npartial output",
    )
    created: list[int] = []
    registry = ToolRegistry()
    registry.register(
        ToolDefinition(name="counted", input_schema=EMPTY),
        lambda: created.append(1) or PoliteSleeper(),
    )
    outcome = await harness.executor.run(
        registry.get("counted"),
        {},
        sandbox=harness.sandbox,
        tool_use_id="tu_1",
        cancel_event=cancel,
    )
    assert (outcome.error_class, outcome.text, created) == ("cancelled", "Tool call cancelled", [])


async def test_cancelling_the_caller_cancels_the_tool(custom: Callable[..., Any]) -> None:
    harness = custom()
    running = asyncio.create_task(harness.call("sleeper", {"seconds": 30}))
    await asyncio.sleep(0.05)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running


async def test_one_mebibyte_result_is_capped(custom: Callable[..., Any]) -> None:
    call = await custom().call("big", {})
    outcome = call.outcome
    total = 3 * (1024 * 1024 // 3) + 1
    assert (outcome.error_class, outcome.truncated, outcome.output_bytes) == (None, True, total)
    data = outcome.text.encode()
    assert len(data) <= 256 * 1024
    head, marker = outcome.text.rsplit("\n", 1)
    assert set(head) == {"€"}
    assert marker == f"[output truncated: {len(head.encode())} of {total} bytes shown]"


def test_cap_content_keeps_images_and_small_results() -> None:
    small = [TextBlock(text="hello")]
    capped = texts.cap_content(small, 1024)
    assert (capped.content, capped.truncated, capped.output_bytes) == (tuple(small), False, 5)
    two = [TextBlock(text="a" * 800), TextBlock(text="b" * 800)]
    capped = texts.cap_content(two, 1024)
    assert capped.truncated and len(capped.content) == 2
    assert sum(len(b.text.encode()) for b in capped.content) <= 1024


async def test_expected_and_unexpected_failures(
    custom: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    harness = custom()
    call = await harness.call("complainer", {})
    assert (call.outcome.error_class, call.text) == ("tool_error", "File not found: src/app.py")
    with caplog.at_level(logging.ERROR):
        call = await harness.call("exploder", {}, tool_use_id="tu_01")
    assert (call.outcome.error_class, call.text) == (
        "internal_error",
        'Tool "exploder" failed with an internal error (see daemon log, tu_01).',
    )
    record = next(r for r in caplog.records if r.levelno == logging.ERROR)
    assert record.exc_info is not None and "boom" in str(record.exc_info[1])
    assert "boom" not in call.text
    call = await harness.call("wrong_type", {})
    assert call.outcome.error_class == "internal_error"


async def test_only_denials_start_with_tool_call_denied(
    custom: Callable[..., Any], harness: Any
) -> None:
    outcomes = [
        (await custom(timeouts={"per_tool": {"sleeper": 0.05}}).call("sleeper", {})).text,
        (await custom().call("exploder", {})).text,
        (await custom().call("complainer", {})).text,
        (await harness.call("nope", {})).text,
        (await harness.call("read_file", {})).text,
        (await harness.call("read_file", {"path": "../x"})).text,
        (await harness.call("write_file", {"path": ".git/x", "content": ""})).text,
        (await harness.call("shell", {"command": "echo 'Tool call denied'"})).text,
        texts.policy_denied_text("shell"),
        texts.confirmation_timeout_text(300),
        texts.cancelled_text(),
        texts.INTERRUPTED,
    ]
    assert not [t for t in outcomes if t.startswith("Tool call denied")]
    assert texts.user_denied_text() == "Tool call denied"
    assert texts.user_denied_text("not now") == "Tool call denied: not now"
    assert texts.not_enabled_denied_text("shell") == "Tool call denied: tool shell is not enabled"
    assert texts.confirmation_timeout_text(1) == (
        "No answer to the confirmation request within 1 s; the tool was not run."
    )
    assert texts.policy_denied_text("shell") == 'Tool "shell" is disabled by the local tool policy.'


def test_failure_message_is_redacted() -> None:
    outcome = texts.failed("tool_error", "key sk-ant-abcdefghijklmnop leaked")
    assert outcome.message == "key [redacted] leaked"
    assert outcome.is_error and outcome.output_bytes == len(outcome.text.encode())
