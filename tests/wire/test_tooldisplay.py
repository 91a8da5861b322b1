"""How a tool call and its confirmation read for a person (pure functions)."""

from __future__ import annotations

import pytest

from metis.wire.tooldisplay import already_settled, summary


@pytest.mark.parametrize(
    ("details", "said"),
    [
        ({"resolution": "allow", "scope": "once"}, "shell was already allowed once"),
        ({"resolution": "allow", "scope": "session"}, "shell was already allowed for this session"),
        ({"resolution": "deny", "scope": None}, "shell was already denied"),
        ({"resolution": "timeout", "scope": None}, "shell was already timed out"),
        ({"resolution": "withdrawn"}, "shell was already withdrawn: its turn ended"),
        ({"resolution": "later"}, "shell was already settled (later)"),
    ],
)
def test_an_answer_to_a_settled_confirmation_says_how_it_was_settled(
    details: dict[str, object], said: str
) -> None:
    assert already_settled({"tool_name": "shell"}, details) == said


def test_the_summary_is_the_most_telling_argument_cut_at_120_characters() -> None:
    assert summary("shell", {"command": "ls -la"}) == "ls -la"
    assert summary("write_file", {"path": "a.txt", "content": "x"}) == "a.txt"
    long = summary("shell", {"command": "x" * 300})
    assert len(long) == 120 and long.endswith("…")
    assert summary("noop", {}) == ""
    assert (
        summary("list_dir", {}) == "(the workspace root)"
        and summary("list_dir", {"path": "src"}) == "src"
    )
