"""`grep_files` honours git's ignore rules (`.gitignore` files, `.git/info/exclude`)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


async def found(harness: Any, **input: Any) -> list[str]:
    """The paths of the files holding `needle`, as the model sees them."""
    call = await harness.call("grep_files", {"pattern": "needle", **input})
    assert call.stage == "executed", call.text
    assert call.outcome.error_class is None, call.text
    if call.text.startswith("No matches"):
        return []
    return sorted({line.split(":", 1)[0] for line in call.text.split("\n")[1:]})


async def answer(harness: Any, **input: Any) -> str:
    call = await harness.call("grep_files", {"pattern": "needle", **input})
    assert call.outcome.error_class is None, call.text
    text: str = call.text
    return text


def write(workspace: Path, *names: str, text: str = "needle\n") -> None:
    for name in names:
        (workspace / name).parent.mkdir(parents=True, exist_ok=True)
        (workspace / name).write_text(text)


async def test_the_root_gitignore_leaves_out_what_it_ignores(harness: Any, workspace: Path) -> None:
    (workspace / ".gitignore").write_text("# generated\n*.log\nout/\n/top.txt\n")
    write(workspace, "app.py", "debug.log", "src/trace.log", "out/gen.py", "top.txt", "src/top.txt")
    assert await found(harness) == ["app.py", "src/top.txt"]


async def test_a_nested_gitignore_applies_below_its_own_directory_only(
    harness: Any, workspace: Path
) -> None:
    (workspace / "sub" / "deep").mkdir(parents=True)
    (workspace / "sub" / ".gitignore").write_text("gen.py\n/local.txt\ndeep/only.txt\n")
    write(
        workspace,
        "gen.py",
        "local.txt",
        "deep/only.txt",
        "sub/gen.py",
        "sub/deep/gen.py",
        "sub/local.txt",
        "sub/deep/local.txt",
        "sub/deep/only.txt",
        "other/sub/gen.py",
    )
    assert await found(harness) == [
        "deep/only.txt",
        "gen.py",
        "local.txt",
        "other/sub/gen.py",
        "sub/deep/local.txt",
    ]


async def test_a_negation_re_includes_and_a_deeper_file_overrides_one_above(
    harness: Any, workspace: Path
) -> None:
    (workspace / ".gitignore").write_text("*.txt\n!keep.txt\n")
    (workspace / "docs").mkdir()
    (workspace / "docs" / ".gitignore").write_text("!*.txt\nkeep.txt\n")
    write(workspace, "a.txt", "keep.txt", "lib/keep.txt", "docs/a.txt", "docs/keep.txt")
    assert await found(harness) == ["docs/a.txt", "keep.txt", "lib/keep.txt"]


async def test_a_pattern_ending_in_a_slash_ignores_directories_only(
    harness: Any, workspace: Path
) -> None:
    (workspace / ".gitignore").write_text("cache/\n")
    write(workspace, "a/cache", "b/cache/x.txt", "c/cache/deep/y.txt")
    assert await found(harness) == ["a/cache"]


async def test_git_info_exclude_is_honoured_below_the_gitignores(
    harness: Any, workspace: Path
) -> None:
    (workspace / ".git" / "info").mkdir(parents=True)
    (workspace / ".git" / "info" / "exclude").write_text("secret.txt\nnotes/\n*.md\n")
    (workspace / ".gitignore").write_text("!README.md\n")
    write(workspace, "secret.txt", "sub/secret.txt", "notes/n.txt", "a.md", "README.md", "ok.txt")
    assert await found(harness) == ["README.md", "ok.txt"]


async def test_a_file_in_an_ignored_directory_cannot_be_re_included(
    harness: Any, workspace: Path
) -> None:
    """Git's rule: it does not look inside an excluded directory, so neither a `!` pattern
    above nor a `.gitignore` inside the directory brings a file back."""
    (workspace / ".gitignore").write_text("out/\n!out/keep.txt\n")
    write(workspace, "out/keep.txt", "out/x.txt", "main.py")
    (workspace / "out" / ".gitignore").write_text("!*\n")
    assert await found(harness) == ["main.py"]
    assert await found(harness, glob="*.txt") == []


async def test_a_path_named_explicitly_is_searched_even_if_ignored(
    harness: Any, workspace: Path
) -> None:
    """As `rg ignored/path` does: the rules judge what the walk finds, not what the model
    names. Inside an ignored directory it names, only the `.gitignore` files found there apply;
    inside one that is not ignored, those above apply as well."""
    (workspace / ".gitignore").write_text("*.log\nout/\n")
    write(workspace, "debug.log", "out/gen.py", "out/sub/x.py", "out/sub/y.log", "out/z.tmp")
    write(workspace, "src/a.py", "src/b.log")
    (workspace / "out" / ".gitignore").write_text("*.tmp\n")
    assert await found(harness, path="debug.log") == ["debug.log"]
    assert await found(harness, path="out") == ["out/gen.py", "out/sub/x.py", "out/sub/y.log"]
    assert await found(harness, path="out/sub") == ["out/sub/x.py", "out/sub/y.log"]
    assert await found(harness, path="src") == ["src/a.py"]
    assert await found(harness) == ["src/a.py"]


async def test_include_ignored_searches_what_the_rules_leave_out(
    harness: Any, workspace: Path
) -> None:
    (workspace / ".gitignore").write_text("*.log\nout/\n")
    write(workspace, "app.py", "debug.log", "out/gen.py", "node_modules/m/x.js")
    assert await found(harness, include_ignored=True) == ["app.py", "debug.log", "out/gen.py"]
    assert await found(harness, include_ignored=False) == ["app.py"]


async def test_no_matches_says_what_the_rules_left_out(harness: Any, workspace: Path) -> None:
    """Files the glob would not have picked are not counted; a directory is counted once,
    whatever it holds; a skipped directory (node_modules) is not counted."""
    (workspace / ".gitignore").write_text("*.log\nout/\nnode_modules/\n")
    write(workspace, "a.log", "b.log", "c.txt", "out/x.log", "out/y.log", "node_modules/m.log")
    assert await answer(harness, pattern="absent") == (
        "No matches (2 files and 1 directory ignored by .gitignore; "
        "include_ignored=true searches them)."
    )
    assert await answer(harness, pattern="absent", glob="a.*") == (
        "No matches (1 file and 1 directory ignored by .gitignore; "
        "include_ignored=true searches them)."
    )
    assert await answer(harness, pattern="absent", path="out") == "No matches."
    assert await answer(harness, pattern="absent", include_ignored=True) == "No matches."
    (workspace / ".gitignore").write_text("*.log\n")
    (workspace / "out" / "x.log").unlink()
    (workspace / "out" / "y.log").unlink()
    assert await answer(harness, glob="*.log") == (
        "No matches (2 files ignored by .gitignore; include_ignored=true searches them)."
    )
    assert await answer(harness, pattern="needle") == "1 matches in 1 files\nc.txt:1: needle"


async def test_a_gitignore_that_cannot_be_read_or_parsed_adds_no_rules(
    harness: Any, workspace: Path, outside: Path
) -> None:
    """A directory, a link, a FIFO or an oversized file named `.gitignore`, or patterns pathspec
    refuses (a lone backslash, a reversed range): the search runs, as without that file."""
    write(workspace, "dir/.gitignore/x.txt", "dir/a.txt")
    write(workspace, "link/a.txt")
    (outside / "patterns").write_text("*.txt\n")
    (workspace / "link" / ".gitignore").symlink_to(outside / "patterns")
    write(workspace, "fifo/a.txt")
    os.mkfifo(workspace / "fifo" / ".gitignore")
    write(workspace, "big/a.txt")
    (workspace / "big" / ".gitignore").write_text("*.txt\n" + "#" * 300_000 + "\n")
    write(workspace, "bad/a.txt", "worse/a.txt", "binary/a.txt")
    (workspace / "bad" / ".gitignore").write_text("*.txt\n\\\n")
    (workspace / "worse" / ".gitignore").write_text("*.txt\n[z-a]\n")
    (workspace / "binary" / ".gitignore").write_bytes(b"\xff\xfe\x00*.txt\x00\n")
    write(workspace, "fine/a.txt", "fine/b.py")
    (workspace / "fine" / ".gitignore").write_text("*.txt\n")
    assert await found(harness) == [
        "bad/a.txt",
        "big/a.txt",
        "binary/a.txt",
        "dir/.gitignore/x.txt",
        "dir/a.txt",
        "fifo/a.txt",
        "fine/b.py",
        "link/a.txt",
        "worse/a.txt",
    ]


async def test_a_pattern_that_would_backtrack_for_seconds_is_dropped(
    harness: Any, workspace: Path
) -> None:
    """Pathspec's regular expression for `a*a*a*a*a*b` took 14 s on such a name, holding the
    GIL (the daemon frozen); the file's other patterns still apply."""
    (workspace / ".gitignore").write_text("a*a*a*a*a*b\n/a*a*a*b/\n**/x/**/y/**/z\n*.log\n")
    name = "a" * 200 + "c"
    write(workspace, name, f"sub/{name}", "trace.log")
    started = time.monotonic()
    assert await found(harness) == [name, f"sub/{name}"]
    assert time.monotonic() - started < 5
