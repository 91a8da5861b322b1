"""The sandbox: hostile paths, symlinks, protected directories.

Each escape ends as `permission_denied` at the pre-check (no `tool.called`) and nothing
outside the root is read, created or changed.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from metis.core.tools.base import MetisHomePath, PathOutsideWorkspace, ProtectedPath
from metis.core.tools.sandbox import MetisHome, Sandbox


def snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() if p.is_file() else b"<dir>"
        for p in sorted(directory.rglob("*"))
    }


async def assert_escape(harness: Any, outside: Path, name: str, input: dict[str, Any]) -> None:
    before = snapshot(outside)
    call = await harness.call(name, input)
    assert call.stage == "precheck", call.text
    assert call.outcome.error_class == "permission_denied"
    assert call.text.endswith("is outside the workspace.")
    assert "TOP-SECRET" not in call.text
    assert snapshot(outside) == before


@pytest.mark.parametrize("path", ["../x", "a/../../x", "/etc/passwd", "../outside/secret.txt"])
async def test_paths_leaving_the_root_are_refused(harness: Any, outside: Path, path: str) -> None:
    await assert_escape(harness, outside, "read_file", {"path": path})
    await assert_escape(harness, outside, "write_file", {"path": path, "content": "x"})
    call = await harness.call("read_file", {"path": path})
    assert call.text == f'Path "{path}" is outside the workspace.'


async def test_absolute_path_inside_the_root_is_allowed(harness: Any, workspace: Path) -> None:
    (workspace / "a.txt").write_text("inside\n")
    call = await harness.call("read_file", {"path": str(workspace / "a.txt")})
    assert (call.stage, call.outcome.error_class, call.text) == ("executed", None, "inside\n")


async def test_sibling_sharing_the_root_prefix_is_outside(
    harness: Any, workspace: Path, tmp_path: Path
) -> None:
    sibling = tmp_path / "ws-other"
    sibling.mkdir()
    (sibling / "secret.txt").write_text("TOP-SECRET\n")
    await assert_escape(harness, sibling, "read_file", {"path": str(sibling / "secret.txt")})
    await assert_escape(harness, sibling, "list_dir", {"path": "../ws-other"})


async def test_symlinks_pointing_outside_are_refused(
    harness: Any, workspace: Path, outside: Path
) -> None:
    (workspace / "file_link").symlink_to(outside / "secret.txt")
    (workspace / "dir_link").symlink_to(outside)
    (workspace / "chain1").symlink_to(workspace / "chain2")
    (workspace / "chain2").symlink_to(workspace / "dir_link")
    await assert_escape(harness, outside, "read_file", {"path": "file_link"})
    await assert_escape(harness, outside, "read_file", {"path": "dir_link/secret.txt"})
    await assert_escape(harness, outside, "list_dir", {"path": "dir_link"})
    await assert_escape(harness, outside, "grep_files", {"pattern": "SECRET", "path": "dir_link"})
    await assert_escape(harness, outside, "read_file", {"path": "chain1/secret.txt"})
    await assert_escape(
        harness, outside, "write_file", {"path": "dir_link/new.txt", "content": "x"}
    )
    await assert_escape(
        harness,
        outside,
        "patch_file",
        {"path": "file_link", "old_text": "TOP", "new_text": "LOW"},
    )


async def test_dangling_symlink_to_outside_cannot_be_written_through(
    harness: Any, workspace: Path, outside: Path
) -> None:
    (workspace / "dangling").symlink_to(outside / "created-by-model.txt")
    await assert_escape(harness, outside, "write_file", {"path": "dangling", "content": "x"})
    assert not (outside / "created-by-model.txt").exists()


async def test_symlinks_inside_the_root_are_followed(harness: Any, workspace: Path) -> None:
    (workspace / "real.txt").write_text("one\n")
    (workspace / "alias").symlink_to("real.txt")
    call = await harness.call("write_file", {"path": "alias", "content": "two\n"})
    assert call.text == "Wrote 4 bytes to real.txt (replaced)."
    assert (workspace / "alias").is_symlink()
    assert (workspace / "real.txt").read_text() == "two\n"


async def test_nul_and_overlong_paths(harness: Any, outside: Path) -> None:
    await assert_escape(harness, outside, "read_file", {"path": "a\x00b"})
    call = await harness.call("read_file", {"path": "a" * 5000})
    assert call.stage == "validate"
    with pytest.raises(PathOutsideWorkspace):
        harness.sandbox.resolve("a" * 5000)


async def test_root_that_is_a_symlink_is_allowed(
    make_harness: Any, workspace: Path, tmp_path: Path
) -> None:
    link = tmp_path / "ws-link"
    link.symlink_to(workspace)
    (workspace / "a.txt").write_text("via link\n")
    harness = make_harness(root=link)
    assert harness.sandbox.root == str(workspace)
    for path in ("a.txt", str(link / "a.txt"), str(workspace / "a.txt")):
        call = await harness.call("read_file", {"path": path})
        assert call.text == "via link\n"


async def test_a_symlink_swapped_in_after_the_precheck_is_caught_at_execution(
    harness: Any, workspace: Path, outside: Path
) -> None:
    entry = harness.registry.lookup("read_file")
    assert harness.sandbox.resolve("later.txt").rel == "later.txt"  # the pre-check passes
    (workspace / "later.txt").symlink_to(outside / "secret.txt")
    outcome = await harness.executor.run(
        entry, {"path": "later.txt"}, sandbox=harness.sandbox, tool_use_id="tu_1"
    )
    assert outcome.error_class == "permission_denied"
    assert "TOP-SECRET" not in outcome.text


async def test_vanished_workspace(harness: Any, workspace: Path) -> None:
    shutil.rmtree(workspace)
    for name, input in [
        ("read_file", {"path": "a"}),
        ("list_dir", {}),
        ("shell", {"command": "true"}),
    ]:
        call = await harness.call(name, input)
        assert call.outcome.error_class == "tool_error"
        assert call.text == "The workspace directory no longer exists."


@pytest.mark.parametrize("path", [".git/hooks/pre-commit", "sub/.git/config", ".git"])
async def test_writes_into_protected_directories_are_refused(
    harness: Any, workspace: Path, path: str
) -> None:
    (workspace / ".git" / "hooks").mkdir(parents=True)
    (workspace / "sub" / ".git").mkdir(parents=True)
    (workspace / "sub" / ".git" / "config").write_text("[core]\n")
    before = snapshot(workspace)
    for name, input in [
        ("write_file", {"path": path, "content": "#!/bin/sh\nrm -rf ~\n"}),
        ("patch_file", {"path": path, "old_text": "[core]", "new_text": "[x]"}),
    ]:
        call = await harness.call(name, input)
        assert call.stage == "precheck"
        assert call.outcome.error_class == "permission_denied"
        assert call.text == f'Path "{path}" is inside a protected directory and cannot be modified.'
    assert snapshot(workspace) == before
    read = await harness.call("read_file", {"path": "sub/.git/config"})
    assert read.text == "[core]\n"


def test_resolve_rules(workspace: Path, tmp_path: Path) -> None:
    sandbox = Sandbox(workspace, protected_dirs=(".git", "secrets"))
    assert sandbox.resolve(".").rel == "."
    assert sandbox.resolve("a/../b").rel == "b"
    assert sandbox.resolve("new/dir/file.txt", write=True).real == str(
        workspace / "new" / "dir" / "file.txt"
    )
    with pytest.raises(ProtectedPath):
        sandbox.resolve(".", write=True)
    with pytest.raises(ProtectedPath):
        sandbox.resolve("x/secrets/y", write=True)
    assert sandbox.resolve("x/secrets/y").rel == "x/secrets/y"
    assert sandbox.resolve("x/.gitignore", write=True).rel == "x/.gitignore"
    with pytest.raises(PathOutsideWorkspace):
        sandbox.resolve(str(tmp_path))
    assert os.path.isabs(sandbox.root)


async def test_a_write_to_the_workspace_root_is_refused_as_the_root(
    harness: Any, workspace: Path
) -> None:
    """The root is refused as what it is; it is no protected directory such as `.git`."""
    (workspace / "sub").mkdir()
    for path in (".", "sub/..", str(workspace)):
        call = await harness.call("write_file", {"path": path, "content": "x"})
        assert call.outcome.error_class == "permission_denied"
        assert call.text == (
            f'Path "{path}" is the workspace root, a directory; name a file inside it.'
        )


async def test_a_path_starting_with_a_tilde_means_the_home_directory(
    harness: Any, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`~/…` was taken literally: a write made a directory called `~` in the workspace (one a
    user's `rm -rf ~` would then mistake for their home). It names the home directory, inside
    the workspace or refused like any path outside it."""
    monkeypatch.setenv("HOME", str(workspace.parent))
    call = await harness.call("write_file", {"path": "~/ws/notes.txt", "content": "x"})
    assert call.text == "Wrote 1 bytes to notes.txt (created)."
    call = await harness.call("write_file", {"path": "~/notes.txt", "content": "x"})
    assert (call.outcome.error_class, call.text) == (
        "permission_denied",
        'Path "~/notes.txt" is outside the workspace.',
    )
    assert sorted(p.name for p in workspace.iterdir()) == ["notes.txt"]
    for path in ("~/.ssh/id_rsa", "~\ud800/x"):
        call = await harness.call("read_file", {"path": path})
        assert (call.stage, call.outcome.error_class) == ("precheck", "permission_denied")


