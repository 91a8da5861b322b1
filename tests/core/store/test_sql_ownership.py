"""The store owns all SQL: no module outside `metis/core/store/` and the store modules of
registered store extensions (`metis/aap/store.py`) holds an SQL statement or runs one.

Every string literal of every module (f-string parts included) is matched against the shapes
of SQL statements, and every `execute`/`executemany`/`executescript`/`fetchone`/`fetchall`
call whose first argument is a string is flagged, whatever the string says.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "metis"
# The core store, and the store modules of registered store extensions (each brings its own
# tables, migration track and repository): AAP's.
OWNERS = ("core/store/", "aap/store.py")

SQL = re.compile(
    r"\bSELECT\b[\s\S]+?\bFROM\b"
    r"|\bINSERT\s+(OR\s+\w+\s+)?INTO\b"
    r"|\bUPDATE\s+\w+\s+SET\b"
    r"|\bDELETE\s+FROM\b"
    r"|\b(CREATE|DROP|ALTER)\s+(TABLE|INDEX|UNIQUE\s+INDEX|VIEW|TRIGGER)\b"
    r"|\bPRAGMA\s+\w+"
    r"|\bVACUUM\b"
    r"|\bBEGIN\s+(IMMEDIATE|EXCLUSIVE|DEFERRED|TRANSACTION)\b"
)
SQL_CALLS = {"execute", "executemany", "executescript", "fetchone", "fetchall"}


def _strings(node: ast.AST) -> list[str]:
    """The literal text of a string constant, or of an f-string with `x` for each field."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return ["".join(str(v.value) if isinstance(v, ast.Constant) else "x" for v in node.values)]
    return []


def offences(source: str) -> list[str]:
    tree = ast.parse(source)
    docstrings = {
        id(body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        for body in [node.body]
        if body and isinstance(body[0], ast.Expr)
    }
    found: list[str] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in SQL_CALLS
            and node.args
            and _strings(node.args[0])
        ):
            found.append(f"line {node.lineno}: {node.func.attr}() of a string")
        if id(node) in docstrings:
            continue
        for text in _strings(node):
            match = SQL.search(text)
            if match:
                found.append(f"line {getattr(node, 'lineno', '?')}: {match.group(0)[:40]!r}")
    return found


def test_no_sql_outside_the_store() -> None:
    report = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(OWNERS):
            continue
        for offence in offences(path.read_text()):
            report.append(f"metis/{relative} {offence}")
    assert not report, "SQL outside the store and its extensions' store modules:\n" + "\n".join(
        report
    )


def test_the_check_recognises_statements_and_calls() -> None:
    assert offences('rows = db.fetchall("SELECT id FROM sessions WHERE x=?", (1,))')
    assert offences('sql = f"UPDATE {table} SET a=? WHERE id=?"')
    assert offences("conn.execute(query)") == []
    assert offences('conn.execute("anything")')
    assert offences('q = "INSERT INTO events VALUES (?)"')
    assert offences('q = "CREATE TABLE t (a)"')
    assert offences('q = "DELETE FROM sessions"')
    assert offences('methods = frozenset({"POST", "DELETE", "PUT"})') == []
    assert offences('text = "select a model from the list"') == []
    assert offences('def f():\n    """Rows: `UPDATE tool_calls SET status`."""\n') == []


def test_the_owners_do_hold_the_sql() -> None:
    """The check is not vacuous: the store modules it skips are where the statements are."""
    store = PACKAGE / "core" / "store" / "sessions.py"
    assert offences(store.read_text())
    assert offences((PACKAGE / "aap" / "store.py").read_text())
