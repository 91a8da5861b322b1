"""The command line's own errors: an argument a subcommand does not know is refused with that
subcommand's usage, the usage names every command, and `--home` is taken by every command that
works on a home (through the CLI entry point, in this process)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from metis.cli import COMMANDS, build_parser, main
from metis.commands.mcp import render
from metis.config import SHIPPED_CONFIG_DIR


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "command", "refused"),
    [
        (["run", "hi", "--bogus"], "run", "--bogus"),
        (["sessions", "list", "--bogus"], "sessions list", "--bogus"),
        (["status", "--bogus"], "status", "--bogus"),
        (["sessions", "title", "sess_01JB8Z0000000000000000000A", "a", "b", "c"],
         "sessions title", "b c"),
        (["trace", "prune", "--days", "1", "--bogus"], "trace prune", "--bogus"),
    ],
)  # fmt: skip
def test_an_unknown_argument_is_refused_with_the_usage_of_its_subcommand(
    metis_home: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    command: str,
    refused: str,
) -> None:
    err = usage_error(argv, capsys)
    assert err.startswith(f"usage: metis {command} ")
    assert err.endswith(f"metis {command}: error: unrecognized arguments: {refused}\n")


def test_the_usage_line_names_every_command_also_when_one_is_loaded() -> None:
    usage = " ".join(build_parser("run").format_usage().split())
    assert "{" + ",".join(["serve", *COMMANDS]) + "}" in usage


def test_trace_prune_takes_home_and_creates_no_missing_home(
    tmp_path: Path, metis_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mistyped = tmp_path / "no" / "such-home"
    assert main(["trace", "prune", "--days", "1", "--home", str(mistyped)]) == 1
    assert f"no trace store at {mistyped / 'metis.db'}" in capsys.readouterr().err
    assert not (tmp_path / "no").exists()


def test_routing_and_models_check_take_home(
    tmp_path: Path, metis_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "other-home"
    home.mkdir()
    (home / "routing.yaml").write_text("schema_version: 1\n")
    assert main(["models", "check", "--home", str(home)]) == 0
    assert capsys.readouterr().out.startswith(f"{SHIPPED_CONFIG_DIR / 'models.yaml'}: valid (")
    assert main(["routing", "check", "--home", str(home)]) == 0
    # one line that fits a terminal: the version as short as the daemon's log gives it
    out = capsys.readouterr().out
    assert re.fullmatch(
        rf"{home / 'routing.yaml'}: valid \(0 errors, 0 warnings\); version [0-9a-f]{{12}}\n", out
    ), out
    (home / "routing.yaml").write_text("rules: 3\n")
    assert main(["routing", "check", "--home", str(home)]) == 1
    assert capsys.readouterr().out.endswith(
        f"{home / 'routing.yaml'}: INVALID (1 error, 0 warnings)\n"
    )
    (home / "routing.yaml").write_text("schema_version: 1\n")
    (home / "models.yaml").write_text("not: [valid\n")
    assert main(["models", "check", "--home", str(home)]) == 1
    assert str(home / "models.yaml") in capsys.readouterr().err


SERVERS = [
    {"name": "git", "state": "ready", "transport": "stdio", "command": "uvx", "args": ["git-mcp"],
     "restarts": 0, "last_error": None, "env": [],
     "tools": [{"name": "mcp__git__log", "policy": "auto"},
               {"name": "mcp__git__commit_all", "policy": "prompt"}]},
    {"name": "search-web", "state": "restarting", "transport": "http",
     "url": "https://mcp.example.com/mcp", "restarts": 2, "last_error": None, "headers": [],
     "tools": []},
]  # fmt: skip


def test_mcp_servers_are_in_columns_for_a_person_and_tab_separated_for_a_script() -> None:
    assert render(SERVERS).splitlines() == [
        "git\tready\tstdio\tuvx git-mcp",
        "  mcp__git__log\tauto",
        "  mcp__git__commit_all\tprompt",
        "search-web\trestarting\thttp\thttps://mcp.example.com/mcp",
        "  restarts: 2",
    ]
    assert render(SERVERS, aligned=True).splitlines() == [
        "git         ready       stdio  uvx git-mcp",
        "  mcp__git__log         auto",
        "  mcp__git__commit_all  prompt",
        "search-web  restarting  http   https://mcp.example.com/mcp",
        "  restarts: 2",
    ]
    # a terminal's width cuts a server's line (its command's end), never a column
    narrow = render(SERVERS, aligned=True, width=42).splitlines()
    assert narrow[0] == "git         ready       stdio  uvx git-mcp"
    assert narrow[3] == "search-web  restarting  http   https://mc…"


def test_an_mcp_servers_own_words_are_shown_never_obeyed_by_a_terminal() -> None:
    failed = {**SERVERS[1], "last_error": "refused \x1b]0;PWNED\x07 (HTTP 403)"}
    assert "  last error: refused \\x1b]0;PWNED\\x07 (HTTP 403)" in render([failed]).splitlines()


@pytest.mark.parametrize("command", ["list", "show", "end", "purge", "title", "export"])
def test_each_sessions_help_says_what_it_does_in_a_sentence(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["sessions", command, "--help"])
    text = capsys.readouterr().out
    description = text.split("\n\n")[1]
    assert description[0].isupper() and description.endswith("."), description
    if command != "list":
        assert "  id  " in text and "`metis sessions list` shows" in " ".join(text.split())
    assert max(len(line) for line in text.splitlines()) <= 80


def test_sessions_help_names_its_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["sessions", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Exit 1 when the daemon cannot be reached" in text and "2 for a bad argument" in text


@pytest.mark.parametrize(("words", "said"), [
    (["mcp"], "The running daemon's MCP servers"),
    (["models", "check"], "Exit 0 when it is valid, 1 when it is not."),
    (["run"], "or the daemon cannot be reached or refuses the key;"),
    (["run"], "130 for Ctrl-C while the prompt is read from stdin, or a second Ctrl-C"),
])  # fmt: skip
def test_a_group_or_command_help_says_what_it_does(
    words: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([*words, "--help"])
    assert said in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("wait", ["-5", "0", "nan", "inf", "soon"])
def test_mcp_restart_refuses_a_wait_that_is_not_a_time(
    wait: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wait of `nan` never ran out: the restart of a server stuck starting waited for ever."""
    with pytest.raises(SystemExit) as exited:
        main(["mcp", "restart", "git", "--wait", wait])
    assert exited.value.code == 2
    assert "argument --wait: " in capsys.readouterr().err