def test_link_loops_long_chains_and_unencodable_names_are_refused_quickly(
    workspace: Path,
) -> None:
    """A symlink chain (e.g. committed to a cloned repository) costs one refused call, not a
    frozen event loop or a crashed turn; neither does a name the filesystem cannot encode."""
    (workspace / "loop1").symlink_to("loop2")
    (workspace / "loop2").symlink_to("loop1")
    for i in range(1, 1200):  # deeper than Python's realpath recursion allows
        (workspace / f"l{i}").symlink_to(f"l{i + 1}")
    (workspace / "l1200").write_text("end\n")
    padded = "d/.." + "/d/.." * 800
    (workspace / "d").mkdir()
    for i in range(1, 60):  # each link walks 1,600 components
        (workspace / f"p{i}").symlink_to(f"{padded}/p{i + 1}")
    sandbox = Sandbox(workspace)
    started = time.monotonic()
    for path in ("loop1", "l1", "p1", "ok\ud800"):
        with pytest.raises(PathOutsideWorkspace):
            sandbox.resolve(path)
    assert time.monotonic() - started < 2  # generous: ~10 ms here; unbounded took 13 s
    (workspace / "short").symlink_to("l1190")
    assert sandbox.resolve("short").rel == "l1200"  # 11 links: within the limit


