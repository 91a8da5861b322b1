"""bwrap for the tests that prove the shell's sandbox: skip without it, fail under CI=true."""

from __future__ import annotations

import os
import shutil

import pytest

from metis.core.tools.bwrap import probe


def require_bwrap() -> str:
    """The usable bwrap executable; a skip with the reason when there is none (a failure when
    the environment says CI=true: `.ci/run` installs bubblewrap, so CI never skips these)."""
    path = shutil.which("bwrap")
    reason = "bwrap not found on PATH" if path is None else probe(path, network=False)
    if path is not None and reason is None:
        return path
    message = f"bubblewrap sandbox unavailable ({reason}); install the bubblewrap package"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message}: CI=true requires it")
    pytest.skip(message)
