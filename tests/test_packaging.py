"""A regular (non-editable) install carries the shipped defaults.

With no `models.yaml` or `routing.yaml` in METIS_HOME the daemon reads the shipped ones from
`metis/defaults/`. An editable install finds them in the work tree whatever pyproject.toml says,
so only a built wheel shows that they are really package data: here one is built offline with
the venv's own setuptools (the test extra's `setuptools>=77`, which pyproject's `license` string
needs), from a copy of the sources so that the work tree gets no `build/` or egg-info, then
installed into a folder of its own and asked for the default policy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from metis.config import SHIPPED_CONFIG_DIR

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "metis"
# What setuptools reads to build the wheel: the project table, the readme and license it names.
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE")
DEFAULTS = ("models.yaml", "routing.yaml")


def _pip(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    return subprocess.run(
        [sys.executable, "-m", "pip", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_shipped_defaults_live_inside_the_package() -> None:
    assert SHIPPED_CONFIG_DIR.is_relative_to(PACKAGE)
    assert all((SHIPPED_CONFIG_DIR / name).is_file() for name in DEFAULTS)


def test_a_built_wheel_ships_the_defaults_and_an_install_from_it_uses_them(
    tmp_path: Path,
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    for name in BUILD_INPUTS:
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(PACKAGE, source / "metis", ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    built = _pip(
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-q",
        "-w",
        str(dist),
        str(source),
        cwd=tmp_path,
    )
    assert built.returncode == 0, (
        f"wheel build failed (setuptools>=77 in this venv?):\n{built.stderr}"
    )
    (wheel,) = dist.glob("metis-*.whl")

    inside = SHIPPED_CONFIG_DIR.relative_to(ROOT).as_posix()
    with zipfile.ZipFile(wheel) as archive:
        for name in DEFAULTS:
            shipped = (SHIPPED_CONFIG_DIR / name).read_bytes()
            assert archive.read(f"{inside}/{name}") == shipped

    # Installed on its own (outside the work tree, first on the path), `metis routing check`
    # with an empty METIS_HOME validates the shipped policy against the shipped registry.
    target = tmp_path / "installed"
    installed = _pip(
        "install",
        "--no-deps",
        "--no-index",
        "-q",
        "--target",
        str(target),
        str(wheel),
        cwd=tmp_path,
    )
    assert installed.returncode == 0, installed.stderr
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target), "METIS_HOME": str(home)}
    check = subprocess.run(
        [sys.executable, "-m", "metis.cli", "routing", "check"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.startswith(f"{target / inside / 'routing.yaml'}: valid"), check.stdout
