"""A routing.yaml that loads with warnings (a global_default whose provider has no key, whose
turns therefore go to another model) is not shown by `metis status` as simply valid."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tests.cli import metis


async def test_status_counts_the_warnings_of_the_policy_in_force(
    start_daemon: Callable[..., Any],
) -> None:
    d = await start_daemon(routing="schema_version: 1\nglobal_default: sonnet\n")
    code, out, err = await metis("status", "--url", d.base_url)
    assert code == 0, err
    assert "  routing:    routing.yaml (valid, 1 warning: `metis routing check` shows it)" in out
    code, out, err = await metis("status", "--json", "--url", d.base_url)
    [warning] = json.loads(out)["routing"]["warnings"]
    assert "global_default references anthropic:claude-sonnet-4-6" in warning
