"""models.yaml → ModelRegistry."""

from __future__ import annotations

import textwrap
from decimal import Decimal
from pathlib import Path

import pytest

from metis.config import SHIPPED_CONFIG_DIR
from metis.core.canonical.redaction import redact
from metis.core.errors import ConfigError, ModelNotConfigured
from metis.core.models.registry import (
    SCRIPTED_MODEL_ID,
    ModelRegistry,
    RegistryLoad,
    load_models_bytes,
    load_registry,
)

SHIPPED = SHIPPED_CONFIG_DIR / "models.yaml"
EXAMPLE = Path(__file__).resolve().parents[2] / "fixtures" / "models.yaml"

BASE = """\
schema_version: 1
pricing_version: "2026-05-08"
providers:
  anthropic:
    adapter: anthropic
    api_key_env: ANTHROPIC_API_KEY
  ollama:
    adapter: openai
    base_url: http://127.0.0.1:11434/v1
models:
  - id: anthropic:claude-sonnet-4-6
    aliases: [sonnet]
    capabilities: {max_context_tokens: 200000, max_output_tokens: 64000}
    pricing: {input_per_mtok: "3.00", output_per_mtok: "15.00"}
  - id: ollama:qwen2.5-coder:14b
    aliases: [qwen-coder]
    capabilities: {max_context_tokens: 32768, max_output_tokens: 4096}
    pricing: {input_per_mtok: 0.1, output_per_mtok: 0}
"""


def load(text: str, env: dict[str, str] | None = None) -> RegistryLoad:
    return load_models_bytes(textwrap.dedent(text).encode(), env={} if env is None else env)


def registry(text: str, env: dict[str, str] | None = None) -> ModelRegistry:
    result = load(text, env)
    assert result.registry is not None, [d.render() for d in result.diagnostics]
    return result.registry


def errors(text: str) -> list[str]:
    result = load(text)
    assert result.registry is None
    return [d.render() for d in result.errors]


# ---- ids, aliases, built-in ------------------------------------------------------------------


def test_model_id_splits_on_the_first_colon_only() -> None:
    entry = registry(BASE).get("ollama:qwen2.5-coder:14b")
    assert entry is not None
    assert (entry.provider, entry.wire_name, entry.adapter) == (
        "ollama",
        "qwen2.5-coder:14b",
        "openai",
    )


def test_aliases_resolve_case_insensitively_and_ids_resolve_to_themselves() -> None:
    reg = registry(BASE)
    assert reg.resolve("SONNET") == "anthropic:claude-sonnet-4-6"
    assert reg.resolve("Qwen-Coder") == "ollama:qwen2.5-coder:14b"
    assert reg.resolve("anthropic:claude-sonnet-4-6") == "anthropic:claude-sonnet-4-6"
    assert reg.resolve("Anthropic:claude-sonnet-4-6") is None  # ids are case-sensitive
    assert reg.resolve("nope") is None


def test_builtin_scripted_model_is_always_registered_last_when_unlisted() -> None:
    reg = registry(BASE)
    last = reg.models()[-1]
    assert last.id == SCRIPTED_MODEL_ID and last.scripted
    assert last.aliases == ("scripted",)
    assert last.label == "offline scripted model (deterministic, not an LLM)"
    caps = last.capabilities
    assert (caps.supports_images, caps.supports_tools, caps.supports_thinking) == (True, True, True)
    assert (caps.supports_prompt_caching, caps.max_context_tokens, caps.max_output_tokens) == (
        False,
        200000,
        8192,
    )
    assert last.pricing.input_per_mtok == Decimal(0)
    assert reg.resolve("SCRIPTED") == SCRIPTED_MODEL_ID


def test_listing_the_scripted_model_keeps_its_position_and_adds_aliases_and_options() -> None:
    text = """\
    pricing_version: v1
    providers:
      local: {adapter: scripted, options: {delta_delay_ms: 15}}
      openai: {adapter: openai, api_key: dummy-key}
    models:
      - id: local:scripted
        aliases: [demo]
        label: my demo
      - id: openai:gpt-5
        capabilities: {max_context_tokens: 4096, max_output_tokens: 1024}
        pricing: {input_per_mtok: "1", output_per_mtok: "2"}
    """
    reg = registry(text)
    assert [m.id for m in reg.models()] == [SCRIPTED_MODEL_ID, "openai:gpt-5"]
    scripted = reg.models()[0]
    assert scripted.aliases == ("scripted", "demo") and scripted.label == "my demo"
    local = next(p for p in reg.providers() if p.name == "local")
    assert local.options == {"chunk_chars": 16, "delta_delay_ms": 15}
    openai = next(p for p in reg.providers() if p.name == "openai")
    assert openai.options == {
        "max_tokens_field": "max_completion_tokens",
        "stream_include_usage": True,
    }


