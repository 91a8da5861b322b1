"""Which of the files the daemon reads once, at start-up, were edited since it started.

`config.yaml` and `models.yaml` are read when `metis serve` starts and never again (only
config.yaml's `mcp` section is applied on demand, by `metis mcp reload`; routing.yaml is
hot-reloaded and is not one of them). An edit made while the daemon runs is therefore not in
force, and nothing else the daemon answers shows it: `metis status`, `metis models` and
`metis routing check` compare the sha256 of each file as the daemon read it
(`GET /server/version`'s `start_up_files`) with the file's bytes now, so that a user who edited
one is told it applies at the next start (and, for a models.yaml, what that start would refuse
in it), and one who saved it unchanged is not.
"""

from __future__ import annotations

from pathlib import Path

from metis.core.config.start_up import READ_AT_START, content_digest

_UNREADABLE = "unreadable"
"""What a file that cannot be read now compares as: unlike any digest, or no file."""


def changed_since_start(home: Path, start_up_files: object) -> list[str]:
    """The names of `home`'s files read at start-up whose content is not what the daemon read
    (`start_up_files`, by name: a digest, None for a file it did not find): edited, created,
    deleted or unreadable since. A daemon that does not say what it read (one older than this
    command) is never said to have been edited under."""
    if not isinstance(start_up_files, dict):
        return []
    changed = []
    for name in READ_AT_START:
        if name not in start_up_files:
            continue
        try:
            now = content_digest(home / name)
        except OSError:
            now = _UNREADABLE
        if now != start_up_files[name]:
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
