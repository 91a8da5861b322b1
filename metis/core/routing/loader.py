"""`routing.yaml` → validated, compiled `Policy`.

`validate_policy(raw, registry)` is the only way to build a policy from bytes: the manager's
reload path, `POST /routing/check` and `metis routing check` all go through it, so they can
never disagree about what is valid. Model references are resolved to canonical ids here, so
nothing downstream ever sees an alias.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from metis.core.config.checks import Collector, Position, join, join_key, position
from metis.core.config.yaml_source import Diagnostic, MarkedDict, load_yaml_bytes, suggest
from metis.core.models.registry import ModelRegistry
from metis.core.routing.predicates import Chain, When, compile_chain, compile_when, implies

TIERS = ("fast", "balanced", "deep")
_TOP_KEYS = ("schema_version", "global_default", "tiers", "rules", "workspaces", "pattern")
_RULE_KEYS = ("name", "description", "when", "use")
_SCOPE_KEYS = ("default", "tiers", "rules")
_PATTERN_KEYS = ("enabled", "cost_weight", "min_confidence", "min_sample_size")


def policy_version(raw: bytes) -> str:
    """Full lowercase sha256 hex of the exact bytes: any edit, comments included, is new."""
    return hashlib.sha256(raw).hexdigest()


EMPTY_POLICY_VERSION = policy_version(b"")


@dataclass(frozen=True, eq=False)
class Rule:
    """One routing rule: when its condition holds, use a model; `path` and `line` locate it for
    diagnostics and `GET /routing`."""

    name: str
    description: str | None
    when: When
    use: str
    line: int | None
    path: str  # e.g. `rules[2]` or `workspaces["/x"].rules[0]`

    def describe(self) -> dict[str, Any]:
        """The rule as `GET /routing` shows it, its condition in YAML form."""
        return {
            "name": self.name,
            "description": self.description,
            "when": self.when.to_yaml(),
            "use": self.use,
            "line": self.line,
        }


@dataclass(frozen=True, eq=False)
class Scope:
    """One `workspaces:` entry; `path` is the resolved directory it covers."""

    path: str
    key: str
    default: str | None
    tiers: dict[str, str] | None
    rules: tuple[Rule, ...]

    def covers(self, workspace: str) -> bool:
        """Whether `workspace` is this scope's directory or lies below it (compared on path
        components, so `/a` does not cover `/ab`)."""
        if workspace == self.path:
            return True
        base = self.path if self.path.endswith("/") else self.path + "/"
        return workspace.startswith(base)


@dataclass(frozen=True)
class PatternSettings:
    """Reserved `pattern:` block: validated and shown, never used in v1."""

    enabled: bool = False
    cost_weight: float = 0.05
    min_confidence: float = 0.05
    min_sample_size: int = 5

    def describe(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "cost_weight": self.cost_weight,
            "min_confidence": self.min_confidence,
            "min_sample_size": self.min_sample_size,
        }


@dataclass(frozen=True, eq=False)
class Policy:
    """A validated routing policy, compiled once at load: each workspace scope's rules are flattened
    with the global ones into one evaluation chain."""

    version: str
    global_default: str | None = None
    tiers: dict[str, str] | None = None
    rules: tuple[Rule, ...] = ()
    scopes: tuple[Scope, ...] = ()  # file order
    pattern: PatternSettings = field(default_factory=PatternSettings)
    warnings: tuple[Diagnostic, ...] = ()
    _longest_first: tuple[Scope, ...] = field(init=False, repr=False)
    _evaluation: dict[str | None, tuple[Chain, tuple[Rule, ...]]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.scopes, key=lambda s: len(s.path), reverse=True))
        object.__setattr__(self, "_longest_first", ordered)
        # Evaluation order per scope (workspace rules, then global), flattened once at load.
        evaluation: dict[str | None, tuple[Rule, ...]] = {None: self.rules}
        for scope in self.scopes:
            evaluation[scope.path] = (*scope.rules, *self.rules)
        object.__setattr__(
            self,
            "_evaluation",
            {k: (compile_chain([r.when for r in rules]), rules) for k, rules in evaluation.items()},
        )

    def scope_for(self, workspace: str) -> Scope | None:
        """The longest workspace key equal to or an ancestor of the session's workspace."""
        for scope in self._longest_first:
            if scope.covers(workspace):
                return scope
        return None

    def rules_in_order(self, scope: Scope | None) -> tuple[Chain, tuple[Rule, ...]]:
        """(the compiled chain, the rules it indexes) in evaluation order for `scope`."""
        return self._evaluation[scope.path if scope is not None else None]


