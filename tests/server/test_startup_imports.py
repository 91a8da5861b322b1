"""What a daemon imports to answer `/health`: none of the heavy libraries it only needs later.

Each costs start-up time and resident memory for as long as the daemon runs: the provider SDKs
(imported in a background thread when a client's first request comes,
`ModelRegistry.warm_in_background`),
the MCP SDK (only with an MCP server configured), the dashboard's markdown renderer and
highlighter (first render), the terminal UI (a client, never the daemon). A fresh interpreter
is needed to see it, so the daemon runs in a subprocess.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp

from metis.testing.serving import free_port, spawn_serve, wait_until_serving

HEAVY = ("anthropic", "openai", "mcp", "markdown_it", "pygments", "nh3", "textual")
# Smaller, but each is memory of an idle daemon that no request has needed yet: the client
# commands are imported only by the command that runs them, and the terminal column measure
# (`rich`'s width tables) only by a command that draws a table or a status bar; `grep_files`'
# ignore-file matcher only when a search meets a `.gitignore`.
LATE = ("difflib", "metis.commands", "rich", "pathspec")
# What the start-up banner does need of the client side: making a path safe to print.
BANNER = {"metis.commands", "metis.commands.printable"}

SCRIPT = """
import asyncio, json, sys
from pathlib import Path

from metis.cli import build_parser, print_banner
from metis.config import load_settings
from metis.server.runner import Daemon


async def main() -> None:
    build_parser("serve")  # the CLI's own imports, as `metis serve` makes them
    daemon = Daemon(load_settings(home=Path(sys.argv[1]), port=0))
    await daemon.start()
    print_banner(daemon)  # as `metis serve` prints it once the daemon is healthy
    loaded = sorted(sys.modules)
    await daemon.stop()
    print(json.dumps(loaded))


asyncio.run(main())
"""


async def run_script(script: str, home: Path, env: dict[str, str]) -> Any:
    """Run `script` (given METIS_HOME as its argument) in a fresh interpreter: its last line
    of output, as JSON."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        str(home),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    return json.loads(out.decode().splitlines()[-1])


