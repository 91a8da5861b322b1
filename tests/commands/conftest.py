"""Fixtures shared by the command tests."""

from __future__ import annotations
