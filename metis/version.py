"""The installed metis version, as `metis --version`, `/server/version` and AAP's `/meta` report it."""

from __future__ import annotations

from functools import cache


@cache
def metis_version() -> str:
    """The package's version, "0.0.0" when running from a source tree that was never installed."""
    from importlib.metadata import PackageNotFoundError, version  # ~30 ms: only when asked

    try:
        return version("metis")
    except PackageNotFoundError:
        return "0.0.0"
