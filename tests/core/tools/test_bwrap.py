"""The bwrap command line (pure), the hidden paths, detection and the new shell settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from metis.core.tools.bwrap import (
    CREDENTIAL_PATHS,
    NAMESPACE_FLAGS,
    ShellSandbox,
    build_argv,
    detect,
    existing,
    find_bwrap,
    hidden_candidates,
)
from metis.core.tools.settings import ShellSettings, ToolsSettings
from tests.shell_sandbox import require_bwrap


def pairs(argv: list[str], flag: str) -> list[str]:
    """The argument following each occurrence of `flag`."""
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_argv_shape() -> None:
    argv = build_argv("/usr/bin/bwrap", "echo hi", "/w/proj")
    assert argv[:8] == ["/usr/bin/bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    assert argv[-5:] == ["--chdir", "/w/proj", "/bin/sh", "-c", "echo hi"]
    assert pairs(argv, "--bind") == ["/w/proj"] and argv[argv.index("--bind") + 2] == "/w/proj"
    assert pairs(argv, "--tmpfs") == ["/tmp"]
    for flag in NAMESPACE_FLAGS:
        assert flag in argv
    assert "--unshare-net" in argv and "--die-with-parent" in argv
    assert pairs(argv, "--cap-drop") == ["ALL"]
    assert "--new-session" not in argv  # the command stays in the group that gets SIGTERM


def test_network_setting_keeps_the_network_namespace() -> None:
    assert "--unshare-net" not in build_argv("bwrap", "true", "/w", network=True)


def test_hidden_paths_are_covered_in_depth_order() -> None:
    argv = build_argv(
        "bwrap",
        "true",
        "/home/u/.ssh/work",
        hide_dirs=["/home/u/.ssh", "/home/u/.metis", "/home/u/.ssh/work/.aws"],
        hide_files=["/home/u/.netrc"],
    )
    mounts = [a for a in argv if a in ("--tmpfs", "--bind", "--ro-bind")][1:]
    targets = [argv[i + 1] for i, a in enumerate(argv) if a in ("--tmpfs", "--bind")]
    # the folder holding the workspace is covered first, the workspace bound back into it, and
    # a hidden folder inside the workspace covered after that
    assert targets.index("/home/u/.ssh") < targets.index("/home/u/.ssh/work")
    assert targets.index("/home/u/.ssh/work") < targets.index("/home/u/.ssh/work/.aws")
    assert "--ro-bind" in mounts
    assert argv[argv.index("/home/u/.netrc") - 1] == "/dev/null"
    remounts = pairs(argv, "--remount-ro")
    assert sorted(remounts) == ["/home/u/.metis", "/home/u/.ssh", "/home/u/.ssh/work/.aws"]
    first_remount = argv.index("--remount-ro")
    assert first_remount > max(i for i, a in enumerate(argv) if a in ("--tmpfs", "--bind"))


def test_a_hidden_path_equal_to_the_workspace_stays_visible() -> None:
    argv = build_argv("bwrap", "true", "/home/u/.ssh", hide_dirs=["/home/u/.ssh", "/"])
    assert pairs(argv, "--tmpfs") == ["/tmp"] and "--remount-ro" not in argv


def test_hidden_candidates_cover_metis_home_and_credentials_of_each_home() -> None:
    paths = hidden_candidates(["/home/u", "/home/u", "relative", ""], "/srv/metis")
    assert paths[0] == "/srv/metis"
    for rel in (".ssh", ".aws", ".config/gcloud", ".gnupg", ".kube", ".docker", ".netrc"):
        assert rel in CREDENTIAL_PATHS and f"/home/u/{rel}" in paths
    assert len([p for p in paths if p.startswith("/home/u/")]) == len(CREDENTIAL_PATHS)
    assert not any(p.startswith("relative") for p in paths)


def test_existing_resolves_links_and_splits_folders_from_files(tmp_path: Path) -> None:
    (tmp_path / "real-ssh").mkdir()
    (tmp_path / ".ssh").symlink_to(tmp_path / "real-ssh")
    (tmp_path / ".netrc").write_text("machine x\n")
    dirs, files = existing([str(tmp_path / ".ssh"), str(tmp_path / ".netrc"), "/nonexistent/x"])
    assert dirs == [str(tmp_path / "real-ssh")] and files == [str(tmp_path / ".netrc")]


def test_sandbox_argv_hides_what_exists_now(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    sandbox = ShellSandbox("bwrap", False, hidden_candidates([str(home)], str(tmp_path / "mh")))
    argv = sandbox.argv("true", str(tmp_path / "ws"))
    assert str(home / ".ssh") in pairs(argv, "--tmpfs")
    assert str(tmp_path / "mh") not in argv  # absent: a mount over it would fail
    (tmp_path / "mh").mkdir()
    assert str(tmp_path / "mh") in pairs(sandbox.argv("true", str(tmp_path / "ws")), "--tmpfs")


def test_find_bwrap_honours_the_configured_path(tmp_path: Path) -> None:
    assert find_bwrap(str(tmp_path / "no-such-bwrap")) is None
    plain = tmp_path / "not-executable"
    plain.write_text("")
    assert find_bwrap(str(plain)) is None
    plain.chmod(0o755)
    assert find_bwrap(str(plain)) == str(plain)


def test_detect_reports_why_there_is_no_sandbox(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-bwrap")
    sandbox, why = detect(mode="auto", bwrap_path=missing, network=False, metis_home="/x")
    assert sandbox is None and why == f"bubblewrap not found ({missing})"
    sandbox, why = detect(mode="off", bwrap_path=None, network=False, metis_home="/x")
    assert sandbox is None and why == "tools.shell.sandbox is off"
    broken = tmp_path / "broken-bwrap"
    broken.write_text("#!/bin/sh\necho 'no namespaces for you' >&2\nexit 1\n")
    broken.chmod(0o755)
    sandbox, why = detect(mode="auto", bwrap_path=str(broken), network=False, metis_home="/x")
    assert sandbox is None and why.endswith("cannot create a sandbox here: no namespaces for you")


def test_a_bwrap_is_probed_once_until_it_is_replaced(tmp_path: Path) -> None:
    """Probes are kept per binary; the same path holding another file is a new binary."""
    stand_in, runs = tmp_path / "bwrap", tmp_path / "runs"
    stand_in.write_text(f"#!/bin/sh\necho run >> {runs}\necho 'not yet' >&2\nexit 1\n")
    stand_in.chmod(0o755)
    for _ in range(2):
        sandbox, why = detect(mode="auto", bwrap_path=str(stand_in), network=False, metis_home="/x")
        assert sandbox is None and why.endswith("cannot create a sandbox here: not yet")
    assert runs.read_text() == "run\n"
    stand_in.write_text(f"#!/bin/sh\necho run >> {runs}\nexit 0\n")  # fixed in place
    fixed, why_fixed = detect(mode="auto", bwrap_path=str(stand_in), network=False, metis_home="/x")
    assert fixed is not None and why_fixed == ""
    assert runs.read_text() == "run\nrun\n"


def test_detect_finds_a_working_bwrap(tmp_path: Path) -> None:
    bwrap = require_bwrap()
    sandbox, why = detect(
        mode="auto", bwrap_path=None, network=True, metis_home=str(tmp_path), homes=["/h"]
    )
    assert sandbox is not None and why == ""
    assert os.path.samefile(sandbox.bwrap, bwrap) and sandbox.network is True
    assert sandbox.hidden[0] == str(tmp_path) and "/h/.ssh" in sandbox.hidden


def test_shell_settings_defaults_and_validation() -> None:
    shell = ToolsSettings().shell
    assert (shell.sandbox, shell.network, shell.bwrap_path) == ("auto", False, None)
    assert ShellSettings(sandbox="off", network=True, bwrap_path="/opt/bwrap").sandbox == "off"
    for bad in ({"sandbox": "maybe"}, {"bwrap_path": ""}, {"sandbox_network": True}):
        with pytest.raises(ValidationError):
            ShellSettings(**bad)
