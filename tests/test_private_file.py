"""Private files: owner-only, replaced whole, and an error that names the file asked for."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from metis.private_file import write_private


def test_a_private_file_is_owner_only_and_replaced_whole(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_text("old")
    target.chmod(0o644)
    write_private(target, b"new", durable=True)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary left


def test_a_file_that_cannot_be_written_is_named_and_the_old_one_kept(tmp_path: Path) -> None:
    missing = tmp_path / "absent" / "export.md"
    with pytest.raises(FileNotFoundError) as raised:
        write_private(missing, b"x")
    assert raised.value.filename == str(missing)
    target = tmp_path / "kept"
    target.mkdir()  # a directory cannot be replaced by a file
    with pytest.raises(IsADirectoryError):
        write_private(target, b"x")
    assert target.is_dir() and [p.name for p in tmp_path.iterdir()] == ["kept"]
