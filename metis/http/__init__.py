"""The HTTP kernel both surfaces are built on (metis REST/WebSocket in `metis/server`, AAP in
`metis/aap`): route tables, the wire-error base and JSON error body, JSON responses, request
body reading, OpenAPI assembly, the daemon's bearer key, and when aiohttp's default TLS
contexts read the system's CA bundle (`ca_bundle`).

The kernel knows no surface: each surface keeps its own closed error table, envelope codes,
middleware and routes, and imports the kernel rather than the other surface.
"""
