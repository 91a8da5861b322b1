"""`GET /routing/policy` with a broken `METIS_HOME/routing.yaml`: which policy is in force, why,
and where each error is (the user's file and line), next to the fields older clients read."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from metis.commands.daemon_client import resolve_daemon
from metis.server.runner import Daemon
from tests.api import Api

BROKEN = "global_default: nowhere:model\nrules:\n  - name: x\n    when: {nope: 1}\n    use: haiku\n"


async def policy_of(d: Daemon, method: str = "GET", path: str = "/routing/policy") -> Any:
    headers = resolve_daemon().headers()
    async with aiohttp.ClientSession(base_url=d.base_url, headers=headers) as http:
        status, body = await Api(http).call(method, path)
    assert status == 200, body
    return body


def located(body: dict[str, Any]) -> list[tuple[str | None, int | None, str]]:
    return [(e["file"], e["line"], e["code"]) for e in body["error_details"]]


async def test_a_broken_edit_names_the_users_file_and_keeps_the_shipped_default(
    start_daemon: Callable[..., Any], metis_home: Path
) -> None:
    d = await start_daemon()
    user = metis_home / "routing.yaml"
    before = await policy_of(d)
    assert before["in_force"] == "shipped_default" and before["error_details"] == []
    assert (
        before["reason"]
        == f"there is no {user}; the shipped default ({before['path']}) is in force"
    )
    shipped = before["path"]

    user.write_text(BROKEN)
    reloaded = await policy_of(d, "POST", "/routing/reload")
    body = await policy_of(d)
    for answer in (reloaded, body):
        assert answer["in_force"] == "shipped_default" and answer["user_file"] == str(user)
        assert answer["reason"] == (
            f"{user} has errors; the shipped default ({shipped}) is in force"
        )
        assert located(answer) == [
            (str(user), 1, "unknown_model"),
            (str(user), 4, "unknown_predicate"),
        ]
    # the fields clients read before stay as they were
    assert body["source"] == "shipped_default" and body["path"] == shipped
    assert body["valid"] is False and body["errors"] == [
        "global_default references unknown model: nowhere:model (line 1)",
        "rules[0].when: unknown predicate 'nope' (line 4)",
    ]

    user.write_text("global_default: haiku\n")
    fixed = await policy_of(d, "POST", "/routing/reload")
    assert fixed["in_force"] == "user_file" and fixed["error_details"] == []
    assert fixed["reason"] == f"{user} is valid; it is in force"


async def test_broken_at_start_up_says_which_policy_is_in_force_instead(
    start_daemon: Callable[..., Any], metis_home: Path
) -> None:
    d = await start_daemon(routing=BROKEN)
    user = metis_home / "routing.yaml"
    body = await policy_of(d)
    assert body["source"] == body["in_force"] == "builtin_empty"
    assert body["reason"].startswith(f"{user} has errors; the built-in empty policy")
    assert located(body)[0] == (str(user), 1, "unknown_model")
