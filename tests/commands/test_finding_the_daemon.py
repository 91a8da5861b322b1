"""How commands find their daemon when the settings around it are wrong: a METIS_PORT that is
not a port, a config.yaml broken while the daemon runs, a `--url` other than the home's
daemon's. The real `metis` in a subprocess; the daemon is real, in the test's process, holding
its home's lock as `metis serve` does."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from metis.cli import main
from metis.server.runner import Daemon
from tests.cli import metis
from tests.helpers import named_by_home_lock

BROKEN_CONFIG = "port: [oops\n"


@pytest.fixture
async def home_daemon(daemon: Daemon, metis_home: Path) -> AsyncIterator[Daemon]:
    """The daemon, named by its home's lock as the daemon running on it."""
    with named_by_home_lock(metis_home, daemon.base_url):
        yield daemon


@pytest.mark.parametrize("command", [["status"], ["sessions", "list"], ["serve"]])
async def test_a_metis_port_that_is_not_a_port_number_is_one_line_naming_it(
    metis_home: Path, command: list[str]
) -> None:
    code, out, err = await metis(*command, env={"METIS_PORT": "abc"})
    assert (code, out) == (2, "")
    assert err == "metis: METIS_PORT='abc' is not a port number (0–65535)\n"
    assert not metis_home.exists()  # nothing made on the way


async def test_a_metis_port_out_of_range_is_named_as_the_cause(metis_home: Path) -> None:
    code, _, err = await metis("status", env={"METIS_PORT": "70000"})
    assert code == 2 and err == "metis: METIS_PORT='70000' is not a port number (0–65535)\n"


@pytest.mark.parametrize("command", ["serve", "status"])
def test_a_port_flag_out_of_range_is_a_usage_error_of_the_command(
    metis_home: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--port", "70000"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"metis {command}: error: argument --port: '70000' is not a port number" in err


async def test_a_config_yaml_broken_while_the_daemon_runs_leaves_its_clients_connected(
    home_daemon: Daemon, metis_home: Path
) -> None:
    (metis_home / "config.yaml").write_text(BROKEN_CONFIG)
    problem = f"{metis_home / 'config.yaml'}:2: YAML syntax"
    code, out, err = await metis("sessions", "list")
    assert code == 0, err
    warning = err.splitlines()[0]
    assert warning.startswith(f"metis: warning: {problem}") and err.count("warning") == 1
    assert warning.endswith("the next `metis serve` on this home refuses it)")
    code, out, err = await metis("status")
    assert (code, err) == (0, "")
    assert f"is running at {home_daemon.base_url}" in out
    assert f"  config:     {problem}" in out
    code, _, err = await metis("serve", "--port", "0")
    assert code == 2 and err.startswith("metis: configuration error:")


async def test_a_broken_config_yaml_does_not_cut_off_clients_that_name_the_daemons_port(
    home_daemon: Daemon, metis_home: Path
) -> None:
    (metis_home / "config.yaml").write_text(BROKEN_CONFIG)
    port = str(home_daemon.state.port)
    for env, flags in (({"METIS_PORT": port}, []), ({}, ["--port", port, "--host", "localhost"])):
        code, out, err = await metis("sessions", "list", *flags, env=env)
        assert (code, out) == (0, ""), err  # no sessions: said on stderr, after the warning
        assert err.startswith("metis: warning: ") and "YAML syntax" in err
        assert err.splitlines()[1].startswith("no active sessions")
    # another port is no address of the running daemon: config.yaml is needed, and it is broken
    code, _, err = await metis("status", "--port", "1")
    assert code == 2 and "configuration error" in err and "YAML syntax" in err
    code, out, _ = await metis("status", "--json", "--port", "1")  # a script still reads JSON
    said = json.loads(out)
    assert (code, said["running"], said["error"]) == (2, None, "configuration_error")
    assert "YAML syntax" in said["message"]


async def test_status_of_another_url_says_where_the_homes_daemon_runs(
    home_daemon: Daemon,
) -> None:
    code, out, _ = await metis("status", "--url", "http://127.0.0.1:1")
    assert code == 3
    assert out.startswith("nothing answers at http://127.0.0.1:1; the daemon of ")
    assert out.endswith(f" runs at {home_daemon.base_url}\n") and "log" not in out
    code, out, _ = await metis("status", "--json", "--url", "http://127.0.0.1:1")
    assert code == 3 and json.loads(out)["home_daemon_url"] == home_daemon.base_url


async def test_clients_pointed_at_another_port_say_where_the_homes_daemon_runs(
    home_daemon: Daemon,
) -> None:
    """Starting a daemon, the usual advice, would be refused: one runs on the home."""
    for command in (["sessions", "list"], ["run", "hello"], ["open", "--print"]):
        code, _, err = await metis(*command, env={"METIS_PORT": "1"})
        assert code == 1, command
        assert err == (
            f"metis: cannot reach the daemon at http://127.0.0.1:1; the daemon of "
            f"{home_daemon.settings.home} runs at {home_daemon.base_url} (`--url "
            f"{home_daemon.base_url}`, or leave out the port that points elsewhere)\n"
        ), command


def test_models_with_no_daemon_says_so_in_words(
    metis_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "--url", "http://127.0.0.1:1"]) == 0
    out = capsys.readouterr().out
    assert "no daemon answers at http://127.0.0.1:1: availability shown from models.yaml" in out
    assert "Error" not in out


