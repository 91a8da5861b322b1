"""Writing a file only its owner may read, whole or not at all.

The daemon's own state beside the store (browser sessions, the last routing policy that
loaded), what a client writes for its user (exports, the redirect page of `metis open`, the
TUI's input history): each is written to a temporary file beside its target, created 0600, then
renamed over it. A reader never sees half a file, and no moment exists at which it is readable
by others, as it would be between creating a file with the default mode and changing it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def write_private(path: Path, data: bytes, *, durable: bool = False) -> None:
    """Replace `path` with `data`, mode 0600. `durable`: synced to disk before the rename, for
    state a crash must not lose. An error creating the temporary file names `path`."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as exc:  # said of the file asked for, not of the temporary one
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
