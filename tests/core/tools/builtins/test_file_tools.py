"""The file tools: read_file, write_file, patch_file, list_dir."""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from metis.core.tools.base import ToolCancelled, ToolContext, ToolLimits
from metis.core.tools.builtins.list_dir import list_entries
from metis.core.tools.builtins.patch_file import patch
from metis.core.tools.builtins.read_file import read_lines
from metis.core.tools.builtins.write_file import WriteFileTool
from metis.core.tools.files import replace_file
from metis.core.tools.sandbox import Sandbox
from metis.core.tools.settings import ToolsSettings

MIB = 1024 * 1024
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")


async def text_of(harness: Any, name: str, input: dict[str, Any]) -> tuple[str | None, str]:
    call = await harness.call(name, input)
    assert call.stage == "executed", call.text
    return call.outcome.error_class, call.text


# ---------------------------------------------------------------------------------------------
# read_file
# ---------------------------------------------------------------------------------------------


async def test_read_whole_file_verbatim(harness: Any, workspace: Path) -> None:
    (workspace / "crlf.txt").write_bytes(b"one\r\ntwo\r\nno newline")
    assert await text_of(harness, "read_file", {"path": "crlf.txt"}) == (
        None,
        "one\r\ntwo\r\nno newline",
    )
    (workspace / "empty.txt").write_bytes(b"")
    assert await text_of(harness, "read_file", {"path": "empty.txt"}) == (None, "[empty file]")


async def test_read_window_and_continuation_note(harness: Any, workspace: Path) -> None:
    (workspace / "ten.txt").write_text("".join(f"l{i}\n" for i in range(1, 11)))
    assert await text_of(harness, "read_file", {"path": "ten.txt", "offset": 3, "limit": 2}) == (
        None,
        "l3\nl4\n[lines 3-4 of 10; use offset=5 to continue]",
    )
    _, tail = await text_of(harness, "read_file", {"path": "ten.txt", "offset": 9})
    assert tail == "l9\nl10\n"
    assert await text_of(harness, "read_file", {"path": "ten.txt", "offset": 11}) == (
        "tool_error",
        "offset 11 is past the end of ten.txt (10 lines).",
    )


async def test_read_refuses_missing_binary_and_special_files(harness: Any, workspace: Path) -> None:
    assert await text_of(harness, "read_file", {"path": "src/app.py"}) == (
        "tool_error",
        "File not found: src/app.py",
    )
    (workspace / "data.bin").write_bytes(b"PK\x03\x04\x00\x01" + b"x" * 100)
    assert await text_of(harness, "read_file", {"path": "data.bin"}) == (
        "tool_error",
        "data.bin is a binary file (106 bytes).",
    )


async def test_reading_or_patching_a_directory_says_it_is_one(
    harness: Any, workspace: Path
) -> None:
    """The old "not a regular file" left the model guessing what `src` was; it is told it named a
    directory and where its entries are."""
    (workspace / "src").mkdir()
    for name, input in [
        ("read_file", {"path": "src"}),
        ("patch_file", {"path": "src", "old_text": "a", "new_text": "b"}),
    ]:
        assert await text_of(harness, name, input) == (
            "tool_error",
            "src is a directory, not a file; list_dir lists its entries.",
        )


async def test_fifo_returns_at_once(harness: Any, workspace: Path) -> None:
    os.mkfifo(workspace / "pipe")
    started = time.monotonic()
    for name, input in [
        ("read_file", {"path": "pipe"}),
        ("patch_file", {"path": "pipe", "old_text": "a", "new_text": "b"}),
        ("write_file", {"path": "pipe", "content": "x"}),
    ]:
        assert await text_of(harness, name, input) == ("tool_error", "pipe is not a regular file.")
    assert time.monotonic() - started < 2
    assert stat.S_ISFIFO((workspace / "pipe").lstat().st_mode)


async def test_one_mebibyte_single_line_is_cut(harness: Any, workspace: Path) -> None:
    (workspace / "long.txt").write_bytes(b"x" * MIB + b"\nsecond\n")
    _, text = await text_of(harness, "read_file", {"path": "long.txt"})
    assert text == "x" * 2000 + "[… line truncated]\nsecond\n"
    (workspace / "wide.txt").write_text("é" * 3000)
    _, text = await text_of(harness, "read_file", {"path": "wide.txt"})
    assert text == "é" * 2000 + "[… line truncated]"


