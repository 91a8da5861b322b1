"""Fixtures for the built-in tools: the race of a directory swapped for a link.

The model's shell writes the workspace while another tool of its batch runs: it can move `d`
aside and put in its place a link to a place it cannot see itself (METIS_HOME), after
`resolve` checked `d/…` and before the tool opens it. Tests make that swap at the racy moment
themselves (after `resolve`, or from a callback the tool makes at that point), so the race is
certain, not timed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from metis.core.tools.base import MetisHomePath, PathOutsideWorkspace, PermissionDenied
from metis.core.tools.sandbox import MetisHome, Sandbox


@dataclass(frozen=True)
class Elsewhere:
    """Where the swapped-in link leads, the sandbox (with its METIS_HOME) and the refusal
    expected for a path through the link."""

    where: Path
    sandbox: Sandbox
    refusal: type[PermissionDenied]

    def swap(self, directory: Path) -> None:
        """The shell's move: `directory` renamed to `<name>.moved`, a link here in its place."""
        directory.rename(directory.with_name(directory.name + ".moved"))
        directory.symlink_to(self.where)

    def refused(self, shown: str) -> pytest.RaisesContext[PermissionDenied]:
        """The refusal `resolve` would have given, naming the path the model asked for."""
        text = "inside METIS_HOME" if self.refusal is MetisHomePath else "outside the workspace"
        return pytest.raises(self.refusal, match=f'^Path "{shown}" is {text}')


@pytest.fixture(params=["outside", "home", "home_inside"])
def elsewhere(request: pytest.FixtureRequest, workspace: Path, tmp_path: Path) -> Elsewhere:
    """The workspace holds `d/api_key` and `d/sub/api_key` (its own, harmless); the link's
    target holds the same names with a secret: a directory outside the workspace, METIS_HOME
    outside it, or METIS_HOME inside it (a workspace made before that was refused)."""
    (workspace / "d" / "sub").mkdir(parents=True)
    for mine in (workspace / "d" / "api_key", workspace / "d" / "sub" / "api_key"):
        mine.write_text("mine\n")
    home = workspace / ".metis" if request.param == "home_inside" else tmp_path / "home"
    where = tmp_path / "outside" if request.param == "outside" else home
    (where / "sub").mkdir(parents=True)
    for key in (where / "api_key", where / "sub" / "api_key"):
        key.write_text("TOP-SECRET\n")
    sandbox = Sandbox(workspace, metis_home=MetisHome.at(home, home / "workspaces"))
    refusal = MetisHomePath if request.param == "home_inside" else PathOutsideWorkspace
    return Elsewhere(where, sandbox, refusal)
