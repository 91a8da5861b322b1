"""`models.yaml` → `ModelRegistry`: declared models, aliases, credentials, adapters.

The registry is read once at start-up and never changes afterwards, so everything downstream
(routing, cost, the `/models` route) can hold plain references to it. The file format itself is
validated by `metis.core.config.models_file`; this module resolves credentials (`METIS_OFFLINE`
included), answers lookups, builds adapters lazily and renders `GET /models`. `load_registry`
turns any validation error into one `ConfigError` listing them all, so `metis serve` and
`metis models check` report identically.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from metis.core.canonical.redaction import register_secret
from metis.core.config.checks import format_diagnostic
from metis.core.config.models_file import (
    LOCAL_PROVIDER,
    PRICE_KEYS,
    SCRIPTED_DEFAULT_OPTIONS,
    SCRIPTED_MODEL_ID,
    ProviderDraft,
    parse_models_yaml,
)
from metis.core.config.yaml_source import Diagnostic
from metis.core.errors import ConfigError, ModelNotConfigured
from metis.core.models.types import ModelEntry, ProviderConfig

if TYPE_CHECKING:
    from metis.core.providers import LLMRequest, LLMResult, ProviderAdapter, StreamEvent

log = logging.getLogger(__name__)

NotConfiguredReason = Literal["unknown", "no_credentials", "offline_forced"]

# The module behind each adapter kind whose import is worth doing ahead of the first call: the
# SDKs take seconds and tens of MiB to import (the scripted adapter imports nothing heavy).
_SDK_ADAPTER_MODULES = {
    "anthropic": "metis.core.providers.anthropic",
    "openai": "metis.core.providers.openai",
}


@dataclass(frozen=True)
class Credential:
    """Outcome of resolving one provider's key at start-up (never a validity issue)."""

    configured: bool
    reason: NotConfiguredReason | None = None
    env_var: str | None = None


class ModelHealth(Protocol):
    """What `describe_models` needs from the availability tracker."""

    def tick(self) -> None:
        """Put the scopes unavailable for long enough back on probation, so a status read is
        current."""

    def model_status(self, model_id: str) -> tuple[str, dict[str, Any] | None]:
        """`(availability, availability_detail)` of a model as `GET /models` shows it."""


