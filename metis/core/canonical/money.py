"""Decimal amounts (USD) and their wire form: exact strings, never floats."""

from __future__ import annotations

from decimal import Decimal


def decimal_str(value: Decimal | int | str) -> str:
    """Plain positional notation, trailing fractional zeros stripped, zero as "0"."""
    d = Decimal(value)
    if not d.is_finite():
        raise ValueError(f"not a finite decimal: {value!r}")
    if d == 0:
        return "0"
    text = format(d, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text
