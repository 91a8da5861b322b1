"""Where an export is written: the file asked for, or a file named after the session."""

from __future__ import annotations

from pathlib import Path

from metis.commands.export_file import export_path


def test_a_file_is_written_where_asked(tmp_path: Path) -> None:
    assert export_path(str(tmp_path / "notes.md"), "sess_1", "md") == tmp_path / "notes.md"


def test_into_a_directory_the_export_takes_the_sessions_name(tmp_path: Path) -> None:
    assert export_path(str(tmp_path), "sess_1", "json") == tmp_path / "sess_1.json"
    absent = tmp_path / "later"
    assert export_path(f"{absent}/", "sess_1", "md") == absent / "sess_1.md"


def test_without_a_path_the_export_lands_here_under_the_sessions_name() -> None:
    assert export_path(None, "sess_1", "md") == Path("sess_1.md")
