"""The `grep_files` tool."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from metis.core.tools.base import ToolContext, ToolLimits
from metis.core.tools.builtins.grep_files import collect_files, search_files
from metis.core.tools.sandbox import MetisHome, Sandbox
from metis.core.tools.settings import ToolsSettings


async def grep(harness: Any, **input: Any) -> tuple[str | None, str]:
    call = await harness.call("grep_files", input)
    assert call.stage == "executed", call.text
    return call.outcome.error_class, call.text


def live_worker_pids() -> list[int]:
    """Matcher processes still running (zombies do not count)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"_grep_search.py" in cmdline and state != "Z":
            pids.append(int(entry))
    return pids


async def test_invalid_regex(harness: Any) -> None:
    assert await grep(harness, pattern="(") == (
        "tool_error",
        "Invalid regular expression: missing ), unterminated subpattern at position 0",
    )


async def test_catastrophic_pattern_times_out_without_blocking_the_loop(
    make_harness: Any, workspace: Path
) -> None:
    (workspace / "evil.txt").write_text("a" * 40 + "!\n")
    harness = make_harness(ToolsSettings.model_validate({"timeouts": {"per_class": {"read": 1}}}))
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    ticking = asyncio.create_task(ticker())
    started = time.monotonic()
    call = await harness.call("grep_files", {"pattern": "(a+)+$"})
    elapsed = time.monotonic() - started
    ticking.cancel()
    assert call.outcome.error_class == "timeout"
    assert call.text == "Timed out after 1 s."
    assert 0.9 < elapsed < 3
    assert ticks >= 10  # the event loop kept running during the match
    # killed at the timeout; on a loaded machine the kernel may take a moment to end it
    deadline = time.monotonic() + 2
    while live_worker_pids() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert live_worker_pids() == []


async def test_skips_ignored_dirs_large_and_binary_files(harness: Any, workspace: Path) -> None:
    for skipped in [
        "node_modules/m",
        ".git",
        ".venv/lib",
        "__pycache__",
        "dist",
        "build",
        ".cache",
    ]:
        (workspace / skipped).mkdir(parents=True)
        (workspace / skipped / "x.txt").write_text("needle\n")
    (workspace / "src").mkdir()
    (workspace / "src" / "app.py").write_text("first\nneedle here\n")
    (workspace / "src" / "huge.txt").write_bytes(b"needle\n" + b"x" * (2 * 1024 * 1024))
    (workspace / "src" / "blob.bin").write_bytes(b"needle\x00\n")
    os.mkfifo(workspace / "src" / "fifo")
    assert await grep(harness, pattern="needle") == (
        None,
        "1 matches in 1 files\nsrc/app.py:2: needle here",
    )
    # An explicitly named skipped directory is searched.
    assert await grep(harness, pattern="needle", path="node_modules") == (
        None,
        "1 matches in 1 files\nnode_modules/m/x.txt:1: needle",
    )


async def test_glob_sorting_and_results(harness: Any, workspace: Path) -> None:
    (workspace / "a").mkdir()
    (workspace / "a" / "z.py").write_text("hit\nmiss\nHIT\n")
    (workspace / "a.py").write_text("hit\n")
    (workspace / "b.txt").write_text("hit\n")
    assert await grep(harness, pattern="hit", glob="*.py") == (
        None,
        "2 matches in 2 files\na.py:1: hit\na/z.py:1: hit",
    )
    assert await grep(harness, pattern="hit", glob="a/*", ignore_case=True) == (
        None,
        "2 matches in 1 files\na/z.py:1: hit\na/z.py:3: HIT",
    )
    assert await grep(harness, pattern="hit", path="b.txt") == (
        None,
        "1 matches in 1 files\nb.txt:1: hit",
    )
    assert await grep(harness, pattern="nothing") == (None, "No matches.")
    assert await grep(harness, pattern="x", path="nowhere") == (
        "tool_error",
        "Path not found: nowhere",
    )


