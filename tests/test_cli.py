"""The command line's parser: every command is known to `--help`, and a command's own module is
imported only to run it."""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys

import pytest

from metis.cli import COMMANDS, build_parser, command_of


def _choices(parser: argparse.ArgumentParser) -> set[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def test_the_full_parser_knows_serve_and_every_client_command() -> None:
    assert _choices(build_parser()) == {"serve", *COMMANDS}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_module_registers_the_command_it_is_listed_under(name: str) -> None:
    assert _choices(build_parser(name)) == {"serve", name}


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["serve", "--port", "0"], "serve"),
        (["--version"], None),
        ([], None),
        (["chat", "--plain", "."], "chat"),
        (["trace", "prune", "--dry-run"], "trace"),
        (["nosuch"], None),  # unknown: the full parser names every choice in its error
    ],
)
def test_the_command_is_the_first_word_that_is_not_an_option(
    argv: list[str], command: str | None
) -> None:
    assert command_of(argv) == command


def test_an_unknown_command_is_refused_with_every_command_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from metis.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["nosuch"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'nosuch'" in err
    assert all(name in err for name in ("serve", *COMMANDS))


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["nosuch"], ["serve", "--port", "not-a-port"], ["--version"]],
    ids=["help", "unknown command", "serve usage error", "version"],
)
def test_the_collector_is_back_on_when_the_command_line_exits_before_a_command_runs(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from metis.cli import main

    with pytest.raises(SystemExit):
        main(argv)
    assert gc.isenabled()


CA_SCRIPT = """
import json, ssl, sys
from metis.cli import main

code = main(["sessions", "list", "--url", sys.argv[1]])
import aiohttp.connector  # imported by the command
verifying = aiohttp.connector._SSL_CONTEXT_VERIFIED.cert_store_stats()["x509_ca"]
system = ssl.create_default_context().cert_store_stats()["x509_ca"]
print(json.dumps({"code": code, "verifying": verifying, "system": system}))
"""


@pytest.mark.parametrize(("scheme", "reads_the_bundle"), [("http", False), ("https", True)])
def test_a_client_command_reads_the_ca_bundle_only_for_an_https_daemon(
    scheme: str, reads_the_bundle: bool
) -> None:
    """aiohttp's verifying context is made without the system's CA bundle (~50 ms of every
    command's start); a command told to reach its daemon at an `https` URL reads it first."""
    done = subprocess.run(
        [sys.executable, "-c", CA_SCRIPT, f"{scheme}://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["code"] == 1 and "cannot reach the daemon" in done.stderr  # nothing listens
    if seen["system"] == 0:
        pytest.skip("this machine has no CA bundle")
    assert seen["verifying"] == (seen["system"] if reads_the_bundle else 0)