class ModelRegistry:
    """Immutable view of `models.yaml` plus resolved credentials and lazily built adapters."""

    def __init__(
        self,
        *,
        providers: Mapping[str, ProviderConfig],
        models: list[ModelEntry],
        pricing_version: str,
        credentials: Mapping[str, Credential],
        offline_forced: bool = False,
        source: str | None = None,
    ) -> None:
        self._providers = dict(providers)
        self._models = list(models)
        self._by_id = {m.id: m for m in self._models}
        self._by_alias = {a.lower(): m.id for m in self._models for a in m.aliases}
        self._credentials = dict(credentials)
        self._offline_forced = offline_forced
        self.pricing_version = pricing_version
        self.source = source
        self._adapters: dict[str, ProviderAdapter] = {}
        self._warm: asyncio.Event | None = None  # set once `warm_in_background` is over
        self._closing = False  # a warm-up ending after `aclose` builds nothing
        # Called on the loop once a warm-up has built the adapters (`metis serve` freezes the
        # SDKs' long-lived types out of the collector's reach then).
        self.on_warm: Callable[[], None] | None = None
        self._default_model = next(
            (m.id for m in self._models if not m.scripted and self.is_configured(m.id)), None
        )
        self.offline_mode: bool = offline_forced or self._default_model is None

    # ---- lookups ------------------------------------------------------------------------

    def models(self) -> list[ModelEntry]:
        """Declared models in file order (order decides `default_model` and tier lookup)."""
        return list(self._models)

    def get(self, model_id: str) -> ModelEntry | None:
        return self._by_id.get(model_id)

    def resolve(self, ref: str) -> str | None:
        """Canonical id of a reference: exact id first, then an alias ignoring case."""
        if ref in self._by_id:
            return ref
        return self._by_alias.get(ref.lower())

    def providers(self) -> list[ProviderConfig]:
        return list(self._providers.values())

    def provider(self, name: str) -> ProviderConfig | None:
        return self._providers.get(name)

    def credential(self, provider: str) -> Credential:
        """How the provider's key resolved at start-up; an unknown provider reads as not configured."""
        return self._credentials.get(provider, Credential(False, "unknown"))

    def is_configured(self, model_id: str) -> bool:
        return self.not_configured_reason(model_id) is None

    def not_configured_reason(self, model_id: str) -> NotConfiguredReason | None:
        """Why a model cannot be used (unknown, no key, offline forced), or None when it can."""
        entry = self._by_id.get(model_id)
        if entry is None:
            return "unknown"
        return self.credential(entry.provider).reason

    def why_not_configured(self, model_id: str) -> str | None:
        """`not_configured_reason` in a user's words, naming what to change (the provider's
        `api_key_env`), or None when the model can be used."""
        reason = self.not_configured_reason(model_id)
        entry = self._by_id.get(model_id)
        if reason is None or entry is None:
            return None if reason is None else "not in models.yaml"
        env_var = self.credential(entry.provider).env_var
        if reason == "offline_forced":
            return "METIS_OFFLINE=1"
        return f"no key: {env_var} is not set" if env_var else "no key"

    def configured_providers(self) -> list[str]:
        """Names of providers whose credential resolved, sorted."""
        return sorted(name for name, cred in self._credentials.items() if cred.configured)

    def default_model(self) -> str | None:
        """The routing floor: first configured real model in file order."""
        return self._default_model

    def model_for_tier(self, tier: str) -> str | None:
        """First declared model with that tier (used when `routing.yaml` sets no `tiers`)."""
        for entry in self._models:
            if entry.tier == tier:
                return entry.id
        return None

    def require_configured(self, ref: str, **details: Any) -> str:
        """Resolve an explicit reference that must be usable now, else `ModelNotConfigured`.

        Shared by the `@alias` prefix, the override field and the sticky model so that all of
        them report `{reference, reason, env_var?}` identically.
        """
        model_id = self.resolve(ref)
        reason = "unknown" if model_id is None else self.not_configured_reason(model_id)
        if reason is None and model_id is not None:
            return model_id
        raise self._not_configured(ref, model_id, reason or "unknown", details)

    def _not_configured(
        self,
        ref: str,
        model_id: str | None,
        reason: NotConfiguredReason,
        details: dict[str, Any],
    ) -> ModelNotConfigured:
        info: dict[str, Any] = {**details, "reference": ref, "reason": reason}
        text = (
            f"unknown model '{ref}'" if reason == "unknown" else f"model '{ref}' is not configured"
        )
        if model_id is not None and reason == "no_credentials":
            entry = self._by_id[model_id]
            env_var = self.credential(entry.provider).env_var
            if env_var:
                info["env_var"] = env_var
                text += f": set {env_var} for provider '{entry.provider}'"
        elif reason == "offline_forced":
            text += " (METIS_OFFLINE=1 disables every provider but 'local')"
        return ModelNotConfigured(text, **info)

    # ---- adapters -----------------------------------------------------------------------

    def adapter_for(self, model_id: str) -> ProviderAdapter:
        """The provider adapter serving a model: one instance per provider, built on first use."""
        from metis.core.providers import build_adapter

        entry = self._by_id.get(model_id)
        reason = self.not_configured_reason(model_id)
        if entry is None or reason is not None:
            raise self._not_configured(
                model_id, model_id if entry else None, reason or "unknown", {}
            )
        adapter = self._adapters.get(entry.provider)
        if adapter is None:
            provider = self._providers[entry.provider]
            if (
                self._warm is not None
                and not self._warm.is_set()
                and provider.adapter in _SDK_ADAPTER_MODULES
            ):  # a stand-in has no `kind` of its own; nothing reads one before the call
                return cast("ProviderAdapter", _AfterWarmUp(self, model_id))
            adapter = build_adapter(provider)
            self._adapters[entry.provider] = adapter
        return adapter

    def warm_adapters(self) -> None:
        """Build the adapter of every configured model's provider now, in this thread."""
        for entry in self._models:
            if self.is_configured(entry.id):
                self.adapter_for(entry.id)

    def warm_in_background(self) -> None:
        """Import the configured providers' SDKs in a thread, then build their adapters.

        Importing the SDKs takes seconds and tens of MiB (their pydantic types), so the daemon
        calls this when a client's first request comes (`Models.prepare_adapters`), not at
        start-up; a first turn that comes later finds its adapter ready. One that comes sooner
        gets a stand-in whose call waits for the warm-up: the event loop never blocks on an
        import. The adapters themselves (their HTTP clients) are built on the loop's thread,
        once the imports are done. Call it from the loop.
        """
        if self._warm is not None:
            return
        modules = sorted(
            {
                _SDK_ADAPTER_MODULES[p.adapter]
                for p in self._providers.values()
                if p.adapter in _SDK_ADAPTER_MODULES and self.credential(p.name).configured
            }
        )
        loop = asyncio.get_running_loop()
        self._warm = asyncio.Event()

        def imports() -> None:
            try:
                for name in modules:
                    importlib.import_module(name)
            except Exception:  # the first call that needs it raises it again, in its turn
                log.warning("importing the provider SDKs in the background failed", exc_info=True)
            finally:
                with contextlib.suppress(RuntimeError):  # the loop closed: the daemon stopped
                    loop.call_soon_threadsafe(self._warmed)

        threading.Thread(target=imports, name="metis-warm-adapters", daemon=True).start()

    def _warmed(self) -> None:
        assert self._warm is not None
        self._warm.set()
        if self._closing:
            return
        try:
            self.warm_adapters()
        except Exception:  # a turn that needs the adapter gets the error itself
            log.error("building the provider adapters failed", exc_info=True)
        if self.on_warm is not None:
            self.on_warm()

    async def wait_warm(self) -> None:
        """Return once the background warm-up (if one was started) is over."""
        if self._warm is not None:
            await self._warm.wait()

    async def aclose(self) -> None:
        """Close every adapter built so far (daemon shutdown)."""
        self._closing = self._warm is not None and not self._warm.is_set()
        adapters, self._adapters = list(self._adapters.values()), {}
        for adapter in adapters:
            try:
                await adapter.aclose()
            except Exception:  # one failing close must not leak the others
                log.warning("closing adapter %s failed", type(adapter).__name__, exc_info=True)

    # ---- GET /models ----------------------------------------------------------------------

    def describe_models(self, health: ModelHealth | None = None) -> dict[str, Any]:
        """The `GET /models` body; runs the availability tick first."""
        if health is not None:
            health.tick()
        configured: list[dict[str, Any]] = []
        unconfigured: list[dict[str, Any]] = []
        for entry in self._models:
            reason = self.not_configured_reason(entry.id)
            if reason is not None:
                cred = self.credential(entry.provider)
                env_var = cred.env_var if reason == "no_credentials" else None
                unconfigured.append(
                    {
                        "id": entry.id,
                        "provider": entry.provider,
                        "reason": reason,
                        "env_var": env_var,
                        "tier": entry.tier,  # what setting the key would make routable
                        "aliases": list(entry.aliases),
                    }
                )
                continue
            status, detail = health.model_status(entry.id) if health else ("healthy", None)
            configured.append(
                {
                    **self.describe_entry(entry),
                    "availability": status,
                    "availability_detail": detail,
                }
            )
        return {
            "offline_mode": self.offline_mode,
            "pricing_version": self.pricing_version,
            "models": configured,
            "unconfigured": unconfigured,
        }

    def describe_entry(self, entry: ModelEntry) -> dict[str, Any]:
        """One model's static description (everything but availability)."""
        prices = {k: _price_text(getattr(entry.pricing, k)) for k in PRICE_KEYS}
        return {
            "id": entry.id,
            "provider": entry.provider,
            "adapter": entry.adapter,
            "wire_name": entry.wire_name,
            "tier": entry.tier,
            "can_delegate": entry.can_delegate,
            "aliases": list(entry.aliases),
            "scripted": entry.scripted,
            "label": entry.label,
            "capabilities": entry.capabilities.model_dump(),
            "pricing": {**prices, "currency": "USD", "pricing_version": self.pricing_version},
        }


