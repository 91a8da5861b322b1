"""Compile the project's modules once, before the xdist workers start, instead of in each.

pytest compiles every test module through its assertion rewriter and caches the result beside
the source (`__pycache__/*-pytest-*.pyc`). In a fresh clone there is no cache yet, and all the
workers start at once: each of them rewrote all ~160 modules itself (~4.5 s of CPU apiece on
the 2-core machine, ~18 s of it in all) before the first test ran, and the first daemons and
commands they started compiled metis's own modules side by side. Here the controller does it
once, split over the CPUs, and writes the caches the workers and their subprocesses then read
(collecting with `-n auto` in a fresh clone: 9.9-11.0 s before, 7.4-8.0 s after). The
installed packages too, when pip left them uncompiled (see `_compile_installed_packages`).

This leans on pytest's private rewriting functions. Should they change, nothing breaks: the
warm-up is skipped (or writes files pytest rejects as stale) and each worker rewrites as before.
"""

from __future__ import annotations

import compileall
import marshal
import os
import re
import struct
import sysconfig
from concurrent.futures import ProcessPoolExecutor
from importlib.util import MAGIC_NUMBER, cache_from_source
from multiprocessing import get_context
from pathlib import Path

import pytest

_TEST_MODULE = re.compile(r"(^|/)(test_[^/]*|conftest)\.py$")  # what pytest rewrites
_config: pytest.Config | None = None  # inherited by the forked rewriting processes


def warm_up(config: pytest.Config, root: Path) -> None:
    """Write the bytecode of metis's modules and the rewritten bytecode of every test module
    that lacks it (the test helpers too, compiled as they are imported: plainly)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    for package in ("metis", "tests", "scripts"):
        compileall.compile_dir(root / package, quiet=1, workers=cpus, rx=_TEST_MODULE)
    _compile_installed_packages(cpus)
    try:
        from _pytest.assertion import rewrite
    except ImportError:
        return
    if not all(hasattr(rewrite, name) for name in ("_rewrite_test", "get_cache_dir", "PYC_TAIL")):
        return
    stale = [str(path) for path in _test_modules(root / "tests") if not _cached(path, rewrite)]
    if not stale:
        return
    global _config
    _config = config
    workers = min(len(stale), cpus)
    try:
        with ProcessPoolExecutor(workers, mp_context=get_context("fork")) as pool:
            list(pool.map(_rewrite_one, stale, chunksize=max(1, len(stale) // (4 * workers))))
    except Exception:
        return  # a cache left unwritten only costs the workers time
    finally:
        _config = None


# Installed packages compiled by no one but the suite: pip leaves them as sources where the
# environment turns bytecode off (PYTHONDONTWRITEBYTECODE), and then each worker compiled the
# SDKs, Textual, schemathesis… side by side at its start (~6,800 modules, the first run of a
# fresh install ~15 s slower than the next). `anthropic`'s package tells whether it is so.
_PROBE = "anthropic"
_NOT_IMPORTED = re.compile(r"/site-packages/(pip|setuptools|_distutils_hack|wheel)/")


def _compile_installed_packages(cpus: int) -> None:
    """Compile the environment's site-packages once, over the CPUs, if pip did not."""
    site = Path(sysconfig.get_paths()["purelib"])
    probe = site / _PROBE / "__init__.py"
    if not probe.exists() or Path(cache_from_source(str(probe))).exists():
        return  # compiled at install (the usual case), or not the environment of metis[test]
    compileall.compile_dir(site, quiet=2, workers=cpus, rx=_NOT_IMPORTED)


def _test_modules(tests_dir: Path) -> list[Path]:
    return [path for path in tests_dir.rglob("*.py") if _TEST_MODULE.search(str(path))]


def _pyc_path(path: Path, rewrite: object) -> Path:
    cache_dir: Path = rewrite.get_cache_dir(path)  # type: ignore[attr-defined]
    return cache_dir / (path.name[:-3] + rewrite.PYC_TAIL)  # type: ignore[attr-defined]


def _cached(path: Path, rewrite: object) -> bool:
    """Whether a rewritten pyc for this exact source (mtime and size) is already there."""
    try:
        header = _pyc_path(path, rewrite).read_bytes()[:16]
    except OSError:
        return False
    stat = path.stat()
    return header == _header(stat)


def _header(stat: os.stat_result) -> bytes:
    """The header pytest reads back: magic, flags, source mtime and size (32 bits each)."""
    return (
        MAGIC_NUMBER
        + b"\x00\x00\x00\x00"
        + struct.pack("<LL", int(stat.st_mtime) & 0xFFFFFFFF, stat.st_size & 0xFFFFFFFF)
    )


def _rewrite_one(source: str) -> None:
    from _pytest.assertion import rewrite

    path = Path(source)
    stat, code = rewrite._rewrite_test(path, _config)  # type: ignore[arg-type]
    pyc = _pyc_path(path, rewrite)
    pyc.parent.mkdir(parents=True, exist_ok=True)
    partial = pyc.with_name(f"{pyc.name}.{os.getpid()}")
    partial.write_bytes(_header(stat) + marshal.dumps(code))
    os.replace(partial, pyc)  # atomic: a reader never sees half a file