@pytest.mark.parametrize(
    "command", [["sessions", "list"], ["sessions", "show", "sess_" + "0" * 26], ["mcp", "list"]]
)
def test_a_json_command_that_cannot_reach_the_daemon_still_prints_json(
    metis_home: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    assert main([*command, "--json", "--url", "http://127.0.0.1:9"]) == 1
    out, err = capsys.readouterr()
    said = json.loads(out)
    assert said["error"] == "unreachable" and said["message"].startswith(
        "cannot reach the daemon at http://127.0.0.1:9; start it with "
    )
    assert err == f"metis: {said['message']}\n"


@pytest.mark.parametrize("command", [["status"], ["sessions", "list"], ["serve", "--port", "0"]])
async def test_a_home_that_is_a_file_is_named_not_a_traceback(
    metis_home: Path, command: list[str]
) -> None:
    metis_home.parent.mkdir(parents=True, exist_ok=True)
    metis_home.write_text("not a folder\n")
    code, _, err = await metis(*command)
    assert code == 2, err
    assert err == f"metis: configuration error:\nMETIS_HOME {metis_home} is not a directory\n"
    assert metis_home.read_text() == "not a folder\n"


async def test_a_key_file_that_cannot_be_used_is_named_by_clients_and_serve(
    metis_home: Path,
) -> None:
    key_file = metis_home / "api_key"
    key_file.mkdir(parents=True)
    for command in (["status"], ["sessions", "list"], ["serve", "--port", "0"]):
        code, _, err = await metis(*command)
        assert code == 2, err
        assert err.endswith(f"cannot read the API key file {key_file}: Is a directory\n")
    key_file.rmdir()
    key_file.write_text("\n")
    code, _, err = await metis("serve", "--port", "0")
    assert code == 2 and "Traceback" not in err
    assert err.endswith(
        f"the API key file {key_file} is empty; delete it and the next start writes a new key\n"
    )
    key_file.write_bytes(b"\xff\xfe key\n")
    code, _, err = await metis("status")
    assert code == 2 and err.endswith(
        f"the API key file {key_file} is not text; delete it and the next start writes a new key\n"
    )


async def test_a_reload_refused_for_a_broken_config_yaml_says_it_once_not_also_as_a_warning(
    home_daemon: Daemon, metis_home: Path
) -> None:
    (metis_home / "config.yaml").write_text(BROKEN_CONFIG)
    code, out, err = await metis("mcp", "reload")
    assert (code, out) == (1, ""), err
    assert err.startswith("metis: config.yaml cannot be applied: ") and err.count("\n") == 1, err
    assert "YAML syntax" in err
