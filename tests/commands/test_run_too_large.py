"""A prompt larger than the daemon takes is a request it refuses, as an unknown model is:
`metis run` exits 2 (`refused` in --json), and the session it made for it is not left behind."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metis.server.runner import Daemon
from tests.api import Api
from tests.cli import metis


async def test_a_prompt_over_the_request_limit_is_refused_with_exit_2(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    d = await start_daemon(config="limits:\n  max_request_bytes: 4096\n")
    prompt = "words " * 1000
    code, out, err = await metis(
        "run", prompt, "--json", "--workspace", str(workspace), "--url", d.base_url
    )
    assert code == 2, err
    said = json.loads(out)
    assert (said["status"], said["reason"]) == ("refused", "payload_too_large"), said
    _, listed = await api_of(d).call("GET", "/sessions?status=all")
    assert listed["sessions"] == []
