"""The metis WebSocket streaming surface (docs/api.md): handshake, connection, hand-off, wire."""

from metis.server.ws.handshake import routes

__all__ = ["routes"]
