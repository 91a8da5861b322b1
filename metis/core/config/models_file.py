"""The `models.yaml` file format: validation and parsing into registry entries.

Pure: bytes in, entries and provider drafts (credentials still unresolved) plus every problem
found out. `metis.core.models.registry` resolves credentials and builds the `ModelRegistry` from the
result, so the format rules live in exactly one place.

Diagnostic codes: the ones shared with routing.yaml (`not_utf8`, `too_large`, `yaml_syntax`,
`root_not_mapping`, `duplicate_key`, `unknown_key`, `missing_key`, `wrong_type`, `out_of_range`,
`unsupported_schema_version`) plus the registry's own `unknown_provider`, `duplicate_model`,
`duplicate_alias`, `alias_is_id`, `conflicting_keys` and `builtin_model` (a setting the built-in
scripted model does not allow).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from metis.core.config.checks import Collector, join, join_key, position
from metis.core.config.yaml_source import Diagnostic, MarkedDict, load_yaml_bytes
from metis.core.models.types import Capabilities, ModelEntry, Pricing, split_model_id

LOCAL_PROVIDER = "local"
SCRIPTED_MODEL_ID = "local:scripted"
SCRIPTED_ALIAS = "scripted"
SCRIPTED_LABEL = "offline scripted model (deterministic, not an LLM)"
SCRIPTED_CAPABILITIES = Capabilities(
    supports_images=True,
    supports_tools=True,
    supports_thinking=True,
    supports_parallel_tool_calls=True,
    supports_prompt_caching=False,
    max_context_tokens=200_000,
    max_output_tokens=8192,
)
SCRIPTED_PRICING = Pricing(
    input_per_mtok=Decimal(0),
    output_per_mtok=Decimal(0),
    cache_read_per_mtok=Decimal(0),
    cache_write_per_mtok=Decimal(0),
)

_PROVIDER_NAME_RE = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_ENV_NAME_RE = re.compile(r"[A-Z_][A-Z0-9_]*")
# `$NAME` or `${NAME}` written as a key: a shell's or a compose file's way, not this file's
_ENV_REFERENCE_RE = re.compile(r"\$\{?(?P<name>[A-Za-z_][A-Za-z0-9_]*)\}?")
_ALIAS_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_URL_RE = re.compile(r"https?://[^\s/?#]+[^\s]*")

_TOP_KEYS = ("schema_version", "pricing_version", "providers", "models")
_PROVIDER_KEYS = (
    "adapter",
    "base_url",
    "api_key_env",
    "api_key",
    "connect_timeout_s",
    "read_timeout_s",
    "options",
)
_LOCAL_PROVIDER_KEYS = ("adapter", "options")
_ADAPTERS = ("anthropic", "openai", "scripted")
_MODEL_KEYS = ("id", "tier", "can_delegate", "aliases", "label", "capabilities", "pricing")
_TIERS = ("fast", "balanced", "deep")
_CAPABILITY_BOOLS: dict[str, bool] = {
    "supports_images": False,
    "supports_tools": True,
    "supports_thinking": False,
    "supports_parallel_tool_calls": True,
    "supports_prompt_caching": False,
}
_CAPABILITY_KEYS = (*_CAPABILITY_BOOLS, "max_context_tokens", "max_output_tokens")
PRICE_KEYS = ("input_per_mtok", "output_per_mtok", "cache_read_per_mtok", "cache_write_per_mtok")
SCRIPTED_DEFAULT_OPTIONS: dict[str, Any] = {"chunk_chars": 16, "delta_delay_ms": 0}
_OPENAI_DEFAULT_OPTIONS: dict[str, Any] = {
    "max_tokens_field": "max_completion_tokens",
    "stream_include_usage": True,
}


@dataclass
class ProviderDraft:
    """A valid `providers.<name>` entry before its credential is resolved."""

    name: str
    adapter: str
    fields: dict[str, Any]


@dataclass
class ParsedModels:
    """What a `models.yaml` declares; `valid` iff no diagnostic is an error."""

    pricing_version: str | None = None
    providers: dict[str, ProviderDraft] = field(default_factory=dict)
    models: list[ModelEntry] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return self.pricing_version is not None and not any(
            d.severity == "error" for d in self.diagnostics
        )


def parse_models_yaml(raw: bytes) -> ParsedModels:
    """Validate `models.yaml` source, collecting every problem in document order."""
    doc = load_yaml_bytes(raw)
    check = Collector(list(doc.errors))
    if doc.errors and doc.data is None:
        return ParsedModels(diagnostics=check.sorted())
    data = MarkedDict() if doc.data is None else doc.data
    if not isinstance(data, MarkedDict):  # the loader builds every mapping as a MarkedDict
        check.error("root_not_mapping", "", (1, 1), "the top level must be a mapping")
        return ParsedModels(diagnostics=check.sorted())

    check.check_keys(data, "", _TOP_KEYS, required=("pricing_version", "providers", "models"))
    if "schema_version" in data:
        version = check.integer(
            data["schema_version"], "schema_version", position(data, "schema_version")
        )
        if version is not None and version != 1:
            check.error(
                "unsupported_schema_version",
                "schema_version",
                position(data, "schema_version"),
                f"schema_version: unsupported version {version} (only 1 is accepted)",
            )
    pricing_version = _pricing_version(check, data)
    providers = _parse_providers(check, data)
    models = _parse_models(check, data, providers)
    if check.has_errors():
        return ParsedModels(diagnostics=check.sorted())
    valid_providers = {name: draft for name, draft in providers.items() if draft is not None}
    return ParsedModels(pricing_version, valid_providers, models, check.sorted())


def _pricing_version(check: Collector, data: MarkedDict) -> str | None:
    if "pricing_version" not in data:
        return None
    value = data["pricing_version"]
    where = position(data, "pricing_version")
    if not isinstance(value, str):
        hint = ' (quote it, e.g. "2026-05-08")' if value is not None else ""
        check.error(
            "wrong_type",
            "pricing_version",
            where,
            f"pricing_version: expected a non-empty string{hint}",
        )
        return None
    return check.string(value, "pricing_version", where, nonempty=True)


def _parse_providers(check: Collector, data: MarkedDict) -> dict[str, ProviderDraft | None]:
    """Declared provider names (None when the entry itself is invalid) and their fields."""
    drafts: dict[str, ProviderDraft | None] = {}
    if "providers" not in data:
        return drafts
    section = check.mapping(data["providers"], "providers", position(data, "providers"))
    if section is None:
        return drafts
    for name, value in section.items():
        path = join_key("providers", name)
        where = position(section, name)
        if not isinstance(name, str) or not _PROVIDER_NAME_RE.fullmatch(name):
            check.error(
                "out_of_range",
                path,
                where,
                f"{path}: provider name must match ^[a-z][a-z0-9_-]{{0,31}}$",
            )
            continue
        drafts[name] = _parse_provider(check, name, value, path, where)
    return drafts


def _parse_provider(
    check: Collector, name: str, value: Any, path: str, where: Any
) -> ProviderDraft | None:
    body = check.mapping(value, path, where)
    if body is None:
        return None
    is_local = name == LOCAL_PROVIDER
    check.check_keys(body, path, _LOCAL_PROVIDER_KEYS if is_local else _PROVIDER_KEYS, ("adapter",))
    adapter = None
    if "adapter" in body:
        adapter = check.string(
            body["adapter"], join(path, "adapter"), position(body, "adapter"), choices=_ADAPTERS
        )
    if adapter is not None and (adapter == "scripted") != is_local:
        message = (
            f"{join(path, 'adapter')}: the built-in provider 'local' must use adapter 'scripted'"
            if is_local
            else f"{join(path, 'adapter')}: only the built-in provider 'local' may use adapter 'scripted'"
        )
        check.error("out_of_range", join(path, "adapter"), position(body, "adapter"), message)
        adapter = None
    fields: dict[str, Any] = {}
    if "base_url" in body and body["base_url"] is not None:
        url = check.string(body["base_url"], join(path, "base_url"), position(body, "base_url"))
        if url is not None and not _URL_RE.fullmatch(url):
            check.error(
                "out_of_range",
                join(path, "base_url"),
                position(body, "base_url"),
                f"{join(path, 'base_url')}: must be an http:// or https:// URL",
            )
        fields["base_url"] = url
    if "api_key_env" in body and body["api_key_env"] is not None:
        fields["api_key_env"] = _env_name(check, body, path)
    if "api_key" in body and body["api_key"] is not None:
        # The literal value is never put into a message.
        if not isinstance(body["api_key"], str):
            check.wrong_type(
                join(path, "api_key"), position(body, "api_key"), "a string", body["api_key"]
            )
        fields["api_key"] = body["api_key"] if isinstance(body["api_key"], str) else None
        reference = _ENV_REFERENCE_RE.fullmatch(fields["api_key"] or "")
        if reference is not None:  # a variable's name (no secret): it is said back
            name = reference["name"]
            check.error(
                "out_of_range",
                join(path, "api_key"),
                position(body, "api_key"),
                f"{join(path, 'api_key')}: {fields['api_key']} would be sent as the key itself: "
                f"this file expands no variables; name the variable instead (api_key_env: {name})",
            )
    if "api_key" in fields and "api_key_env" in fields:
        check.error(
            "conflicting_keys",
            path,
            position(body, "api_key"),
            f"{path}: set either api_key or api_key_env, not both",
        )
    for key in ("connect_timeout_s", "read_timeout_s"):
        if key in body:
            fields[key] = check.number(
                body[key], join(path, key), position(body, key), positive=True
            )
    fields["options"] = _parse_options(check, body, path, adapter)
    if adapter is None:
        return None
    return ProviderDraft(name, adapter, fields)


def _env_name(check: Collector, body: dict[str, Any], path: str) -> str | None:
    """`api_key_env`: the name of the variable holding the key. What is written there is never
    put into a message: a key pasted in place of the name would be printed back by every
    command that checks the file, and into the daemon's log."""
    key_path, where = join(path, "api_key_env"), position(body, "api_key_env")
    value = check.string(body["api_key_env"], key_path, where)
    if value is None or _ENV_NAME_RE.fullmatch(value):
        return value
    check.error(
        "out_of_range",
        key_path,
        where,
        f"{key_path}: must be the name of an environment variable (A-Z, 0-9 and _, not "
        "starting with a digit), such as OPENAI_API_KEY; the value written is not shown, in "
        "case it is the key itself (put the key in that variable, never in this file)",
    )
    return None


