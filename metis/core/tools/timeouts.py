"""Effective timeouts.

Most tools get their class default, overridden per class and then per tool in `config.yaml`.
A tool whose timeout is part of its input (the shell) uses that value capped by its maximum,
enforces it itself, and gets a hard limit a little later so it can report partial output.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from metis.core.tools.settings import DEFAULT_CLASS_TIMEOUTS, TimeoutsSettings

if TYPE_CHECKING:
    from metis.core.tools.registry import RegisteredTool


@dataclass(frozen=True)
class InputTimeout:
    """The timeout comes from input `field` (else `default`), capped by `maximum`.

    The tool enforces it itself; the executor's hard limit is `margin_seconds` later.
    """

    field: str
    default: float
    maximum: float
    margin_seconds: float = 10.0


def effective_timeout(
    entry: RegisteredTool, input: Mapping[str, Any], timeouts: TimeoutsSettings
) -> float:
    """Seconds for `tool.called.timeout_seconds` and the tool's own deadline."""
    spec = entry.input_timeout
    if spec is not None:
        requested = input.get(spec.field, spec.default)
        return float(min(requested, spec.maximum))
    definition = entry.definition
    if definition.name in timeouts.per_tool:
        return float(timeouts.per_tool[definition.name])
    if definition.timeout_seconds is not None:
        return float(definition.timeout_seconds)
    side_effects = definition.side_effects
    return float(timeouts.per_class.get(side_effects, DEFAULT_CLASS_TIMEOUTS[side_effects]))


def hard_limit(entry: RegisteredTool, effective: float) -> float:
    """When the executor stops waiting: the effective timeout, plus the margin of a tool
    that enforces its own timeout."""
    spec = entry.input_timeout
    return effective + (spec.margin_seconds if spec is not None else 0.0)
