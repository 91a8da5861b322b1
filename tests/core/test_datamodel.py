"""metis's pydantic models are built at first use, and in the background once the daemon listens."""

from __future__ import annotations
import __future__

import asyncio
import importlib
import logging
import pkgutil
import sys

import pytest
from pydantic import TypeAdapter

from metis.core.datamodel import (
    DataModel,
    build_deferred_models,
    deferred_adapter,
    deferred_models,
)


def _metis_models_pending() -> list[str]:
    return [c.__qualname__ for c in deferred_models() if c.__module__.startswith("metis.")]


def test_a_model_is_not_built_until_its_first_use() -> None:
    class Point(DataModel):
        x: int

    assert not Point.__pydantic_complete__
    assert Point(x=1).x == 1
    assert Point.__pydantic_complete__


def test_a_subclass_keeps_the_deferral_with_its_own_config() -> None:
    from pydantic import ConfigDict

    class Strict(DataModel):
        model_config = ConfigDict(extra="forbid")
        x: int

    assert not Strict.__pydantic_complete__
    with pytest.raises(ValueError, match="Extra inputs"):
        Strict.model_validate({"x": 1, "y": 2})


async def test_the_background_build_leaves_no_model_of_the_daemon_unbuilt() -> None:
    importlib.import_module("metis.server.runner")  # every surface and the core
    importlib.import_module("metis.cli")

    await build_deferred_models()

    assert _metis_models_pending() == []
    content = importlib.import_module("metis.core.canonical.content")
    assert content.CONTENT_LIST_ADAPTER.pydantic_complete


def test_modules_that_define_models_keep_their_annotations_evaluated() -> None:
    """Postponed (string) annotations cost a model's class creation a compile per field: ~11 ms
    of the daemon's start-up over its ~170 models. A module that defines models does without
    `from __future__ import annotations` (a forward reference is quoted)."""
    import metis

    for info in pkgutil.walk_packages(metis.__path__, "metis."):
        if not info.name.startswith("metis.testing") and not info.name.endswith("__main__"):
            importlib.import_module(info.name)

    def subclasses(cls: type[DataModel]) -> set[type[DataModel]]:
        return {s for sub in cls.__subclasses__() for s in (sub, *subclasses(sub))}

    postponing = {
        model.__module__
        for model in subclasses(DataModel)
        if model.__module__.startswith("metis.")
        and getattr(sys.modules[model.__module__], "annotations", None) is __future__.annotations
    }
    assert postponing == set()


async def test_the_background_build_lets_the_loop_serve_between_slices() -> None:
    models = [type(f"Slice{i}", (DataModel,), {"__annotations__": {"x": "int"}}) for i in range(4)]
    ticks: list[int] = []

    async def other_work() -> None:
        for _ in range(100):
            ticks.append(sum(m.__pydantic_complete__ for m in models))
            await asyncio.sleep(0)

    worker = asyncio.create_task(other_work())
    await build_deferred_models(slice_s=0.0)  # yield after every model
    await worker

    assert all(m.__pydantic_complete__ for m in models)
    # the other task ran while only some of the models were built
    assert any(0 < t < len(models) for t in ticks)


async def test_a_model_that_cannot_be_built_is_logged_once_and_the_others_are_still_built(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(DataModel):
        x: NotDefinedAnywhere  # type: ignore[name-defined]  # noqa: F821

    class Fine(DataModel):
        y: int

    adapter = deferred_adapter(list[int])

    with caplog.at_level(logging.ERROR, logger="metis.core.datamodel"):
        await build_deferred_models()

    assert Fine.__pydantic_complete__
    assert adapter.pydantic_complete
    assert not Broken.__pydantic_complete__
    assert "Broken" in caplog.text

    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="metis.core.datamodel"):
        await build_deferred_models()
    assert caplog.text == ""  # logged once: a later build in this process skips it


def test_a_deferred_adapter_validates_at_its_first_use() -> None:
    adapter: TypeAdapter[list[int]] = deferred_adapter(list[int])

    assert not adapter.pydantic_complete
    assert adapter.validate_python(["1", 2]) == [1, 2]
