"""The routing.yaml example of docs/configuration.md loads as written: a user copies it."""

from __future__ import annotations

import re
from pathlib import Path

from metis.config import SHIPPED_CONFIG_DIR
from metis.core.models.registry import load_models_file
from metis.core.routing.loader import validate_policy
from metis.core.routing.predicates import PREDICATE_KEYS

DOC = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def yaml_blocks() -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def test_the_documented_routing_example_loads_against_the_shipped_models() -> None:
    [example] = [b for b in yaml_blocks() if b.startswith("schema_version: 1\nglobal_default:")]
    keys = {"ANTHROPIC_API_KEY": "k", "OPENAI_API_KEY": "k"}
    registry = load_models_file(SHIPPED_CONFIG_DIR / "models.yaml", env=keys).registry
    assert registry is not None
    result = validate_policy(example.encode(), registry)
    assert result.errors == []
    # the example's workspace need not exist on the machine that runs the tests
    assert {d.code for d in result.diagnostics} <= {"workspace_missing"}
    assert result.policy is not None
    assert result.policy.global_default == "anthropic:claude-sonnet-4-6"
    shown = {key for key in PREDICATE_KEYS if re.search(rf"\b{key}:", example)}
    assert len(shown) >= 10  # it shows the vocabulary, not one predicate
