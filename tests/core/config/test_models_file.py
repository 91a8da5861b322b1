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
