"""The AAP `workspace` option: an absolute directory inside the allowed roots, or a
bare name naming a scratch workspace under `METIS_HOME/workspaces/`.

Scratch workspaces let clients that know nothing about this machine's filesystem (browser apps,
remote tools) get an isolated sandbox without ever touching user directories. Resolution never
writes; `provisioned` creates a scratch directory only once every other check has passed, and
removes it again if the request is refused after all.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from metis.aap.errors import AapError
from metis.config import AapSettings
from metis.core.application import expand_workspace
from metis.core.errors import WorkspaceInvalid

BARE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")


@dataclass(frozen=True)
class WorkspaceChoice:
    path: Path  # resolved (realpath) directory
    scratch: bool  # a bare name: created by `Workspaces.provisioned` when missing


def _bad(message: str) -> AapError:
    return AapError("invalid_option", message, {"option": "workspace"})


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


class Workspaces:
    def __init__(self, home: Path, settings: AapSettings, default_workspace: str | None) -> None:
        self.scratch_root = home / "workspaces"
        self.default = (
            Path(default_workspace).expanduser()
            if default_workspace
            else self.scratch_root / "default"
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
        """The AAP allowed roots, resolved; the metis setting plays no part."""
        return tuple(
            p.resolve() for p in (self.scratch_root, self.default, *self._extra) if p.exists()
        )

    def resolve(self, value: str) -> WorkspaceChoice:
        """Judge a client value without writing anything; `invalid_option` when refused."""
        if BARE_NAME_RE.fullmatch(value):
            path = self.scratch_root.resolve() / value
            if not os.path.lexists(path):
                return WorkspaceChoice(path, True)
            # An existing entry may be a symlink: judged after resolution, like a path.
            return WorkspaceChoice(self._inside_roots(value, path), True)
        if "\0" in value:  # no directory name holds one (os calls raise ValueError)
            raise _bad("workspace must not contain a NUL character")
        try:
            expanded = expand_workspace(value)
        except WorkspaceInvalid as exc:
            raise _bad(exc.message) from exc
        if not expanded.is_absolute():
            raise _bad(
                "workspace must be an absolute directory or a bare name "
                "(letters, digits, '.', '_', '-'; at most 64 characters)"
            )
        return WorkspaceChoice(self._inside_roots(value, expanded), False)

    def _inside_roots(self, value: str, path: Path) -> Path:
        """The realpath of an existing directory inside an allowed root (symlinks followed)."""
        real = Path(os.path.realpath(path))
        if not real.is_dir():
            raise _bad(f"workspace {value!r} is not an existing directory")
        if not any(_within(real, root) for root in self.roots()):
            raise _bad(f"workspace {value!r} is outside the allowed workspace roots")
        return real

    @staticmethod
    @contextlib.contextmanager
    def provisioned(choice: WorkspaceChoice) -> Iterator[str]:
        """The workspace directory of a session being created, for the block that creates it.

        A missing scratch directory is created on entry (core checks that the directory
        exists). If the block fails, the request is refused after all: a directory created
        here is removed again while still empty, so a refused request leaves nothing on disk
        A cancellation (BaseException) keeps it: a v1 stream cancelled by its
        client keeps its session, and so its workspace.
        """
        created = choice.scratch and not choice.path.exists()
        if created:
            choice.path.mkdir(mode=0o700)
        try:
            yield str(choice.path.resolve())
        except Exception:
            if created:
                with contextlib.suppress(OSError):  # not empty: something ran in it, keep it
                    choice.path.rmdir()
            raise
