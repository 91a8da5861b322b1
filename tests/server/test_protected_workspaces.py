"""A session may not work in `/`, the user's home or a system directory unless an allowed root
names that very directory, nor in a directory that holds METIS_HOME or lies inside it at all
(core: `metis.core.sessions.service.resolve_workspace`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from metis.core.sessions.service import protected_workspaces
from tests.api import Api


async def _create(api: Api, path: str | Path) -> tuple[int, Any]:
    return await api.call("POST", "/sessions", {"workspace_path": str(path)})


def _refused(status: int, body: Any, path: Any) -> None:
    assert status == 400, (path, body)
    assert body["error"]["code"] == "invalid_workspace", (path, body)
    assert body["error"]["details"]["reason"] == "protected_directory", (path, body)


async def test_root_home_and_system_directories_are_refused(
    make_api: Callable[..., Any], metis_home: Path, tmp_path: Path
) -> None:
    _, api = await make_api()
    link = tmp_path / "etc-link"
    link.symlink_to("/etc")
    candidates: list[str | Path] = ["/", "/etc", "/usr", "/var", "/proc", "/proc/self", "~"]
    candidates += [Path.home(), link, "/etc/"]
    for path in candidates:
        _refused(*await _create(api, path), path)
    status, body = await api.call("GET", "/sessions")
    assert status == 200 and body["sessions"] == []  # nothing was created


async def test_a_directory_holding_metis_home_must_be_listed_and_one_inside_it_never_works(
    make_api: Callable[..., Any], metis_home: Path
) -> None:
    metis_home.mkdir(parents=True, exist_ok=True)
    (metis_home / "inside").mkdir()
    holder = metis_home.parent
    (holder / "project").mkdir()
    roots = [metis_home, metis_home / "inside", holder / "project"]
    _, api = await make_api(allowed_workspace_roots=[str(root) for root in roots])
    for path in (holder, metis_home, metis_home / "inside"):
        status, body = await _create(api, path)
        assert status == 400, (path, body)
        assert body["error"]["code"] == "invalid_workspace"
        assert body["error"]["details"]["reason"] == "metis_home"
        assert "METIS_HOME" in body["error"]["message"]
    status, body = await _create(api, holder / "project")
    assert status == 201, body


async def test_a_system_directory_reached_through_its_symlink_is_refused(
    make_api: Callable[..., Any],
) -> None:
    _, api = await make_api()
    linked = [p for p in ("/bin", "/lib", "/sbin") if os.path.islink(p)]
    if not linked:
        pytest.skip("no merged-/usr symlinks on this system")
    for path in linked:
        _refused(*await _create(api, path), path)
        _refused(*await _create(api, os.path.realpath(path)), os.path.realpath(path))


async def test_an_explicitly_listed_directory_is_accepted(
    make_api: Callable[..., Any], workspace: Path
) -> None:
    home = Path.home().resolve()
    _, api = await make_api(allowed_workspace_roots=["/", "/etc", str(home), str(workspace)])
    for path in ("/", "/etc", home, workspace):
        status, body = await _create(api, path)
        assert status == 201, (path, body)
        assert body["workspace_path"] == str(Path(path).resolve())
    # listing `/` does not list what lies under it: /usr is still a system directory
    _refused(*await _create(api, "/usr"), "/usr")


async def test_ordinary_directories_stay_usable_without_any_setting(
    make_api: Callable[..., Any], workspace: Path, tmp_path: Path
) -> None:
    _, api = await make_api()
    nested = tmp_path / "etc"  # named like a system directory, but not one
    nested.mkdir()
    for path in (workspace, nested):
        status, body = await _create(api, path)
        assert status == 201, (path, body)


def test_the_protected_set_holds_each_directory_and_its_resolution() -> None:
    protected = protected_workspaces()
    assert {"/", "/etc", "/root", str(Path.home())} <= protected
    for path in ("/bin", "/lib", "/etc", "/var"):
        assert str(Path(path).resolve()) in protected
