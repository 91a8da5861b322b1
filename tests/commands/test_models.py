"""`metis models` as a real subprocess against a real offline daemon."""

from __future__ import annotations

from pathlib import Path

from metis.server.runner import Daemon
from tests.cli import at_a_terminal, metis


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


async def test_at_80_columns_a_models_availability_wraps_under_its_row(daemon: Daemon) -> None:
    """No line wider than the terminal: a reason that does not fit goes under its model,
    indented; a pipe still gets one line per model (above)."""
    code, lines, err = await at_a_terminal("models", "--url", daemon.base_url, width=80)
    assert code == 0, err
    assert max(len(line) for line in lines) <= 80, lines
    sonnet = next(i for i, line in enumerate(lines) if line.startswith("anthropic:claude-sonnet"))
    assert lines[sonnet].split() == [
        "anthropic:claude-sonnet-4-6",
        "balanced",
        "sonnet,",
        "balanced",
    ]
    assert lines[sonnet + 1] == "    no key (ANTHROPIC_API_KEY unset)"
    scripted = next(line for line in lines if line.startswith("local:scripted"))
    assert scripted.split()[-2:] == ["healthy", "[scripted]"]  # it fits: on its row


async def test_with_or_without_a_daemon_the_list_has_the_same_order_and_words(
    daemon: Daemon,
) -> None:
    """The models that can answer first, then the others; offline mode said alike."""
    listings = []
    for url in (daemon.base_url, "http://127.0.0.1:9"):
        code, out, err = await metis("models", "--url", url)
        assert code == 0, err
        listings.append(out.splitlines())
    live, local = listings
    assert [line.split()[0] for line in live[1:7]] == [line.split()[0] for line in local[1:7]]
    assert live[1].startswith("local:scripted")
    said = "offline mode: on (only local:scripted is served unless asked)"
    assert said in live and said in local


SONNET = "anthropic:claude-sonnet-4-6"
NOT_CONFIGURING = (
    "a reset does not configure a model: the daemon reads provider keys and METIS_OFFLINE "
    "when it starts"
)


async def test_resetting_a_model_without_a_key_says_it_stays_unavailable(daemon: Daemon) -> None:
    """A reset clears availability only: a model whose provider has no key cannot answer
    after it either, and the command says so in `metis models`' words, never "healthy"."""
    code, out, err = await metis("models", "reset", "sonnet", "--url", daemon.base_url)
    assert code == 0, err
    assert out.splitlines() == [
        f"reset {SONNET}; it stays unavailable: no key (ANTHROPIC_API_KEY unset)",
        NOT_CONFIGURING,
    ]


async def test_resetting_every_model_names_those_that_stay_unavailable_and_why(
    daemon: Daemon,
) -> None:
    code, out, err = await metis("models", "reset", "--url", daemon.base_url)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[:2] == [
        "reset every model; healthy again: none was unavailable",
        "still unavailable, not configured:",
    ]
    assert f"  {SONNET}: no key (ANTHROPIC_API_KEY unset)" in lines[2:-1]
    assert not any("local:scripted" in line for line in lines)  # it can answer
    assert lines[-1] == NOT_CONFIGURING


async def test_resetting_a_configured_model_says_only_what_the_reset_did(daemon: Daemon) -> None:
    code, out, err = await metis("models", "reset", "local:scripted", "--url", daemon.base_url)
    assert code == 0, err
    assert out.splitlines() == ["reset local:scripted; healthy again: none was unavailable"]
