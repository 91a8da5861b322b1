"""Step 3 of the pipeline: resolve every path field before confirmation.

Nothing is created or opened here; a missing file is fine. The resolved paths also key the
per-session path lock of write tools.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from metis.core.canonical.tools import ToolDefinition
from metis.core.tools.base import PermissionDenied, ToolError
from metis.core.tools.results import ToolOutcome, expected_failure
from metis.core.tools.sandbox import ResolvedPath, Sandbox, writes_paths


@dataclass(frozen=True)
class PathCheck:
    """`failure` is the `permission_denied` (or workspace-gone `tool_error`) outcome, if any."""

    paths: tuple[ResolvedPath, ...]
    failure: ToolOutcome | None = None


def precheck(definition: ToolDefinition, input: Mapping[str, Any], sandbox: Sandbox) -> PathCheck:
    """Resolve every path field of the input with the tool's access (write for write-class tools);
    the first refusal becomes the call's outcome before anyone is asked to confirm."""
    write = writes_paths(definition.side_effects)
    paths: list[ResolvedPath] = []
    for field in definition.path_fields:
        value = input.get(field)
        if value is None:
            continue
        try:
            paths.append(sandbox.resolve(value, write=write))
        except (PermissionDenied, ToolError) as exc:
            return PathCheck(tuple(paths), expected_failure(exc))
    return PathCheck(tuple(paths))
