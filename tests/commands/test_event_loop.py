"""A one-shot command's event loop takes Ctrl-C between its callbacks."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from metis.commands.event_loop import run_command


def test_ctrl_c_ends_the_command_with_keyboard_interrupt_after_its_cleanup() -> None:
    """The main task is cancelled by the loop, its `finally` runs, and the command ends with
    KeyboardInterrupt (exit 130 and one line in `metis.cli.main`), not CancelledError."""
    cleaned: list[str] = []

    async def waits_for_the_daemon() -> None:
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGINT)
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append("closed")

    with pytest.raises(KeyboardInterrupt):
        run_command(waits_for_the_daemon())
    assert cleaned == ["closed"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back


def test_a_cancel_that_is_no_ctrl_c_stays_a_cancel() -> None:
    async def cancelled() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(1)

    with pytest.raises(asyncio.CancelledError):
        run_command(cancelled())


def test_a_command_that_finishes_returns_its_result() -> None:
    async def answers() -> int:
        return 7

    assert run_command(answers()) == 7