class _AfterWarmUp:
    """A provider's adapter while the background warm-up still imports its SDK: a call waits
    for the warm-up (without blocking the loop), then goes to the real adapter."""

    def __init__(self, registry: ModelRegistry, model_id: str) -> None:
        self._registry = registry
        self._model_id = model_id

    async def _adapter(self) -> ProviderAdapter:
        await self._registry.wait_warm()
        return self._registry.adapter_for(self._model_id)

    async def stream(self, req: LLMRequest) -> AsyncIterator[StreamEvent]:
        adapter = await self._adapter()
        events = cast("AsyncGenerator[StreamEvent, None]", adapter.stream(req))
        async with contextlib.aclosing(events):
            async for event in events:
                yield event

    async def complete(self, req: LLMRequest) -> LLMResult:
        return await (await self._adapter()).complete(req)

    async def aclose(self) -> None:
        """Nothing of its own: the registry closes the real adapter."""


def _price_text(value: Decimal) -> str:
    """Plain positional text keeping the declared precision (`"3.00"` stays `"3.00"`)."""
    return format(value, "f")


# ---------------------------------------------------------------------------------------------
# Loading and validation
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegistryLoad:
    """Result of validating one `models.yaml`: the registry iff there is no error."""

    registry: ModelRegistry | None
    diagnostics: list[Diagnostic]

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]

    @property
    def valid(self) -> bool:
        return self.registry is not None