async def test_invalid_utf8_is_replaced_and_counted(harness: Any, workspace: Path) -> None:
    (workspace / "latin1.txt").write_bytes("café\nnaïve\nok\n".encode("latin-1"))
    _, text = await text_of(harness, "read_file", {"path": "latin1.txt"})
    assert text == "caf\ufffd\nna\ufffdve\nok\n[2 invalid UTF-8 sequences replaced]"


async def test_invalid_utf8_is_replaced_per_sequence_and_counted_within_the_cut(
    harness: Any, workspace: Path
) -> None:
    """Each invalid sequence is one U+FFFD as `errors="replace"` makes them (a truncated
    sequence is one, a surrogate's three bytes are three); a U+FFFD the file holds is shown but
    not counted; a cut line counts only what is shown, also when its read ends mid-sequence."""
    (workspace / "mixed.txt").write_bytes(
        b"ok \xef\xbf\xbd kept \xff\n"
        + b"\xe2\x82x \xed\xa0\x80 \xf0\x9f\x98\r\n"
        + b"a" * 1998 + b"\xef\xbf\xbd" + b"\xff" * 5000 + b"\n"
        + b"\xff" * 8003 + b"\xf0\x9f\x98\x80" * 10 + b"\n"
        + b"end \x80"
    )  # fmt: skip
    _, text = await text_of(harness, "read_file", {"path": "mixed.txt"})
    assert text == (
        "ok \ufffd kept \ufffd\n"
        + "\ufffdx \ufffd\ufffd\ufffd \ufffd\r\n"
        + "a" * 1998 + "\ufffd\ufffd[… line truncated]\n"
        + "\ufffd" * 2000 + "[… line truncated]\n"
        + "end \ufffd\n"
        + "[2008 invalid UTF-8 sequences replaced]"
    )  # fmt: skip


async def test_large_file_is_streamed_and_counted(harness: Any, workspace: Path) -> None:
    (workspace / "big.txt").write_text("".join(f"{i}\n" for i in range(1, 100_001)))
    _, text = await text_of(harness, "read_file", {"path": "big.txt", "offset": 50_000, "limit": 1})
    assert text == "50000\n[lines 50000-50000 of 100000; use offset=50001 to continue]"


async def test_a_window_over_the_result_limit_ends_with_where_to_continue(
    make_harness: Any, workspace: Path
) -> None:
    """2,000 lines of 1,000 characters are 2 MB, far over the 256 KiB result cap: the read stops
    at the last whole line that fits and says where to continue, instead of being cut mid-line
    by the cap with the continuation note cut away."""
    harness = make_harness(ToolsSettings(max_result_bytes=8192))
    (workspace / "wide.txt").write_text("".join(f"{i:04} " + "x" * 995 + "\n" for i in range(2000)))
    call = await harness.call("read_file", {"path": "wide.txt"})
    assert (call.outcome.error_class, call.outcome.truncated) == (None, False)
    lines = call.text.split("\n")
    assert lines[:-1] == [f"{i:04} " + "x" * 995 for i in range(7)]
    assert lines[-1] == (
        "[lines 1-7 of 2000; the next line would pass the 8192-byte result limit; "
        "use offset=8 to continue]"
    )
    call = await harness.call("read_file", {"path": "wide.txt", "offset": 1999})
    assert call.text == "1998 " + "x" * 995 + "\n1999 " + "x" * 995 + "\n"


# ---------------------------------------------------------------------------------------------
# write_file
# ---------------------------------------------------------------------------------------------


async def test_write_creates_and_replaces(harness: Any, workspace: Path) -> None:
    call = await harness.call("write_file", {"path": "src/pkg/app.py", "content": "print('hi')\n"})
    assert call.text == "Wrote 12 bytes to src/pkg/app.py (created)."
    assert call.outcome.files_modified == ("src/pkg/app.py",)
    target = workspace / "src" / "pkg" / "app.py"
    target.chmod(0o751)
    call = await harness.call("write_file", {"path": "src/pkg/app.py", "content": "é\r\n"})
    assert call.text == "Wrote 4 bytes to src/pkg/app.py (replaced)."
    assert target.read_bytes() == "é\r\n".encode()
    assert stat.S_IMODE(target.stat().st_mode) == 0o751
    assert sorted(p.name for p in target.parent.iterdir()) == ["app.py"]  # no temp files left


