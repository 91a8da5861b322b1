"""Which of the files the daemon reads once, at start-up, were edited since it started.

`config.yaml` and `models.yaml` are read when `metis serve` starts and never again (only
config.yaml's `mcp` section is applied on demand, by `metis mcp reload`; routing.yaml is
hot-reloaded and is not one of them). An edit made while the daemon runs is therefore not in
force, and nothing the daemon answers shows it: `metis status` and `metis models` compare the
files' change times with the daemon's start (`GET /health`'s `started_at`) so that a user who
edited one is told it applies at the next start, and, for a models.yaml, what that start would
refuse in it.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

READ_AT_START = ("config.yaml", "models.yaml")


def changed_since_start(home: Path, started_at: str | None) -> list[str]:
    """The names of `home`'s files read at start-up that were written (or replaced, as an
    editor saving by rename does) after `started_at`; a file deleted since is not noticed."""
    if not started_at:
        return []
    try:
        started = datetime.fromisoformat(started_at.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return []
    changed = []
    for name in READ_AT_START:
        try:
            st = (home / name).stat()
        except OSError:
            continue
        if max(st.st_mtime, st.st_ctime) > started:
            changed.append(name)
    return changed


def models_problem(home: Path) -> str | None:
    """The first error of `home`'s models.yaml (`file:line:col: error: …`), as the next
    `metis serve` would refuse it; None when it is valid or absent."""
    from metis.core.config.checks import format_diagnostic
    from metis.core.models.registry import load_models_file

    path = home / "models.yaml"
    if not path.exists():
        return None
    errors = load_models_file(path).errors
    if not errors:
        return None
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return format_diagnostic(path, errors[0]) + more
