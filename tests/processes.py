"""Process checks for tests that prove tool commands leave nothing running (Linux /proc)."""

from __future__ import annotations

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
