"""`metis models` as a real subprocess against a real offline daemon."""

from __future__ import annotations

from pathlib import Path

from metis.server.runner import Daemon
from tests.cli import metis


async def test_models_shows_what_an_unset_key_would_make_routable(
    daemon: Daemon, workspace: Path
) -> None:
    """An unconfigured model's tier and aliases come from the daemon's registry, so a user
    sees which key brings `sonnet` (the shipped registry, no provider key set)."""
    code, out, err = await metis("models", "--url", daemon.base_url)
    assert code == 0, err
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert rows["anthropic:claude-sonnet-4-6"][1:4] == ["balanced", "sonnet,", "balanced"]
    assert "no key (ANTHROPIC_API_KEY unset)" in " ".join(rows["anthropic:claude-sonnet-4-6"])
    assert rows["local:scripted"][1:3] == ["-", "scripted"]