async def test_a_started_daemon_has_imported_no_heavy_library_it_does_not_use_yet(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["METIS_OFFLINE"] = "1"
    loaded = set(await run_script(SCRIPT, tmp_path / "home", env))
    assert "aiohttp" in loaded  # the script did start a daemon
    early = sorted(
        name
        for name in loaded
        if any(name == lib or name.startswith(lib + ".") for lib in (*HEAVY, *LATE))
        and name not in BANNER
    )
    assert early == []


SDK_SCRIPT = """
import asyncio, json, sys
from pathlib import Path

import aiohttp

from metis.config import load_settings
from metis.server.runner import Daemon


async def main() -> None:
    daemon = Daemon(load_settings(home=Path(sys.argv[1]), port=0))
    await daemon.start()
    key = daemon.state.auth.api_key.value
    async with aiohttp.ClientSession(daemon.base_url) as http:
        async with http.get("/health") as r:
            assert r.status == 200
        await daemon.core.registry.wait_warm()  # returns at once unless a warm-up started
        idle = "anthropic" in sys.modules
        async with http.get("/models", headers={"Authorization": f"Bearer {key}"}) as r:
            assert r.status == 200
    await daemon.core.registry.wait_warm()  # the warm-up that request started
    print(json.dumps({"idle": idle, "after_client": "anthropic" in sys.modules}))
    await daemon.stop()


asyncio.run(main())
"""


async def test_a_provider_sdk_is_imported_when_the_first_client_comes_not_at_start(
    tmp_path: Path,
) -> None:
    """An idle daemon (health probes only) never pays the SDK's memory; a client's first
    request starts its import in the background, so the client's first turn finds it."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.pop("METIS_OFFLINE", None)
    env["ANTHROPIC_API_KEY"] = "sk-ant-not-called"  # nothing is called: the SDK is only imported
    seen = await run_script(SDK_SCRIPT, tmp_path / "home", env)
    assert seen == {"idle": False, "after_client": True}


MODELS_SCRIPT = """
import asyncio, json, sys
from pathlib import Path

import aiohttp

from metis.config import load_settings
from metis.core.datamodel import deferred_models
from metis.server.runner import Daemon


def pending() -> int:
    return sum(1 for m in deferred_models() if m.__module__.startswith("metis."))


async def main() -> None:
    daemon = Daemon(load_settings(home=Path(sys.argv[1]), port=0))
    await daemon.start()
    at_start = pending()
    async with aiohttp.ClientSession(daemon.base_url) as http:
        async with http.get("/health") as r:  # served while they are built
            assert r.status == 200
    await daemon.core.models_built()
    print(json.dumps({"at_start": at_start, "after": pending()}))
    await daemon.stop()


asyncio.run(main())
"""


async def test_the_models_start_up_did_not_need_are_built_in_the_background_once_it_listens(
    tmp_path: Path,
) -> None:
    """Start-up does not build them (a model is built at its first use); once the daemon
    listens, the background build leaves none unbuilt."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["METIS_OFFLINE"] = "1"
    seen = await run_script(MODELS_SCRIPT, tmp_path / "home", env)
    assert seen["at_start"] > 50
    assert seen["after"] == 0


SERVE_GC_SCRIPT = """
import gc, http.client, json, os, signal, socket, sys, threading, time

from metis.cli import main

with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
collections = []
seen = {}


def watch() -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                break
        except OSError:
            time.sleep(0.01)
    while not gc.isenabled() and time.monotonic() < deadline:
        time.sleep(0.01)
    seen["enabled"] = gc.isenabled()
    seen["start_up_collections"] = list(collections)
    os.kill(os.getpid(), signal.SIGTERM)


gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(info["generation"]))
threading.Thread(target=watch, daemon=True).start()
code = main(["serve", "--home", sys.argv[1], "--port", str(port), "--log-level", "WARNING"])
print(json.dumps({**seen, "code": code}))
"""


async def test_serve_imports_and_starts_with_no_automatic_collection_then_turns_the_collector_on(
    tmp_path: Path,
) -> None:
    """The collector is off while `metis serve` imports its modules and starts (walking the
    objects they leave was ~40 ms of a start); once it serves and its deferred models are
    built, one full collection has run (the start-up heap is frozen after it) and the collector
    is on."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["METIS_OFFLINE"] = "1"
    seen = await run_script(SERVE_GC_SCRIPT, tmp_path / "home", env)
    assert seen["code"] == 0
    assert seen["enabled"]
    # the first collection of the process since `main` began is the one before the freeze (an
    # automatic one during the imports would be of generation 0); automatic ones may follow it
    assert seen["start_up_collections"][:1] == [2]


SERVE_CA_SCRIPT = """
import http.client, json, os, signal, socket, ssl, sys, threading, time
from pathlib import Path

from metis.cli import main

with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
seen = {}


def status(path, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", path, headers=headers or {})
    return conn.getresponse().status


def trusted():
    import aiohttp.connector  # imported by then: the daemon is serving
    return aiohttp.connector._SSL_CONTEXT_VERIFIED.cert_store_stats()["x509_ca"]


def watch() -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if status("/health") == 200:
                break
        except OSError:
            time.sleep(0.01)
    time.sleep(0.3)  # start-up's background work is over
    seen["idle"] = trusted()
    seen["environment"] = {name: os.environ.get(name) for name in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    key = Path(sys.argv[1], "api_key").read_text().strip()
    seen["client"] = status("/models", {"Authorization": f"Bearer {key}"})
    seen["system"] = ssl.create_default_context().cert_store_stats()["x509_ca"]
    # read in the daemon's executor: a count taken meanwhile can be part of the bundle
    while trusted() != seen["system"] and time.monotonic() < deadline:
        time.sleep(0.01)
    seen["after_client"] = trusted()
    os.kill(os.getpid(), signal.SIGTERM)


before = {name: os.environ.get(name) for name in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
threading.Thread(target=watch, daemon=True).start()
code = main(["serve", "--home", sys.argv[1], "--port", str(port), "--log-level", "WARNING"])
print(json.dumps({**seen, "before": before, "code": code}))
"""


async def test_serve_reads_the_ca_bundle_of_aiohttps_default_context_once_a_client_comes(
    tmp_path: Path,
) -> None:
    """aiohttp reads the system's CA bundle into its default TLS contexts at import (~3 MiB,
    ~50 ms of a start). An idle `metis serve` has not read it; once a client came, the verifying
    context trusts what the system trusts, and the environment the daemon's tools inherit is
    as it was."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["METIS_OFFLINE"] = "1"
    seen = await run_script(SERVE_CA_SCRIPT, tmp_path / "home", env)
    assert seen["code"] == 0
    assert seen["idle"] == 0
    assert seen["client"] == 200
    assert seen["after_client"] == seen["system"]
    assert seen["environment"] == seen["before"]


async def test_a_daemon_stopped_as_its_first_client_comes_exits_cleanly(tmp_path: Path) -> None:
    """The first client's request starts reading the CA bundle (and the SDK imports) off the
    loop; a SIGTERM right after it must still end the process with status 0 (a daemon thread
    still inside OpenSSL when the interpreter finalized crashed it with SIGSEGV)."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["METIS_OFFLINE"] = "1"
    home = tmp_path / "home"
    for run in range(3):
        port = free_port()
        output = tmp_path / f"serve-{run}.txt"
        with output.open("wb") as sink:
            proc = await spawn_serve(home, port, environ=env, output=sink)
        try:
            async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
                await wait_until_serving(http, "/health")
                key = (home / "api_key").read_text().strip()
                async with http.get("/models", headers={"Authorization": f"Bearer {key}"}) as r:
                    assert r.status == 200
        finally:
            if proc.returncode is None:  # one that ended early is reported below, not masked
                proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(proc.wait(), 60)
        assert code == 0, output.read_text()
