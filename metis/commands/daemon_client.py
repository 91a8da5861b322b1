"""How a command finds its daemon: the URL to call and the key to send.

The address: flag (`--url`, else `--host`/`--port`) > METIS_HOST / METIS_PORT > the daemon
running on METIS_HOME (its `daemon.lock` names its URL: one started with `--port`, or on port 0,
is found) > `METIS_HOME/config.yaml` > 127.0.0.1:8421, the precedence `metis serve` binds with
(`metis.config.resolve_address`) but for the running daemon; METIS_HOME itself is `--home` >
METIS_HOME > ~/.metis. The running daemon is found without config.yaml: a file broken since
it started is a warning, not a reason to refuse its clients.

The key is the daemon's own: METIS_API_KEY, else `METIS_HOME/api_key` (read, never created),
sent as `Authorization: Bearer <key>` on every HTTP request and WebSocket upgrade. The key is
never printed; `DaemonTarget`'s repr leaves it out.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from metis.commands.printable import printable
from metis.config import (
    LOOPBACK_HOSTS,
    env_port,
    home_from,
    load_file_settings,
    port_argument,
    resolve_address,
)
from metis.core.canonical.ids import is_session_id
from metis.core.errors import ConfigError
from metis.http.apikey import existing_api_key
from metis.http.ca_bundle import load_ca_bundle
from metis.server.lock import LOCK_FILE, running_url

CONFIG_FILE = "config.yaml"
RESTART_REFUSED = "the running daemon goes on; the next `metis serve` on this home refuses it"
START_HINT = "start it with `metis serve --detach` (or `metis serve` in another terminal)"


def refused_key(url: str) -> str:
    """What every client says when the daemon answers 401: whose key it wanted."""
    return f"the daemon at {url} refused the key (METIS_API_KEY, else METIS_HOME/api_key)"


def unreachable(url: str, home: Path | None = None) -> str:
    """What a client says when nothing answers at the daemon's URL: where the daemon of `home`
    runs instead, when its lock names another URL (METIS_PORT or `--port` pointing elsewhere:
    starting one would be refused), else how to start one."""
    running = running_url(home / LOCK_FILE) if home is not None else None
    if running is not None and running != url:
        return (
            f"cannot reach the daemon at {url}; the daemon of {printable(home)} runs at "
            f"{running} (`--url {running}`, or leave out the port that points elsewhere)"
        )
    return f"cannot reach the daemon at {url}; {START_HINT}"


@dataclass(frozen=True)
class DaemonTarget:
    url: str
    home: Path
    api_key: str | None = field(default=None, repr=False)
    # what is wrong with the home's config.yaml, when the daemon was found without it (its
    # lock): the running daemon answers, the next `metis serve` on the home will refuse it
    config_error: str | None = None

    def headers(self) -> dict[str, str]:
        """Headers for every request to the daemon (empty when no key is known)."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def _url_host(host: str) -> str:
    if host not in LOOPBACK_HOSTS:
        host = "127.0.0.1"  # the daemon refuses other hosts and binds this one instead
    return "[::1]" if host == "::1" else "127.0.0.1" if host == "localhost" else host


def _config_error(home: Path) -> str | None:
    """The first problem of the home's config.yaml (file:line: key: problem), if it has one."""
    try:
        load_file_settings(home / CONFIG_FILE)
    except ConfigError as exc:
        problems = exc.message.splitlines()
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return problems[0] + more
    return None


def _listens_at(url: str, host: str | None, port: int | None) -> bool:
    """Whether a daemon at `url` is the one a named host and port (either may be unnamed; a
    port 0 is any) point at."""
    parts = urlsplit(url)
    if port and parts.port != port:
        return False
    return not host or _url_host(host).strip("[]") == parts.hostname


def resolve_daemon(
    *,
    url: str | None = None,
    host: str | None = None,
    port: int | None = None,
    home: Path | str | None = None,
) -> DaemonTarget:
    """Where the daemon of `home` listens and its key. The daemon running on the home is found
    through its lock without config.yaml, so a file broken since it started does not cut its
    clients off (`config_error` says what is wrong). Raises ConfigError for a bad config.yaml
    that is needed (the message names file, line and key), AddressError for a bad METIS_PORT."""
    home_path = home_from(home)
    key = existing_api_key(home_path, os.environ.get("METIS_API_KEY") or None)
    if url:
        if url.lower().startswith(("https:", "wss:")):
            load_ca_bundle()  # the daemon behind a TLS proxy: verified as the system trusts
        return DaemonTarget(url.rstrip("/"), home_path, key)
    lock = home_path / LOCK_FILE
    named_port = port if port is not None else env_port()
    named_host = host or os.environ.get("METIS_HOST")
    # the home's running daemon when it listens where the flags and environment say (no
    # address named, or port 0: "any"), found without reading config.yaml
    running = running_url(lock)
    if running and _listens_at(running, named_host, named_port):
        return DaemonTarget(running, home_path, key, _config_error(home_path))
    file_settings = load_file_settings(home_path / CONFIG_FILE)
    requested_host, effective_port = resolve_address(file_settings, host=host, port=named_port)
    if effective_port == 0:  # port 0 with a host, or in config.yaml: the running one's URL
        running = running_url(lock)
        if running:
            return DaemonTarget(running, home_path, key)
    return DaemonTarget(f"http://{_url_host(requested_host)}:{effective_port}", home_path, key)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--url`, `--host`, `--port`, `--home` for a command that talks to the daemon."""
    group = parser.add_argument_group(
        "daemon",
        "which daemon to talk to: flag > METIS_HOST/METIS_PORT > the daemon running on "
        "METIS_HOME > METIS_HOME/config.yaml > http://127.0.0.1:8421; the key is "
        "METIS_API_KEY, else METIS_HOME/api_key",
    )
    group.add_argument("--url", help="daemon URL (overrides --host/--port)")
    group.add_argument("--host", help="daemon host (overrides METIS_HOST)")
    group.add_argument("--port", type=port_argument, help="daemon port (overrides METIS_PORT)")
    add_home_argument(group, "METIS_HOME of the daemon (overrides env)")


def add_home_argument(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    help_text: str = "METIS_HOME to work on (overrides env; default ~/.metis)",
    default: object = None,
) -> None:
    """`--home DIR`, read with `metis.config.home_from`; `default=argparse.SUPPRESS` for a
    subcommand's, so it does not undo the flag given to its command."""
    parser.add_argument("--home", metavar="DIR", help=help_text, default=default)


def session_id(value: str) -> str:
    """An argument that names a session (`sess_` and 26 characters): checked before it goes
    into a request's path, where `sess_x?purge=true` or `../..` would name something else."""
    if not is_session_id(value):
        raise argparse.ArgumentTypeError(
            f"not a session id: {value!r} (ids look like sess_01JB8Z…, 31 characters; "
            "`metis sessions list` shows them)"
        )
    return value


def target_from_args(args: argparse.Namespace) -> DaemonTarget:
    """The daemon `args` name (`add_arguments`). A config.yaml broken while its daemon runs is
    said in one line on stderr as the command goes on with that daemon, unless the command
    names it itself (`config_warning=False` in its parser's defaults: `metis status`)."""
    target = resolve_daemon(url=args.url, host=args.host, port=args.port, home=args.home)
    if target.config_error is not None and getattr(args, "config_warning", True):
        print(f"metis: warning: {target.config_error} ({RESTART_REFUSED})", file=sys.stderr)
    return target