def test_scripted_model_refuses_capabilities_and_pricing() -> None:
    text = """\
    pricing_version: v1
    providers: {}
    models:
      - id: local:scripted
        capabilities: {max_context_tokens: 4096, max_output_tokens: 1024}
        pricing: {input_per_mtok: "1", output_per_mtok: "2"}
    """
    found = errors(text)
    assert len(found) == 2
    assert all("built-in local:scripted" in e for e in found)


# ---- validation: every problem in one pass ------------------------------------------------------


def test_every_documented_error_is_reported_in_one_pass_with_lines() -> None:
    text = """\
    pricing_version: "2026-05-08"
    providers:
      anthropic:
        adapter: anthropic
        api_key_env: ANTHROPIC_API_KEY
        api_key_env: OTHER
      openai:
        adapter: openai
        base_urll: http://x
    models:
      - id: anthropic:a
        aliases: [fast]
        capabilities: {max_context_tokens: 200000, max_output_tokens: 1000}
        pricing: {input_per_mtok: "-1", output_per_mtok: "abc"}
      - id: anthropic:b
        aliases: [FAST2, fast, "openai:c"]
        capabilities: {max_context_tokens: 200000, max_output_tokens: 1000}
        pricing: {input_per_mtok: .nan, output_per_mtok: true}
      - id: mistral:large
        capabilities: {max_context_tokens: 200000, max_output_tokens: 1000}
        pricing: {input_per_mtok: "1", output_per_mtok: "1"}
      - id: openai:c
        capabilities: {max_context_tokens: 200000, max_output_tokens: 1000}
        pricing: {input_per_mtok: "1", output_per_mtok: "1"}
    """
    found = errors(text)
    expected = [
        "providers.anthropic.api_key_env: duplicate key 'api_key_env' (line 6)",
        "providers.openai: unknown key 'base_urll' (allowed: adapter, base_url, api_key_env, "
        "api_key, connect_timeout_s, read_timeout_s, options); did you mean 'base_url'? (line 9)",
        "models[0].pricing.input_per_mtok: must not be negative (line 14)",
        "models[0].pricing.output_per_mtok: expected a number or numeric string, got string (line 14)",
        "models[1].aliases[0]: 'FAST2' does not match ^[a-z0-9][a-z0-9._-]{0,63}$ (line 16)",
        "models[1].aliases[1]: alias 'fast' is already used by anthropic:a (line 16)",
        "models[1].aliases[2]: alias 'openai:c' equals a model id (line 16)",
        "models[1].pricing.input_per_mtok: must be a finite number (line 18)",
        "models[1].pricing.output_per_mtok: expected a number or numeric string, got boolean (line 18)",
        "models[2].id: unknown provider 'mistral' in 'mistral:large' (declared: anthropic, openai) "
        "(line 19)",
    ]
    assert found == expected


