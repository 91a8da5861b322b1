"""The web dashboard the daemon serves at `/` (docs/dashboard.md).

Static files ship in `static/`; markdown is rendered and sanitized here, server-side
(`render.py`), because model output is untrusted; `routes.py` serves both plus the costs
summary the Costs view charts.
"""
