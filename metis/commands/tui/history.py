"""Prompt history, one file per workspace under METIS_HOME/chat_history/ (mode 0600)."""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path

from metis.private_file import write_private

MAX_ENTRIES = 1000


class InputHistory:
    """Entries oldest first; ↑/↓ walk them, the line being typed is kept as the newest."""

    def __init__(self, home: Path, workspace: str) -> None:
        digest = hashlib.sha256(workspace.encode()).hexdigest()[:16]
        self.path = home / "chat_history" / f"{digest}.json"
        self.entries: list[str] = []
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if isinstance(data, dict) and isinstance(data.get("entries"), list):
                self.entries = [str(e) for e in data["entries"]][-MAX_ENTRIES:]
        self.workspace = workspace
        self._index: int | None = None  # position while walking; None: at the draft
        self._draft = ""

    def add(self, text: str) -> None:
        self._index = None
        if not text.strip() or (self.entries and self.entries[-1] == text):
            return
        self.entries.append(text)
        del self.entries[:-MAX_ENTRIES]
        self._save()

    def previous(self, current: str) -> str | None:
        if not self.entries:
            return None
        if self._index is None:
            self._draft = current
            self._index = len(self.entries)
        if self._index == 0:
            return None
        self._index -= 1
        return self.entries[self._index]

    def next(self) -> str | None:
        if self._index is None:
            return None
        self._index += 1
        if self._index >= len(self.entries):
            self._index = None
            return self._draft
        return self.entries[self._index]

    def _save(self) -> None:
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            data = json.dumps({"workspace": self.workspace, "entries": self.entries})
            write_private(self.path, data.encode())