def test_structural_errors_name_path_and_key() -> None:
    text = """\
    schema_version: 2
    pricing_version: 2026-05-08
    providers:
      Bad Name: {adapter: openai}
      both: {adapter: openai, api_key: a, api_key_env: B}
      sim: {adapter: scripted}
      oa: {adapter: openai, options: {max_tokens_field: nope, chunk_chars: 3}, read_timeout_s: 0}
    models:
      - id: both:m
        tier: huge
        capabilities: {max_context_tokens: 100, max_output_tokens: 1000, supports_tools: "yes"}
        pricing: {output_per_mtok: "1"}
      - id: both:m
        capabilities: {max_context_tokens: 2000, max_output_tokens: 2000}
        pricing: {input_per_mtok: "1", output_per_mtok: "1"}
      - id: "no-colon"
      - id: local:other
    """
    found = "\n".join(errors(text))
    for fragment in (
        "schema_version: unsupported version 2",
        "pricing_version: expected a non-empty string (quote it",
        'providers["Bad Name"]: provider name must match',
        "providers.both: set either api_key or api_key_env, not both",
        "providers.sim.adapter: only the built-in provider 'local' may use adapter 'scripted'",
        "providers.oa.options.max_tokens_field: 'nope' is not one of",
        "providers.oa.options: unknown key 'chunk_chars'",
        "providers.oa.read_timeout_s: must be greater than 0",
        "models[0].tier: 'huge' is not one of fast, balanced, deep",
        "models[0].capabilities.max_context_tokens: must be at least 1024",
        "models[0].capabilities.supports_tools: expected a boolean",
        "models[0].pricing: missing required key 'input_per_mtok'",
        "models[1].capabilities.max_output_tokens: must be less than max_context_tokens (2000), "
        "which holds the input too",
        "models[2]: missing required key 'capabilities'",
        "models[2].id: 'no-colon' is not a model id",
        "models[3].id: provider 'local' only serves the built-in model local:scripted",
    ):
        assert fragment in found, fragment


def test_duplicate_model_ids_are_errors() -> None:
    text = BASE + textwrap.indent(
        textwrap.dedent("""\
        - id: anthropic:claude-sonnet-4-6
          capabilities: {max_context_tokens: 200000, max_output_tokens: 64000}
          pricing: {input_per_mtok: "3", output_per_mtok: "15"}
        """),
        "  ",
    )
    found = errors(text)
    assert found == [
        "models[2].id: duplicate model id 'anthropic:claude-sonnet-4-6' (first at models[0]) (line 19)"
    ]


def test_syntax_and_root_errors_are_diagnostics_not_exceptions() -> None:
    assert errors("providers: [unclosed\n")[0].startswith("YAML syntax")
    assert errors("- a list\n") == ["the top level must be a mapping (line 1)"]
    assert load_models_bytes(b"\xff\xfe").errors[0].code == "not_utf8"
    assert [e.split(": ", 1)[0] for e in errors("# only a comment\n")] == [
        "missing required key 'pricing_version'",
        "missing required key 'providers'",
        "missing required key 'models'",
    ]


