"""`metis routing check [FILE]`: validate a routing policy against the model registry.

Uses the same validation as the daemon's reload path, so a policy that passes here loads; the
output names file, line and column for every error and warning.

Which models are configured depends on the provider keys in the daemon's environment, which a
shell need not share (a systemd `EnvironmentFile`). So when a daemon runs on the home, the file
is checked by it (`POST /routing/check`) against the registry its turns use; only without one
(or with `--models`) is it checked here, with the keys this shell has, and the output says so.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from metis.commands import usage
from metis.commands.client import CALL_FAILURES, DaemonApi, NotADaemon, failure_text
from metis.commands.daemon_client import DaemonTarget, add_home_argument
from metis.commands.event_loop import run_command
from metis.commands.models import (
    DAEMON_TIMEOUT_S,
    MODELS_FILE,
    default_models_path,
    load_for_cli,
)
from metis.commands.since_start import changed_since_start
from metis.config import SHIPPED_CONFIG_DIR, home_from
from metis.core.config.checks import format_diagnostic
from metis.core.config.yaml_source import Diagnostic, load_yaml_bytes
from metis.core.errors import ConfigError
from metis.core.routing.loader import read_policy_file
from metis.http.apikey import existing_api_key
from metis.server.lock import LOCK_FILE, running_url
from metis.wire.counts import counted

ROUTING_FILE = "routing.yaml"


def default_routing_path(home: Path) -> Path:
    """`home`'s routing.yaml if it exists, else the shipped default (as the daemon does)."""
    user = home / ROUTING_FILE
    return user if user.exists() else SHIPPED_CONFIG_DIR / ROUTING_FILE


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "routing", help="routing policy tools", description="Routing policy tools."
    )
    parser.set_defaults(func=lambda _args: usage(parser))
    commands = parser.add_subparsers(dest="routing_command", metavar="{check}")
    check = commands.add_parser(
        "check",
        help="validate a routing.yaml against the model registry",
        description="Validate FILE (default: $METIS_HOME/routing.yaml, else the shipped default). "
        "The daemon running on the home checks it against the models its turns use (its "
        "provider keys); without one, or with --models, it is checked here with the provider "
        "keys this shell has. Exits 1 when the policy has errors, 2 when models.yaml itself is "
        "invalid.",
    )
    check.add_argument("file", nargs="?", type=Path, default=None, help="policy to validate")
    check.add_argument(
        "--models",
        type=Path,
        default=None,
        help="models.yaml to validate against, here rather than by the daemon "
        "(default: $METIS_HOME/models.yaml, else shipped)",
    )
    add_home_argument(check)
    check.set_defaults(func=check_routing)


def check_routing(args: argparse.Namespace) -> int:
    home = home_from(args.home)
    path: Path = args.file or default_routing_path(home)
    text, unreadable = _policy_text(path)
    if text is None:  # its problem depends on no model and no key: said as it is
        return _report(path, unreadable, False, "", None)
    daemon = _home_daemon(home) if args.models is None else None
    here = f"no daemon runs on {home}; a daemon's keys may differ"
    if daemon is not None:
        try:
            return run_command(_check_by_daemon(daemon, path, text))
        except (*CALL_FAILURES, NotADaemon) as exc:
            said = failure_text(exc, daemon.url)
            here = f"the daemon at {daemon.url} did not check it: {said}"
    models: Path = args.models or default_models_path(home)
    registry = load_for_cli(models)
    if registry is None:
        return 2
    result = read_policy_file(path, registry)
    checked = f"against {models} with the provider keys this shell has"
    if args.models is None:
        checked += f" ({here})"
    # what a check here found may depend on the keys; with nothing found, nothing to qualify
    basis = checked if result.diagnostics else None
    return _report(path, result.diagnostics, result.valid, result.version, basis)


def _policy_text(path: Path) -> tuple[str | None, list[Diagnostic]]:
    """The file as text (for the daemon), or None and the error of a file that cannot be read
    as UTF-8 text (missing, a directory, not UTF-8). What is wrong with such a file depends on
    no model and no key, so it is said without checking models.yaml (a broken one would hide
    it) or asking the daemon, and without a line on what it was checked against."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        message = f"cannot read {path}: {exc.strerror}"
        return None, [Diagnostic("error", "unreadable", "", None, None, message)]
    try:
        return raw.decode("utf-8"), []
    except UnicodeDecodeError:
        return None, list(load_yaml_bytes(raw).errors)


def _home_daemon(home: Path) -> DaemonTarget | None:
    """The daemon running on `home` (its lock names its URL) with the key its clients send;
    None when none runs or its key cannot be read."""
    url = running_url(home / LOCK_FILE)
    if url is None:
        return None
    try:
        key = existing_api_key(home, os.environ.get("METIS_API_KEY") or None)
    except ConfigError:
        return None
    return DaemonTarget(url, home, key)


async def _check_by_daemon(daemon: DaemonTarget, path: Path, text: str) -> int:
    """`POST /routing/check` with the file's text: the daemon validates it against the
    registry its turns use, with its provider keys."""
    async with DaemonApi(daemon.url, daemon.headers(), DAEMON_TIMEOUT_S) as api:
        body = await api.call("POST", "/routing/check", {"policy_yaml": text})
        version = await api.call("GET", "/server/version")
    diagnostics = [Diagnostic(**d) for d in body["diagnostics"]]
    checked = f"by the daemon at {daemon.url}, against its models and provider keys"
    # its registry is the models.yaml it read when it started: a model added since is unknown
    # to it, and the check is to say why
    if MODELS_FILE in changed_since_start(daemon.home, version.get("start_up_files")):
        checked += (
            f" (the models it loaded when it started: {daemon.home / MODELS_FILE} changed "
            "since, and applies when it restarts)"
        )
    return _report(path, diagnostics, body["valid"], body["version"], checked)


def _report(
    path: Path,
    diagnostics: Sequence[Diagnostic],
    valid: bool,
    version: str,
    checked: str | None,
) -> int:
    """Every diagnostic, what the models were checked against (if said), then the verdict; the
    exit code."""
    for diagnostic in diagnostics:
        print(format_diagnostic(path, diagnostic))
    if checked is not None:
        print(f"checked {checked}")
    errors = sum(d.severity == "error" for d in diagnostics)
    warnings = len(diagnostics) - errors
    verdict = "valid" if valid else "INVALID"
    found = f"{counted(errors, 'error')}, {counted(warnings, 'warning')}"
    # the version as the daemon's log names the policy it loads; an invalid file has none
    shown = f"; version {version[:12]}" if valid else ""
    print(f"{path}: {verdict} ({found}){shown}")
    return 0 if valid else 1
