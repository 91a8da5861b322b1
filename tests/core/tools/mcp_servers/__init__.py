"""Real MCP servers for the tests, written with the official SDK (`MCPServer`, FastMCP's v2
name): `demo.py` runs over stdio or Streamable HTTP; and three written by hand: `malformed.py`,
whose tool listing the SDK cannot read as it is, `telltale.py`, whose failures repeat its
environment, and `growing.py`, whose tools change as it runs. `python_server` writes the config.yaml entry that starts one (or any Python code)
with this interpreter."""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEMO = HERE / "demo.py"
MALFORMED = HERE / "malformed.py"
TELLTALE = HERE / "telltale.py"
GROWING = HERE / "growing.py"


def python_server(*args: str | Path, **settings: object) -> str:
    """An entry of `mcp.servers` that runs this Python with `args`, plus `settings` (a JSON
    object: YAML reads it as a flow mapping)."""
    return json.dumps({"command": sys.executable, "args": [str(a) for a in args], **settings})