async def test_grep_skips_unresolvable_links(harness: Any, workspace: Path) -> None:
    (workspace / "loop1").symlink_to("loop2")
    (workspace / "loop2").symlink_to("loop1")
    for i in range(1, 1200):
        (workspace / f"l{i}").symlink_to(f"l{i + 1}")
    (workspace / "l1200").write_text("needle\n")
    (workspace / "plain.txt").write_text("needle\n")
    call = await harness.call("grep_files", {"pattern": "needle"})
    assert call.stage == "executed", call.text
    assert "plain.txt" in call.text and "l1200" in call.text


async def test_metis_home_inside_a_workspace_is_out_of_every_file_tools_reach(
    make_harness: Any, workspace: Path
) -> None:
    home = workspace / "metis-home"
    home.mkdir()
    (home / "api_key").write_text("TOP-SECRET-KEY\n")
    (workspace / "notes.txt").write_text("TOP-SECRET? no, notes\n")
    (workspace / "key_link").symlink_to(home / "api_key")
    (workspace / "key_hardlink").hardlink_to(home / "api_key")
    harness = make_harness(metis_home=home)
    for name, input in (
        ("read_file", {"path": "metis-home/api_key"}),
        ("read_file", {"path": "key_link"}),
        ("read_file", {"path": "key_hardlink"}),
        ("write_file", {"path": "key_hardlink", "content": "overwritten"}),
        ("list_dir", {"path": "metis-home"}),
        ("grep_files", {"pattern": "SECRET", "path": "metis-home"}),
        ("write_file", {"path": "metis-home/new", "content": "x"}),
    ):
        call = await harness.call(name, input)
        assert call.stage == "precheck", (name, call.text)
        assert call.outcome.error_class == "permission_denied"
        assert call.text.endswith("is inside METIS_HOME, which tools may not access.")
    searched = await harness.call("grep_files", {"pattern": "SECRET"})
    assert "notes.txt" in searched.text
    assert "KEY" not in searched.text and "key_link" not in searched.text
    assert "key_hardlink" not in searched.text
    assert not (home / "new").exists()
    assert (home / "api_key").read_text() == "TOP-SECRET-KEY\n"


