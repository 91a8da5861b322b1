"""`metis open`: open the dashboard in a browser, logged in.

Asks the running daemon for a fresh one-time login URL (`POST /login/tokens`, with the
daemon's key) and opens the system's browser (`webbrowser.open`) on a private file that
redirects to it: `METIS_HOME/run/open-dashboard.html`, mode 0600 in the 0700 home. The URL
itself is never a browser's argument, where any local user could read it
(`/proc/<pid>/cmdline`). `--print` only prints the URL; so does a machine where no browser can
be started. The URL works once and expires after `auth.login_token_ttl_s` (5 min); it is not
the key, and the key is never printed.
"""

from __future__ import annotations

import argparse
import html
import json
import sys
import urllib.error
import urllib.request
import webbrowser
from pathlib import Path
from typing import Any

from metis.commands.daemon_client import (
    DaemonTarget,
    add_arguments,
    refused_key,
    target_from_args,
    unreachable,
)
from metis.core.errors import ConfigError
from metis.private_file import write_private

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
            status, content_type = response.status, response.headers.get_content_type()
            try:
                body = json.loads(response.read())
            except ValueError:  # JSON or UTF-8 that does not decode: not a daemon's answer
                raise OpenFailed(
                    f"{target.url} does not answer as a metis daemon (HTTP {status}, "
                    f"{content_type})"
                ) from None
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            raise OpenFailed(refused_key(target.url)) from None
        raise OpenFailed(f"the daemon at {target.url} answered {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        # a daemon that accepts and then says nothing (stopped, stuck) is there: telling its
        # user to start one would send them to a `metis serve` that refuses to start
        if isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError):
            raise OpenFailed(
                f"the daemon at {target.url} did not answer within {DAEMON_TIMEOUT_S:g} s"
            ) from None
        raise OpenFailed(unreachable(target.url, target.home)) from None
    if not isinstance(body, dict) or not isinstance(body.get("url"), str):
        raise OpenFailed(f"the daemon at {target.url} gave no login URL")
    return body


REDIRECT_FILE = "open-dashboard.html"  # in METIS_HOME/run


def write_redirect_file(home: Path, url: str) -> Path:
    """A private HTML file that sends the browser on to `url` (replaced on each call)."""
    run = home / "run"
    run.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = html.escape(url, quote=True)
    body = (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
        f'<meta http-equiv="refresh" content="0;url={target}">\n'
        '<meta name="referrer" content="no-referrer">\n'
        "<title>metis: opening the dashboard</title></head>\n"
        f'<body><p><a href="{target}">Open the metis dashboard</a> (a one-time login link).</p>'
        "</body></html>\n"
    ).encode()
    path = run / REDIRECT_FILE
    write_private(path, body)
    return path


def _open_browser(home: Path, url: str) -> bool:
    try:
        page = write_redirect_file(home, url)
    except OSError as exc:
        print(f"metis: cannot write the login page ({exc.strerror})", file=sys.stderr)
        return False
    try:
        return webbrowser.open(page.as_uri(), new=2)
    except webbrowser.Error:
        return False


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
    if _open_browser(target.home, url):
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
