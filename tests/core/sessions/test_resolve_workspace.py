"""resolve_workspace: which values name a usable workspace, and why the others do not."""

from __future__ import annotations

from pathlib import Path

import pytest

from metis.core.errors import WorkspaceNotFound, WorkspaceRefused
from metis.core.sessions.service import protected_workspaces, resolve_workspace
from metis.core.tools.sandbox import MetisHome

PROTECTED = protected_workspaces()


def refusal(raw: str, roots: tuple[Path, ...] = ()) -> str:
    with pytest.raises(WorkspaceNotFound) as caught:
        resolve_workspace(raw, roots, PROTECTED)
    return str(caught.value.details["reason"])


def test_a_directory_is_returned_symlink_resolved(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    resolved = resolve_workspace(str(tmp_path / "link") + "/", (), PROTECTED)
    assert resolved == str((tmp_path / "real").resolve())


def test_each_unusable_value_says_which_check_failed(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert refusal("relative/dir") == "not_absolute"
    assert refusal(str(tmp_path / "absent")) == "not_found"
    assert refusal(str(tmp_path / "file")) == "not_a_directory"
    assert refusal(str(tmp_path / "file" / "below")) == "not_found"
    assert refusal(str(tmp_path / "loop")) == "not_found"
    assert refusal("/" + "x" * 5000) == "not_found"  # a name longer than any file system takes
    assert refusal(str(tmp_path) + "\0") == "not_found"


def test_outside_every_allowed_root_is_not_accessible(tmp_path: Path) -> None:
    (tmp_path / "inside" / "deeper").mkdir(parents=True)
    (tmp_path / "inside-not").mkdir()
    roots = ((tmp_path / "inside").resolve(),)
    assert resolve_workspace(str(tmp_path / "inside" / "deeper"), roots, PROTECTED)
    assert refusal(str(tmp_path / "inside-not"), roots) == "not_accessible"
    # the code is the contract's; the message says why, not "permission denied"
    with pytest.raises(WorkspaceNotFound) as caught:
        resolve_workspace(str(tmp_path / "inside-not"), roots, PROTECTED)
    assert str(caught.value).endswith(
        f"is not usable: outside the directories this daemon allows sessions in ({roots[0]})"
    )


def test_protected_directories_and_pseudo_file_systems_are_refused_unless_listed() -> None:
    for raw in ("/", "/etc", "/proc/self", "/sys/kernel", "/dev"):
        with pytest.raises(WorkspaceRefused):
            resolve_workspace(raw, (), PROTECTED)
    assert resolve_workspace("/etc", (Path("/etc").resolve(),), PROTECTED) == str(
        Path("/etc").resolve()
    )
    with pytest.raises(WorkspaceRefused):  # a root above a protected directory is not enough
        resolve_workspace("/etc", (Path("/"),), PROTECTED)


def test_a_path_written_under_a_pseudo_file_system_is_refused_wherever_it_leads() -> None:
    # /proc/self/cwd resolves to the daemon's working directory, outside /proc
    with pytest.raises(WorkspaceRefused):
        resolve_workspace("/proc/self/cwd", (), PROTECTED)


def test_a_workspace_holding_metis_home_must_be_listed_and_one_inside_it_is_refused(
    tmp_path: Path,
) -> None:
    home_dir = tmp_path / "data" / "metis"
    (home_dir / "sub").mkdir(parents=True)
    (home_dir / "workspaces" / "scratch").mkdir(parents=True)
    home = MetisHome.at(home_dir, home_dir / "workspaces")
    for workspace, roots in (
        (tmp_path / "data", ()),
        (tmp_path, ()),
        (home_dir, (home_dir.resolve(),)),
        (home_dir / "sub", ((home_dir / "sub").resolve(),)),
    ):
        with pytest.raises(WorkspaceRefused) as caught:
            resolve_workspace(str(workspace), roots, PROTECTED, home)
        assert caught.value.details["reason"] == "metis_home"
        assert "METIS_HOME" in caught.value.message
    holder = (tmp_path / "data").resolve()
    assert resolve_workspace(str(holder), (holder,), PROTECTED, home) == str(holder)
    scratch = home_dir / "workspaces" / "scratch"  # AAP's scratch workspaces are ordinary ones
    assert resolve_workspace(str(scratch), (), PROTECTED, home) == str(scratch.resolve())
    (tmp_path / "data" / "project").mkdir()
    assert resolve_workspace(str(tmp_path / "data" / "project"), (), PROTECTED, home)
    (tmp_path / "data" / "metis-other").mkdir()  # a sibling whose name only starts the same
    assert resolve_workspace(str(tmp_path / "data" / "metis-other"), (), PROTECTED, home)
