"""The base of metis's pydantic models: each is built when first used, not when imported.

Building a model's validator and serializer is most of what defining it costs. metis has ~170
models, most of which a given request never touches, and building them all at import was ~40 ms
of a daemon's ~0.5 s start on a 2-core machine. So a model is built at its first use, and once
the daemon listens `build_deferred_models` builds the rest a few at a time, leaving the loop to
requests in between (`Core.start_background`): a first turn finds them built. (Built at a first
use instead, they added ~5 ms to a first turn; started by a client's first request, the build
ran beside that client's first turn and added ~20 ms to it.)
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter

log = logging.getLogger(__name__)

SLICE_S = 0.0005
"""How long the background build runs before it lets the event loop serve again..."""
GAP_S = 0.001
"""...and for how long: a request's steps (each resumed at once) run in the gap, so one that
comes during the build is delayed by a slice now and then, not a slice at each of its awaits."""


class DataModel(BaseModel):
    """A pydantic model whose schema is built at its first use (or by `build_deferred_models`).

    Subclasses declare their own `model_config` as usual; pydantic merges it with this one.
    """

    model_config = ConfigDict(defer_build=True)


_ADAPTERS: list[TypeAdapter[Any]] = []
_UNBUILDABLE: weakref.WeakSet[type[DataModel] | TypeAdapter[Any]] = weakref.WeakSet()
"""What a background build failed to build: not tried (nor logged) again by the next one."""


def deferred_adapter(type_: Any) -> TypeAdapter[Any]:
    """A `TypeAdapter` (of a union or a list: a model has its own validator) built at its first
    use, or by `build_deferred_models`."""
    adapter: TypeAdapter[Any] = TypeAdapter(type_, config=ConfigDict(defer_build=True))
    _ADAPTERS.append(adapter)
    return adapter


def deferred_models() -> Iterator[type[DataModel]]:
    """Every imported `DataModel` class not built yet, subclasses after their bases."""
    stack: list[type[DataModel]] = [DataModel]
    seen: set[type[DataModel]] = set()
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub in seen:
                continue
            seen.add(sub)
            stack.append(sub)
            if not sub.__pydantic_complete__:
                yield sub


def _build(cls: type[DataModel] | TypeAdapter[Any]) -> None:
    # pydantic resolves postponed annotations with the caller's locals as a fallback: this frame
    # holds nothing but what it builds
    if isinstance(cls, TypeAdapter):
        cls.rebuild()
    else:
        cls.model_rebuild()


async def build_deferred_models(slice_s: float = SLICE_S, gap_s: float = GAP_S) -> int:
    """Build every model and adapter not built yet, giving the event loop `gap_s` seconds after
    every `slice_s` seconds of building, so requests are served meanwhile; returns how many were
    built. A model that cannot be built is logged (once per process) and left to fail at its
    first use, where the error reaches a caller."""
    built = 0
    deadline = time.perf_counter() + slice_s
    pending: list[type[DataModel] | TypeAdapter[Any]] = [*deferred_models(), *_ADAPTERS]
    for cls in pending:
        if _is_built(cls) or cls in _UNBUILDABLE:  # built meanwhile (a request needed it)
            continue
        try:
            _build(cls)
        except Exception:
            _UNBUILDABLE.add(cls)
            log.exception("%r could not be built", cls)
        else:
            built += 1
        if time.perf_counter() >= deadline:
            await asyncio.sleep(gap_s)
            deadline = time.perf_counter() + slice_s
    return built


def _is_built(cls: type[DataModel] | TypeAdapter[Any]) -> bool:
    if isinstance(cls, TypeAdapter):
        return bool(cls.pydantic_complete)
    return cls.__pydantic_complete__
