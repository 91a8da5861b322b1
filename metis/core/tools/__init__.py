"""Built-in tools, the workspace sandbox and the pure parts of the tool pipeline.

The dispatcher (events, storage, slots, confirmations) is built on this API:
`ToolRegistry` (lookup and offer) → `RegisteredTool.validate` → `precheck` → `resolve_mode`
and `summarize` → `ToolExecutor.timeout_for` / `ToolExecutor.run` → `ToolOutcome`.

Each part is imported from its own module (`metis.core.tools.registry`, `.executor`, …); the
package itself imports nothing, so what needs only the settings (every client command reads
`config.yaml`, and with it the `tools` and `mcp` sections) does not load the executor and the
built-in tools: 15 ms of each command's start.
"""
