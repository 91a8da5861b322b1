"""`metis routing check [FILE]`: validate a routing policy against the model registry.

Uses the same validation as the daemon's reload path, so a policy that passes here loads; the
output names file, line and column for every error and warning.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from metis.commands import usage
from metis.commands.daemon_client import add_home_argument
from metis.commands.models import default_models_path, load_for_cli
from metis.config import SHIPPED_CONFIG_DIR, home_from
from metis.core.config.checks import format_diagnostic
from metis.core.routing.loader import read_policy_file
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
        "Exits 1 when the policy has errors, 2 when models.yaml itself is invalid.",
    )
    check.add_argument("file", nargs="?", type=Path, default=None, help="policy to validate")
    check.add_argument(
        "--models",
        type=Path,
        default=None,
        help="models.yaml to validate against (default: $METIS_HOME/models.yaml, else shipped)",
    )
    add_home_argument(check)
    check.set_defaults(func=check_routing)


def check_routing(args: argparse.Namespace) -> int:
    home = home_from(args.home)
    registry = load_for_cli(args.models or default_models_path(home))
    if registry is None:
        return 2
    path: Path = args.file or default_routing_path(home)
    result = read_policy_file(path, registry)
    for diagnostic in result.diagnostics:
        print(format_diagnostic(path, diagnostic))
    errors, warnings = len(result.errors), len(result.warnings)
    verdict = "valid" if result.valid else "INVALID"
    found = f"{counted(errors, 'error')}, {counted(warnings, 'warning')}"
    # the version as the daemon's log names the policy it loads; an invalid file has none
    version = f"; version {result.version[:12]}" if result.valid else ""
    print(f"{path}: {verdict} ({found}){version}")
    return 0 if result.valid else 1
