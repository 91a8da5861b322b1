"""`metis models` and `metis models check [PATH]`: inspect and validate the model registry.

`check` runs exactly the validation `metis serve` runs at start-up, so a file that passes here
starts the daemon; listing shows which providers have a key before any turn is attempted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from metis.config import SHIPPED_CONFIG_DIR, default_home
from metis.core.configcheck import format_diagnostic
from metis.core.registry import ModelRegistry, load_models_file

MODELS_FILE = "models.yaml"


def default_models_path() -> Path:
    """`$METIS_HOME/models.yaml` if it exists, else the shipped default."""
    user = default_home() / MODELS_FILE
    return user if user.exists() else SHIPPED_CONFIG_DIR / MODELS_FILE


def load_for_cli(path: Path) -> ModelRegistry | None:
    """The registry at `path`, or None after printing every error to stderr."""
    result = load_models_file(path)
    for diagnostic in result.diagnostics:
        print(format_diagnostic(path, diagnostic), file=sys.stderr)
    return result.registry


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "models",
        help="list the model registry and which providers have credentials",
        description="List models.yaml ($METIS_HOME/models.yaml, else the shipped default).",
    )
    parser.add_argument("--models", type=Path, default=None, help="models.yaml to read")
    parser.set_defaults(func=list_models)
    commands = parser.add_subparsers(dest="models_command", metavar="{check}")
    check = commands.add_parser("check", help="validate a models.yaml without starting anything")
    check.add_argument("path", nargs="?", type=Path, default=None, help="file to validate")
    check.set_defaults(func=check_models)


def check_models(args: argparse.Namespace) -> int:
    path: Path = args.path or args.models or default_models_path()
    registry = load_for_cli(path)
    if registry is None:
        return 1
    count = len(registry.models())
    print(f"{path}: OK ({count} models, pricing_version {registry.pricing_version})")
    return 0


def _status(registry: ModelRegistry, model_id: str) -> str:
    reason = registry.not_configured_reason(model_id)
    if reason is None:
        return "configured"
    entry = registry.get(model_id)
    env_var = registry.credential(entry.provider).env_var if entry else None
    if reason == "no_credentials" and env_var:
        return f"no key ({env_var} unset)"
    if reason == "offline_forced":
        return "off (METIS_OFFLINE=1)"
    return reason


def list_models(args: argparse.Namespace) -> int:
    path: Path = args.models or default_models_path()
    registry = load_for_cli(path)
    if registry is None:
        return 2
    rows = [("MODEL", "TIER", "ALIASES", "AVAILABILITY")]
    for entry in registry.models():
        rows.append(
            (
                entry.id,
                entry.tier or "-",
                ", ".join(entry.aliases) or "-",
                _status(registry, entry.id) + (" [scripted]" if entry.scripted else ""),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    print()
    print(f"source: {path}")
    print(f"pricing_version: {registry.pricing_version}")
    mode = "on (only local:scripted is served unless asked)" if registry.offline_mode else "off"
    print(f"offline mode: {mode}")
    default = registry.default_model()
    print(f"default model: {default or 'none (no configured real model)'}")
    return 0