def _parse_options(
    check: Collector, body: MarkedDict, path: str, adapter: str | None
) -> dict[str, Any]:
    """Adapter options, closed per adapter, with their defaults filled in."""
    defaults = {"openai": _OPENAI_DEFAULT_OPTIONS, "scripted": SCRIPTED_DEFAULT_OPTIONS}.get(
        adapter or "", {}
    )
    options = dict(defaults)
    if "options" not in body or body["options"] is None or adapter is None:
        return options
    opt_path = join(path, "options")
    section = check.mapping(body["options"], opt_path, position(body, "options"))
    if section is None:
        return options
    check.check_keys(section, opt_path, tuple(defaults))
    for key, value in section.items():
        key_path, where = join_key(opt_path, key), position(section, key)
        if key == "max_tokens_field":
            options[key] = check.string(
                value, key_path, where, choices=("max_completion_tokens", "max_tokens")
            )
        elif key == "stream_include_usage":
            options[key] = check.boolean(value, key_path, where)
        elif key == "chunk_chars":
            options[key] = check.integer(value, key_path, where, minimum=1, maximum=256)
        elif key == "delta_delay_ms":
            options[key] = check.integer(value, key_path, where, minimum=0, maximum=5000)
    return options


def _parse_models(
    check: Collector, data: MarkedDict, providers: dict[str, ProviderDraft | None]
) -> list[ModelEntry]:
    if "models" not in data:
        return []
    items = check.list_of(data["models"], "models", position(data, "models"))
    if items is None:
        return []
    entries: list[ModelEntry] = []
    seen_ids: dict[str, int] = {}
    seen_aliases: dict[str, str] = {}
    ids = {m["id"] for m in items if isinstance(m, dict) and isinstance(m.get("id"), str)}
    ids.add(SCRIPTED_MODEL_ID)
    for index, item in enumerate(items):
        path = join("models", index)
        body = check.mapping(item, path, position(items, index))
        if body is None:
            continue
        # the id as written, recorded before the entry is parsed: an entry with other errors
        # still claims its id, so a later duplicate of it is reported in the same pass
        raw_id = body.get("id")
        first = seen_ids.setdefault(raw_id, index) if isinstance(raw_id, str) and raw_id else index
        if first != index:
            check.error(
                "duplicate_model",
                join(path, "id"),
                position(body, "id"),
                f"{join(path, 'id')}: duplicate model id '{raw_id}' (first at models[{first}])",
            )
        entry = _parse_model(check, body, path, providers, ids, seen_aliases)
        if entry is not None and first == index:
            entries.append(entry)
    if SCRIPTED_MODEL_ID not in seen_ids:
        entries.append(_scripted_entry((), None))
    return entries


