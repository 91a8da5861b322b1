"""The files of METIS_HOME the daemon reads once, at start-up, known by their content.

`config.yaml` and `models.yaml` are read when `metis serve` starts and never again (only
config.yaml's `mcp` section is applied on demand; routing.yaml is hot-reloaded and is not one
of them). The daemon keeps the sha256 of each as it found it, and a client compares that with
the file's bytes now: an edit of the content waits for a restart, a save that changes nothing
(an editor's `:w`, `touch`) does not, which no change time can tell apart.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

READ_AT_START = ("config.yaml", "models.yaml")


def content_digest(path: Path) -> str | None:
    """The sha256 (hex) of the file's bytes; None when there is no file. OSError when there is
    one that cannot be read."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    return hashlib.sha256(raw).hexdigest()


def digests_at_start(home: Path) -> dict[str, str | None]:
    """Each start-up file's digest, taken just before the daemon reads the files: an edit
    racing the start then reads as a change (a restart too many), never as none. A file that
    cannot be read stops the start when it is loaded; its digest is None, as for no file."""
    digests: dict[str, str | None] = {}
    for name in READ_AT_START:
        try:
            digests[name] = content_digest(home / name)
        except OSError:
            digests[name] = None
    return digests
