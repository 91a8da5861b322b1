"""The one compact JSON encoder of every HTTP/WebSocket/SSE body (no aiohttp: pure modules such
as the WebSocket frame codec use it too)."""

from __future__ import annotations

import json
from typing import Any

# One shared encoder: `dumps` runs once per response and once per streamed event or frame.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def dumps(data: Any) -> str:
    """Compact JSON, non-ASCII text kept as is (bodies and frames are sent as UTF-8)."""
    return _ENCODER.encode(data)
