"""A session's AAP configuration: `agent.tools`, `agent.options`, client `tools`.

Validation (each failure is a 400 with its own code), the merge rules of turn overrides, the
SessionInfo rendering, and the translation into what core understands: a `SurfaceToolPolicy`
(trusted → auto, untrusted → prompt → suspended, unlisted → disabled), application tool
definitions and the per-turn model override.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from metis.aap.agents import AUTO, AgentSpec, WorkspaceChoice, Workspaces
from metis.aap.errors import AapError
from metis.aap.store import AapSession
from metis.aap.wire import ServerToolRef
from metis.core.application import Models, SurfaceToolPolicy
from metis.core.canonical.content import TOOL_NAME_RE
from metis.core.canonical.tools import ToolDefinition

SECRET_PLACEHOLDER = "***"
_SCHEMA_KEYS = {3: "parameters", 1: "inputSchema"}


def _tools_error(message: str, **details: Any) -> AapError:
    return AapError("invalid_tools", message, details)


def _option_error(message: str, option: str) -> AapError:
    return AapError("invalid_option", message, {"option": option})


# ---- agent.tools ---------------------------------------------------------------------------


def check_agent_tools(agent: AgentSpec, refs: Sequence[ServerToolRef]) -> list[dict[str, Any]]:
    """`[{name, trust: bool}]`: exposed names only, no duplicates; omitted trust = false."""
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for ref in refs:
        if agent.tool(ref.name) is None:
            raise _tools_error(f"agent {agent.name} has no tool {ref.name!r}", name=ref.name)
        if ref.name in seen:
            raise _tools_error(f"tool {ref.name!r} is listed twice", name=ref.name)
        seen.add(ref.name)
        out.append({"name": ref.name, "trust": bool(ref.trust)})
    return out


# ---- client tools --------------------------------------------------------------------------


def check_client_tools(
    agent: AgentSpec, raw_tools: Sequence[Mapping[str, Any]], version: int
) -> list[dict[str, Any]]:
    """Client tool specs as stored: known keys in the client's order, schema under `parameters`.

    `raw_tools` already passed the wire model (types are right); this checks the names and
    the schema shape, which are `invalid_tools` rather than shape errors.
    """
    schema_key = _SCHEMA_KEYS[version]
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for raw in raw_tools:
        name = raw["name"]
        if not TOOL_NAME_RE.fullmatch(name):
            raise _tools_error(
                f"client tool name {name!r} must match ^[A-Za-z0-9_-]{{1,64}}$", name=name
            )
        if name in seen:
            raise _tools_error(f"client tool {name!r} is declared twice", name=name)
        if agent.tool(name) is not None:
            raise _tools_error(f"client tool {name!r} is named like a server tool", name=name)
        seen.add(name)
        schema = raw.get(schema_key)
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise _tools_error(
                f"client tool {name!r}: `{schema_key}` must be a JSON object schema "
                '({"type": "object", ...})',
                name=name,
            )
        stored: dict[str, Any] = {}
        for key, value in raw.items():
            if key == schema_key:
                stored["parameters"] = value
            elif key in ("name", "description") or (key == "title" and value is not None):
                stored[key] = value
        out.append(stored)
    return out


def render_client_tool(tool: Mapping[str, Any], version: int) -> dict[str, Any]:
    schema_key = _SCHEMA_KEYS[version]
    return {(schema_key if k == "parameters" else k): v for k, v in tool.items()}


def application_tools(session: AapSession) -> tuple[ToolDefinition, ...]:
    return tuple(
        ToolDefinition(
            name=t["name"],
            title=t.get("title"),
            description=t.get("description", ""),
            input_schema=t["parameters"],
            origin="application",
        )
        for t in session.client_tools
    )


def surface_policy(agent_tools: Sequence[Mapping[str, Any]]) -> SurfaceToolPolicy:
    """Listed + trusted → auto (inline); listed → prompt (suspended); not listed → disabled."""
    return SurfaceToolPolicy(
        enabled=frozenset(t["name"] for t in agent_tools),
        modes={t["name"]: "auto" if t["trust"] else "prompt" for t in agent_tools},
    )


# ---- options -------------------------------------------------------------------------------


@dataclass(frozen=True)
class OptionValues:
    options: dict[str, str]
    secrets: dict[str, str]
    workspace: WorkspaceChoice | None  # set at creation only


def _check_value(agent: AgentSpec, key: str, value: Any) -> str:
    spec = agent.option(key)
    if spec is None:
        raise _option_error(f"agent {agent.name} declares no option {key!r}", key)
    if not isinstance(value, str):
        raise _option_error(f"option {key!r} must be a string", key)
    if spec.type == "select" and value not in spec.choices:
        raise _option_error(f"option {key!r} must be one of {list(spec.choices)}", key)
    return value


def create_options(
    agent: AgentSpec, given: Mapping[str, Any] | None, workspaces: Workspaces
) -> OptionValues:
    """Every declared option materialised: the client's value, else the current default."""
    given = dict(given or {})
    for key, value in given.items():
        _check_value(agent, key, value)
    options: dict[str, str] = {}
    secrets: dict[str, str] = {}
    for spec in agent.options:
        value = given.get(spec.name, spec.default)
        (secrets if spec.type == "secret" else options)[spec.name] = value
    workspace = workspaces.resolve(options.get("workspace", agent.workspace_default))
    return OptionValues(options, secrets, workspace)


def merge_options(agent: AgentSpec, session: AapSession, given: Mapping[str, Any]) -> OptionValues:
    """Turn overrides merged by key; `"***"` keeps a stored secret. The workspace is fixed:
    the stored value itself is a no-op, any other value (even one naming the same directory)
    is refused."""
    options, secrets = dict(session.options), dict(session.secret_options)
    for key, value in given.items():
        value = _check_value(agent, key, value)
        spec = agent.option(key)
        assert spec is not None
        if key == "workspace":
            if value != session.options.get("workspace"):
                raise _option_error(
                    "the workspace is fixed when the session is created", "workspace"
                )
            continue
        if spec.type == "secret":
            if value != SECRET_PLACEHOLDER:
                secrets[key] = value
            continue
        options[key] = value
    return OptionValues(options, secrets, None)


def model_override(models: Models, options: Mapping[str, str]) -> str | None:
    """`model` ≠ auto → the canonical id applied as every turn's per_message_override.

    A stored value this daemon cannot resolve any more (models.yaml changed) is treated like
    `auto`: the routing chain decides, as for any override that cannot be served.
    """
    value = options.get("model", AUTO)
    if value == AUTO:
        return None
    model_id = models.resolve(value)
    return model_id if model_id is not None and models.is_configured(model_id) else None


# ---- rendering -----------------------------------------------------------------------------


def session_info(agent: AgentSpec | None, session: AapSession, version: int) -> dict[str, Any]:
    """The SessionInfo of GET /sessions/:id (list items use the same function)."""
    names = [o.name for o in agent.options] if agent is not None else []
    values: dict[str, str] = {}
    for name in [*names, *session.options, *session.secret_options]:
        if name in session.secret_options:
            values[name] = SECRET_PLACEHOLDER
        elif name in session.options:
            values[name] = session.options[name]
    return {
        "sessionId": session.session_id,
        "agent": {
            "name": session.agent_name,
            "tools": [{"name": t["name"], "trust": t["trust"]} for t in session.agent_tools],
            "options": values,
        },
        "tools": [render_client_tool(t, version) for t in session.client_tools],
    }