BUILTIN_EMPTY = Policy(version=EMPTY_POLICY_VERSION)


@dataclass(frozen=True)
class PolicyCheck:
    """Outcome of validating one policy source; `policy` is set iff there is no error."""

    policy: Policy | None
    version: str
    diagnostics: tuple[Diagnostic, ...]

    @property
    def valid(self) -> bool:
        return self.policy is not None

    @property
    def errors(self) -> list[str]:
        return [d.render() for d in self.diagnostics if d.severity == "error"]

    @property
    def warnings(self) -> list[str]:
        return [d.render() for d in self.diagnostics if d.severity == "warning"]

    def as_dict(self) -> dict[str, Any]:
        """The `POST /routing/check` body."""
        return {
            "valid": self.valid,
            "errors": self.errors,
            "warnings": self.warnings,
            "diagnostics": [d.as_dict() for d in self.diagnostics],
            "version": self.version,
        }


def validate_policy(raw: bytes, registry: ModelRegistry) -> PolicyCheck:
    """Validate and compile policy bytes against a registry, collecting every problem."""
    version = policy_version(raw)
    doc = load_yaml_bytes(raw)
    check = Collector(list(doc.errors))
    if doc.errors and doc.data is None:
        return PolicyCheck(None, version, tuple(check.sorted()))
    data = MarkedDict() if doc.data is None else doc.data
    if not isinstance(data, MarkedDict):  # the loader builds every mapping as a MarkedDict
        check.error("root_not_mapping", "", (1, 1), "the top level must be a mapping")
        return PolicyCheck(None, version, tuple(check.sorted()))
    policy = _Loader(check, registry).policy(data, version)
    diagnostics = tuple(check.sorted())
    if check.has_errors() or policy is None:
        return PolicyCheck(None, version, diagnostics)
    warnings = tuple(d for d in diagnostics if d.severity == "warning")
    return PolicyCheck(replace(policy, warnings=warnings), version, diagnostics)


