"""`metis models`, `metis models check [PATH]`, `metis models reset [MODEL]`.

Listing asks the running daemon (`GET /models`, with its key) so it shows live availability:
which models routing skips, why, and until when; with no daemon answering (or `--models FILE`)
it shows the registry from models.yaml alone. `reset` asks the daemon to treat a model (and its
provider), or every model, as healthy again, and says which stay unusable all the same (no
key: a reset does not configure a model). `check` runs exactly the validation `metis serve`
runs at start-up, so a file that passes here starts the daemon.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from metis.commands.client import NOT_A_URL, not_a_url
from metis.commands.daemon_client import (
    DaemonTarget,
    add_arguments,
    add_home_argument,
    refused_key,
    target_from_args,
)
from metis.commands.event_loop import run_command
from metis.commands.since_start import changed_since_start
from metis.config import SHIPPED_CONFIG_DIR, home_from
from metis.core.config.checks import format_diagnostic
from metis.core.errors import ConfigError
from metis.core.models.registry import ModelRegistry, load_models_file
from metis.core.tools.textutil import visible_controls
from metis.server.lock import LOCK_FILE, running_url
from metis.wire.models import unconfigured_reason
from metis.wire.table import table_lines
from metis.wire.when import local_time

MODELS_FILE = "models.yaml"
DAEMON_TIMEOUT_S = 3.0


class NoDaemon(Exception):
    """No daemon answered (refused, timed out) or it refused the key; the message says which."""


async def _daemon_call(target: DaemonTarget, method: str, path: str) -> tuple[int, Any]:
    timeout = aiohttp.ClientTimeout(total=DAEMON_TIMEOUT_S)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout, headers=target.headers()) as http,
            http.request(method, target.url + path) as response,
        ):
            body = await response.json(content_type=None)
    except NOT_A_URL as exc:
        raise NoDaemon(not_a_url(target.url)) from exc
    except TimeoutError as exc:
        raise NoDaemon(f"no daemon answers at {target.url} within {DAEMON_TIMEOUT_S:g} s") from exc
    except aiohttp.ClientConnectionError as exc:
        raise NoDaemon(f"no daemon answers at {target.url}") from exc
    except (aiohttp.ClientError, ValueError) as exc:  # an answer, not JSON: not a daemon's
        raise NoDaemon(f"{target.url} does not answer as a metis daemon") from exc
    if response.status == 401:
        raise NoDaemon(refused_key(target.url))
    return response.status, body


def daemon_call(target: DaemonTarget, method: str, path: str) -> tuple[int, Any]:
    """One REST call to the daemon; raises `NoDaemon` when there is no usable answer."""
    return run_command(_daemon_call(target, method, path))


def default_models_path(home: Path) -> Path:
    """`home`'s models.yaml if it exists, else the shipped default."""
    user = home / MODELS_FILE
    return user if user.exists() else SHIPPED_CONFIG_DIR / MODELS_FILE


def load_for_cli(path: Path) -> ModelRegistry | None:
    """The registry at `path`, or None after printing every error to stderr."""
    result = load_models_file(path)
    for diagnostic in result.diagnostics:
        print(format_diagnostic(path, diagnostic), file=sys.stderr)
    return result.registry


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "models",
        help="list the model registry and which providers have credentials",
        description="List models.yaml ($METIS_HOME/models.yaml, else the shipped default).",
    )
    parser.add_argument(
        "--models",
        type=Path,
        default=None,
        help="models.yaml to read instead of asking the daemon (no live availability)",
    )
    add_arguments(parser)
    parser.set_defaults(func=list_models)
    commands = parser.add_subparsers(dest="models_command", metavar="{check,reset}")
    check = commands.add_parser(
        "check",
        help="validate a models.yaml without starting anything",
        description="Validate PATH (default: $METIS_HOME/models.yaml, else the shipped "
        "default) as the daemon would load it: every error is named by file, line and column. "
        "Exit 0 when it is valid, 1 when it is not.",
    )
    check.add_argument(
        "path", nargs="?", type=Path, default=None, help="the models.yaml to validate"
    )
    # SUPPRESS: a `--home` given before `check` is kept
    add_home_argument(check, default=argparse.SUPPRESS)
    check.set_defaults(func=check_models)
    # SUPPRESS: daemon flags given before `reset` are not overwritten by the sub-parser's defaults
    reset = commands.add_parser(
        "reset",
        help="make the daemon try a model (and its provider) again, or every model",
        description="Clear the running daemon's availability state: for MODEL (id or alias) "
        "and its provider, or for every model. Routing uses them again from the next turn.",
        argument_default=argparse.SUPPRESS,
    )
    reset.add_argument("model", nargs="?", default=None, help="model id or alias (default: all)")
    add_arguments(reset)
    reset.set_defaults(func=reset_models)


