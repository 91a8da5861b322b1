"""`metis open`: open the dashboard in a browser, logged in.

Asks the running daemon for a fresh one-time login URL (`POST /login/tokens`, with the
daemon's key) and hands it to the system's browser (`webbrowser.open`). `--print` only prints
the URL; so does a machine where no browser can be started. The URL works once and expires
after `auth.login_token_ttl_s` (5 min); it is not the key, and the key is never printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
import webbrowser
from typing import Any

from metis.commands.daemon_client import DaemonTarget, add_arguments, target_from_args
from metis.core.errors import ConfigError

DAEMON_TIMEOUT_S = 5.0


class OpenFailed(Exception):
    """No login URL: no daemon answers, it refused the key, or it answered an error."""


def request_login_url(target: DaemonTarget) -> dict[str, Any]:
    """`{url, expires_at}` from the daemon's `POST /login/tokens`."""
    req = urllib.request.Request(
        target.url + "/login/tokens", data=b"", method="POST", headers=target.headers()
    )
    try:
        with urllib.request.urlopen(req, timeout=DAEMON_TIMEOUT_S) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            raise OpenFailed(
                f"the daemon at {target.url} refused the key "
                "(METIS_API_KEY, else METIS_HOME/api_key)"
            ) from None
        raise OpenFailed(f"the daemon at {target.url} answered {exc.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise OpenFailed(
            f"no daemon answers at {target.url} ({type(exc).__name__}); start one with "
            "`metis serve`"
        ) from None
    if not isinstance(body, dict) or not isinstance(body.get("url"), str):
        raise OpenFailed(f"the daemon at {target.url} gave no login URL")
    return body


def _cmd_open(args: argparse.Namespace) -> int:
    try:
        target = target_from_args(args)
        login = request_login_url(target)
    except ConfigError as exc:
        print(f"metis: configuration error:\n{exc.message}", file=sys.stderr)
        return 2
    except OpenFailed as exc:
        print(f"metis: {exc}", file=sys.stderr)
        return 1
    url = login["url"]
    if args.print_only:
        print(url, flush=True)
        return 0
    try:
        opened = webbrowser.open(url, new=2)
    except webbrowser.Error:
        opened = False
    if opened:
        print("Opened the dashboard in your browser (a one-time login link).", flush=True)
    else:
        print(f"No browser could be opened; open this one-time link:\n{url}", flush=True)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "open",
        help="open the dashboard in a browser, logged in",
        description="Ask the running daemon for a fresh one-time login URL and open it in "
        "the browser. The link works once and expires after auth.login_token_ttl_s (5 min).",
    )
    parser.add_argument(
        "--print",
        dest="print_only",
        action="store_true",
        help="print the login URL instead of opening a browser",
    )
    add_arguments(parser)
    parser.set_defaults(func=_cmd_open)
