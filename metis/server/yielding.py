"""Yield the CPU once a response is written, so a local client gets it without waiting.

A response written to a loopback socket is not always in the client's hands when `send`
returns: on a busy machine the kernel can leave the rest of the delivery (the receiving side
of the loopback, which wakes the client) to the per-CPU softirq thread, which runs only when
the task on that CPU stops or is preempted. The daemon's event loop often goes straight from a
response to CPU-bound work: a 202 is followed by the turn it accepted starting its first model
call, ~1.5 ms of Python without a blocking call. Measured on the 2-core machine: the 202 reached
the client ~1.5 ms after it was written (`scripts/bench_all.py`, "POST turns → 202"), and 0.25 ms
once the loop yielded the CPU right after writing it.

`sched_yield` costs about a microsecond when nothing else waits for the CPU; when something
does, that is exactly what should run next (the delivery, the client reading it).
"""

from __future__ import annotations

import os

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

_yield_cpu = getattr(os, "sched_yield", None)  # POSIX; elsewhere responses go out as before


class YieldingRequestHandler(RequestHandler):
    """A connection handler that yields the CPU after each response it finishes."""

    __slots__ = ()

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        finished = await super().finish_response(request, resp, start_time)
        if _yield_cpu is not None:
            _yield_cpu()
        return finished
