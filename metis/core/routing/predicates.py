"""The closed predicate vocabulary of `when:` blocks, compiled once at load.

Compilation turns each `when` mapping into a `When`: a test closure over `Facts` (the turn's
facts, computed once per decision), the normalised YAML form shown by `GET /routing/policy`,
and the normalised conjuncts the shadowing analysis compares. Doing all parsing, regex and glob
compilation here means evaluation at turn time is total: it never raises and never re-parses.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from types import FunctionType
from typing import Any

from metis.core.config.checks import Collector, Position, join, position, prefix
from metis.core.routing.context import TurnContext

MAX_TEXT_CHARS = 65_536
MAX_NESTING = 8
_GLOB_MEMO_SIZE = 1024

_EXTENSION_RE = re.compile(r"\.?[A-Za-z0-9][A-Za-z0-9_+-]{0,15}")
_TIME_RE = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])")

INT_PREDICATES = (
    "message_length_gt",
    "message_length_lt",
    "estimated_input_tokens_gt",
    "estimated_input_tokens_lt",
    "turn_index_gt",
    "turn_index_lt",
)
BOOL_PREDICATES = ("has_images", "has_tool_calls_in_history", "tool_use_in_progress")
COMBINATORS = ("all_of", "any_of", "not")
PREDICATE_KEYS = (
    "message_matches",
    "message_contains_any",
    *INT_PREDICATES,
    *BOOL_PREDICATES,
    "mentions_file_extension",
    "workspace_path_glob",
    "session_cost_usd_gt",
    "time_of_day_between",
    *COMBINATORS,
)
SET_PREDICATES = ("message_contains_any", "mentions_file_extension", "workspace_path_glob")


class Facts:
    """Per-decision view of a `TurnContext`, with the derived values predicates share.

    The case-folded text and the local minute of day are computed on first use only: most
    policies never ask for them, and a decision must stay in the microsecond range.
    """

    __slots__ = (
        "_folded",
        "_minute",
        "cost",
        "has_history_tools",
        "has_images",
        "in_progress",
        "length",
        "now",
        "text",
        "tokens",
        "turn_index",
        "workspace",
    )

    def __init__(self, ctx: TurnContext) -> None:
        text = ctx.message_text
        # Length predicates measure the whole message; only the text the
        # matching predicates search is capped.
        self.length = len(text)
        self.text = text[:MAX_TEXT_CHARS] if self.length > MAX_TEXT_CHARS else text
        self.tokens = ctx.estimated_input_tokens
        self.has_images = ctx.image_count > 0
        self.workspace = ctx.workspace_path
        self.turn_index = ctx.turn_index
        self.has_history_tools = ctx.has_tool_calls_in_history
        self.in_progress = ctx.tool_use_in_progress
        self.cost = ctx.session_cost_usd
        self.now = ctx.now
        self._folded: str | None = None
        self._minute: int | None = None

    def fold(self) -> str:
        """The case-folded text, computed once (read it as `f._folded or f.fold()`)."""
        if self._folded is None:
            self._folded = self.text.casefold()
        return self._folded

    @property
    def minute(self) -> int:
        """Daemon-local minute of the day (a naive `now` is taken as local already)."""
        if self._minute is None:
            now = self.now.astimezone() if self.now.tzinfo is not None else self.now
            self._minute = now.hour * 60 + now.minute
        return self._minute


Test = Callable[[Facts], bool]
Conjunct = tuple[str, Hashable]


@dataclass(frozen=True, eq=False)
class Condition:
    """One `key: value` of a `when` mapping, compiled."""

    key: str
    shown: Any  # the normalised YAML value (globs expanded, extensions lower-case)
    norm: Hashable  # the value compared by shadowing analysis
    test: Test
    inner: tuple[When, ...] = ()  # operands of all_of / any_of / not
    # `test` as a Python expression over `compile_chain`'s locals with `{k}` for `constant`;
    # None where a closure call is as cheap (loops, memos) and for combinators.
    inline: str | None = None
    constant: Any = None


@dataclass(frozen=True, eq=False)
class When:
    """A compiled `when` mapping: its keys ANDed, in source order."""

    conditions: tuple[Condition, ...]
    test: Test

    def to_yaml(self) -> dict[str, Any]:
        return {c.key: c.shown for c in self.conditions}

    def conjuncts(self) -> frozenset[Conjunct]:
        """Top-level conditions with `all_of` items inlined recursively."""
        result: set[Conjunct] = set()
        for condition in self.conditions:
            if condition.key == "all_of":
                for item in condition.inner:
                    result |= item.conjuncts()
            else:
                result.add((condition.key, condition.norm))
        return frozenset(result)


def implies(later: Conjunct, earlier: Conjunct) -> bool:
    """Whether a later rule's conjunct guarantees an earlier rule's (the shadowing cases only)."""
    key, value = later
    if key != earlier[0]:
        return False
    if value == earlier[1]:
        return True
    if key.endswith("_gt"):
        return bool(value >= earlier[1])  # type: ignore[operator]
    if key.endswith("_lt"):
        return bool(value <= earlier[1])  # type: ignore[operator]
    if key in SET_PREDICATES:
        return bool(earlier[1] >= value)  # type: ignore[operator]
    return False


def _all(tests: Sequence[Test]) -> Test:
    if len(tests) == 1:
        return tests[0]
    if len(tests) == 2:
        a, b = tests
        return lambda f: a(f) and b(f)
    items = tuple(tests)

    def every(f: Facts) -> bool:
        # Explicit loops: a generator per evaluation costs more than the tests themselves.
        for t in items:  # noqa: SIM110
            if not t(f):
                return False
        return True

    return every


def _any(tests: Sequence[Test]) -> Test:
    items = tuple(tests)

    def some(f: Facts) -> bool:
        for t in items:  # noqa: SIM110
            if t(f):
                return True
        return False

    return some


# ---------------------------------------------------------------------------------------------
# Globs and times
# ---------------------------------------------------------------------------------------------


def glob_to_regex(pattern: str) -> str:
    """Translate a whole-path glob: `**` crosses `/`, `*` and `?` do not, `[...]` classes.

    `/**/` also matches a single `/` and a trailing `/**` matches the directory itself, so
    `~/scratch/**` covers `~/scratch` and everything below it. Raises ValueError on braces or
    an unterminated class.
    """
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if pattern.startswith("/**", i) and (i + 3 == n or pattern[i + 3] == "/"):
            out.append("(?:/.*)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif ch == "*":
            out.append("[^/]*")
            i += 1
        elif ch == "?":
            out.append("[^/]")
            i += 1
        elif ch == "[":
            j = i + 1
            negate = j < n and pattern[j] == "!"
            j += negate
            if j < n and pattern[j] == "]":
                j += 1  # a leading ] is a literal member
            end = pattern.find("]", j)
            if end == -1:
                raise ValueError("unterminated character class '['")
            body = pattern[i + 1 + negate : end].replace("\\", "\\\\").replace("^", "\\^")
            out.append(f"[{'^' if negate else ''}{body}]")
            i = end + 1
        elif ch in "{}":
            raise ValueError("brace expansion is not supported; use a list of patterns")
        else:
            out.append(re.escape(ch))
            i += 1
    return "".join(out)


def _nested_repeat(regex: str) -> bool:
    """Whether a repeat (`+`, `*`, `{2,}`) holds another unbounded one: the shape whose
    backtracking is exponential (`(a+)+$` against `aaaa…b`). Python's `re` has no time limit
    and runs on the daemon's event loop, so such a rule could stall every session; it is only
    flagged (a warning), as some such patterns are harmless."""
    import importlib  # the parser's tree, which has no stubs: a configuration check needs it

    c = importlib.import_module("re._constants")
    parser = importlib.import_module("re._parser")

    def repeats(items: Any, inside: bool) -> bool:
        for op, arg in items:
            if op in (c.MAX_REPEAT, c.MIN_REPEAT):
                _, high, body = arg
                if (inside and high == c.MAXREPEAT) or repeats(body, inside or high > 1):
                    return True
            elif op is c.SUBPATTERN:
                if repeats(arg[3], inside):
                    return True
            elif op is c.BRANCH and any(repeats(branch, inside) for branch in arg[1]):
                return True
        return False

    try:
        return repeats(parser.parse(regex), False)
    except Exception:  # compiled already; a parser of another Python version need not match
        return False


def _parse_time(text: str) -> int | None:
    match = _TIME_RE.fullmatch(text)
    return int(match.group(1)) * 60 + int(match.group(2)) if match else None


# ---------------------------------------------------------------------------------------------
# Compilation
# ---------------------------------------------------------------------------------------------


class _Compiler:
    """Compiles `when` mappings, reporting every problem into one collector."""

    def __init__(self, check: Collector) -> None:
        self.check = check

    def when(self, value: Any, path: str, where: Position, depth: int = 0) -> When | None:
        body = self.check.mapping(value, path, where)
        if body is None:
            return None
        before = len(self.check.diagnostics)
        self.check.check_keys(
            body,
            path,
            PREDICATE_KEYS,
            noun="predicate",
            code="unknown_predicate",
            list_allowed=False,
        )
        conditions: list[Condition] = []
        for key, raw in body.items():
            if key not in PREDICATE_KEYS:
                continue
            condition = self.condition(key, raw, join(path, key), position(body, key), depth)
            if condition is not None:
                conditions.append(condition)
        if len(self.check.diagnostics) > before:
            return None
        if not conditions:
            return When((), lambda f: True)
        return When(tuple(conditions), _all([c.test for c in conditions]))

    def condition(
        self, key: str, raw: Any, path: str, where: Position, depth: int
    ) -> Condition | None:
        check = self.check
        if key in COMBINATORS:
            return self.combinator(key, raw, path, where, depth)
        if key in INT_PREDICATES:
            n = check.integer(raw, path, where, minimum=0)
            return None if n is None else _int_condition(key, n)
        if key in BOOL_PREDICATES:
            flag = check.boolean(raw, path, where)
            return None if flag is None else _bool_condition(key, flag)
        if key == "message_matches":
            return self.message_matches(raw, path, where)
        if key == "message_contains_any":
            items = self.strings(raw, path, where)
            if items is None:
                return None
            folded = tuple(s.casefold() for s in items)

            def test(f: Facts) -> bool:
                text = f._folded or f.fold()
                for needle in folded:  # noqa: SIM110 - a loop beats any() + generator here
                    if needle in text:
                        return True
                return False

            return Condition(key, list(items), frozenset(folded), test)
        if key == "mentions_file_extension":
            return self.extensions(raw, path, where)
        if key == "workspace_path_glob":
            return self.globs(raw, path, where)
        if key == "session_cost_usd_gt":
            amount = check.decimal(raw, path, where)
            if amount is None:
                return None
            return Condition(
                key,
                format(amount, "f"),
                amount,
                lambda f: f.cost > amount,
                inline="cost > {k}",
                constant=amount,
            )
        return self.time_between(raw, path, where)

    def combinator(
        self, key: str, raw: Any, path: str, where: Position, depth: int
    ) -> Condition | None:
        check = self.check
        if depth + 1 > MAX_NESTING:
            check.error(
                "nesting_too_deep",
                path,
                where,
                f"{path}: all_of/any_of/not nested deeper than {MAX_NESTING} levels",
            )
            return None
        if key == "not":
            if isinstance(raw, dict) and not raw:
                check.error("empty_list", path, where, f"{path}: must not be empty")
                return None
            inner = self.when(raw, path, where, depth + 1)
            if inner is None:
                return None
            inner_test = inner.test
            return Condition(
                key, inner.to_yaml(), inner.conjuncts(), lambda f: not inner_test(f), (inner,)
            )
        items = check.list_of(raw, path, where)
        if items is None:
            return None
        if not items:
            check.error("empty_list", path, where, f"{path}: must not be empty")
            return None
        compiled: list[When] = []
        for index, item in enumerate(items):
            item_path, item_where = join(path, index), position(items, index)
            if isinstance(item, dict) and not item:
                check.error("empty_list", item_path, item_where, f"{item_path}: must not be empty")
                continue
            when = self.when(item, item_path, item_where, depth + 1)
            if when is not None:
                compiled.append(when)
        if len(compiled) != len(items):
            return None
        shown = [w.to_yaml() for w in compiled]
        tests = [w.test for w in compiled]
        if key == "all_of":
            return Condition(key, shown, None, _all(tests), tuple(compiled))
        norm = frozenset(w.conjuncts() for w in compiled)
        return Condition(key, shown, norm, _any(tests), tuple(compiled))

    def message_matches(self, raw: Any, path: str, where: Position) -> Condition | None:
        text = self.check.string(raw, path, where)
        if text is None:
            return None
        try:
            pattern = re.compile(text)
        except re.error as exc:
            self.check.error("invalid_regex", path, where, f"{path}: invalid regex: {exc}")
            return None
        if _nested_repeat(text):
            self.check.warning(
                "regex_backtracking",
                path,
                where,
                f"{path}: a repeated group holds an unbounded repeat, as in '(a+)+': on some "
                "messages matching it takes exponential time, during which the daemon answers "
                "nothing; write it without the inner repeat",
            )
        search = pattern.search
        return Condition(
            "message_matches",
            text,
            text,
            lambda f: search(f.text) is not None,
            inline="{k}(text) is not None",
            constant=search,
        )

    def strings(self, raw: Any, path: str, where: Position) -> list[str] | None:
        """A non-empty list of non-empty strings."""
        items = self.check.list_of(raw, path, where)
        if items is None:
            return None
        if not items:
            self.check.error("empty_list", path, where, f"{path}: must not be empty")
            return None
        result = [
            self.check.string(item, join(path, i), position(items, i), nonempty=True)
            for i, item in enumerate(items)
        ]
        return None if any(r is None for r in result) else result  # type: ignore[return-value]

    def extensions(self, raw: Any, path: str, where: Position) -> Condition | None:
        items = self.strings(raw, path, where)
        if items is None:
            return None
        normalised: list[str] = []
        for index, item in enumerate(items):
            if not _EXTENSION_RE.fullmatch(item):
                item_path = join(path, index)
                self.check.error(
                    "out_of_range",
                    item_path,
                    position(raw, index),
                    f"{item_path}: '{item}' is not a file extension "
                    "(letters, digits, _ + -; at most 16 characters)",
                )
                return None
            ext = item.lstrip(".").lower()
            if ext not in normalised:
                normalised.append(ext)
        # Equivalent to the documented token regex `(?<![\w.])[\w./~-]*\.(ext…)(?!\w|\.\w)`:
        # a maximal run of path characters before the dot always satisfies the look-behind, so
        # only the dot, the extension and the look-ahead decide; this form stays linear.
        alternation = "|".join(re.escape(e) for e in normalised)
        search = re.compile(rf"\.(?:{alternation})(?!\w|\.\w)", re.IGNORECASE).search
        return Condition(
            "mentions_file_extension",
            normalised,
            frozenset(normalised),
            lambda f: "." in f.text and search(f.text) is not None,
            inline='"." in text and {k}(text) is not None',
            constant=search,
        )

    def globs(self, raw: Any, path: str, where: Position) -> Condition | None:
        if isinstance(raw, str):
            items: list[str] | None = [raw]
            single = True
        else:
            items = self.strings(raw, path, where)
            single = False
        if items is None:
            return None
        expanded: list[str] = []
        regexes: list[str] = []
        for index, item in enumerate(items):
            item_path = path if single else join(path, index)
            item_where = where if single else position(raw, index)
            pattern = os.path.expanduser(item)
            problem = None
            if not pattern.startswith("/"):
                problem = "must be an absolute path after ~ expansion"
            else:
                try:
                    regexes.append(glob_to_regex(pattern))
                except ValueError as exc:
                    problem = str(exc)
            if problem:
                self.check.error(
                    "invalid_glob",
                    item_path,
                    item_where,
                    f"{item_path}: invalid glob '{item}': {problem}",
                )
                return None
            expanded.append(pattern)
        fullmatch = re.compile("|".join(f"(?:{r})" for r in regexes)).fullmatch
        seen: dict[str, bool] = {}  # a daemon serves few workspaces; remember their answers

        def test(f: Facts) -> bool:
            hit = seen.get(f.workspace)
            if hit is None:
                if len(seen) >= _GLOB_MEMO_SIZE:
                    seen.clear()
                hit = seen[f.workspace] = fullmatch(f.workspace) is not None
            return hit

        return Condition(
            "workspace_path_glob", expanded[0] if single else expanded, frozenset(expanded), test
        )

    def time_between(self, raw: Any, path: str, where: Position) -> Condition | None:
        items = self.check.list_of(raw, path, where)
        if items is None:
            return None
        bounds = [_parse_time(t) if isinstance(t, str) else None for t in items]
        if len(items) != 2 or None in bounds or bounds[0] == bounds[1]:
            self.check.error(
                "invalid_time",
                path,
                where,
                f'{prefix(path)}expected ["HH:MM", "HH:MM"] between 00:00 and 23:59 '
                "with different start and end",
            )
            return None
        start, end = bounds[0], bounds[1]
        assert start is not None and end is not None
        shown = [f"{start // 60:02d}:{start % 60:02d}", f"{end // 60:02d}:{end % 60:02d}"]
        if start < end:
            test: Test = lambda f: start <= f.minute < end  # noqa: E731
        else:
            test = lambda f: f.minute >= start or f.minute < end  # noqa: E731
        return Condition("time_of_day_between", shown, (start, end), test)


def _int_condition(key: str, n: int) -> Condition:
    tests: dict[str, tuple[Test, str]] = {
        "message_length_gt": (lambda f: f.length > n, "length > {k}"),
        "message_length_lt": (lambda f: f.length < n, "length < {k}"),
        "estimated_input_tokens_gt": (lambda f: f.tokens > n, "tokens > {k}"),
        "estimated_input_tokens_lt": (lambda f: f.tokens < n, "tokens < {k}"),
        "turn_index_gt": (lambda f: f.turn_index > n, "turn_index > {k}"),
        "turn_index_lt": (lambda f: f.turn_index < n, "turn_index < {k}"),
    }
    test, inline = tests[key]
    return Condition(key, n, n, test, inline=inline, constant=n)


def _bool_condition(key: str, flag: bool) -> Condition:
    tests: dict[str, tuple[Test, str]] = {
        "has_images": (lambda f: f.has_images is flag, "has_images is {k}"),
        "has_tool_calls_in_history": (
            lambda f: f.has_history_tools is flag,
            "has_history_tools is {k}",
        ),
        "tool_use_in_progress": (lambda f: f.in_progress is flag, "in_progress is {k}"),
    }
    test, inline = tests[key]
    return Condition(key, flag, flag, test, inline=inline, constant=flag)


def compile_when(check: Collector, value: Any, path: str, where: Position) -> When | None:
    """Compile one `when` mapping; problems go to `check` and the result is then None."""
    return _Compiler(check).when(value, path, where)


Chain = Callable[[Facts], Iterator[int]]

# The `Facts` fields a chain reads into locals once; `Condition.inline` templates use these names.
_CHAIN_LOCALS = (
    "text",
    "length",
    "tokens",
    "turn_index",
    "has_images",
    "has_history_tools",
    "in_progress",
    "cost",
)


def compile_chain(whens: Sequence[When]) -> Chain:
    """One generator function yielding, in order, the indexes of the `whens` a turn matches.

    A policy's rules are tested one after another on every turn. As one closure call per
    condition (and more per combinator), a 200-rule policy spent ~125 µs per decision here,
    mostly in call overhead, over the 50 µs budget. Here every condition with an inline form
    and every combinator becomes one expression of a single function, evaluated lazily and in
    the short-circuit order of `When.test`; the rest (substring lists, globs, times) stay
    closure calls. Only trusted text enters the source — the fixed templates of this module,
    local names and parameter names; each value from the policy is bound as a parameter
    default (`k0`, `k1`, …), never formatted into code.
    """
    constants: list[Any] = []

    def ref(value: Any) -> str:
        constants.append(value)
        return f"k{len(constants) - 1}"

    def all_of(when: When) -> str:
        return " and ".join(map(condition, when.conditions)) or "True"

    def condition(c: Condition) -> str:
        if c.inline is not None:
            return f"({c.inline.format(k=ref(c.constant))})"
        if c.key == "all_of":
            return f"({' and '.join(f'({all_of(w)})' for w in c.inner)})"
        if c.key == "any_of":
            return f"({' or '.join(f'({all_of(w)})' for w in c.inner)})"
        if c.key == "not":
            return f"(not ({all_of(c.inner[0])}))"
        return f"{ref(c.test)}(f)"

    body = [f"    {name} = f.{name}" for name in _CHAIN_LOCALS]
    for index, when in enumerate(whens):
        body += [f"    if {all_of(when)}:", f"        yield {index}"]
    if not whens:
        body.append("    yield from ()")
    params = "".join(f", k{i}=None" for i in range(len(constants)))
    namespace: dict[str, Any] = {}
    source = "\n".join([f"def chain(f{params}):", *body])
    exec(compile(source, "<routing rules>", "exec"), namespace)
    chain: FunctionType = namespace["chain"]
    chain.__defaults__ = tuple(constants)
    return chain


__all__ = [
    "MAX_NESTING",
    "MAX_TEXT_CHARS",
    "PREDICATE_KEYS",
    "Chain",
    "Condition",
    "Facts",
    "When",
    "compile_chain",
    "compile_when",
    "glob_to_regex",
    "implies",
]
