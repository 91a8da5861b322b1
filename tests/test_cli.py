"""The command line's parser: every command is known to `--help`, and a command's own module is
imported only to run it."""

from __future__ import annotations

import argparse
import gc

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
