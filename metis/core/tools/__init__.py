"""Built-in tools, the workspace sandbox and the pure parts of the tool pipeline.

The dispatcher (events, storage, slots, confirmations) is built on this API:
`ToolRegistry` (lookup and offer) → `RegisteredTool.validate` → `precheck` → `resolve_mode`
and `summarize` → `ToolExecutor.timeout_for` / `ToolExecutor.run` → `ToolOutcome`.
"""

from metis.core.tools.base import (
    PathOutsideWorkspace,
    PermissionDenied,
    ProtectedPath,
    Tool,
    ToolCancelled,
    ToolContext,
    ToolError,
    ToolInterrupted,
    ToolLimits,
    ToolNameConflict,
    ToolOutput,
    ToolRegistrationError,
    ToolTimedOut,
)
from metis.core.tools.executor import ToolExecutor
from metis.core.tools.policy import ModeResolution, SurfaceToolPolicy, resolve_mode
from metis.core.tools.precheck import PathCheck, precheck
from metis.core.tools.registry import RegisteredTool, ToolRegistry
from metis.core.tools.results import ErrorClass, ToolOutcome
from metis.core.tools.sandbox import ResolvedPath, Sandbox
from metis.core.tools.schema import InputError, InputValidation, SchemaError
from metis.core.tools.settings import (
    BUILTIN_TOOL_NAMES,
    ToolsSettings,
    check_env_passthrough,
    limits_from_settings,
)
from metis.core.tools.summary import ConfirmationSummary, summarize
from metis.core.tools.timeouts import InputTimeout, effective_timeout, hard_limit

__all__ = [
    "BUILTIN_TOOL_NAMES",
    "ConfirmationSummary",
    "ErrorClass",
    "InputError",
    "InputTimeout",
    "InputValidation",
    "ModeResolution",
    "PathCheck",
    "PathOutsideWorkspace",
    "PermissionDenied",
    "ProtectedPath",
    "RegisteredTool",
    "ResolvedPath",
    "Sandbox",
    "SchemaError",
    "SurfaceToolPolicy",
    "Tool",
    "ToolCancelled",
    "ToolContext",
    "ToolError",
    "ToolExecutor",
    "ToolInterrupted",
    "ToolLimits",
    "ToolNameConflict",
    "ToolOutcome",
    "ToolOutput",
    "ToolRegistrationError",
    "ToolRegistry",
    "ToolTimedOut",
    "ToolsSettings",
    "check_env_passthrough",
    "effective_timeout",
    "hard_limit",
    "limits_from_settings",
    "precheck",
    "resolve_mode",
    "summarize",
]