def read_policy_file(path: Path, registry: ModelRegistry) -> PolicyCheck:
    """Validate a file; an unreadable one is an invalid policy (`unreadable`), not a crash."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        message = f"cannot read {path}: {exc.strerror}"
        diagnostic = Diagnostic("error", "unreadable", "", None, None, message)
        return PolicyCheck(None, policy_version(b""), (diagnostic,))
    return validate_policy(raw, registry)


class _Loader:
    def __init__(self, check: Collector, registry: ModelRegistry) -> None:
        self.check = check
        self.registry = registry

    def policy(self, data: MarkedDict, version: str) -> Policy | None:
        check = self.check
        check.check_keys(data, "", _TOP_KEYS)
        if "schema_version" in data:
            where = position(data, "schema_version")
            n = check.integer(data["schema_version"], "schema_version", where)
            if n is not None and n != 1:
                check.error(
                    "unsupported_schema_version",
                    "schema_version",
                    where,
                    f"schema_version: unsupported version {n} (only 1 is accepted)",
                )
        global_default = None
        if data.get("global_default") is not None:
            global_default = self.model_ref(
                data["global_default"], "global_default", position(data, "global_default")
            )
        tiers = self.tiers(data, "")
        rules = self.rules(data, "")
        scopes = self.workspaces(data)
        pattern = self.pattern(data)
        if check.has_errors():
            return None
        self.shadowing(rules, scopes)
        return Policy(
            version=version,
            global_default=global_default,
            tiers=tiers,
            rules=rules,
            scopes=tuple(scopes),
            pattern=pattern,
        )

    # ---- model references ---------------------------------------------------------------

    def model_ref(
        self, value: Any, path: str, where: Position, *, serves_turns: bool = False
    ) -> str | None:
        """Canonical id of a reference; unconfigured targets only warn."""
        ref = self.check.string(value, path, where, nonempty=True)
        if ref is None:
            return None
        model_id = self.registry.resolve(ref)
        if model_id is None:
            known = [m.id for m in self.registry.models()]
            known += [a for m in self.registry.models() for a in m.aliases]
            self.check.error(
                "unknown_model",
                path,
                where,
                f"{path} references unknown model: {ref}{suggest(ref, known)}",
            )
            return None
        why = self.registry.why_not_configured(model_id)
        if why is not None:
            self.check.warning(
                "model_not_configured",
                path,
                where,
                f"{path} references {model_id}, which is not configured ({why}); "
                "turns will reject it",
            )
        entry = self.registry.get(model_id)
        if serves_turns and entry is not None and not entry.capabilities.supports_tools:
            self.check.warning(
                "model_without_tools",
                path,
                where,
                f"{path} references {model_id}, which does not support tools; "
                "it is rejected for every turn that offers tools",
            )
        return model_id

    def tiers(self, parent: MarkedDict, base: str) -> dict[str, str] | None:
        if parent.get("tiers") is None:
            return None
        path = join(base, "tiers") if base else "tiers"
        body = self.check.mapping(parent["tiers"], path, position(parent, "tiers"))
        if body is None or not body:
            return None
        self.check.check_keys(body, path, TIERS)
        present = [t for t in TIERS if t in body]
        if len(present) != len(TIERS):
            missing = ", ".join(t for t in TIERS if t not in body)
            self.check.error(
                "tiers_incomplete",
                path,
                position(parent, "tiers"),
                f"{path}: give all of fast, balanced and deep or none (missing: {missing})",
            )
        result = {t: self.model_ref(body[t], join(path, t), position(body, t)) for t in present}
        if len(present) != len(TIERS) or None in result.values():
            return None
        return result  # type: ignore[return-value]

    # ---- rules ----------------------------------------------------------------------------

    def rules(self, parent: MarkedDict, base: str) -> tuple[Rule, ...]:
        if parent.get("rules") is None:
            return ()
        path = join(base, "rules") if base else "rules"
        items = self.check.list_of(parent["rules"], path, position(parent, "rules"))
        if items is None:
            return ()
        rules: list[Rule] = []
        names: dict[str, int] = {}
        for index, item in enumerate(items):
            rule_path, where = join(path, index), position(items, index)
            body = self.check.mapping(item, rule_path, where)
            if body is None:
                continue
            rule = self.rule(body, rule_path, index)
            if rule is None:
                continue
            if rule.name in names:
                self.check.error(
                    "duplicate_rule_name",
                    join(rule_path, "name"),
                    position(body, "name"),
                    f"{join(rule_path, 'name')}: duplicate rule name '{rule.name}' "
                    f"(also {join(path, names[rule.name])})",
                )
                continue
            names[rule.name] = index
            rules.append(rule)
        return tuple(rules)

    def rule(self, body: MarkedDict, path: str, index: int) -> Rule | None:
        check = self.check
        check.check_keys(body, path, _RULE_KEYS, ("when", "use"))
        name: str | None = f"rule_{index}"
        if "name" in body:
            name = check.string(
                body["name"], join(path, "name"), position(body, "name"), nonempty=True
            )
        description = None
        if body.get("description") is not None:
            description = check.string(
                body["description"], join(path, "description"), position(body, "description")
            )
        when = None
        if "when" in body:
            when = compile_when(check, body["when"], join(path, "when"), position(body, "when"))
        use = None
        if "use" in body:
            use = self.model_ref(
                body["use"], join(path, "use"), position(body, "use"), serves_turns=True
            )
        if name is None or when is None or use is None:
            return None
        return Rule(name, description, when, use, body.line, path)

    # ---- workspaces -----------------------------------------------------------------------

    def workspaces(self, data: MarkedDict) -> list[Scope]:
        if data.get("workspaces") is None:
            return []
        section = self.check.mapping(data["workspaces"], "workspaces", position(data, "workspaces"))
        if section is None:
            return []
        scopes: list[Scope] = []
        seen: dict[str, str] = {}
        for key, value in section.items():
            path, where = join_key("workspaces", key), position(section, key)
            if not isinstance(key, str):
                self.check.wrong_type(path, where, "a path string key", key)
                continue
            expanded = os.path.expanduser(key)
            if not os.path.isabs(expanded):
                self.check.error(
                    "workspace_not_absolute",
                    path,
                    where,
                    f"{path}: workspace key must be an absolute path (after ~ expansion)",
                )
                continue
            resolved = str(Path(expanded).resolve(strict=False))
            if resolved in seen:
                self.check.error(
                    "duplicate_workspace",
                    path,
                    where,
                    f"{path}: resolves to {resolved}, like {join_key('workspaces', seen[resolved])}",
                )
                continue
            seen[resolved] = key
            if not Path(resolved).is_dir():
                self.check.warning(
                    "workspace_missing",
                    path,
                    where,
                    f"{path}: {resolved} is not an existing directory; the scope matches nothing "
                    "until it exists",
                )
            scope = self.scope(value, key, resolved, path, where)
            if scope is not None:
                scopes.append(scope)
        return scopes

    def scope(
        self, value: Any, key: str, resolved: str, path: str, where: Position
    ) -> Scope | None:
        body = self.check.mapping(value, path, where)
        if body is None:
            return None
        self.check.check_keys(body, path, _SCOPE_KEYS)
        default = None
        if body.get("default") is not None:
            default = self.model_ref(
                body["default"], join(path, "default"), position(body, "default"), serves_turns=True
            )
        tiers = self.tiers(body, path)
        rules = self.rules(body, path)
        return Scope(resolved, key, default, tiers, rules)

    # ---- pattern (reserved) ---------------------------------------------------------------

    def pattern(self, data: MarkedDict) -> PatternSettings:
        if "pattern" not in data:
            return PatternSettings()
        where = position(data, "pattern")
        self.check.warning(
            "pattern_reserved",
            "pattern",
            where,
            "pattern: pattern-based routing is reserved; these settings are validated and ignored",
        )
        if data["pattern"] is None:
            return PatternSettings()
        body = self.check.mapping(data["pattern"], "pattern", where)
        if body is None:
            return PatternSettings()
        self.check.check_keys(body, "pattern", _PATTERN_KEYS)
        values: dict[str, Any] = {}
        if "enabled" in body:
            values["enabled"] = self.check.boolean(
                body["enabled"], "pattern.enabled", position(body, "enabled")
            )
        for key in ("cost_weight", "min_confidence"):
            if key in body:
                values[key] = self.check.number(
                    body[key], f"pattern.{key}", position(body, key), minimum=0, maximum=1
                )
        if "min_sample_size" in body:
            values["min_sample_size"] = self.check.integer(
                body["min_sample_size"],
                "pattern.min_sample_size",
                position(body, "min_sample_size"),
                minimum=1,
            )
        return PatternSettings(**{k: v for k, v in values.items() if v is not None})

    # ---- warnings: shadowing -------------------------------------------------------------

    def shadowing(self, rules: tuple[Rule, ...], scopes: list[Scope]) -> None:
        """Report the shadowing cases (docs/configuration.md), per (earlier, later) pair in evaluation order."""
        self._shadow_pairs(rules, rules, None)
        for scope in scopes:
            self._shadow_pairs(scope.rules, scope.rules, None)
            self._shadow_pairs(scope.rules, rules, scope)

    def _shadow_pairs(
        self, earlier_rules: tuple[Rule, ...], later_rules: tuple[Rule, ...], scope: Scope | None
    ) -> None:
        same_list = earlier_rules is later_rules
        conjuncts = {id(r): r.when.conjuncts() for r in (*earlier_rules, *later_rules)}
        for li, later in enumerate(later_rules):
            candidates = earlier_rules[:li] if same_list else earlier_rules
            for earlier in candidates:
                e_set, l_set = conjuncts[id(earlier)], conjuncts[id(later)]
                if not all(any(implies(c_l, c_e) for c_l in l_set) for c_e in e_set):
                    continue
                where = f" in workspace {scope.path}" if scope else ""
                subject = f"{later.path} ('{later.name}')"
                other = f"{earlier.path} ('{earlier.name}')"
                if earlier.use == later.use:
                    self.check.warning(
                        "duplicate_rule",
                        later.path,
                        (later.line, None),
                        f"{subject} can never be chosen{where}: {other} matches whenever it does "
                        f"and uses the same model {later.use}",
                    )
                elif e_set != l_set:
                    self.check.warning(
                        "shadowed_rule",
                        later.path,
                        (later.line, None),
                        f"{subject} is shadowed by {other}{where}: only used when "
                        f"{earlier.use} is rejected; move it above '{earlier.name}' to give it "
                        "priority",
                    )


__all__ = [
    "BUILTIN_EMPTY",
    "EMPTY_POLICY_VERSION",
    "TIERS",
    "PatternSettings",
    "Policy",
    "PolicyCheck",
    "Rule",
    "Scope",
    "policy_version",
    "read_policy_file",
    "validate_policy",
]
