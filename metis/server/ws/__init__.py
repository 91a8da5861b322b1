"""The metis WebSocket streaming surface (websocket.md): handshake, connection, seam, wire."""

from metis.server.ws.handshake import routes

__all__ = ["routes"]
