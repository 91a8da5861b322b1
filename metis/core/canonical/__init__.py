"""Canonical vocabulary shared by every layer, one module per concept.

Everything here is pure (no I/O, no HTTP), so providers, tools, the store and all three
surfaces agree on one representation and one serializer for each concept.
"""