def test_load_registry_raises_one_config_error_listing_everything(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text("pricing_version: v\nproviders: {}\nmodels: [{id: x:y}]\nextra: 1\n")
    with pytest.raises(ConfigError) as info:
        load_registry(path, env={})
    assert str(path) in info.value.message
    assert len(info.value.details["errors"]) == 4
    assert "invalid models.yaml (4 errors)" in info.value.message
    assert "unknown key 'extra'" in info.value.message
    path.write_text("pricing_version: v\nproviders: {}\nmodels: []\nextra: 1\n")
    with pytest.raises(ConfigError) as info:
        load_registry(path, env={})
    assert "invalid models.yaml (1 error)" in info.value.message


# ---- prices ----------------------------------------------------------------------------------


def test_prices_are_exact_decimals_and_cache_prices_default_to_input() -> None:
    reg = registry(BASE)
    sonnet = reg.get("anthropic:claude-sonnet-4-6")
    qwen = reg.get("ollama:qwen2.5-coder:14b")
    assert sonnet is not None and qwen is not None
    assert sonnet.pricing.input_per_mtok == Decimal("3.00")
    assert sonnet.pricing.cache_read_per_mtok == Decimal("3.00")
    assert sonnet.pricing.cache_write_per_mtok == Decimal("3.00")
    assert str(qwen.pricing.input_per_mtok) == "0.1"  # a YAML float goes through str()
    assert qwen.pricing.cache_read_per_mtok == Decimal("0.1")


# ---- credentials, offline mode, default model ------------------------------------------------


@pytest.mark.parametrize(
    ("env", "configured", "reason"),
    [
        ({"ANTHROPIC_API_KEY": "sk-ant-secret-1234"}, True, None),
        ({}, False, "no_credentials"),
        ({"ANTHROPIC_API_KEY": ""}, False, "no_credentials"),
        ({"ANTHROPIC_API_KEY": "k", "METIS_OFFLINE": "1"}, False, "offline_forced"),
    ],
)
def test_api_key_env_drives_configuration(
    env: dict[str, str], configured: bool, reason: str | None
) -> None:
    text = """\
    pricing_version: v
    providers: {anthropic: {adapter: anthropic, api_key_env: ANTHROPIC_API_KEY}}
    models:
      - id: anthropic:a
        capabilities: {max_context_tokens: 200000, max_output_tokens: 1000}
        pricing: {input_per_mtok: "1", output_per_mtok: "1"}
    """
    reg = registry(text, env)
    assert reg.is_configured("anthropic:a") is configured
    assert reg.not_configured_reason("anthropic:a") == reason
    assert reg.offline_mode is not configured
    assert reg.default_model() == ("anthropic:a" if configured else None)
    assert reg.not_configured_reason("nope:x") == "unknown"
    assert reg.is_configured(SCRIPTED_MODEL_ID)


def test_resolved_keys_are_registered_for_redaction_and_never_dumped() -> None:
    reg = registry(BASE, {"ANTHROPIC_API_KEY": "zz-very-secret-key"})
    provider = next(p for p in reg.providers() if p.name == "anthropic")
    assert provider.sdk_key == "zz-very-secret-key"
    assert "zz-very-secret-key" not in repr(provider) and "api_key" not in provider.model_dump()
    assert redact("boom zz-very-secret-key") == "boom [redacted]"


def test_whitespace_around_a_key_is_not_part_of_it() -> None:
    """A trailing newline would reach the Authorization header, which the HTTP client refuses."""
    reg = registry(BASE, {"ANTHROPIC_API_KEY": " zz-key-with-newline\n"})
    assert (
        next(p for p in reg.providers() if p.name == "anthropic").sdk_key == "zz-key-with-newline"
    )
    assert redact("boom zz-key-with-newline") == "boom [redacted]"
    blank = registry(BASE, {"ANTHROPIC_API_KEY": " \n"})
    assert blank.not_configured_reason("anthropic:claude-sonnet-4-6") == "no_credentials"
    literal = registry(
        BASE.replace(
            "    base_url: http://127.0.0.1:11434/v1",
            "    base_url: http://h/v1\n    api_key: 'dummy '",
        )
    )
    assert next(p for p in literal.providers() if p.name == "ollama").sdk_key == "dummy"


def test_a_key_no_http_header_can_carry_is_named_in_the_log_not_shown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry(BASE, {"ANTHROPIC_API_KEY": "\u201czz-quoted-key\u201d"})
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith(
        "the key of provider 'anthropic' (ANTHROPIC_API_KEY) holds a character an HTTP header "
        "cannot carry"
    )
    assert "zz-quoted-key" not in caplog.text


def test_keyless_and_literal_key_providers_are_configured_and_end_offline_mode() -> None:
    reg = registry(BASE, {})
    assert reg.is_configured("ollama:qwen2.5-coder:14b")
    assert not reg.is_configured("anthropic:claude-sonnet-4-6")
    assert reg.offline_mode is False
    assert reg.default_model() == "ollama:qwen2.5-coder:14b"
    ollama = next(p for p in reg.providers() if p.name == "ollama")
    assert ollama.sdk_key == "metis-no-key"
    literal = registry(
        BASE.replace(
            "    base_url: http://127.0.0.1:11434/v1",
            "    base_url: http://h/v1\n    api_key: dummy",
        )
    )
    assert next(p for p in literal.providers() if p.name == "ollama").sdk_key == "dummy"


def test_metis_offline_disables_every_provider_but_local() -> None:
    reg = registry(BASE, {"ANTHROPIC_API_KEY": "k", "METIS_OFFLINE": "1"})
    assert reg.offline_mode is True
    assert reg.default_model() is None
    assert reg.not_configured_reason("ollama:qwen2.5-coder:14b") == "offline_forced"
    assert reg.configured_providers() == ["local"]


def test_require_configured_reports_reference_reason_and_env_var() -> None:
    reg = registry(BASE, {})
    assert reg.require_configured("QWEN-coder") == "ollama:qwen2.5-coder:14b"
    with pytest.raises(ModelNotConfigured) as info:
        reg.require_configured("sonnet", source="per_message_override")
    assert info.value.details == {
        "source": "per_message_override",
        "reference": "sonnet",
        "reason": "no_credentials",
        "env_var": "ANTHROPIC_API_KEY",
    }
    with pytest.raises(ModelNotConfigured) as info:
        reg.require_configured("nope")
    assert info.value.details == {"reference": "nope", "reason": "unknown"}


def test_model_for_tier_is_the_first_declared_model_of_that_tier() -> None:
    reg = registry(EXAMPLE.read_text(), {})
    assert reg.model_for_tier("fast") == "anthropic:claude-haiku-4-5"
    assert reg.model_for_tier("deep") == "anthropic:claude-opus-4-7"


# ---- shipped and example files, GET /models ---------------------------------------------------


def test_shipped_models_yaml_has_the_documented_models_in_order() -> None:
    reg = load_registry(SHIPPED, env={})
    assert [m.id for m in reg.models()] == [
        "anthropic:claude-sonnet-4-6",
        "anthropic:claude-opus-4-7",
        "anthropic:claude-haiku-4-5",
        "openai:gpt-5",
        "openai:gpt-5-mini",
        SCRIPTED_MODEL_ID,
    ]
    assert reg.offline_mode and reg.default_model() is None
    local = next(p for p in reg.providers() if p.name == "local")
    assert local.options["delta_delay_ms"] == 0


def test_describe_models_matches_the_documented_body() -> None:
    reg = registry(EXAMPLE.read_text(), {"ANTHROPIC_API_KEY": "k"})
    body = reg.describe_models()
    assert set(body) == {"offline_mode", "pricing_version", "models", "unconfigured"}
    assert body["offline_mode"] is False and body["pricing_version"] == "2026-05-08"
    sonnet = body["models"][0]
    assert sonnet == {
        "id": "anthropic:claude-sonnet-4-6",
        "provider": "anthropic",
        "adapter": "anthropic",
        "wire_name": "claude-sonnet-4-6",
        "tier": "balanced",
        "can_delegate": True,
        "aliases": ["sonnet", "balanced"],
        "scripted": False,
        "label": None,
        "capabilities": {
            "supports_images": True,
            "supports_tools": True,
            "supports_thinking": True,
            "supports_parallel_tool_calls": True,
            "supports_prompt_caching": True,
            "max_context_tokens": 200000,
            "max_output_tokens": 64000,
        },
        "pricing": {
            "input_per_mtok": "3.00",
            "output_per_mtok": "15.00",
            "cache_read_per_mtok": "0.30",
            "cache_write_per_mtok": "3.75",
            "currency": "USD",
            "pricing_version": "2026-05-08",
        },
        "availability": "healthy",
        "availability_detail": None,
    }
    ids = [m["id"] for m in body["models"]]
    assert ids == [
        "anthropic:claude-sonnet-4-6",
        "anthropic:claude-opus-4-7",
        "anthropic:claude-haiku-4-5",
        "ollama:qwen2.5-coder:14b",
        "ollama:llama3.2:3b",
        SCRIPTED_MODEL_ID,
    ]
    scripted = body["models"][-1]
    assert scripted["scripted"] is True and scripted["label"].startswith("offline scripted")
    assert body["unconfigured"] == [
        {
            "id": "openai:gpt-5",
            "provider": "openai",
            "reason": "no_credentials",
            "env_var": "OPENAI_API_KEY",
            "tier": None,
            "aliases": ["gpt5"],
        },
        {
            "id": "openai:gpt-5-mini",
            "provider": "openai",
            "reason": "no_credentials",
            "env_var": "OPENAI_API_KEY",
            "tier": None,
            "aliases": ["gpt5-mini", "mini"],
        },
    ]


def test_adapters_are_built_lazily_once_per_provider_and_closed() -> None:
    import asyncio

    reg = registry(EXAMPLE.read_text(), {"ANTHROPIC_API_KEY": "sk-ant-k"})
    first = reg.adapter_for("anthropic:claude-sonnet-4-6")
    assert reg.adapter_for("anthropic:claude-haiku-4-5") is first
    assert reg.adapter_for(SCRIPTED_MODEL_ID) is not first
    with pytest.raises(ModelNotConfigured):
        reg.adapter_for("openai:gpt-5")
    asyncio.run(reg.aclose())
    assert reg.adapter_for("anthropic:claude-sonnet-4-6") is not first
    asyncio.run(reg.aclose())