def _parse_model(
    check: Collector,
    body: MarkedDict,
    path: str,
    providers: dict[str, ProviderDraft | None],
    all_ids: set[str],
    seen_aliases: dict[str, str],
) -> ModelEntry | None:
    check.check_keys(body, path, _MODEL_KEYS, ("id",))
    model_id = _model_id(check, body, path, providers)
    builtin = body.get("id") == SCRIPTED_MODEL_ID
    if not builtin:
        for key in ("capabilities", "pricing"):
            if key not in body:
                check.error(
                    "missing_key", path, position(body), f"{path}: missing required key '{key}'"
                )
    if builtin:
        for key in ("capabilities", "pricing"):
            if key in body:
                check.error(
                    "builtin_model",
                    join(path, key),
                    position(body, key),
                    f"{join(path, key)}: the built-in local:scripted model has fixed {key}; remove it",
                )
    tier = None
    if body.get("tier") is not None:
        tier = check.string(
            body["tier"], join(path, "tier"), position(body, "tier"), choices=_TIERS
        )
    can_delegate = False
    if "can_delegate" in body:
        can_delegate = bool(
            check.boolean(
                body["can_delegate"], join(path, "can_delegate"), position(body, "can_delegate")
            )
        )
    label = None
    if body.get("label") is not None:
        label = check.string(body["label"], join(path, "label"), position(body, "label"))
    aliases = _aliases(check, body, path, model_id or path, all_ids, seen_aliases)
    capabilities = (
        _capabilities(
            check, body["capabilities"], join(path, "capabilities"), position(body, "capabilities")
        )
        if "capabilities" in body and not builtin
        else None
    )
    pricing = (
        _pricing(check, body["pricing"], join(path, "pricing"), position(body, "pricing"))
        if "pricing" in body and not builtin
        else None
    )
    if model_id is None:
        return None
    if builtin:
        return _scripted_entry(aliases, label, tier, can_delegate)
    if capabilities is None or pricing is None:
        return None
    provider, wire_name = split_model_id(model_id)
    draft = providers.get(provider)
    if draft is None:
        return None
    return ModelEntry(
        id=model_id,
        provider=provider,
        wire_name=wire_name,
        adapter=draft.adapter,  # type: ignore[arg-type]
        tier=tier,  # type: ignore[arg-type]
        can_delegate=can_delegate,
        aliases=aliases,
        label=label,
        capabilities=capabilities,
        pricing=pricing,
    )


