"""A lock file left by a daemon killed with -9 (or by a crash of the machine) names a pid that
may since belong to another process (pids are reused, and after a reboot the low ones always
are). Clients must not take the URL it names for a running daemon: that the lock is held is
asked of the kernel, as `metis stop` asks it. The kernel's answer comes from a shared lock
taken for an instant, so a daemon starting just then must not take it for a daemon running."""

from __future__ import annotations

import fcntl
import json
import os
import threading
from pathlib import Path

from metis.server.lock import LOCK_FILE, acquire, read_holder
from metis.testing.serving import free_port
from tests.cli import metis


def left_by_a_killed_daemon(home: Path, url: str) -> None:
    """The file as a daemon killed with -9 leaves it, its pid now another live process's (this
    test's), the lock itself held by no one."""
    home.mkdir(parents=True, exist_ok=True)
    (home / LOCK_FILE).write_text(json.dumps({"pid": os.getpid(), "url": url}) + "\n")


async def test_clients_do_not_take_a_stale_lock_for_a_running_daemon(metis_home: Path) -> None:
    stale = f"http://127.0.0.1:{free_port()}"
    left_by_a_killed_daemon(metis_home, stale)
    port = free_port()
    (metis_home / "config.yaml").write_text(f"port: {port}\n")

    code, out, err = await metis("status")
    assert code == 3, err
    assert f"nothing answers at http://127.0.0.1:{port} " in out, out  # config.yaml's port
    assert stale not in out + err

    other = free_port()
    code, out, err = await metis("sessions", "list", env={"METIS_PORT": str(other)})
    assert code == 1
    assert err.startswith(f"metis: cannot reach the daemon at http://127.0.0.1:{other}; start")
    assert "runs at" not in err, err


def test_a_start_is_not_refused_for_a_clients_look_at_the_lock(metis_home: Path) -> None:
    metis_home.mkdir(parents=True)
    probe = os.open(metis_home / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a client asking whether it is held
    threading.Timer(0.05, os.close, (probe,)).start()  # which it is, for an instant
    lock = acquire(metis_home)
    try:
        assert read_holder(metis_home / LOCK_FILE)[0] == os.getpid()
    finally:
        lock.release()
