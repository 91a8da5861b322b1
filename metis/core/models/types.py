"""Frozen data types of the model registry, shared by registry, adapters and routing.

Kept apart from `registry.py` (which loads and validates `models.yaml`) so that provider adapters
depend only on these shapes, never on the loader.
"""

from decimal import Decimal
from typing import Any, Literal

from pydantic import ConfigDict, Field

from metis.core.datamodel import DataModel

AdapterKind = Literal["anthropic", "openai", "scripted"]
Tier = Literal["fast", "balanced", "deep"]
KEYLESS_PLACEHOLDER = "metis-no-key"


class ProviderConfig(DataModel):
    """One `providers.<name>` entry with its credential resolved at start-up.

    `api_key` holds the resolved secret (from `api_key_env` or the literal), or None for keyless
    providers; it is excluded from every dump and repr so it can never be echoed or logged.
    """

    model_config = ConfigDict(frozen=True)

    name: str
    adapter: AdapterKind
    base_url: str | None = None
    api_key_env: str | None = None
    api_key: str | None = Field(default=None, exclude=True, repr=False)
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 120.0
    options: dict[str, Any] = Field(default_factory=dict)

    @property
    def sdk_key(self) -> str:
        """The key handed to the SDK: the resolved one, else the keyless placeholder."""
        return self.api_key or KEYLESS_PLACEHOLDER

    @property
    def key_source(self) -> str:
        """Where the key was set, as a person would look for it: its environment variable, else
        the provider's entry in models.yaml."""
        return self.api_key_env or f"providers.{self.name}.api_key"

    def unusable_key(self) -> str | None:
        """Why the key can never be sent, or None. An HTTP header carries printable ASCII only;
        a key pasted with typographic quotes or a stray control character would make every call
        fail inside the HTTP client, so the adapters refuse it up front with this message,
        which names where the key is set and never the key."""
        key = self.api_key
        if key is None or (key.isascii() and key.isprintable()):
            return None
        return (
            f"the key of provider '{self.name}' ({self.key_source}) holds a character an HTTP "
            "header cannot carry (a typographic quote copied with it?); fix it and restart metis"
        )


class Capabilities(DataModel):
    """What a model can do and its token limits; routing validates candidates against these."""

    model_config = ConfigDict(frozen=True)

    supports_images: bool = False
    supports_tools: bool = True
    supports_thinking: bool = False
    supports_parallel_tool_calls: bool = True
    supports_prompt_caching: bool = False
    max_context_tokens: int
    max_output_tokens: int


class Pricing(DataModel):
    """USD per million tokens, exact Decimal."""

    model_config = ConfigDict(frozen=True)

    input_per_mtok: Decimal
    output_per_mtok: Decimal
    cache_read_per_mtok: Decimal
    cache_write_per_mtok: Decimal


class ModelEntry(DataModel):
    """One declared model: canonical id, provider, the name sent on the wire, its adapter,
    capabilities and pricing."""

    model_config = ConfigDict(frozen=True)

    id: str
    provider: str
    wire_name: str
    adapter: AdapterKind
    tier: Tier | None = None
    can_delegate: bool = False
    aliases: tuple[str, ...] = ()
    label: str | None = None
    capabilities: Capabilities
    pricing: Pricing

    @property
    def scripted(self) -> bool:
        return self.adapter == "scripted"


def split_model_id(model_id: str) -> tuple[str, str]:
    """`provider:name` split on the first colon only (`ollama:qwen2.5-coder:14b`)."""
    provider, _, name = model_id.partition(":")
    return provider, name