async def test_a_double_star_glob_also_matches_no_directory(harness: Any, workspace: Path) -> None:
    """`**/*.py` is how a model asks for every Python file: the top-level ones included, as
    `src/**/*.py` includes those directly in src; `*` stays within one name."""
    for name in ["top.py", "src/app.py", "src/pkg/mod.py", "src/pkg/deep/x.py", "docs/a.py"]:
        (workspace / name).parent.mkdir(parents=True, exist_ok=True)
        (workspace / name).write_text("hit\n")
    _, text = await grep(harness, pattern="hit", glob="**/*.py")
    assert text.split("\n")[1:] == [
        "docs/a.py:1: hit",
        "src/app.py:1: hit",
        "src/pkg/deep/x.py:1: hit",
        "src/pkg/mod.py:1: hit",
        "top.py:1: hit",
    ]
    _, text = await grep(harness, pattern="hit", glob="src/**/*.py")
    assert text.split("\n")[1:] == [
        "src/app.py:1: hit",
        "src/pkg/deep/x.py:1: hit",
        "src/pkg/mod.py:1: hit",
    ]
    _, text = await grep(harness, pattern="hit", glob="src/*.py")
    assert text.split("\n")[1:] == ["src/app.py:1: hit"]
    _, text = await grep(harness, pattern="hit", glob="src/**/deep/**")
    assert text.split("\n")[1:] == ["src/pkg/deep/x.py:1: hit"]


async def test_a_named_file_that_cannot_be_searched_says_why(harness: Any, workspace: Path) -> None:
    """A directory's big and binary files are skipped quietly, but a file the model names
    itself answered "No matches." although it holds the pattern."""
    (workspace / "huge.log").write_bytes(b"needle\n" + b"x" * (2 * 1024 * 1024))
    assert await grep(harness, pattern="needle", path="huge.log") == (
        "tool_error",
        "huge.log is 2097159 bytes; grep_files searches files up to 2097152 bytes. Search it "
        "with the shell's grep, or read it in parts with read_file.",
    )
    (workspace / "blob.bin").write_bytes(b"needle\x00\n")
    assert await grep(harness, pattern="needle", path="blob.bin") == (
        "tool_error",
        "blob.bin is a binary file (8 bytes).",
    )


async def test_a_glob_given_as_the_path_is_pointed_to_the_glob_field(
    harness: Any, workspace: Path
) -> None:
    (workspace / "src").mkdir()
    (workspace / "src" / "a.py").write_text("hit\n")
    assert await grep(harness, pattern="hit", path="src/*.py") == (
        "tool_error",
        "Path not found: src/*.py (path names one directory or file; to pick files by a "
        'pattern, give path="src" and glob="*.py")',
    )
    assert await grep(harness, pattern="hit", path="**/*.py") == (
        "tool_error",
        "Path not found: **/*.py (path names one directory or file; to pick files by a "
        'pattern, give path="." and glob="**/*.py")',
    )


async def test_max_results_cut_off(harness: Any, workspace: Path) -> None:
    (workspace / "f.txt").write_text("m\n" * 5)
    _, text = await grep(harness, pattern="m", max_results=3)
    assert text.split("\n") == [
        "3 matches in 1 files (stopped at max_results)",
        "f.txt:1: m",
        "f.txt:2: m",
        "f.txt:3: m",
    ]
    _, text = await grep(harness, pattern="m", max_results=5)
    assert text.split("\n")[0] == "5 matches in 1 files"


async def test_long_lines(harness: Any, workspace: Path) -> None:
    (workspace / "wide.txt").write_text("k" + "y" * 400 + "\n" + "z" * 5000 + "late\n")
    _, text = await grep(harness, pattern="k|late")
    assert text == "1 matches in 1 files\nwide.txt:1: k" + "y" * 299 + "…"


async def test_symlinks(harness: Any, workspace: Path, outside: Path) -> None:
    (workspace / "real.txt").write_text("needle\n")
    (workspace / "alias.txt").symlink_to("real.txt")
    (workspace / "out.txt").symlink_to(outside / "secret.txt")
    (workspace / "outdir").symlink_to(outside)
    (workspace / "sub").mkdir()
    (workspace / "loop").symlink_to(workspace)
    _, text = await grep(harness, pattern="needle|SECRET")
    assert text == "2 matches in 2 files\nalias.txt:1: needle\nreal.txt:1: needle"


# ---------------------------------------------------------------------------------------------
# a directory swapped for a link after the check (see conftest.py)
# ---------------------------------------------------------------------------------------------


