"""Real MCP servers for the tests, written with the official SDK (`MCPServer`, FastMCP's v2
name): `demo.py` runs over stdio or Streamable HTTP; and one written by hand, `malformed.py`,
whose tool listing the SDK cannot read as it is."""