def _model_id(
    check: Collector, body: MarkedDict, path: str, providers: dict[str, ProviderDraft | None]
) -> str | None:
    if "id" not in body:
        return None
    id_path, where = join(path, "id"), position(body, "id")
    model_id = check.string(body["id"], id_path, where, nonempty=True)
    if model_id is None:
        return None
    provider, sep, name = model_id.partition(":")
    if not sep or not name or any(ch.isspace() for ch in name):
        check.error(
            "out_of_range",
            id_path,
            where,
            f"{id_path}: '{model_id}' is not a model id of the form provider:name (no whitespace)",
        )
        return None
    if provider not in providers and provider != LOCAL_PROVIDER:
        hint = f" (declared: {', '.join(sorted(providers))})" if providers else ""
        check.error(
            "unknown_provider",
            id_path,
            where,
            f"{id_path}: unknown provider '{provider}' in '{model_id}'{hint}",
        )
        return None
    if provider == LOCAL_PROVIDER and model_id != SCRIPTED_MODEL_ID:
        check.error(
            "out_of_range",
            id_path,
            where,
            f"{id_path}: provider 'local' only serves the built-in model {SCRIPTED_MODEL_ID}",
        )
        return None
    return model_id


def _aliases(
    check: Collector,
    body: MarkedDict,
    path: str,
    owner: str,
    all_ids: set[str],
    seen: dict[str, str],
) -> tuple[str, ...]:
    if body.get("aliases") is None:
        return ()
    alias_path = join(path, "aliases")
    items = check.list_of(body["aliases"], alias_path, position(body, "aliases"))
    if items is None:
        return ()
    result: list[str] = []
    for index, alias in enumerate(items):
        item_path, where = join(alias_path, index), position(items, index)
        if isinstance(alias, str) and alias in all_ids:
            check.error(
                "alias_is_id", item_path, where, f"{item_path}: alias '{alias}' equals a model id"
            )
            continue
        value = check.string(
            alias, item_path, where, pattern=_ALIAS_RE, pattern_text="^[a-z0-9][a-z0-9._-]{0,63}$"
        )
        if value is None:
            continue
        folded = value.lower()
        if folded == SCRIPTED_ALIAS and owner != SCRIPTED_MODEL_ID:
            check.error(
                "duplicate_alias",
                item_path,
                where,
                f"{item_path}: alias '{value}' is reserved for {SCRIPTED_MODEL_ID}",
            )
            continue
        if folded in seen:
            check.error(
                "duplicate_alias",
                item_path,
                where,
                f"{item_path}: alias '{value}' is already used by {seen[folded]}",
            )
            continue
        seen[folded] = owner
        result.append(value)
    return tuple(result)


