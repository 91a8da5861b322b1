"""models.yaml validation reports every problem of the file in one pass."""

from __future__ import annotations

from metis.core.models.registry import load_models_bytes

TWICE = """\
schema_version: 1
pricing_version: "t-1"
providers:
  loc: {adapter: openai, base_url: "http://127.0.0.1:9/v1", api_key: x}
models:
  - id: loc:m1
    capabilities: {max_context_tokens: 100000, max_output_tokens: 1000, bogus: 1}
    pricing: {input_per_mtok: "0", output_per_mtok: "0"}
  - id: loc:m1
    capabilities: {max_context_tokens: 100000, max_output_tokens: 1000}
    pricing: {input_per_mtok: "0", output_per_mtok: "0"}
"""


def test_a_duplicate_id_is_reported_when_its_first_entry_has_another_error() -> None:
    """The first entry's own error does not hide that the second one reuses its id."""
    diagnostics = load_models_bytes(TWICE.encode(), env={}).diagnostics
    assert [(d.code, d.path, d.line) for d in diagnostics] == [
        ("unknown_key", "models[0].capabilities", 7),
        ("duplicate_model", "models[1].id", 9),
    ]
    assert (
        diagnostics[1].message == "models[1].id: duplicate model id 'loc:m1' (first at models[0])"
    )


KEY_IN_PLACE_OF_NAME = """\
schema_version: 1
pricing_version: "t-1"
providers:
  openai: {adapter: openai, api_key_env: sk-proj-Abc123SECRETvalue}
models: []
"""


def test_a_key_written_where_its_variable_is_named_is_refused_without_being_shown() -> None:
    """Every command that checks the file prints its errors, and the daemon logs them: a key
    pasted into `api_key_env` must not be printed back."""
    diagnostics = load_models_bytes(KEY_IN_PLACE_OF_NAME.encode(), env={}).diagnostics
    assert [(d.code, d.path, d.line) for d in diagnostics] == [
        ("out_of_range", "providers.openai.api_key_env", 4)
    ]
    message = diagnostics[0].message
    assert "SECRET" not in message and "sk-proj" not in message
    assert "name of an environment variable" in message and "OPENAI_API_KEY" in message


def test_a_variable_written_as_the_key_is_refused_naming_the_key_to_use_instead() -> None:
    """`api_key: ${OPENAI_API_KEY}` is a shell's idiom: taken literally, every call would send
    those 17 characters as the key and be refused by the provider."""
    text = KEY_IN_PLACE_OF_NAME.replace("api_key_env: sk-proj-Abc123SECRETvalue", "api_key: $X")
    for written in ("${OPENAI_API_KEY}", "$OPENAI_API_KEY"):
        source = text.replace("$X", f'"{written}"')
        diagnostics = load_models_bytes(source.encode(), env={}).diagnostics
        assert [(d.code, d.path) for d in diagnostics] == [
            ("out_of_range", "providers.openai.api_key")
        ]
        assert "(api_key_env: OPENAI_API_KEY)" in diagnostics[0].message
    plain = text.replace("$X", '"sk-local-not-a-reference"')
    assert load_models_bytes(plain.encode(), env={}).diagnostics == []


NULL_KEYS = """\
pricing_version: "t-1"
~: 1
providers:
  local: {adapter: scripted}
  ~: {adapter: openai}
  loc:
    adapter: openai
    base_url: "http://127.0.0.1:9/v1"
    options: {~: 1}
models:
  - id: local:scripted
"""


def test_a_key_left_null_is_named_null_at_its_own_line() -> None:
    """Not `None` (Python's word) nor the line of the mapping that holds it."""
    diagnostics = load_models_bytes(NULL_KEYS.encode(), env={}).diagnostics
    assert [(d.path, d.line, d.message) for d in diagnostics] == [
        (
            "",
            2,
            "unknown key null (allowed: schema_version, pricing_version, providers, models)",
        ),
        ("providers.null", 5, "providers.null: provider name must match ^[a-z][a-z0-9_-]{0,31}$"),
        (
            "providers.loc.options",
            9,
            "providers.loc.options: unknown key null "
            "(allowed: max_tokens_field, stream_include_usage)",
        ),
    ]
