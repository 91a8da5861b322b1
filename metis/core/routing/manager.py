"""`PolicyManager`: which routing policy is in force, hot reload and last-known-good.

Every way a policy can change (start-up, the file watcher, the turn-start hash check, the API)
goes through one serialised `reload`, so there is exactly one place deciding what becomes
active, what is persisted as last-known-good and which events are emitted. A broken edit never
takes routing down: the previous policy stays active and the problem is reported once.

The watcher looks at the file's status (`os.stat`) on a timer rather than subscribing to the
directory's change notifications: `routing.yaml` lives in METIS_HOME beside the store, and a
notifier watching that directory was woken by every page SQLite wrote (measured: a commit of
seven pages took 70 µs instead of 30).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from metis.core.canonical.times import format_datetime
from metis.core.config.yaml_source import Diagnostic
from metis.core.models.registry import SCRIPTED_MODEL_ID, ModelRegistry
from metis.core.routing.availability import Availability, EmitSystemEvent
from metis.core.routing.clock import SYSTEM_CLOCK, Clock
from metis.core.routing.loader import (
    BUILTIN_EMPTY,
    TIERS,
    Policy,
    PolicyCheck,
    validate_policy,
)
from metis.private_file import write_private

log = logging.getLogger(__name__)

PolicySourceName = Literal["user_file", "last_known_good", "shipped_default", "builtin_empty"]
ReloadReason = Literal["startup", "watcher", "turn_start", "api", "file_deleted"]

USER_FILE_NAME = "routing.yaml"
LKG_FILE_NAME = "routing.lkg.yaml"
_UNREADABLE = "unreadable"


def _no_emit(event_type: str, payload: dict[str, Any]) -> None:
    log.debug("%s %s", event_type, payload)


WATCH_INTERVAL_S = 0.2
"""How often the watcher looks at `routing.yaml`: an edit is in force within three intervals."""

FileStatus = tuple[int, int, int, int] | str | None


def _file_status(path: Path) -> FileStatus:
    """What any change to the file changes: its inode (a save by rename), size and times; None
    when it is absent, `_UNREADABLE` when it cannot be looked at."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError:
        return _UNREADABLE
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class PolicyManager:
    """Holds the active policy and the state of the on-disk file."""

    def __init__(
        self,
        registry: ModelRegistry,
        *,
        home: Path,
        shipped_path: Path,
        emit_system_event: EmitSystemEvent | None = None,
        availability: Availability | None = None,
        clock: Clock = SYSTEM_CLOCK,
        watch_interval_s: float = WATCH_INTERVAL_S,
    ) -> None:
        self.registry = registry
        self.home = home
        self.user_path = home / USER_FILE_NAME
        self.lkg_path = home / LKG_FILE_NAME
        self.shipped_path = shipped_path
        self._emit: EmitSystemEvent = _no_emit if emit_system_event is None else emit_system_event
        self._availability = availability
        self._clock = clock
        self._watch_interval_s = watch_interval_s

        self.active: Policy = BUILTIN_EMPTY
        self.source: PolicySourceName = "builtin_empty"
        self.path: Path | None = None
        self.loaded_at: datetime | None = None
        self.valid = True
        self.errors: list[str] = []
        self.errors_file: Path | None = None  # the file `errors` belong to
        self.error_diagnostics: tuple[Diagnostic, ...] = ()
        self.warnings: list[str] = []
        self.using_last_known_good = False
        self.file_version: str | None = None
        # why the persisted last-known-good was not used at start-up (None: it was, or none)
        self.lkg_rejection: str | None = None

        self._lock = asyncio.Lock()
        self._attempted = False
        self._seen_key: str | None = None  # what the last attempt read: hash, None or unreadable
        self._reported_invalid: str | None = None
        self._loaded_once = False
        self._watch_task: asyncio.Task[None] | None = None

    @property
    def version(self) -> str:
        return self.active.version

    # ---- reading the user file ------------------------------------------------------------

    def _read_user(self) -> tuple[str | None, bytes | None, Diagnostic | None]:
        """(change key, bytes, error): the key is the sha256, None if absent, or unreadable."""
        try:
            raw = self.user_path.read_bytes()
        except FileNotFoundError:
            return None, None, None
        except OSError as exc:
            message = f"cannot read {self.user_path}: {exc.strerror}"
            return _UNREADABLE, None, Diagnostic("error", "unreadable", "", None, None, message)
        return hashlib.sha256(raw).hexdigest(), raw, None

    # ---- the single reload path -----------------------------------------------------------

    async def start(self) -> None:
        """Start-up load: user file, else persisted LKG, else shipped default, else empty."""
        await self.reload("startup")

    async def reload(
        self, reason: ReloadReason = "api", *, reset_availability: bool = False
    ) -> dict[str, Any]:
        """Re-read and (if needed) re-validate; returns the `POST /routing/reload` body."""
        async with self._lock:
            before = self.active.version
            self._reload_locked(reason)
        reset = False
        if reset_availability and self._availability is not None:
            self._availability.reset()
            reset = True
        return {
            "version": self.active.version,
            "valid": self.valid,
            "changed": self.active.version != before,
            "source": self.source,
            "using_last_known_good": self.using_last_known_good,
            "errors": list(self.errors),
            "warnings": list(self.warnings),
            "availability_reset": reset,
            **self.in_force(),
        }

    async def ensure_current(self) -> None:
        """Turn-start check: one small read and hash; reload if the file changed since."""
        key, _, _ = self._read_user()
        if not self._attempted or key != self._seen_key:
            await self.reload("turn_start")

    def _reload_locked(self, reason: ReloadReason) -> None:
        key, raw, problem = self._read_user()
        if self._attempted and key == self._seen_key and reason != "api":
            return
        self._attempted, self._seen_key = True, key
        if key is None:
            self.file_version = None
            self._load_shipped(reason)
            return
        self.file_version = key if raw is not None else None
        if raw is not None:
            result = validate_policy(raw, self.registry)
        else:
            assert problem is not None
            result = PolicyCheck(None, hashlib.sha256(b"").hexdigest(), (problem,))
        if result.policy is not None:
            self._set_errors(None, None)
            self._reported_invalid = None
            self._activate(result.policy, "user_file", self.user_path, reason, result)
            assert raw is not None
            self._persist_lkg(raw)
            return
        self._set_errors(self.user_path, result)
        log.warning("%s is invalid: %s", self.user_path, "; ".join(result.errors))
        if reason == "startup":
            self._startup_fallback(key, result)
            return
        self.using_last_known_good = self.source != "builtin_empty"
        self._report_invalid(key, result)

    def _startup_fallback(self, key: str, invalid: PolicyCheck) -> None:
        """Broken user file at start-up: the persisted LKG if it still validates, else empty."""
        lkg: PolicyCheck | None = None
        try:
            lkg = validate_policy(self.lkg_path.read_bytes(), self.registry)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot read %s: %s", self.lkg_path, exc.strerror)
        using_lkg = lkg is not None and lkg.policy is not None
        if lkg is not None and lkg.policy is None:
            # said, or the user who reads "the built-in empty policy is in force" cannot tell
            # why the last version that loaded was not used (a model it names is gone)
            self.lkg_rejection = "; ".join(lkg.errors)
            log.warning(
                "%s (the last version of %s that loaded) is not used, it no longer validates: %s",
                self.lkg_path,
                self.user_path.name,
                self.lkg_rejection,
            )
        self.using_last_known_good = using_lkg
        active_version = lkg.version if lkg is not None and using_lkg else BUILTIN_EMPTY.version
        self._report_invalid(key, invalid, active_version=active_version)
        if lkg is not None and lkg.policy is not None:
            self._activate(lkg.policy, "last_known_good", self.lkg_path, "startup", lkg)
        else:
            self._activate(BUILTIN_EMPTY, "builtin_empty", None, "startup", None)
        self.using_last_known_good = using_lkg

    def _load_shipped(self, reason: ReloadReason) -> None:
        """No user file: the shipped default; if even that is broken, the built-in empty one."""
        try:
            result = validate_policy(self.shipped_path.read_bytes(), self.registry)
        except OSError as exc:
            message = f"cannot read {self.shipped_path}: {exc.strerror}"
            diagnostic = Diagnostic("error", "unreadable", "", None, None, message)
            result = PolicyCheck(None, BUILTIN_EMPTY.version, (diagnostic,))
        self._reported_invalid = None
        if result.policy is not None:
            self._set_errors(None, None)
            self._activate(result.policy, "shipped_default", self.shipped_path, reason, result)
            return
        log.error(
            "shipped routing policy %s is invalid; using the built-in empty policy: %s",
            self.shipped_path,
            "; ".join(result.errors),
        )
        self._set_errors(self.shipped_path, result)
        self._activate(BUILTIN_EMPTY, "builtin_empty", None, reason, None)

    def _set_errors(self, path: Path | None, result: PolicyCheck | None) -> None:
        """Valid (no result) or the errors of the file at `path`."""
        self.valid = result is None
        self.errors = result.errors if result is not None else []
        self.errors_file = path
        self.error_diagnostics = (
            tuple(d for d in result.diagnostics if d.severity == "error") if result else ()
        )

    def in_force(self) -> dict[str, Any]:
        """Which policy routes turns now and why, with the errors located in their file."""
        user, source = self.user_path, self.source
        in_force = {
            "user_file": f"{user}",
            "last_known_good": f"the last version of {user} that loaded ({self.lkg_path})",
            "shipped_default": f"the shipped default ({self.shipped_path})",
            "builtin_empty": "the built-in empty policy (no rules: turns go to the default model)",
        }[source]
        if self.valid:
            if source == "user_file":
                reason = f"{user} is valid; it is in force"
            elif source == "shipped_default":
                reason = f"there is no {user}; {in_force} is in force"
            else:
                reason = f"{in_force} is in force"
        elif self.errors_file == user:
            if source == "user_file":
                in_force = f"the last version of {user} that loaded"
            reason = f"{user} has errors; {in_force} is in force"
        else:
            reason = f"{self.errors_file} has errors; {in_force} is in force"
        if source == "builtin_empty" and self.lkg_rejection is not None:
            reason += f" ({self.lkg_path} no longer validates: {self.lkg_rejection})"
        errors_file = str(self.errors_file) if self.errors_file is not None else None
        return {
            "in_force": source,
            "reason": reason,
            "user_file": str(user),
            "error_details": [
                {
                    "file": errors_file,
                    "line": d.line,
                    "column": d.column,
                    "code": d.code,
                    "path": d.path,
                    "message": d.message,
                }
                for d in self.error_diagnostics
            ],
        }

    def _activate(
        self,
        policy: Policy,
        source: PolicySourceName,
        path: Path | None,
        reason: ReloadReason,
        result: PolicyCheck | None,
    ) -> None:
        previous = self.active.version if self._loaded_once else None
        self.active = policy  # the one attribute swap the engine reads
        self.source, self.path = source, path
        self.loaded_at = self._clock.wall()
        self.warnings = result.warnings if result is not None else []
        self.using_last_known_good = source == "last_known_good"
        if source != "builtin_empty":
            self.lkg_rejection = None
        self._loaded_once = True
        log.info("routing policy %s loaded from %s (%s)", policy.version[:12], source, reason)
        if policy.version != previous:
            self._warn_unconfigured_default(policy)
        self._emit(
            "routing.policy_loaded",
            {
                "version": policy.version,
                "previous_version": previous,
                "source": source,
                "path": str(path) if path is not None else None,
                "reason": reason,
                "warnings": list(self.warnings),
            },
        )

    def _warn_unconfigured_default(self, policy: Policy) -> None:
        """One WARNING in the log when a policy coming into force names an unconfigured
        global_default: its warnings are only reported through the API, and every turn no rule
        picks then goes to another model (or fails) with nothing said where an operator looks."""
        chosen = policy.global_default
        why = self.registry.why_not_configured(chosen) if chosen else None
        if chosen is None or why is None:
            return
        floor = self.registry.default_model()
        if floor:
            instead = f"go to {floor}, the first configured model"
        elif self.registry.offline_mode:  # the engine's last default: the scripted model
            instead = f"go to {SCRIPTED_MODEL_ID} (offline)"
        else:
            instead = "find no model"
        log.warning(
            "global_default %s is not configured (%s); turns no rule picks %s",
            chosen,
            why,
            instead,
        )

    def _report_invalid(
        self, key: str, result: PolicyCheck, *, active_version: str | None = None
    ) -> None:
        """`routing.policy_invalid`, once per distinct bad file version."""
        if key == self._reported_invalid:
            return
        self._reported_invalid = key
        self._emit(
            "routing.policy_invalid",
            {
                "policy_path": str(self.user_path),
                # an unreadable file has no bytes to hash: the check's version stands in, as
                # POST /routing/check reports it (None would get the event dropped as invalid)
                "file_version": self.file_version or result.version,
                "errors": result.errors,
                "using_last_known_good": self.using_last_known_good,
                "active_version": active_version or self.active.version,
            },
        )

    def _persist_lkg(self, raw: bytes) -> None:
        """Atomically keep the last bytes that loaded (temp file, fsync, rename, mode 0600)."""
        try:
            if self.lkg_path.read_bytes() == raw:
                return
        except OSError:
            pass
        try:
            write_private(self.lkg_path, raw, durable=True)
        except OSError as exc:
            log.warning("could not write %s: %s", self.lkg_path, exc)

    # ---- read-only views ------------------------------------------------------------------

    def check(self, policy_yaml: str | None = None) -> dict[str, Any]:
        """`POST /routing/check`: validate text, or the on-disk file; never changes state."""
        if policy_yaml is not None:
            return validate_policy(policy_yaml.encode("utf-8"), self.registry).as_dict()
        path = self.user_path if self.user_path.exists() else self.shipped_path
        try:
            raw = path.read_bytes()
        except OSError as exc:
            message = f"cannot read {path}: {exc.strerror}"
            diagnostic = Diagnostic("error", "unreadable", "", None, None, message)
            return PolicyCheck(None, BUILTIN_EMPTY.version, (diagnostic,)).as_dict()
        return validate_policy(raw, self.registry).as_dict()

    def describe(self) -> dict[str, Any]:
        """`GET /routing/policy`: the policy in use, plus the on-disk file's validity."""
        policy = self.active
        tiers: dict[str, str | None] = (
            dict(policy.tiers)
            if policy.tiers
            else {t: self.registry.model_for_tier(t) for t in TIERS}
        )
        return {
            "version": policy.version,
            "valid": self.valid,
            "loaded_at": format_datetime(self.loaded_at) if self.loaded_at else None,
            "source": self.source,
            "path": str(self.path) if self.path is not None else None,
            "file_version": self.file_version,
            "global_default": policy.global_default,
            # a turn no rule, workspace default or global_default picks goes to this model
            "fallback_model": self.registry.default_model(),
            "tiers": {t: tiers.get(t) for t in TIERS},
            "rules": [rule.describe() for rule in policy.rules],
            "workspaces": {
                scope.path: {
                    "default": scope.default,
                    "tiers": dict(scope.tiers) if scope.tiers else None,
                    "rules": [rule.describe() for rule in scope.rules],
                }
                for scope in policy.scopes
            },
            "pattern": policy.pattern.describe(),
            "errors": list(self.errors),
            "warnings": list(self.warnings),
            "using_last_known_good": self.using_last_known_good,
            **self.in_force(),
        }

    # ---- watcher --------------------------------------------------------------------------

    def start_watcher(self) -> None:
        """Look at the file every `watch_interval_s` from now on (see the module's docstring)."""
        if self._watch_task is None:
            self._watch_task = asyncio.create_task(
                self._watch(_file_status(self.user_path)), name="routing-watcher"
            )

    async def _watch(self, seen: FileStatus) -> None:
        """Reload once a change has settled: the same status at two looks in a row, so an
        editor's write in several steps is read whole, not reported invalid half-way."""
        candidate = seen
        while True:
            await asyncio.sleep(self._watch_interval_s)
            status = _file_status(self.user_path)
            if status == seen or status != candidate:
                candidate = status  # unchanged, or changed since the last look
                continue
            seen = status
            try:
                await self.reload("watcher" if status is not None else "file_deleted")
            except Exception:
                log.exception("routing reload after a file change failed")

    async def aclose(self) -> None:
        """Stop watching (daemon shutdown). A reload runs whole once begun (`_reload_locked`
        never awaits), so cancelling the watcher never leaves one half done."""
        task, self._watch_task = self._watch_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


__all__ = ["LKG_FILE_NAME", "USER_FILE_NAME", "PolicyManager", "ReloadReason"]