async def test_write_refusals(harness: Any, workspace: Path) -> None:
    (workspace / "dir").mkdir()
    assert await text_of(harness, "write_file", {"path": "dir", "content": "x"}) == (
        "tool_error",
        "dir is a directory.",
    )
    big = "x" * (6 * MIB)
    error, text = await text_of(harness, "write_file", {"path": "big.txt", "content": big})
    assert (error, text) == (
        "tool_error",
        f"content is {6 * MIB} bytes; write_file accepts at most {5 * MIB} bytes.",
    )
    assert not (workspace / "big.txt").exists()
    (workspace / "file").write_text("x")
    error, text = await text_of(harness, "write_file", {"path": "file/child", "content": "x"})
    assert (error, text) == ("tool_error", "Cannot create file/child: a parent is not a directory.")


async def test_a_write_to_a_path_ending_in_a_slash_is_refused_not_made_a_file(
    harness: Any, workspace: Path
) -> None:
    """`notes/` names a directory: writing a file called `notes` instead would put the content
    where the model does not think it is and block the directory it meant."""
    assert await text_of(harness, "write_file", {"path": "notes/", "content": "x"}) == (
        "tool_error",
        'notes/ ends with "/", so it names a directory; write_file needs the path of a file '
        "(e.g. notes/file.txt).",
    )
    assert not (workspace / "notes").exists()


async def test_cancelled_write_leaves_the_old_file(workspace: Path) -> None:
    target = workspace / "keep.txt"
    target.write_text("old\n")
    sandbox = Sandbox(workspace)
    cancel = asyncio.Event()
    cancel.set()
    ctx = ToolContext(
        tool_use_id="tu_1",
        workspace=sandbox,
        cancel_event=cancel,
        deadline=time.monotonic() + 60,
        limits=ToolLimits(),
    )
    with pytest.raises(ToolCancelled):
        await WriteFileTool().run({"path": "keep.txt", "content": "new\n"}, ctx)
    # Cancelled between writing the temp file and the rename: still the old content.
    answers = iter([False, True])
    with pytest.raises(ToolCancelled):
        replace_file(
            sandbox, sandbox.resolve("keep.txt"), b"new\n", cancelled=lambda: next(answers)
        )
    assert target.read_text() == "old\n"
    assert [p.name for p in workspace.iterdir()] == ["keep.txt"]


@ROOT_ONLY
async def test_write_and_patch_keep_the_owner_group_and_mode(harness: Any, workspace: Path) -> None:
    """The replacement is given the old file's owner before its mode, as a chown clears the
    set-user-ID and set-group-ID bits."""
    target = workspace / "owned.txt"
    target.write_text("old\n")
    os.chown(target, 12345, 12345)
    target.chmod(0o6750)
    await text_of(harness, "write_file", {"path": "owned.txt", "content": "new\n"})
    assert target.read_text() == "new\n"
    info = target.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (12345, 12345, 0o6750)
    await text_of(harness, "patch_file", {"path": "owned.txt", "old_text": "new", "new_text": "x"})
    assert target.read_text() == "x\n"
    info = target.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (12345, 12345, 0o6750)


