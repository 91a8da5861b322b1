"""The daemon's key file: created once, and a creation that fails leaves nothing behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from metis.http.apikey import KEY_FILE, load_api_key

# A child whose files may not grow past 0 bytes (RLIMIT_FSIZE; Python ignores SIGXFSZ, so the
# write fails with EFBIG as it would with ENOSPC on a full disk).
CREATE_WITHOUT_ROOM = """
import resource, sys
from pathlib import Path
from metis.core.errors import ConfigError
from metis.http.apikey import load_api_key
resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
try:
    load_api_key(Path(sys.argv[1]), None)
except ConfigError as exc:
    print(exc.message)
"""


def test_a_key_file_that_cannot_be_written_is_named_and_not_left_empty(tmp_path: Path) -> None:
    """An empty key file would make every later start refuse the home until deleted by hand."""
    run = subprocess.run(
        [sys.executable, "-c", CREATE_WITHOUT_ROOM, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.stdout == f"cannot write the API key file {tmp_path / KEY_FILE}: File too large\n"
    assert not (tmp_path / KEY_FILE).exists()
    key = load_api_key(tmp_path, None)  # with room again, the next start creates it
    assert key.created and (tmp_path / KEY_FILE).read_text() == key.value + "\n"
