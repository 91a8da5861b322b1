"""How a client says why a declared model cannot answer (`GET /models`'s `unconfigured`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def unconfigured_reason(model: Mapping[str, Any]) -> str:
    """`no key (ANTHROPIC_API_KEY unset)`, `off (METIS_OFFLINE=1)`, else the daemon's reason."""
    reason = str(model.get("reason"))
    if reason == "no_credentials" and model.get("env_var"):
        return f"no key ({model['env_var']} unset)"
    if reason == "offline_forced":
        return "off (METIS_OFFLINE=1)"
    return reason
