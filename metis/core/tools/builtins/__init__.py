"""The six built-in tools, in the order the contract lists them."""

from __future__ import annotations

from collections.abc import Callable

from metis.core.canonical.tools import ToolDefinition
from metis.core.tools.base import Tool
from metis.core.tools.builtins import grep_files, list_dir, patch_file, read_file, shell, write_file
from metis.core.tools.bwrap import ShellSandbox
from metis.core.tools.settings import BUILTIN_TOOL_NAMES, ToolsSettings
from metis.core.tools.timeouts import InputTimeout

BuiltinSpec = tuple[ToolDefinition, Callable[[], Tool], InputTimeout | None]


def builtin_tools(
    settings: ToolsSettings, shell_sandbox: ShellSandbox | None = None
) -> list[BuiltinSpec]:
    """Definition, factory and input-timeout rule of each builtin, in contract order; the
    shell's says what `shell_sandbox` (None: unsandboxed) allows."""
    shell_settings = settings.shell
    specs: list[BuiltinSpec] = [
        (read_file.DEFINITION, read_file.ReadFileTool, None),
        (write_file.DEFINITION, write_file.WriteFileTool, None),
        (patch_file.DEFINITION, patch_file.PatchFileTool, None),
        (list_dir.DEFINITION, list_dir.ListDirTool, None),
        (grep_files.DEFINITION, grep_files.GrepFilesTool, None),
        (
            shell.definition(
                shell_settings.default_timeout_seconds,
                shell_settings.max_timeout_seconds,
                shell_sandbox,
            ),
            shell.ShellTool,
            InputTimeout(
                field="timeout_seconds",
                default=shell_settings.default_timeout_seconds,
                maximum=shell_settings.max_timeout_seconds,
            ),
        ),
    ]
    assert tuple(d.name for d, _, _ in specs) == BUILTIN_TOOL_NAMES
    return specs