def check_models(args: argparse.Namespace) -> int:
    path: Path = args.path or args.models or default_models_path(home_from(args.home))
    registry = load_for_cli(path)
    if registry is None:
        return 1
    count = len(registry.models())
    # in the words of `metis routing check`
    print(f"{path}: valid ({count} models, pricing_version {registry.pricing_version})")
    return 0


def _status(registry: ModelRegistry, model_id: str) -> str:
    reason = registry.not_configured_reason(model_id)
    if reason is None:
        return "configured"
    entry = registry.get(model_id)
    env_var = registry.credential(entry.provider).env_var if entry else None
    return unconfigured_reason({"reason": reason, "env_var": env_var})


def _target(args: argparse.Namespace) -> DaemonTarget | None:
    try:
        return target_from_args(args)
    except ConfigError as exc:
        print(f"metis: configuration error:\n{exc.message}", file=sys.stderr)
        return None


class Refused(Exception):
    """The daemon answered a call with an error: its message, and the exit status to leave
    with (2 for a request it refuses, as `run` refuses a model it does not know; else 1)."""

    def __init__(self, message: str, exit_status: int) -> None:
        super().__init__(message)
        self.exit_status = exit_status


def _answer(target: DaemonTarget, method: str, path: str) -> Any:
    """The body of the daemon's 200 answer; `NoDaemon` or `Refused` when there is none."""
    status, body = daemon_call(target, method, path)
    if status != 200:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        said = error.get("message") or f"the daemon answered HTTP {status}"
        raise Refused(said, 2 if 400 <= status < 500 else 1)
    return body


def _reset_lines(reset: dict[str, Any], unconfigured: list[dict[str, Any]]) -> list[str]:
    """What a reset did, without claiming more: a reset clears availability only, so a model
    the registry declares but cannot use (no key, METIS_OFFLINE=1: fixed when the daemon
    started) stays unavailable, said in `metis models`' words."""
    recovered = ", ".join(reset["recovered"]) or "none was unavailable"
    model = reset["model"]
    if model is None:
        lines = [f"reset every model; healthy again: {recovered}"]
        if unconfigured:
            lines.append("still unavailable, not configured:")
            lines += [f"  {m['id']}: {unconfigured_reason(m)}" for m in unconfigured]
    else:
        stays = next((m for m in unconfigured if m["id"] == model), None)
        if stays is None:
            return [f"reset {model}; healthy again: {recovered}"]
        lines = [f"reset {model}; it stays unavailable: {unconfigured_reason(stays)}"]
    if unconfigured:
        lines.append(
            "a reset does not configure a model: the daemon reads provider keys and "
            "METIS_OFFLINE when it starts"
        )
    return lines


def reset_models(args: argparse.Namespace) -> int:
    target = _target(args)
    if target is None:
        return 2
    path = f"/models/{quote(args.model, safe=':')}/reset" if args.model else "/models/reset"
    try:
        # the models it cannot use, asked first: a failure then leaves nothing reset
        unconfigured = _answer(target, "GET", "/models")["unconfigured"]
        reset = _answer(target, "POST", path)
    except NoDaemon as exc:
        print(f"metis: {exc}; availability lives in the running daemon", file=sys.stderr)
        return 1
    except Refused as exc:
        print(f"metis: {exc}", file=sys.stderr)
        return exc.exit_status
    print("\n".join(_reset_lines(reset, unconfigured)))
    return 0


def _print_table(rows: Sequence[tuple[str, ...]]) -> None:
    """Aligned; at a terminal narrower than a row, its availability wraps under it."""
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    print("\n".join(table_lines(rows, width)))