@ROOT_ONLY
async def test_an_owner_that_cannot_be_given_away_is_kept_by_writing_in_place(
    harness: Any, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon that is not root may not chown its temp file to the file's owner: it writes
    through the existing file rather than take it over."""
    target = workspace / "theirs.txt"
    target.write_text("old content\n")
    os.chown(target, 12345, 12345)
    inode = target.stat().st_ino

    def refuse(fd: int, uid: int, gid: int) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "fchown", refuse)
    await text_of(harness, "write_file", {"path": "theirs.txt", "content": "new\n"})
    assert target.read_text() == "new\n"
    info = target.stat()
    assert (info.st_ino, info.st_uid, info.st_gid) == (inode, 12345, 12345)
    assert [p.name for p in workspace.iterdir()] == ["theirs.txt"]


async def test_a_hard_linked_file_is_written_through_its_inode(
    harness: Any, workspace: Path
) -> None:
    """A rename would split the link, the other name keeping the old content."""
    target = workspace / "a.txt"
    other = workspace / "b.txt"
    target.write_text("old content\n")
    os.link(target, other)
    inode = target.stat().st_ino
    call = await harness.call("write_file", {"path": "a.txt", "content": "new\n"})
    assert call.text == "Wrote 4 bytes to a.txt (replaced)."
    assert other.read_text() == "new\n"
    await text_of(harness, "patch_file", {"path": "b.txt", "old_text": "new", "new_text": "x"})
    assert target.read_text() == "x\n"
    assert (target.stat().st_ino, other.stat().st_ino, target.stat().st_nlink) == (inode, inode, 2)
    assert sorted(p.name for p in workspace.iterdir()) == ["a.txt", "b.txt"]


def test_a_cancel_before_an_in_place_write_leaves_the_old_content(workspace: Path) -> None:
    target = workspace / "a.txt"
    target.write_text("old\n")
    os.link(target, workspace / "b.txt")
    sandbox = Sandbox(workspace)
    answers = iter([False, True])
    with pytest.raises(ToolCancelled):
        replace_file(sandbox, sandbox.resolve("a.txt"), b"new\n", cancelled=lambda: next(answers))
    assert target.read_text() == (workspace / "b.txt").read_text() == "old\n"


def test_a_read_stuck_in_a_line_as_long_as_the_file_stops_when_cancelled(
    workspace: Path,
) -> None:
    """A sparse file with no newline (`truncate -s 1T` makes one in no time) is one line to
    skip to its end: cancel is seen within it, not once the whole file was read (this one is
    256 MiB; read to its end, the call would return instead of raising)."""
    with open(workspace / "sparse.txt", "wb") as handle:
        handle.write(b"a" * 9000)
        handle.truncate(256 * 1024**2)
    sandbox = Sandbox(workspace)
    checks = 0

    def cancelled() -> bool:
        nonlocal checks
        checks += 1
        return checks > 3

    with pytest.raises(ToolCancelled):
        read_lines(sandbox, sandbox.resolve("sparse.txt"), 1, 10, cancelled)
    assert checks == 4


# ---------------------------------------------------------------------------------------------
# patch_file
# ---------------------------------------------------------------------------------------------


async def test_patch_keeps_crlf_and_reports_lines(harness: Any, workspace: Path) -> None:
    target = workspace / "win.txt"
    target.write_bytes(b"a\r\nb\r\nc\r\n")
    call = await harness.call(
        "patch_file", {"path": "win.txt", "old_text": "b\r\n", "new_text": "B1\r\nB2\r\n"}
    )
    assert call.text == "Patched win.txt (line 2: -1 +2 lines)."
    assert call.outcome.files_modified == ("win.txt",)
    assert target.read_bytes() == b"a\r\nB1\r\nB2\r\nc\r\n"


async def test_patch_quoting_a_crlf_file_with_lf_endings_keeps_crlf(
    harness: Any, workspace: Path
) -> None:
    """A model quoting a Windows file usually writes its line breaks as \\n: the text is there,
    only the endings differ, so it is matched with the file's \\r\\n and the new text written
    with them too, instead of a "not found" the model cannot get past."""
    target = workspace / "win.txt"
    target.write_bytes(b"a\r\nb\r\nc\r\nb\r\n")
    call = await harness.call(
        "patch_file", {"path": "win.txt", "old_text": "a\nb\n", "new_text": "A\nB1\nB2\n"}
    )
    assert (call.outcome.error_class, call.text) == (
        None,
        "Patched win.txt (line 1: -2 +3 lines; line endings written as the file's \\r\\n).",
    )
    assert target.read_bytes() == b"A\r\nB1\r\nB2\r\nc\r\nb\r\n"
    (workspace / "twice.txt").write_bytes(b"x\r\ny\r\nx\r\ny\r\n")
    assert await text_of(
        harness, "patch_file", {"path": "twice.txt", "old_text": "x\ny", "new_text": "z"}
    ) == (
        "tool_error",
        "old_text occurs 2 times in twice.txt (its line endings read as the file's \\r\\n); "
        "add surrounding lines so it matches exactly once.",
    )
    assert (workspace / "twice.txt").read_bytes() == b"x\r\ny\r\nx\r\ny\r\n"


async def test_patch_adding_lines_to_a_crlf_file_writes_them_with_crlf(
    harness: Any, workspace: Path
) -> None:
    """A one-line quote matches as it is, but the lines the new text adds must not bring bare
    LF breaks into a file whose every break is CRLF."""
    target = workspace / "win.txt"
    target.write_bytes(b"def f():\r\n    return 1\r\n")
    call = await harness.call(
        "patch_file",
        {"path": "win.txt", "old_text": "def f():", "new_text": "def f():\n    x = 0"},
    )
    assert call.text == (
        "Patched win.txt (line 1: -1 +2 lines; line endings written as the file's \\r\\n)."
    )
    assert target.read_bytes() == b"def f():\r\n    x = 0\r\n    return 1\r\n"
    mixed = workspace / "mixed.txt"
    mixed.write_bytes(b"a\r\nb\n")
    call = await harness.call(
        "patch_file", {"path": "mixed.txt", "old_text": "b", "new_text": "b\nc"}
    )
    assert call.text == "Patched mixed.txt (line 2: -1 +2 lines)."
    assert mixed.read_bytes() == b"a\r\nb\nc\n"


async def test_patch_refusals_reach_the_model_verbatim(harness: Any, workspace: Path) -> None:
    (workspace / "f.py").write_text("x = 1\ny = 1\n")
    cases = [
        (
            {"old_text": "z = 1", "new_text": "z = 2"},
            "old_text was not found in f.py. Read the file again and copy the text exactly, "
            "including whitespace.",
        ),
        (
            {"old_text": " = 1", "new_text": " = 2"},
            "old_text occurs 2 times in f.py; add surrounding lines so it matches exactly once.",
        ),
        ({"old_text": "x", "new_text": "x"}, "old_text and new_text are identical."),
    ]
    for input, expected in cases:
        assert await text_of(harness, "patch_file", {"path": "f.py", **input}) == (
            "tool_error",
            expected,
        )
    assert (workspace / "f.py").read_text() == "x = 1\ny = 1\n"
    assert await text_of(
        harness, "patch_file", {"path": "nope.py", "old_text": "a", "new_text": "b"}
    ) == ("tool_error", "File not found: nope.py")


async def test_patch_counts_overlapping_occurrences(harness: Any, workspace: Path) -> None:
    """`aa` stands at two positions of `aaa`: ambiguous, so nothing is replaced."""
    (workspace / "f.txt").write_text("aaa")
    assert await text_of(
        harness, "patch_file", {"path": "f.txt", "old_text": "aa", "new_text": "b"}
    ) == (
        "tool_error",
        "old_text occurs 2 times in f.txt; add surrounding lines so it matches exactly once.",
    )
    assert (workspace / "f.txt").read_text() == "aaa"


async def test_patch_refuses_binary_non_utf8_and_oversized(harness: Any, workspace: Path) -> None:
    (workspace / "b.bin").write_bytes(b"a\x00b")
    (workspace / "l.txt").write_bytes(b"caf\xe9")
    (workspace / "huge.txt").write_bytes(b"a" * (5 * MIB + 1))
    patch = {"old_text": "a", "new_text": "b"}
    assert await text_of(harness, "patch_file", {"path": "b.bin", **patch}) == (
        "tool_error",
        "b.bin is a binary file (3 bytes).",
    )
    assert await text_of(harness, "patch_file", {"path": "l.txt", **patch}) == (
        "tool_error",
        "l.txt is not valid UTF-8 text; patch_file cannot edit it.",
    )
    error, text = await text_of(harness, "patch_file", {"path": "huge.txt", **patch})
    assert error == "tool_error" and text.startswith(f"huge.txt is {5 * MIB + 1} bytes")


# ---------------------------------------------------------------------------------------------
# list_dir
# ---------------------------------------------------------------------------------------------


async def test_list_dir(harness: Any, workspace: Path, outside: Path) -> None:
    (workspace / "b.txt").write_text("")
    (workspace / "a_dir").mkdir()
    (workspace / "link").symlink_to(outside)
    (workspace / "C").write_text("")
    assert await text_of(harness, "list_dir", {}) == (None, "C\na_dir/\nb.txt\nlink@")
    assert await text_of(harness, "list_dir", {"path": "a_dir"}) == (None, "[empty directory]")
    assert await text_of(harness, "list_dir", {"path": "b.txt"}) == (
        "tool_error",
        "b.txt is not a directory.",
    )
    assert await text_of(harness, "list_dir", {"path": "missing"}) == (
        "tool_error",
        "Directory not found: missing",
    )


async def test_list_dir_sorts_by_name_before_suffixing(harness: Any, workspace: Path) -> None:
    """`a/` sorts as `a`, ahead of `a-b` and `a.txt`, although `/` follows `-` and `.`."""
    (workspace / "a.txt").write_text("")
    (workspace / "a-b").write_text("")
    (workspace / "a").mkdir()
    (workspace / "a0").symlink_to("a")
    assert await text_of(harness, "list_dir", {}) == (None, "a/\na-b\na.txt\na0@")


async def test_list_dir_caps_entries_and_says_how_to_see_the_rest(
    harness: Any, workspace: Path
) -> None:
    for i in range(1005):
        (workspace / f"f{i:04}").write_text("")
    _, text = await text_of(harness, "list_dir", {"path": "."})
    lines = text.split("\n")
    assert lines[0] == "f0000" and lines[999] == "f0999"
    assert lines[1000:] == [
        "[5 more entries not shown: list_dir shows the first 1000 by name; the shell's ls "
        "lists them all]"
    ]


# ---------------------------------------------------------------------------------------------
# a directory swapped for a link between the sandbox check and the open (see conftest.py)
# ---------------------------------------------------------------------------------------------


def test_a_read_through_a_swapped_directory_is_refused(workspace: Path, elsewhere: Any) -> None:
    sandbox = elsewhere.sandbox
    targets = [sandbox.resolve("d/api_key"), sandbox.resolve("d/sub/api_key")]
    elsewhere.swap(workspace / "d")
    for target in targets:
        with elsewhere.refused(target.rel):
            read_lines(sandbox, target, 1, 10, lambda: False)


def test_a_listing_through_a_swapped_directory_is_refused(workspace: Path, elsewhere: Any) -> None:
    sandbox = elsewhere.sandbox
    target = sandbox.resolve("d/sub")
    elsewhere.swap(workspace / "d")
    with elsewhere.refused("d/sub"):
        list_entries(sandbox, target)


def snapshot(directory: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(directory)): p.read_bytes() if p.is_file() else None
        for p in sorted(directory.rglob("*"))
    }


@pytest.mark.parametrize("path", ["d/api_key", "d/new.txt", "d/sub/api_key", "d/x/y/new.txt"])
def test_a_write_through_a_swapped_directory_is_refused(
    workspace: Path, elsewhere: Any, path: str
) -> None:
    """Replacing, creating, and creating the missing directories on the way."""
    sandbox = elsewhere.sandbox
    target = sandbox.resolve(path, write=True)
    before = snapshot(elsewhere.where)
    elsewhere.swap(workspace / "d")
    with elsewhere.refused(path):
        replace_file(sandbox, target, b"written\n", cancelled=lambda: False)
    assert snapshot(elsewhere.where) == before


def test_a_patch_through_a_swapped_directory_is_refused(workspace: Path, elsewhere: Any) -> None:
    sandbox = elsewhere.sandbox
    target = sandbox.resolve("d/api_key", write=True)
    before = snapshot(elsewhere.where)
    elsewhere.swap(workspace / "d")
    with elsewhere.refused("d/api_key"):
        patch(sandbox, target, "SECRET", "x", MIB, lambda: False)
    assert snapshot(elsewhere.where) == before


@pytest.mark.parametrize("hard_linked", [False, True])
def test_a_directory_swapped_just_before_the_rename_does_not_move_the_write(
    workspace: Path, elsewhere: Any, hard_linked: bool
) -> None:
    """The write acts in the directory it checked, wherever its name points by then: the new
    content lands in the moved directory, nothing outside changes. (A hard-linked file is
    written in place, through the same checked directory.)"""
    sandbox = elsewhere.sandbox
    if hard_linked:
        os.link(workspace / "d" / "api_key", workspace / "d" / "other")
    target = sandbox.resolve("d/api_key", write=True)
    before = snapshot(elsewhere.where)
    calls = 0

    def swap_on_second_check() -> bool:  # the first is at the start, the second at the rename
        nonlocal calls
        calls += 1
        if calls == 2:
            elsewhere.swap(workspace / "d")
        return False

    replace_file(sandbox, target, b"written\n", cancelled=swap_on_second_check)
    assert calls == 2
    assert snapshot(elsewhere.where) == before
    moved = workspace / "d.moved"
    assert (moved / "api_key").read_text() == "written\n"
    names = {p.name for p in moved.iterdir()}
    assert names == ({"api_key", "sub", "other"} if hard_linked else {"api_key", "sub"})
