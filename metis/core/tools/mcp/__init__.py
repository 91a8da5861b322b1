"""MCP servers as tool sources (client side, the official `mcp` SDK).

`settings` (the `mcp:` section of config.yaml) → `manager.McpManager` (one `server.McpServer`
per configured server, started in the background) → their tools in the `ToolRegistry` as
`mcp__<server>__<tool>` (`tools`), dispatched through the same pipeline as the builtins.
"""

from metis.core.tools.mcp.settings import McpServerSettings, McpSettings

__all__ = ["McpServerSettings", "McpSettings"]
