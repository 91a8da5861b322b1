"""Token usage as adapters report it, and the cost core derives from it."""

from decimal import Decimal, localcontext
from typing import Any, Protocol

from pydantic import ConfigDict, Field

from metis.core.canonical.money import decimal_str
from metis.core.datamodel import DataModel


class TokenUsage(DataModel):
    """Token buckets as reported (or estimated) by an adapter; the three input buckets are disjoint."""

    model_config = ConfigDict(frozen=True)

    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cache_read_tokens: int = Field(default=0, ge=0)
    cache_write_tokens: int = Field(default=0, ge=0)
    estimated: bool = False


class Usage(DataModel):
    """TokenUsage plus what core derives from it: Decimal cost, pricing version, latency."""

    model_config = ConfigDict(frozen=True)

    input_tokens: int = Field(default=0, ge=0)
    cache_read_tokens: int = Field(default=0, ge=0)
    cache_write_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cost_usd: Decimal = Decimal(0)
    pricing_version: str = ""
    latency_ms: int = 0
    estimated: bool = False

    def wire(self) -> dict[str, Any]:
        """The usage as surfaces and message metadata carry it: the cost as an exact decimal string,
        never a float."""
        data = self.model_dump()
        data["cost_usd"] = decimal_str(self.cost_usd)
        return data


class Prices(Protocol):
    """USD per million tokens of each bucket (a model's `pricing` in models.yaml)."""

    @property
    def input_per_mtok(self) -> Decimal: ...
    @property
    def output_per_mtok(self) -> Decimal: ...
    @property
    def cache_read_per_mtok(self) -> Decimal: ...
    @property
    def cache_write_per_mtok(self) -> Decimal: ...


def compute_cost(usage: TokenUsage, pricing: Prices) -> Decimal:
    """USD cost of one call from per-million-token prices, never quantized.

    Computed in a 28-significant-digit decimal context whatever the caller's context is, so
    the same usage always prices to the same Decimal.
    """
    with localcontext() as ctx:
        ctx.prec = 28
        total: Decimal = (
            Decimal(usage.input_tokens) * pricing.input_per_mtok
            + Decimal(usage.cache_read_tokens) * pricing.cache_read_per_mtok
            + Decimal(usage.cache_write_tokens) * pricing.cache_write_per_mtok
            + Decimal(usage.output_tokens) * pricing.output_per_mtok
        ) / Decimal(1_000_000)
    return total
