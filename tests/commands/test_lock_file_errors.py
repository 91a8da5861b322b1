"""A lock file that cannot be written (a full disk, here a lock file that is /dev/full) stops
`metis serve` with a message naming the file, not an errno alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from metis.server.lock import LOCK_FILE
from tests.cli import metis


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
async def test_a_lock_file_that_cannot_be_written_is_named(metis_home: Path) -> None:
    metis_home.mkdir(parents=True)
    (metis_home / LOCK_FILE).symlink_to("/dev/full")
    code, _, err = await metis("serve", "--port", "0", env={"METIS_OFFLINE": "1"})
    assert code == 1, err
    assert err.startswith("metis: cannot start: cannot write ") and LOCK_FILE in err, err
