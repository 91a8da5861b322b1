"""The event loop of a one-shot command, and what Ctrl-C does to it.

`asyncio.run` takes Ctrl-C by cancelling the command's main task from inside Python's signal
handler, which runs between any two bytecodes, also inside one of the loop's own callbacks.
One landing in the callback that completes a socket connection (a command connecting to the
daemon) cancelled the future that callback was about to complete, and the loop printed the
callback's `InvalidStateError` with a traceback before `metis: interrupted` (Python 3.11).
Here the loop takes the signal itself, between two callbacks; the command ends as before, with
`KeyboardInterrupt` (exit 130 and one line, `metis.cli.main`). A second Ctrl-C while the first
is being handled interrupts at once.

`metis chat` and `metis run` handle Ctrl-C themselves and do not use this.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_command(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`, Ctrl-C taken by the loop (the module's docstring says why)."""
    return asyncio.run(_interruptible(main))


async def _interruptible(main: Coroutine[Any, Any, T]) -> T:
    task = asyncio.current_task()
    hears = (
        task is not None
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN  # a background job's stays so
    )
    if not hears:
        return await main
    assert task is not None
    loop = asyncio.get_running_loop()
    interrupted = False

    def interrupt() -> None:
        nonlocal interrupted
        if interrupted:
            raise KeyboardInterrupt  # out of the loop at once: the first one is stuck
        interrupted = True
        task.cancel()

    loop.add_signal_handler(signal.SIGINT, interrupt)
    try:
        return await main
    except asyncio.CancelledError:
        if interrupted:
            raise KeyboardInterrupt from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGINT)
