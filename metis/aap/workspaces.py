"""The AAP `workspace` option (aap.md §3): an absolute directory inside the allowed roots, or a
bare name naming a scratch workspace under `METIS_HOME/workspaces/`.

Scratch workspaces let clients that know nothing about this machine's filesystem (browser apps,
remote tools) get an isolated sandbox without ever touching user directories. Resolution never
writes; `materialize` creates a scratch directory only once every other check has passed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from metis.aap.errors import AapError
from metis.aap.settings import AapSettings

BARE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class WorkspaceChoice:
    path: Path  # resolved (realpath) directory
    scratch: bool  # a bare name: created on materialize when missing


def _bad(message: str) -> AapError:
    return AapError("invalid_option", message, {"option": "workspace"})


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


class Workspaces:
    def __init__(self, home: Path, settings: AapSettings) -> None:
        self.scratch_root = home / "workspaces"
        configured = settings.default_workspace
        self.default = (
            Path(configured).expanduser() if configured else self.scratch_root / "default"
        )
        self._extra = tuple(Path(p).expanduser() for p in settings.workspace_roots)

    def ensure_default(self) -> None:
        """Start-up: the scratch root and the default workspace exist (mode 0700)."""
        for path in (self.scratch_root, self.default):
            if not path.exists():
                path.mkdir(parents=True, mode=0o700)

    def default_value(self) -> str:
        return str(self.default.resolve())

    def roots(self) -> tuple[Path, ...]:
        return tuple(
            p.resolve() for p in (self.scratch_root, self.default, *self._extra) if p.exists()
        )

    def resolve(self, value: str) -> WorkspaceChoice:
        """Judge a client value without writing anything; `invalid_option` when refused."""
        if BARE_NAME_RE.match(value):
            path = self.scratch_root.resolve() / value
            if path.exists() and not path.is_dir():
                raise _bad(f"scratch workspace {value!r} exists and is not a directory")
            return WorkspaceChoice(path.resolve() if path.exists() else path, True)
        expanded = Path(value).expanduser()
        if not expanded.is_absolute():
            raise _bad(
                "workspace must be an absolute directory or a bare name "
                "(letters, digits, '.', '_', '-'; at most 64 characters)"
            )
        real = Path(os.path.realpath(expanded))
        if not real.is_dir():
            raise _bad(f"workspace {value!r} is not an existing directory")
        if not any(_within(real, root) for root in self.roots()):
            raise _bad(f"workspace {value!r} is outside the allowed workspace roots")
        return WorkspaceChoice(real, False)

    @staticmethod
    def materialize(choice: WorkspaceChoice) -> str:
        if choice.scratch and not choice.path.exists():
            choice.path.mkdir(mode=0o700)
        return str(choice.path.resolve())
