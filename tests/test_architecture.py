"""The import graph keeps the layers apart (docs/architecture.md).

Every module under `metis/` is parsed (not imported); its `import`/`from … import` statements,
relative ones resolved, give the edges. Core and the config never reach a surface or the HTTP
stack, however indirectly; each surface builds on the HTTP kernel (`metis.http`) rather than on
the other surface, the metis surface knowing AAP at its one mount point only.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "metis"

SURFACES_AND_UI = ("metis.server", "metis.aap", "metis.commands", "metis.dashboard", "metis.http")
HTTP_STACK = ("aiohttp",)  # the server side (aiohttp.web) and the client alike
AAP_MOUNT_POINT = "metis.server.app"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


@cache
def direct_imports(module: str) -> frozenset[str]:
    """Every module `module` names in an import statement (function-level ones included)."""
    path = _modules()[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node, path.name == "__init__.py")
            found.add(target)
            # `from pkg import sub` imports the submodule `pkg.sub` when there is one
            found.update(
                f"{target}.{alias.name}"
                for alias in node.names
                if f"{target}.{alias.name}" in _modules()
            )
    return frozenset(found)


def _in_package(name: str) -> Iterable[str]:
    """`name` and the packages above it that are metis modules (importing runs their inits)."""
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        candidate = ".".join(parts[:i])
        if candidate in _modules():
            yield candidate


@cache
def transitive_imports(module: str) -> frozenset[str]:
    seen: set[str] = set()
    expanded: set[str] = set()
    stack = [module]
    while stack:
        current = stack.pop()
        if current in expanded:
            continue
        expanded.add(current)
        for name in direct_imports(current):
            seen.add(name)
            packages = list(_in_package(name))  # importing `a.b.c` runs `a` and `a.b` too
            seen.update(packages)
            stack.extend(packages)
    return frozenset(seen)


def _under(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _offending(module: str, forbidden: Iterable[str]) -> list[str]:
    forbidden = tuple(forbidden)
    return sorted(n for n in transitive_imports(module) if _under(n, forbidden))


def test_the_graph_sees_every_module_and_resolves_relative_imports() -> None:
    assert "metis.core.runtime" in _modules()
    assert "metis.http.routes" in _modules()
    # a sanity check of the walk itself: the daemon app reaches both surfaces and the kernel
    reached = transitive_imports("metis.server.app")
    assert {"metis.aap.app", "metis.http.routes", "metis.core.runtime", "aiohttp"} <= reached


def test_core_never_imports_a_surface_or_the_http_stack() -> None:
    offenders = {
        module: bad
        for module in _modules()
        if _under(module, ("metis.core",))
        and (bad := _offending(module, (*SURFACES_AND_UI, *HTTP_STACK)))
    }
    assert offenders == {}


def test_the_config_never_imports_a_surface_or_the_http_stack() -> None:
    assert _offending("metis.config", (*SURFACES_AND_UI, *HTTP_STACK)) == []


def test_the_wire_helpers_stand_apart_from_the_daemon_and_its_clients() -> None:
    """metis/wire/ reads the REST API's JSON for the clients and the daemon's export alike: it
    imports neither side, nor core, nor the HTTP stack."""
    offenders = {
        module: bad
        for module in _modules()
        if _under(module, ("metis.wire",))
        and (bad := _offending(module, (*SURFACES_AND_UI, *HTTP_STACK, "metis.core")))
    }
    assert offenders == {}
    assert "metis.wire.export" in _modules()


def test_the_http_kernel_knows_no_surface() -> None:
    offenders = {
        module: bad
        for module in _modules()
        if _under(module, ("metis.http",))
        and (bad := _offending(module, ("metis.server", "metis.aap", "metis.commands")))
    }
    assert offenders == {}


def test_aap_builds_on_the_kernel_never_on_the_metis_surface() -> None:
    aap = [m for m in _modules() if _under(m, ("metis.aap",))]
    offenders = {m: bad for m in aap if (bad := _offending(m, ("metis.server",)))}
    assert offenders == {}
    assert any("metis.http.routes" in direct_imports(m) for m in aap)


def test_the_metis_surface_knows_aap_only_at_its_mount_point() -> None:
    server = [m for m in _modules() if _under(m, ("metis.server", "metis.dashboard"))]
    offenders = {
        m: sorted(n for n in direct_imports(m) if _under(n, ("metis.aap",)))
        for m in server
        if m != AAP_MOUNT_POINT
    }
    assert {m: bad for m, bad in offenders.items() if bad} == {}
    assert sorted(n for n in direct_imports(AAP_MOUNT_POINT) if _under(n, ("metis.aap",))) == [
        "metis.aap",
        "metis.aap.app",
    ]
    assert any("metis.http.routes" in direct_imports(m) for m in server)


# ---- the surfaces reach core through the application interface only -------------------------

SURFACE_PACKAGES = ("metis.server", "metis.aap", "metis.dashboard")
# What of core a surface module may import: the application interface (which re-exports the
# value types of its services), the domain errors, the canonical value types and the events'
# catalog and envelope types (docs/architecture.md lists the same modules).
CANONICAL_CONCEPTS = (
    "content",
    "ids",
    "jsontext",
    "messages",
    "money",
    "redaction",
    "times",
    "tools",
    "usage",
)
PUBLIC_CORE = (
    "metis.core",  # the package itself (importing a submodule runs it)
    "metis.core.application",
    "metis.core.errors",
    "metis.core.canonical",
    *(f"metis.core.canonical.{concept}" for concept in CANONICAL_CONCEPTS),
    "metis.core.events",
    "metis.core.events.catalog",
    "metis.core.events.envelope",
    "metis.core.datamodel",  # the base of every pydantic model, wire models included
)
# A store extension's store module defines its tables and repository on the store's own API
# (it holds the database the application binds it to: `Application.extend_store`).
STORE_EXTENSION_MODULES = {"metis.aap.store"}
STORE_EXTENSION_API = ("metis.core.store", "metis.core.store.store", "metis.core.store.tx")
STORE_EXTENSION_API += ("metis.core.store.db",)
# The composition root builds `Core` and hands the surfaces an `Application` (tests reach the
# Core through `Daemon.core`).
COMPOSITION_ROOT = {"metis.server.runner": ("metis.core.runtime",)}
# Attributes that are core's internals whatever object they are read from.
FORBIDDEN_ATTRIBUTES = frozenset(
    {"db", "store", "slots", "bus", "session_cache", "costs", "writer"}
)


def _surface_modules() -> list[str]:
    return [m for m in _modules() if _under(m, SURFACE_PACKAGES)]


def test_surfaces_import_only_the_public_core() -> None:
    offenders: dict[str, list[str]] = {}
    for module in _surface_modules():
        allowed = set(PUBLIC_CORE)
        if module in STORE_EXTENSION_MODULES:
            allowed.update(STORE_EXTENSION_API)
        allowed.update(COMPOSITION_ROOT.get(module, ()))
        bad = sorted(
            name
            for name in direct_imports(module)
            if _under(name, ("metis.core",)) and name not in allowed
        )
        if bad:
            offenders[module] = bad
    assert offenders == {}


def test_surfaces_touch_no_core_internals() -> None:
    offenders: dict[str, list[str]] = {}
    for module in _surface_modules():
        if module in STORE_EXTENSION_MODULES:
            continue
        path = _modules()[module]
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        found = sorted(
            f"{node.lineno}: .{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRIBUTES
        )
        if found:
            offenders[module] = found
    assert offenders == {}


def test_the_attribute_check_sees_a_reach_through() -> None:
    """A sanity check of the AST walk: `state.app.db` would be found."""
    tree = ast.parse("async def f(state):\n    return state.core.db.schema_version\n")
    attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert "db" in attrs & FORBIDDEN_ATTRIBUTES


def test_the_documented_module_list_names_every_module() -> None:
    """docs/architecture.md's module tree stays true: a module (or package) added under metis/
    without a word in the tree fails here."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    tree = doc.split("```\nmetis/", 1)[1].split("```", 1)[0]
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", tree))
    undocumented = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "metis").rglob("*.py"))
        if (path.parent.name if path.name == "__init__.py" else path.stem) not in words
    ]
    assert undocumented == []