def _live_status(model: dict[str, Any]) -> str:
    if model["availability"] == "healthy":
        return "healthy"
    detail = model.get("availability_detail") or {}
    # why, in the provider's words, is said under the table
    until = local_time(detail.get("recovers_at"), seconds=True, zone=True)
    return f"unavailable until {until}" if until else "unavailable"


def _tier_and_aliases(tier: str | None, aliases: Sequence[str] | None) -> tuple[str, str]:
    """The TIER and ALIASES cells of a model's row, `-` for none (live or from models.yaml)."""
    return tier or "-", ", ".join(aliases or []) or "-"


def show_live(target: DaemonTarget, body: dict[str, Any]) -> None:
    """The daemon's `GET /models`: availability as routing sees it now, and why."""
    rows = [("MODEL", "TIER", "ALIASES", "AVAILABILITY")]
    for model in body["models"]:
        status = _live_status(model) + (" [scripted]" if model.get("scripted") else "")
        rows.append(
            (model["id"], *_tier_and_aliases(model.get("tier"), model.get("aliases")), status)
        )
    for model in body["unconfigured"]:
        rows.append(
            (
                model["id"],
                *_tier_and_aliases(model.get("tier"), model.get("aliases")),
                unconfigured_reason(model),
            )
        )
    _print_table(rows)
    down = [m for m in body["models"] if m["availability"] != "healthy"]
    if down:
        print()
        for model in down:
            detail = model.get("availability_detail") or {}
            why = str(detail.get("message") or detail.get("trigger_reason"))
            print(f"{model['id']}: {visible_controls(why)}")  # the provider's words
            since = local_time(detail.get("since"), seconds=True, zone=True)
            again = local_time(detail.get("recovers_at"), seconds=True, zone=True)
            print(
                f"  unavailable since {since}, routing tries it again after {again}; "
                f"`metis models reset {model['id']}` does it now"
            )
    print()
    print(f"source: the daemon at {target.url} (live availability)")
    print(f"pricing_version: {body['pricing_version']}")
    print(f"offline mode: {_offline_mode(body['offline_mode'])}")


def _say_edited_since_start(target: DaemonTarget) -> None:
    """The daemon read its home's models.yaml when it started: an edit since is not in what
    it lists, and is said (asked only of the home's own daemon, which its lock names)."""
    if running_url(target.home / LOCK_FILE) != target.url:
        return
    try:
        _, version = daemon_call(target, "GET", "/server/version")
    except NoDaemon:
        return
    read = version.get("start_up_files") if isinstance(version, dict) else None
    if MODELS_FILE in changed_since_start(target.home, read):
        print(
            f"{target.home / MODELS_FILE} changed since the daemon started: it applies when "
            "the daemon restarts (`metis models --models FILE` lists the file)"
        )


def _offline_mode(on: bool) -> str:
    return "on (only local:scripted is served unless asked)" if on else "off"


def list_models(args: argparse.Namespace) -> int:
    note = None
    if args.models is None:
        target = _target(args)
        if target is None:
            return 2
        try:
            status, body = daemon_call(target, "GET", "/models")
        except NoDaemon as exc:
            note = f"{exc}: availability shown from models.yaml only"
        else:
            if status == 200:
                show_live(target, body)
                _say_edited_since_start(target)
                return 0
            note = f"the daemon at {target.url} answered {status}: showing models.yaml only"
    path: Path = args.models or default_models_path(home_from(args.home))
    registry = load_for_cli(path)
    if registry is None:
        return 2
    rows = [("MODEL", "TIER", "ALIASES", "AVAILABILITY")]
    # the models that can answer first, as the daemon lists them
    entries = sorted(
        registry.models(), key=lambda e: registry.not_configured_reason(e.id) is not None
    )
    for entry in entries:
        rows.append(
            (
                entry.id,
                *_tier_and_aliases(entry.tier, entry.aliases),
                _status(registry, entry.id) + (" [scripted]" if entry.scripted else ""),
            )
        )
    _print_table(rows)
    print()
    if note is not None:
        print(note)
    print(f"source: {path}")
    print(f"pricing_version: {registry.pricing_version}")
    print(f"offline mode: {_offline_mode(registry.offline_mode)}")
    default = registry.default_model()
    print(f"default model: {default or 'none (no configured real model)'}")
    return 0
