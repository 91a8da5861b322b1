"""Where `metis sessions export --output` and the terminal app's `/export` write a session."""

from __future__ import annotations

from pathlib import Path


def export_path(given: str | None, session_id: str, fmt: str) -> Path:
    """The file asked for; inside a directory asked for (one that exists, or a path ending in
    `/`), the name the dashboard's download gives (`<id>.<fmt>`), as with `cp FILE DIR`;
    with nothing asked, that name in the current directory."""
    name = f"{session_id}.{fmt}"
    if not given:
        return Path(name)
    path = Path(given).expanduser()
    return path / name if given.endswith("/") or path.is_dir() else path