async def search(sandbox: Sandbox, files: list[Any]) -> str:
    """Every line of `files` (as `collect_files` gave them), searched by the matcher process."""
    ctx = ToolContext(
        tool_use_id="tu_1",
        workspace=sandbox,
        cancel_event=asyncio.Event(),
        deadline=time.monotonic() + 60,
        limits=ToolLimits(),
    )
    return await search_files(files, ".", False, 100, ctx)


async def test_the_matcher_skips_a_file_whose_directory_was_swapped_after_the_walk(
    workspace: Path, elsewhere: Any
) -> None:
    """The matcher opens each file tens of milliseconds after the walk listed it."""
    (workspace / "kept.txt").write_text("kept\n")
    sandbox = elsewhere.sandbox
    files = collect_files(sandbox, sandbox.resolve("."), None, lambda: False)
    assert [file[0] for file in files] == ["d/api_key", "d/sub/api_key", "kept.txt"]
    assert (await search(sandbox, files)).startswith("3 matches in 3 files\n")
    elsewhere.swap(workspace / "d")
    assert await search(sandbox, files) == (
        "1 matches in 1 files\nkept.txt:1: kept\n"
        "(2 files changed during the search and not searched: d/api_key, d/sub/api_key)"
    )


async def test_the_matcher_skips_a_file_that_is_no_longer_the_one_checked(
    workspace: Path, tmp_path: Path
) -> None:
    """Same path, another file: a hard link to the daemon's key put in its place after the walk
    (which the walk would have refused) is not read."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "api_key").write_text("TOP-SECRET\n")
    (workspace / "notes.txt").write_text("mine\n")
    sandbox = Sandbox(workspace, metis_home=MetisHome.at(home, home / "workspaces"))
    files = collect_files(sandbox, sandbox.resolve("."), None, lambda: False)
    (workspace / "notes.txt").unlink()
    (workspace / "notes.txt").hardlink_to(home / "api_key")
    assert await search(sandbox, files) == (
        "No matches.\n(1 file changed during the search and not searched: notes.txt)"
    )
    assert collect_files(sandbox, sandbox.resolve("."), None, lambda: False) == []


async def test_a_file_replaced_by_a_write_during_the_search_is_named_not_missed(
    workspace: Path,
) -> None:
    """A `write_file` of the same batch replaces a file by a rename between the walk and the
    read: the result says it was not searched instead of a bare "No matches."."""
    (workspace / "notes.txt").write_text("needle\n")
    sandbox = Sandbox(workspace)
    files = collect_files(sandbox, sandbox.resolve("."), None, lambda: False)
    (workspace / "new.txt").write_text("needle again\n")
    (workspace / "new.txt").replace(workspace / "notes.txt")
    assert await search(sandbox, files) == (
        "No matches.\n(1 file changed during the search and not searched: notes.txt)"
    )


async def test_a_directory_swapped_while_the_walk_runs_is_not_entered(
    workspace: Path, elsewhere: Any
) -> None:
    """The walk lists `d` (queueing `d/sub`), then `d` is swapped before `d/sub` is opened.
    The walk's cancel check is the hook: it runs at every 256th entry, here `d`'s last."""
    listed_before_d = len(os.listdir(workspace))
    for i in range(256 - listed_before_d - 2):  # `d` already holds `api_key` and `sub`
        (workspace / "d" / f"f{i:03}").write_text("")

    def swap_once() -> bool:
        if not (workspace / "d").is_symlink():
            elsewhere.swap(workspace / "d")
        return False

    sandbox = elsewhere.sandbox
    files = collect_files(sandbox, sandbox.resolve("."), None, swap_once)
    assert (workspace / "d").is_symlink()
    assert [file[0] for file in files if not file[0].startswith("d/f")] == ["d/api_key"]
    assert "TOP-SECRET" not in await search(sandbox, files)


async def test_a_search_whose_directory_was_swapped_after_the_check_is_refused(
    workspace: Path, elsewhere: Any
) -> None:
    sandbox = elsewhere.sandbox
    targets = [sandbox.resolve("d/sub"), sandbox.resolve("d/sub/api_key")]
    elsewhere.swap(workspace / "d")
    for target in targets:
        with elsewhere.refused(target.rel):
            collect_files(sandbox, target, None, lambda: False)
