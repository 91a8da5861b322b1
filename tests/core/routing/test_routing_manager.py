"""Hot reload, last-known-good and the routing endpoint bodies."""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from metis.core.events.catalog import RoutingPolicyInvalid
from metis.core.models.registry import ModelRegistry
from metis.core.routing.availability import Availability
from metis.core.routing.engine import RoutingEngine
from metis.core.routing.loader import EMPTY_POLICY_VERSION
from metis.core.routing.manager import PolicyManager
from tests.core.routing.routing_kit import EventLog, ManualClock, make_ctx, make_registry

GOOD = b"schema_version: 1\nglobal_default: haiku\n"
GOOD2 = b"schema_version: 1\nglobal_default: opus\n"
BAD = b"schema_version: 1\nglobal_default: nonexistent:model\n"
BAD2 = b"schema_version: 1\nglobal_default: nonexistent:other\n"
SHIPPED = b"# shipped\nschema_version: 1\nrules: []\n"


def sha(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def shipped(tmp_path: Path) -> Path:
    path = tmp_path / "shipped-routing.yaml"
    path.write_bytes(SHIPPED)
    return path


@pytest.fixture
def make_manager(
    registry: ModelRegistry,
    home: Path,
    shipped: Path,
    events: EventLog,
    clock: ManualClock,
    availability: Availability,
) -> Callable[..., PolicyManager]:
    def build(**kwargs: object) -> PolicyManager:
        return PolicyManager(
            registry,
            home=home,
            shipped_path=shipped,
            emit_system_event=events,
            availability=availability,
            clock=clock,
            **kwargs,  # type: ignore[arg-type]
        )

    return build


@pytest.fixture
async def watched(
    make_manager: Callable[..., PolicyManager], home: Path
) -> AsyncIterator[PolicyManager]:
    (home / "routing.yaml").write_bytes(GOOD)
    manager = make_manager(watch_interval_s=0.02)
    await manager.start()
    manager.start_watcher()
    try:
        yield manager
    finally:
        await manager.aclose()


async def wait_for(condition: Callable[[], bool], timeout: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached within the timeout")
        await asyncio.sleep(0.02)


# ---- start-up ----------------------------------------------------------------------------------


async def test_an_unconfigured_global_default_is_one_warning_in_the_log(
    home: Path, shipped: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The policy's warnings reach the API only; the log says once (not at every reload of the
    same version) that global_default's turns go to another model."""
    (home / "routing.yaml").write_bytes(GOOD)  # haiku: anthropic, whose key is unset
    manager = PolicyManager(make_registry({"OPENAI_API_KEY": "k"}), home=home, shipped_path=shipped)
    await manager.start()
    await manager.reload("api")
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == [
        "global_default anthropic:haiku is not configured (no key: ANTHROPIC_API_KEY is not "
        "set); turns no rule picks go to openai:gpt-5, the first configured model"
    ]


async def test_offline_an_unconfigured_global_default_is_said_to_give_way_to_the_scripted_model(
    home: Path, shipped: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With no model configured the engine's last default is the scripted model: the log said
    such turns "find no model" while they were answered."""
    (home / "routing.yaml").write_bytes(GOOD)
    registry = make_registry({})
    assert registry.offline_mode and registry.default_model() is None
    manager = PolicyManager(registry, home=home, shipped_path=shipped)
    await manager.start()
    [warned] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned.endswith("; turns no rule picks go to local:scripted (offline)"), warned


async def test_startup_loads_a_valid_user_file_and_persists_it_as_lkg(
    make_manager: Callable[..., PolicyManager], home: Path, events: EventLog
) -> None:
    (home / "routing.yaml").write_bytes(GOOD)
    manager = make_manager()
    await manager.start()
    assert (manager.source, manager.version, manager.valid) == ("user_file", sha(GOOD), True)
    assert manager.active.global_default == "anthropic:haiku"
    lkg = home / "routing.lkg.yaml"
    assert lkg.read_bytes() == GOOD
    assert stat.S_IMODE(lkg.stat().st_mode) == 0o600
    assert events == [
        (
            "routing.policy_loaded",
            {
                "version": sha(GOOD),
                "previous_version": None,
                "source": "user_file",
                "path": str(home / "routing.yaml"),
                "reason": "startup",
                "warnings": [],
            },
        )
    ]


async def test_startup_without_a_user_file_uses_the_shipped_default(
    make_manager: Callable[..., PolicyManager], home: Path, shipped: Path
) -> None:
    manager = make_manager()
    await manager.start()
    assert (manager.source, manager.path, manager.version) == (
        "shipped_default",
        shipped,
        sha(SHIPPED),
    )
    assert manager.file_version is None
    assert not (home / "routing.lkg.yaml").exists()  # only user files become LKG


async def test_broken_shipped_default_falls_back_to_the_builtin_empty_policy(
    make_manager: Callable[..., PolicyManager], shipped: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shipped.write_bytes(b"rules: 5\n")
    manager = make_manager()
    await manager.start()
    assert (manager.source, manager.version) == ("builtin_empty", EMPTY_POLICY_VERSION)
    assert any(r.levelname == "ERROR" for r in caplog.records)


async def test_restart_with_a_broken_file_uses_the_persisted_lkg(
    make_manager: Callable[..., PolicyManager], home: Path, events: EventLog
) -> None:
    (home / "routing.yaml").write_bytes(GOOD)
    await make_manager().start()
    (home / "routing.yaml").write_bytes(BAD)
    events.clear()
    manager = make_manager()
    await manager.start()
    assert (manager.source, manager.version) == ("last_known_good", sha(GOOD))
    assert manager.using_last_known_good and not manager.valid
    assert manager.errors == ["global_default references unknown model: nonexistent:model (line 2)"]
    assert [t for t, _ in events] == ["routing.policy_invalid", "routing.policy_loaded"]
    assert events[0][1] == {
        "policy_path": str(home / "routing.yaml"),
        "file_version": sha(BAD),
        "errors": manager.errors,
        "using_last_known_good": True,
        "active_version": sha(GOOD),
    }
    assert events[1][1]["source"] == "last_known_good"
    assert (home / "routing.lkg.yaml").read_bytes() == GOOD


async def test_restart_with_a_broken_file_and_no_lkg_uses_the_builtin_empty_policy(
    make_manager: Callable[..., PolicyManager], home: Path, events: EventLog
) -> None:
    (home / "routing.yaml").write_bytes(BAD)
    manager = make_manager()
    await manager.start()
    assert (manager.source, manager.version) == ("builtin_empty", EMPTY_POLICY_VERSION)
    assert not manager.using_last_known_good and not manager.valid
    assert events[0][1]["using_last_known_good"] is False
    assert events[0][1]["active_version"] == EMPTY_POLICY_VERSION


async def test_an_lkg_that_no_longer_validates_is_not_used(
    make_manager: Callable[..., PolicyManager], home: Path
) -> None:
    (home / "routing.lkg.yaml").write_bytes(BAD2)
    (home / "routing.yaml").write_bytes(BAD)
    manager = make_manager()
    await manager.start()
    assert manager.source == "builtin_empty"


async def test_an_lkg_left_unused_at_startup_says_why_in_the_log_and_the_reason(
    make_manager: Callable[..., PolicyManager], home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A model the last good version names was removed from models.yaml: without a word, the
    user only sees the empty policy in force where the one that loaded last was promised."""
    (home / "routing.lkg.yaml").write_bytes(BAD2)
    (home / "routing.yaml").write_bytes(BAD)
    manager = make_manager()
    await manager.start()
    unknown = "global_default references unknown model: nonexistent:other (line 2)"
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert (
        f"{home / 'routing.lkg.yaml'} (the last version of routing.yaml that loaded) is not "
        f"used, it no longer validates: {unknown}"
    ) in warned
    assert manager.in_force()["reason"] == (
        f"{home / 'routing.yaml'} has errors; the built-in empty policy (no rules: turns go to "
        f"the default model) is in force ({home / 'routing.lkg.yaml'} no longer validates: "
        f"{unknown})"
    )
    (home / "routing.yaml").write_bytes(GOOD)
    await manager.reload("api")
    assert manager.in_force()["reason"] == f"{home / 'routing.yaml'} is valid; it is in force"


async def test_a_routing_yaml_that_cannot_be_read_is_reported_by_a_valid_event(
    make_manager: Callable[..., PolicyManager], home: Path, events: EventLog
) -> None:
    """A directory in its place, at start-up and on a reload: the bus drops an event whose
    payload does not fit the catalog, so the refusal must fit it."""
    (home / "routing.yaml").mkdir()
    manager = make_manager()
    await manager.start()
    (home / "routing.yaml").rmdir()
    (home / "routing.yaml").write_bytes(GOOD)
    await manager.reload("api")
    (home / "routing.yaml").unlink()
    (home / "routing.yaml").mkdir()
    await manager.reload("api")
    refused = events.of("routing.policy_invalid")
    assert len(refused) == 2
    for payload in refused:
        RoutingPolicyInvalid.model_validate(payload)
        assert payload["errors"] == [f"cannot read {home / 'routing.yaml'}: Is a directory"]


# ---- reloads -------------------------------------------------------------------------------------


async def test_turn_start_check_sees_an_edit_without_the_watcher(
    make_manager: Callable[..., PolicyManager], home: Path, events: EventLog
) -> None:
    path = home / "routing.yaml"
    path.write_bytes(GOOD)
    manager = make_manager()
    await manager.start()
    await manager.ensure_current()
    assert len(events) == 1  # unchanged file: no reload
    path.write_bytes(GOOD2)
    await manager.ensure_current()
    assert manager.version == sha(GOOD2) and manager.active.global_default == "anthropic:opus"
    assert events[-1][1]["reason"] == "turn_start"
    assert events[-1][1]["previous_version"] == sha(GOOD)
    assert (home / "routing.lkg.yaml").read_bytes() == GOOD2


async def test_invalid_edit_keeps_the_policy_and_reports_once_per_bad_version(
    make_manager: Callable[..., PolicyManager], home: Path, events: EventLog
) -> None:
    path = home / "routing.yaml"
    path.write_bytes(GOOD)
    manager = make_manager()
    await manager.start()
    events.clear()
    path.write_bytes(BAD)
    for _ in range(3):
        await manager.ensure_current()
    await manager.reload("api")
    assert manager.version == sha(GOOD) and manager.source == "user_file"
    assert manager.using_last_known_good and not manager.valid
    assert [t for t, _ in events] == ["routing.policy_invalid"]
    path.write_bytes(BAD2)
    await manager.ensure_current()
    assert [t for t, _ in events] == ["routing.policy_invalid", "routing.policy_invalid"]
    assert (home / "routing.lkg.yaml").read_bytes() == GOOD
    path.write_bytes(GOOD2)
    await manager.ensure_current()
    assert manager.valid and not manager.using_last_known_good and manager.errors == []


async def test_deleting_the_user_file_switches_to_the_shipped_default(
    make_manager: Callable[..., PolicyManager], home: Path, shipped: Path, events: EventLog
) -> None:
    path = home / "routing.yaml"
    path.write_bytes(GOOD)
    manager = make_manager()
    await manager.start()
    path.unlink()
    await manager.reload("file_deleted")
    assert (manager.source, manager.path, manager.file_version) == (
        "shipped_default",
        shipped,
        None,
    )
    assert events[-1][1]["reason"] == "file_deleted"


async def test_api_reload_always_revalidates_and_reports_its_outcome(
    make_manager: Callable[..., PolicyManager],
    home: Path,
    events: EventLog,
    availability: Availability,
) -> None:
    (home / "routing.yaml").write_bytes(GOOD)
    manager = make_manager()
    await manager.start()
    availability.record_failure("anthropic:haiku", "auth")
    body = await manager.reload("api", reset_availability=True)
    assert body == {
        "version": sha(GOOD),
        "valid": True,
        "changed": False,
        "source": "user_file",
        "using_last_known_good": False,
        "errors": [],
        "warnings": [],
        "availability_reset": True,
        "in_force": "user_file",
        "reason": f"{home / 'routing.yaml'} is valid; it is in force",
        "user_file": str(home / "routing.yaml"),
        "error_details": [],
    }
    assert availability.unavailable_scope("anthropic:haiku") is None
    assert [t for t, _ in events].count("routing.policy_loaded") == 2
    (home / "routing.yaml").write_bytes(BAD)
    body = await manager.reload("api")
    assert (
        body["valid"] is False
        and body["changed"] is False
        and body["using_last_known_good"] is True
    )
    assert body["errors"] == ["global_default references unknown model: nonexistent:model (line 2)"]
    assert body["availability_reset"] is False
    (home / "routing.yaml").write_bytes(GOOD2)
    assert (await manager.reload("api"))["changed"] is True


async def test_engine_reads_the_active_policy_and_its_state(
    make_manager: Callable[..., PolicyManager],
    home: Path,
    registry: ModelRegistry,
    availability: Availability,
) -> None:
    (home / "routing.yaml").write_bytes(GOOD)
    manager = make_manager()
    await manager.start()
    engine = RoutingEngine(registry, manager, availability)
    assert engine.decide(make_ctx()).chosen_model == "anthropic:haiku"
    (home / "routing.yaml").write_bytes(BAD)
    await manager.ensure_current()
    decision = engine.decide(make_ctx())
    assert decision.chosen_model == "anthropic:haiku"
    assert (decision.policy_source, decision.using_last_known_good) == ("user_file", True)


# ---- the watcher (real files) ----------------------------------------------------------------------


async def test_watcher_sees_an_edit(watched: PolicyManager, home: Path) -> None:
    (home / "routing.yaml").write_bytes(GOOD2)
    await wait_for(lambda: watched.version == sha(GOOD2))


async def test_watcher_sees_a_save_by_rename(watched: PolicyManager, home: Path) -> None:
    tmp = home / ".routing.yaml.swp"
    tmp.write_bytes(GOOD2)
    os.replace(tmp, home / "routing.yaml")
    await wait_for(lambda: watched.version == sha(GOOD2))


async def test_watcher_sees_a_deletion(
    watched: PolicyManager, home: Path, events: EventLog
) -> None:
    (home / "routing.yaml").unlink()
    await wait_for(lambda: watched.source == "shipped_default")
    assert events[-1][1]["reason"] == "file_deleted"


async def test_watcher_ignores_other_files(
    watched: PolicyManager, home: Path, events: EventLog
) -> None:
    before = len(events)
    (home / "models.yaml").write_text("x")
    await asyncio.sleep(0.3)
    assert len(events) == before


async def test_watcher_keeps_watching_after_a_broken_edit(
    watched: PolicyManager, home: Path, events: EventLog
) -> None:
    (home / "routing.yaml").write_text("tiers: [unclosed\n")
    await wait_for(lambda: not watched.valid)
    assert watched.version == sha(GOOD)  # the previous policy stays in force
    (home / "routing.yaml").write_bytes(GOOD2)
    await wait_for(lambda: watched.valid and watched.version == sha(GOOD2))


# ---- read-only views -------------------------------------------------------------------------------


async def test_check_never_changes_state_or_emits(
    make_manager: Callable[..., PolicyManager], home: Path, events: EventLog
) -> None:
    (home / "routing.yaml").write_bytes(GOOD)
    manager = make_manager()
    await manager.start()
    events.clear()
    body = manager.check("schema_version: 1\nglobal_default: nonexistent:model\nrules: []")
    assert body["valid"] is False
    assert body["errors"] == ["global_default references unknown model: nonexistent:model (line 2)"]
    assert body["version"] == sha(
        b"schema_version: 1\nglobal_default: nonexistent:model\nrules: []"
    )
    (home / "routing.yaml").write_bytes(BAD)
    on_disk = manager.check(None)
    assert on_disk["valid"] is False and on_disk["version"] == sha(BAD)
    assert set(on_disk) == {"valid", "errors", "warnings", "diagnostics", "version"}
    assert manager.version == sha(GOOD) and manager.valid and events == []
    assert (home / "routing.lkg.yaml").read_bytes() == GOOD
    (home / "routing.yaml").unlink()
    assert manager.check(None)["version"] == sha(SHIPPED)


async def test_describe_in_the_valid_state(
    make_manager: Callable[..., PolicyManager], home: Path, tmp_path: Path
) -> None:
    raw = f"""\
global_default: sonnet
rules:
  - name: docs
    description: cheap docs
    when: {{mentions_file_extension: [.MD], message_length_lt: 300}}
    use: haiku
workspaces:
  {tmp_path}:
    default: gpt5
    rules: [{{when: {{has_images: true}}, use: mini}}]
pattern: {{enabled: false}}
""".encode()
    (home / "routing.yaml").write_bytes(raw)
    manager = make_manager()
    await manager.start()
    body = manager.describe()
    assert body == {
        "version": sha(raw),
        "valid": True,
        "loaded_at": "2026-05-08T12:00:00.000000Z",
        "source": "user_file",
        "path": str(home / "routing.yaml"),
        "file_version": sha(raw),
        "global_default": "anthropic:sonnet",
        "fallback_model": "anthropic:sonnet",  # the registry's first configured model
        "tiers": {
            "fast": "anthropic:haiku",
            "balanced": "anthropic:sonnet",
            "deep": "anthropic:opus",
        },
        "rules": [
            {
                "name": "docs",
                "description": "cheap docs",
                "when": {"mentions_file_extension": ["md"], "message_length_lt": 300},
                "use": "anthropic:haiku",
                "line": 3,
            }
        ],
        "workspaces": {
            str(tmp_path): {
                "default": "openai:gpt-5",
                "tiers": None,
                "rules": [
                    {
                        "name": "rule_0",
                        "description": None,
                        "when": {"has_images": True},
                        "use": "openai:mini",
                        "line": 10,
                    }
                ],
            }
        },
        "pattern": {
            "enabled": False,
            "cost_weight": 0.05,
            "min_confidence": 0.05,
            "min_sample_size": 5,
        },
        "errors": [],
        "warnings": [body["warnings"][0]],
        "using_last_known_good": False,
        "in_force": "user_file",
        "reason": f"{home / 'routing.yaml'} is valid; it is in force",
        "user_file": str(home / "routing.yaml"),
        "error_details": [],
    }
    assert body["warnings"][0].startswith("pattern: pattern-based routing is reserved")


async def test_describe_in_the_last_known_good_state(
    make_manager: Callable[..., PolicyManager], home: Path
) -> None:
    (home / "routing.yaml").write_bytes(GOOD)
    await make_manager().start()
    (home / "routing.yaml").write_bytes(BAD)
    manager = make_manager()
    await manager.start()
    body = manager.describe()
    assert (body["version"], body["source"], body["valid"]) == (sha(GOOD), "last_known_good", False)
    assert body["path"] == str(home / "routing.lkg.yaml")
    assert body["file_version"] == sha(BAD)
    assert body["global_default"] == "anthropic:haiku"
    assert body["errors"] == ["global_default references unknown model: nonexistent:model (line 2)"]
    assert body["using_last_known_good"] is True
