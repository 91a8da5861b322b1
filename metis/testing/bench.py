"""Shared set-up of the benchmark scripts: a fake provider in its own process and a registry
pointing at it, so what a benchmark measures is the daemon, not the provider's CPU."""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH_MODEL = "anthropic:claude-sonnet-4-6"
_MODELS = """
pricing_version: "bench"
providers:
  anthropic: {{adapter: anthropic, base_url: "{url}", api_key: "bench-key"}}
models:
  - id: anthropic:claude-sonnet-4-6
    aliases: [sonnet]
    capabilities: {{max_context_tokens: {context_tokens}, max_output_tokens: 8192}}
    pricing: {{input_per_mtok: "3", output_per_mtok: "15"}}
"""


def bench_workspace() -> str:
    """The benchmarks' workspace: a directory of its own in the temporary directory, which holds
    their temporary METIS_HOMEs and so may not be a workspace itself."""
    path = Path(tempfile.gettempdir()) / "metis-bench-workspace"
    path.mkdir(exist_ok=True)
    return str(path)


def bench_reply(deltas: int, *, chunk_chars: int = 8, repeat: int = 1) -> dict[str, Any]:
    """A fake-provider reply of `deltas` text deltas, served `repeat` times.

    Its usage figures are given, so the provider does not count the request's tokens: that
    count reads the whole history, and the provider's time would grow with a long session's
    history and pass for the daemon's."""
    return {
        "text": "x" * (chunk_chars * deltas),
        "chunk_chars": chunk_chars,
        "repeat": repeat,
        "usage": {"input_tokens": 1000, "output_tokens": deltas},
    }


def bench_models_yaml(anthropic_url: str, *, context_tokens: int = 200_000) -> str:
    """A models.yaml whose one model (alias `sonnet`) is served by the fake provider.

    A small `context_tokens` makes a long session outgrow the model's window, so that its
    turns are compacted to fit."""
    return _MODELS.format(url=anthropic_url, context_tokens=context_tokens)


def daemon_headers(daemon: Any) -> dict[str, str]:
    """The daemon's key as the metis REST header (a `metis.server.runner.Daemon`)."""
    return {"Authorization": f"Bearer {daemon.state.auth.api_key.value}"}


async def spawn_fake_provider() -> tuple[asyncio.subprocess.Process, str]:
    """Start `python -m metis.testing.fake_provider` on a free port; returns (process, base URL)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "metis.testing.fake_provider",
        "--port",
        "0",
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    while True:
        line = (await proc.stdout.readline()).decode()
        if not line:
            raise RuntimeError("the fake provider exited before printing its address")
        if line.startswith("ANTHROPIC_BASE_URL="):
            return proc, line.strip().split("=", 1)[1]


async def stop_process(proc: asyncio.subprocess.Process) -> None:
    proc.terminate()
    await proc.wait()