def test_a_hard_link_to_a_file_of_metis_home_is_private_wherever_it_is(tmp_path: Path) -> None:
    home = tmp_path / "home"
    scratch = home / "workspaces"
    (scratch / "aap-1").mkdir(parents=True)
    (home / "api_key").write_text("K\n")
    elsewhere = tmp_path / "ws"
    elsewhere.mkdir()
    (elsewhere / "plain.txt").write_text("x\n")
    links = [elsewhere / "key.txt", scratch / "aap-1" / "key.txt"]
    for link in links:
        link.hardlink_to(home / "api_key")
    metis_home = MetisHome.at(home, scratch)
    assert metis_home.private(str(home / "api_key"))
    assert all(metis_home.private(str(link)) for link in links)
    assert not metis_home.private(str(elsewhere / "plain.txt"))
    (scratch / "aap-1" / "own.txt").write_text("y\n")
    assert not metis_home.private(str(scratch / "aap-1" / "own.txt"))


def test_a_file_opened_through_a_directory_swapped_for_a_link_is_caught(tmp_path: Path) -> None:
    root, outside = tmp_path / "ws", tmp_path / "outside"
    (root / "d").mkdir(parents=True)
    outside.mkdir()
    (root / "d" / "notes.txt").write_text("mine")
    (outside / "notes.txt").write_text("TOP-SECRET")
    sandbox = Sandbox(root)
    target = sandbox.resolve("d/notes.txt")
    (root / "d").rename(root / "d.moved")  # the race: after the check, before the open
    (root / "d").symlink_to(outside)
    fd = os.open(target.real, os.O_RDONLY)
    try:
        with pytest.raises(PathOutsideWorkspace):
            sandbox.check_opened(fd, "d/notes.txt")
    finally:
        os.close(fd)
    fd = os.open(root / "d.moved" / "notes.txt", os.O_RDONLY)
    try:
        sandbox.check_opened(fd, "d.moved/notes.txt")  # inside: nothing to say
    finally:
        os.close(fd)


def test_a_hard_link_to_the_daemons_key_opened_in_the_workspace_is_caught(tmp_path: Path) -> None:
    home, root = tmp_path / "home", tmp_path / "ws"
    home.mkdir()
    root.mkdir()
    (home / "api_key").write_text("secret")
    os.link(home / "api_key", root / "notes.txt")
    sandbox = Sandbox(root, metis_home=MetisHome.at(home, home / "workspaces"))
    fd = os.open(root / "notes.txt", os.O_RDONLY)
    try:
        with pytest.raises(MetisHomePath):
            sandbox.check_opened(fd, "notes.txt")
    finally:
        os.close(fd)
