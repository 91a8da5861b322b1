"""JSON and empty responses, encoded by the one compact encoder (`metis/http/jsontext.py`)."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel

from metis.http.jsontext import dumps


def json_response(
    data: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    return web.Response(
        status=status,
        text=dumps(data),
        content_type="application/json",
        charset="utf-8",
        headers=headers,
    )


def no_content(headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=204, headers=headers)


def json_head(status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """The head of a JSON answer without its body, for a HEAD whose GET would do what a HEAD
    must not (mint a token): no `Content-Length`, which only the body would determine."""
    return web.Response(
        status=status, content_type="application/json", charset="utf-8", headers=headers
    )
