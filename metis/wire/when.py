"""Times as a person at this machine reads them: the daemon stores and sends UTC (ISO 8601 with
`Z`), and a listing in the terminal shows it in the local time zone, as a clock on the wall
would (`2026-11-28 14:43`). What scripts read (a pipe's lines, `--json`, an export) keeps UTC."""

from __future__ import annotations

from datetime import datetime


def local_time(iso: str | None, *, seconds: bool = False, zone: bool = False) -> str:
    """`iso` (a daemon's timestamp) in the local time zone, to the minute (or the second),
    with the zone's name after it when `zone` (`2026-11-28 15:43:07 CET`: a line that stands
    alone says which clock it is on; a listing's rows do not repeat it); a value that is not a
    timestamp is returned as it came ("" for None)."""
    if not iso:
        return ""
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        return iso
    if moment.tzinfo is None:  # a naive stamp cannot be placed: shown as given
        return iso
    shown = "%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M"
    return moment.astimezone().strftime(shown + (" %Z" if zone else ""))
