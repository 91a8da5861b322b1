"""start_eagerly: a coroutine's first step runs on the caller's stack; the rest, if any, in a task."""

from __future__ import annotations

import asyncio

import pytest

from metis.core.eager import start_eagerly


async def test_a_coroutine_that_never_waits_is_done_before_the_loop_turns() -> None:
    ran: list[str] = []
    asyncio.get_running_loop().call_soon(ran.append, "next iteration")

    async def quick() -> int:
        ran.append("coroutine")
        return 7

    outcome = start_eagerly(quick())
    assert outcome.done() and not isinstance(outcome, asyncio.Task)
    assert await outcome == 7
    assert ran == ["coroutine"]  # no trip round the loop: the callback has not run yet


async def test_an_error_raised_before_any_wait_is_the_futures_outcome() -> None:
    async def failing() -> None:
        raise ValueError("refused")

    outcome = start_eagerly(failing())
    assert outcome.done()
    with pytest.raises(ValueError, match="refused"):
        await outcome


async def test_a_coroutine_that_waits_goes_on_in_a_task_with_what_it_waited_for() -> None:
    gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    steps: list[str] = []

    async def slow() -> str:
        steps.append("before")
        value = await gate
        steps.append("after")
        await asyncio.sleep(0)  # a bare yield, as `sleep(0)` makes, is passed on too
        return value.upper()

    outcome = start_eagerly(slow())
    assert steps == ["before"] and isinstance(outcome, asyncio.Task)
    gate.set_result("done")
    assert await outcome == "DONE"
    assert steps == ["before", "after"]


async def test_an_error_after_a_wait_reaches_the_awaiting_caller() -> None:
    async def late_failure() -> None:
        await asyncio.sleep(0)
        raise KeyError("late")

    with pytest.raises(KeyError, match="late"):
        await start_eagerly(late_failure())


async def test_shielded_the_rest_goes_on_when_the_caller_is_cancelled() -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    finished: list[str] = []

    async def work() -> None:
        await gate
        finished.append("committed")

    rest = start_eagerly(work())

    async def caller() -> None:
        await asyncio.shield(rest)

    waiting = asyncio.ensure_future(caller())
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    gate.set_result(None)
    await rest
    assert finished == ["committed"]


async def test_cancelling_the_task_cancels_the_coroutine_where_it_waits() -> None:
    cleaned: list[str] = []

    async def waits_forever() -> None:
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            cleaned.append("cleaned up")

    rest = start_eagerly(waits_forever())
    await asyncio.sleep(0)
    rest.cancel()
    with pytest.raises(asyncio.CancelledError):
        await rest
    assert cleaned == ["cleaned up"]