def _capabilities(check: Collector, value: Any, path: str, where: Any) -> Capabilities | None:
    body = check.mapping(value, path, where)
    if body is None:
        return None
    before = len(check.errors)
    check.check_keys(body, path, _CAPABILITY_KEYS, ("max_context_tokens", "max_output_tokens"))
    fields: dict[str, Any] = {}
    for key, default in _CAPABILITY_BOOLS.items():
        fields[key] = (
            check.boolean(body[key], join(path, key), position(body, key))
            if key in body
            else default
        )
    context = output = None
    if "max_context_tokens" in body:
        context = check.integer(
            body["max_context_tokens"],
            join(path, "max_context_tokens"),
            position(body, "max_context_tokens"),
            minimum=1024,
        )
    if "max_output_tokens" in body:
        output = check.integer(
            body["max_output_tokens"],
            join(path, "max_output_tokens"),
            position(body, "max_output_tokens"),
            minimum=1,
        )
    if context is not None and output is not None and output >= context:
        # the output is kept out of the window: with it all, no turn's input would fit
        out_path = join(path, "max_output_tokens")
        check.error(
            "out_of_range",
            out_path,
            position(body, "max_output_tokens"),
            f"{out_path}: must be less than max_context_tokens ({context}), which holds the "
            "input too",
        )
    if len(check.errors) > before or context is None or output is None:
        return None
    return Capabilities(**fields, max_context_tokens=context, max_output_tokens=output)


def _pricing(check: Collector, value: Any, path: str, where: Any) -> Pricing | None:
    body = check.mapping(value, path, where)
    if body is None:
        return None
    before = len(check.errors)
    check.check_keys(body, path, PRICE_KEYS, ("input_per_mtok", "output_per_mtok"))
    prices = {
        key: check.decimal(body[key], join(path, key), position(body, key))
        for key in PRICE_KEYS
        if key in body
    }
    if len(check.errors) > before or prices.get("input_per_mtok") is None:
        return None
    prices.setdefault("cache_read_per_mtok", prices["input_per_mtok"])
    prices.setdefault("cache_write_per_mtok", prices["input_per_mtok"])
    # No price is None here: a price that failed to parse added an error above.
    return Pricing(**{key: value for key, value in prices.items() if value is not None})


def _scripted_entry(
    extra_aliases: tuple[str, ...],
    label: str | None,
    tier: str | None = None,
    can_delegate: bool = False,
) -> ModelEntry:
    aliases = (SCRIPTED_ALIAS, *(a for a in extra_aliases if a.lower() != SCRIPTED_ALIAS))
    return ModelEntry(
        id=SCRIPTED_MODEL_ID,
        provider=LOCAL_PROVIDER,
        wire_name="scripted",
        adapter="scripted",
        tier=tier,  # type: ignore[arg-type]
        can_delegate=can_delegate,
        aliases=aliases,
        label=label or SCRIPTED_LABEL,
        capabilities=SCRIPTED_CAPABILITIES,
        pricing=SCRIPTED_PRICING,
    )


__all__ = [
    "LOCAL_PROVIDER",
    "PRICE_KEYS",
    "SCRIPTED_DEFAULT_OPTIONS",
    "SCRIPTED_MODEL_ID",
    "ParsedModels",
    "ProviderDraft",
    "parse_models_yaml",
]
