"""A small MCP server for the tests: `python demo.py` (stdio) or
`python demo.py http PORT` (Streamable HTTP on 127.0.0.1:PORT, path /mcp).

`MCP_DEMO_LOG` (a file path) receives one line per notable thing the server sees: calls,
cancellations, the environment names a test asks for. `MCP_DEMO_ALIAS` names one more tool, an
alias of `add` (for name clashes between servers).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Annotated

from mcp.server.mcpserver import Image, MCPServer
from mcp_types import ImageContent, TextContent
from pydantic import Field

server = MCPServer("demo", instructions="A demo server for metis tests.")
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6300010000050001a5f645400000000049454e44ae426082"
)


def note(line: str) -> None:
    path = os.environ.get("MCP_DEMO_LOG")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


@server.tool()
def add(a: int, b: Annotated[int, Field(ge=0)] = 2) -> str:
    """Add two integers."""
    note(f"add {a} {b}")
    return str(a + b)


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer (cancellable)."""
    note("slow started")
    try:
        await asyncio.sleep(seconds)
    except BaseException:
        note("slow cancelled")
        raise
    note("slow finished")
    return "slept"


@server.tool(structured_output=False)  # sent once: not again as `structuredContent`
def big(megabytes: int) -> str:
    """A large text result."""
    return "x" * (megabytes * 1024 * 1024)


@server.tool()
def picture() -> list[TextContent | ImageContent]:
    """A caption and a PNG image."""
    image = Image(data=PNG, format="png").to_image_content()
    return [TextContent(type="text", text="a one-pixel image"), image]


@server.tool()
def env(name: str) -> str:
    """Whether an environment variable is set in the server (never its value)."""
    return "set" if name in os.environ else "unset"


@server.tool()
def whoami() -> str:
    """The server's process id."""
    return str(os.getpid())


@server.tool()
def spawn() -> str:
    """Start a long sleep in the server's process group; its pid."""
    child = subprocess.Popen(["sleep", "300"])
    return str(child.pid)


@server.tool()
def fail() -> str:
    """Always fails."""
    raise ValueError("this tool always fails")


if os.environ.get("MCP_DEMO_ALIAS"):
    server.add_tool(add, name=os.environ["MCP_DEMO_ALIAS"])


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