def load_models_bytes(
    raw: bytes,
    *,
    source: str | None = None,
    env: Mapping[str, str] | None = None,
) -> RegistryLoad:
    """Validate `models.yaml` source and, when valid, build the registry.

    `env` defaults to `os.environ`; credentials are resolved from it (and `METIS_OFFLINE`).
    """
    parsed = parse_models_yaml(raw)
    if not parsed.valid or parsed.pricing_version is None:
        return RegistryLoad(None, parsed.diagnostics)
    environ = os.environ if env is None else env
    offline = environ.get("METIS_OFFLINE") == "1"
    configs, credentials = _resolve_credentials(parsed.providers, environ, offline)
    registry = ModelRegistry(
        providers=configs,
        models=parsed.models,
        pricing_version=parsed.pricing_version,
        credentials=credentials,
        offline_forced=offline,
        source=source,
    )
    return RegistryLoad(registry, parsed.diagnostics)


def load_models_file(path: Path, *, env: Mapping[str, str] | None = None) -> RegistryLoad:
    """Read and validate a models.yaml; an unreadable file becomes a diagnostic, so `metis models
    check` reports it like any other problem."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        message = f"cannot read {path}: {exc.strerror}"
        return RegistryLoad(None, [Diagnostic("error", "unreadable", "", None, None, message)])
    return load_models_bytes(raw, source=str(path), env=env)


def load_registry(path: Path, *, env: Mapping[str, str] | None = None) -> ModelRegistry:
    """Start-up entry point: the registry, or one `ConfigError` listing every problem."""
    result = load_models_file(path, env=env)
    if result.registry is None:
        rendered = [d.render() for d in result.errors]
        lines = "\n".join(f"  {format_diagnostic(path, d)}" for d in result.errors)
        count = f"{len(rendered)} error{'' if len(rendered) == 1 else 's'}"
        text = f"{path}: invalid models.yaml ({count}):\n{lines}"
        raise ConfigError(text, path=str(path), errors=rendered)
    return result.registry


def _bare(key: str | None) -> str | None:
    """A key without the whitespace around it, None when nothing is left. A key read from a
    file (`export K=$(cat key)` keeps no newline, but an `EnvironmentFile` line may keep a
    trailing space, a pasted key a newline) is never meant to carry it, and the HTTP client
    refuses a header holding a control character: every call failed as "internal adapter
    error: ValueError", naming neither the key nor its variable."""
    return (key or "").strip() or None


def _resolve_credentials(
    drafts: dict[str, ProviderDraft], env: Mapping[str, str], offline: bool
) -> tuple[dict[str, ProviderConfig], dict[str, Credential]]:
    """Provider configs with their keys, and whether each provider is usable right now."""
    drafts = dict(drafts)
    if LOCAL_PROVIDER not in drafts:
        drafts[LOCAL_PROVIDER] = ProviderDraft(
            LOCAL_PROVIDER, "scripted", {"options": dict(SCRIPTED_DEFAULT_OPTIONS)}
        )
    configs: dict[str, ProviderConfig] = {}
    credentials: dict[str, Credential] = {}
    for name, draft in drafts.items():
        fields = {k: v for k, v in draft.fields.items() if v is not None}
        env_var = fields.get("api_key_env")
        key: str | None = _bare(fields.get("api_key"))
        if draft.adapter == "scripted":
            credential = Credential(True)
        elif offline:
            credential = Credential(False, "offline_forced", env_var)
        elif env_var is not None:
            key = _bare(env.get(env_var))
            credential = Credential(True) if key else Credential(False, "no_credentials", env_var)
        else:
            credential = Credential(True)  # literal key, or keyless (SDK gets the placeholder)
        register_secret(key)
        fields.pop("api_key", None)
        config = ProviderConfig(name=name, adapter=draft.adapter, api_key=key, **fields)  # type: ignore[arg-type]
        unusable = config.unusable_key()
        if unusable is not None:  # said at start-up too, before the first call fails with it
            log.warning("%s", unusable)
        configs[name] = config
        credentials[name] = credential
    return configs, credentials


__all__ = [
    "LOCAL_PROVIDER",
    "SCRIPTED_MODEL_ID",
    "Credential",
    "ModelHealth",
    "ModelRegistry",
    "RegistryLoad",
    "load_models_bytes",
    "load_models_file",
    "load_registry",
]
