"""A routing.yaml that does not load at start-up is said where the user looks when starting
the daemon, its banner (also the one `metis serve --detach` shows from the log it cannot
otherwise see), not only in a log line: its turns go to another policy than the file's."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from metis.testing.serving import free_port, spawn_serve
from tests.cli import metis

BROKEN = "rules: [\n"


async def test_the_banner_says_a_broken_routing_yaml_and_what_routes_instead(
    metis_home: Path, tmp_path: Path
) -> None:
    metis_home.mkdir(parents=True)
    (metis_home / "routing.yaml").write_text(BROKEN)
    port = free_port()
    with (tmp_path / "serve.log").open("wb") as log:
        offline = {**os.environ, "METIS_OFFLINE": "1"}
        proc = await spawn_serve(
            metis_home, port, output=log, environ=offline, stdout=asyncio.subprocess.PIPE
        )
    try:
        assert proc.stdout is not None
        out = ""
        async with asyncio.timeout(60):
            while "Next:" not in out:
                line = await proc.stdout.readline()
                assert line, (tmp_path / "serve.log").read_text()
                out += line.decode()
    finally:
        proc.terminate()
        await proc.wait()
    assert (
        f"  routing: {metis_home / 'routing.yaml'} has errors; the built-in empty policy "
    ) in out, out
    assert "(`metis routing check` says why)\n" in out


async def test_a_detached_start_shows_the_routing_line_of_its_banner(metis_home: Path) -> None:
    metis_home.mkdir(parents=True)
    (metis_home / "routing.yaml").write_text(BROKEN)
    env = {"METIS_OFFLINE": "1", "METIS_PORT": str(free_port())}
    code, out, err = await metis("serve", "--detach", env=env)
    try:
        assert code == 0, err
        assert f"  routing: {metis_home / 'routing.yaml'} has errors;" in out, out
    finally:
        await metis("stop", env=env)
