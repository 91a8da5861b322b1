"""Process checks for tests that prove tool commands leave nothing running (Linux /proc)."""

from __future__ import annotations

import asyncio
from pathlib import Path


def live_group_members(pgid: int) -> list[int]:
    """Processes of a group that are still alive (zombies nobody reaped yet do not count)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


async def gone(pgid: int, timeout_s: float = 5.0) -> bool:
    """Whether every member of the group dies within `timeout_s` (a SIGKILL takes effect only
    once its process next runs, so a loaded machine may show it for a moment)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while live_group_members(pgid):
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def noted_groups(metis_home: Path) -> list[int]:
    """The running shell groups the daemon noted (`metis/core/tools/groups.py`): the host's
    process group ids, which `$$` inside the sandbox's own PID namespace is not."""
    ledger = metis_home / "run" / "shell-groups"
    return [int(p.name) for p in ledger.iterdir() if p.name.isdigit()] if ledger.is_dir() else []


async def the_noted_group(metis_home: Path, timeout_s: float = 5.0) -> int:
    """The one shell group the daemon noted. The note is written once the spawn has returned,
    so on a loaded machine the command can already be running (and writing files) before it:
    wait for the note rather than read the ledger at once."""
    async with asyncio.timeout(timeout_s):
        while not (groups := noted_groups(metis_home)):
            await asyncio.sleep(0.01)
    [pgid] = groups
    return pgid
