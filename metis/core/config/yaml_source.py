"""Safe YAML loading that keeps positions, for diagnostics naming file, line and key.

`config.yaml`, `models.yaml` and `routing.yaml` are all read through `load_yaml_bytes`, so every
configuration error in metis has the same shape and the same rules: read as bytes with a size
limit, UTF-8 (a leading BOM tolerated), duplicate keys are errors (never last-wins), and every
mapping and sequence remembers the 1-based line and column of itself and of each key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

MAX_YAML_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Diagnostic:
    """One configuration problem: severity, a code from the closed vocabulary, the dotted key path
    and its position; every config check reports in this shape."""

    severity: str  # "error" | "warning"
    code: str
    path: str
    line: int | None
    column: int | None
    message: str

    def render(self) -> str:
        """`<message> (line L)`; file-level problems without a position omit the suffix."""
        return self.message if self.line is None else f"{self.message} (line {self.line})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "severity": self.severity,
            "code": self.code,
            "path": self.path,
            "line": self.line,
            "column": self.column,
            "message": self.message,
        }


class MarkedDict(dict[Any, Any]):
    """A mapping that knows where it and each of its keys stand in the source."""

    line: int | None = None
    column: int | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.key_marks: dict[Any, tuple[int, int]] = {}

    def key_line(self, key: Any) -> int | None:
        """The line of `key`, or of the mapping itself when the key was not in the source (a
        default)."""
        mark = self.key_marks.get(key)
        return mark[0] if mark else self.line


class MarkedList(list[Any]):
    """A sequence that knows where it and each of its items stand in the source."""

    line: int | None = None
    column: int | None = None

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.item_marks: list[tuple[int, int]] = []

    def item_line(self, index: int) -> int | None:
        """The line of item `index`, or of the list itself when there is no such item."""
        if 0 <= index < len(self.item_marks):
            return self.item_marks[index][0]
        return self.line


@dataclass
class YamlDocument:
    """What loading a YAML file gave: the data (None when unusable) and the problems found on the
    way."""

    data: Any
    errors: list[Diagnostic] = field(default_factory=list)


# libyaml's parser is about ten times faster than PyYAML's own (every daemon start reads
# models.yaml and routing.yaml), but its binding composes nested collections by C recursion that
# no recursion limit guards. Every nesting level of a flow collection costs one bracket and a
# block level costs indentation (a 1 MiB file cannot nest blocks deeper than ~1,400 levels), so a
# text with few brackets is safe for it; anything else goes through the pure-Python parser, whose
# RecursionError becomes a diagnostic.
_C_PARSER_MAX_BRACKETS = 256


def _parser_for(text: str) -> type[yaml.SafeLoader]:
    fast: type[yaml.SafeLoader] | None = getattr(yaml, "CSafeLoader", None)
    if fast is not None and text.count("[") + text.count("{") <= _C_PARSER_MAX_BRACKETS:
        return fast
    return yaml.SafeLoader


def _marked_loader(
    duplicates: list[tuple[MarkedDict, Any, int, int]], base: type[yaml.SafeLoader]
) -> type[yaml.SafeLoader]:
    class Loader(base):  # type: ignore[valid-type,misc]
        pass

    def construct_mapping(loader: Loader, node: yaml.MappingNode, deep: bool = False) -> Any:
        loader.flatten_mapping(node)
        result = MarkedDict()
        result.line, result.column = node.start_mark.line + 1, node.start_mark.column + 1
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                key = str(key)
            mark = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            if key in result:
                duplicates.append((result, key, *mark))
                continue
            result[key] = loader.construct_object(value_node, deep=True)
            result.key_marks[key] = mark
        return result

    def construct_sequence(loader: Loader, node: yaml.SequenceNode, deep: bool = False) -> Any:
        result = MarkedList(loader.construct_object(child, deep=True) for child in node.value)
        result.line, result.column = node.start_mark.line + 1, node.start_mark.column + 1
        result.item_marks = [(c.start_mark.line + 1, c.start_mark.column + 1) for c in node.value]
        return result

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, construct_sequence)
    return Loader


def load_yaml_bytes(raw: bytes, *, max_bytes: int = MAX_YAML_BYTES) -> YamlDocument:
    """Parse YAML source; problems come back as diagnostics, never as exceptions."""
    if len(raw) > max_bytes:
        return YamlDocument(
            None,
            [Diagnostic("error", "too_large", "", None, None, f"file exceeds {max_bytes} bytes")],
        )
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return YamlDocument(
            None,
            [Diagnostic("error", "not_utf8", "", None, None, f"file is not UTF-8 ({exc.reason})")],
        )
    duplicates: list[tuple[MarkedDict, Any, int, int]] = []
    try:
        data = yaml.load(text, Loader=_marked_loader(duplicates, _parser_for(text)))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = mark.line + 1 if mark else None
        column = mark.column + 1 if mark else None
        problem = exc.problem or "invalid YAML"
        return YamlDocument(
            None, [Diagnostic("error", "yaml_syntax", "", line, column, f"YAML syntax: {problem}")]
        )
    except RecursionError:  # PyYAML composes nested collections recursively
        return YamlDocument(
            None,
            [Diagnostic("error", "yaml_syntax", "", None, None, "YAML syntax: nested too deeply")],
        )
    except yaml.YAMLError as exc:
        return YamlDocument(None, [Diagnostic("error", "yaml_syntax", "", None, None, str(exc))])
    return YamlDocument(data, _duplicate_key_errors(data, duplicates))


def _duplicate_key_errors(
    data: Any, duplicates: list[tuple[MarkedDict, Any, int, int]]
) -> list[Diagnostic]:
    """One `duplicate_key` diagnostic per repeated key, in the shared diagnostic form.

    The loader cannot know where a mapping stands while building it, so the dotted path of
    each mapping holding a duplicate is found afterwards by walking the loaded document.
    """
    if not duplicates:
        return []
    from metis.core.config.checks import join, join_key, quoted_key  # it imports this module

    paths: dict[int, str] = {}
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        node, path = stack.pop()
        if not isinstance(node, dict | list) or id(node) in paths:
            continue  # an alias repeats a node: its first place names it
        paths[id(node)] = path
        if isinstance(node, dict):
            children = [(value, join_key(path, key)) for key, value in node.items()]
        else:
            children = [(value, join(path, index)) for index, value in enumerate(node)]
        stack.extend(reversed(children))
    errors = []
    for container, key, line, column in duplicates:
        path = join_key(paths.get(id(container), ""), key)
        message = f"{path}: duplicate key {quoted_key(key)}"
        errors.append(Diagnostic("error", "duplicate_key", path, line, column, message))
    return errors


def read_yaml_file(path: Path, *, max_bytes: int = MAX_YAML_BYTES) -> YamlDocument:
    """Load a YAML file with positions; an unreadable file becomes a diagnostic, never an exception."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return YamlDocument(
            None,
            [
                Diagnostic(
                    "error", "unreadable", "", None, None, f"cannot read {path}: {exc.strerror}"
                )
            ],
        )
    return load_yaml_bytes(raw, max_bytes=max_bytes)


def suggest(key: str, allowed: list[str] | tuple[str, ...]) -> str:
    """`; did you mean 'x'?` when a close allowed key exists, else "" (difflib is imported
    here: only a configuration error needs it)."""
    import difflib

    match = difflib.get_close_matches(key, list(allowed), n=1, cutoff=0.75)
    return f"; did you mean '{match[0]}'?" if match else ""


THE_CONTAINER: Any = object()
"""The key of no entry: where a mapping or sequence itself stands (`line_of`, `position`). Not
None, which is a key as well: YAML's null, written `~` or left empty."""


def line_of(container: Any, key: Any = THE_CONTAINER) -> int | None:
    """Best-known line of a key (for a MarkedDict) or item (for a MarkedList)."""
    if isinstance(container, MarkedDict):
        return container.key_line(key) if key is not THE_CONTAINER else container.line
    if isinstance(container, MarkedList):
        return container.item_line(key) if isinstance(key, int) else container.line
    return None
