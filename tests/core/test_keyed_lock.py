"""KeyedLock: holders of one key run one after another, other keys do not wait, nothing stays."""

from __future__ import annotations

import asyncio

from metis.core.keyed_lock import KeyedLock


async def test_holders_of_one_key_run_one_after_another_in_the_order_they_asked() -> None:
    locks = KeyedLock()
    trace: list[str] = []

    async def holder(name: str) -> None:
        async with locks.hold("sess_a"):
            trace.append(f"{name} in")
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            trace.append(f"{name} out")

    await asyncio.gather(holder("first"), holder("second"), holder("third"))
    assert trace == ["first in", "first out", "second in", "second out", "third in", "third out"]


async def test_another_key_does_not_wait_for_a_held_one() -> None:
    locks = KeyedLock()
    release = asyncio.Event()

    async def slow() -> None:
        async with locks.hold("sess_slow"):
            await release.wait()

    task = asyncio.create_task(slow())
    await asyncio.sleep(0)
    async with asyncio.timeout(1):
        async with locks.hold("sess_other"):
            pass
    release.set()
    await task


async def test_no_lock_is_kept_once_nobody_holds_or_waits_even_after_a_failure() -> None:
    locks = KeyedLock()

    async def failing() -> None:
        async with locks.hold("sess_a"):
            await asyncio.sleep(0)
            raise RuntimeError("boom")

    async def waiting() -> None:
        async with locks.hold("sess_a"):
            assert len(locks) == 1

    results = await asyncio.gather(failing(), waiting(), return_exceptions=True)
    assert isinstance(results[0], RuntimeError) and results[1] is None
    assert len(locks) == 0
