"""Seeded system messages extend the prompt, however the history they are found in grew."""

from __future__ import annotations

from metis.core.canonical.content import TextBlock
from metis.core.canonical.ids import new_ulid
from metis.core.canonical.messages import Message
from metis.core.turns.runner import with_seeded_instructions


def message(role: str, text: str) -> Message:
    return Message(
        id=new_ulid(),
        session_id="s",
        turn_id=None,
        role=role,  # type: ignore[arg-type]
        content=[TextBlock(text=text)] if text else [],
        created_at_us=1,
    )


def test_seeded_texts_follow_the_prompt_in_order_as_the_history_grows() -> None:
    history = [message("system", "be brief"), message("user", "hi"), message("system", "")]
    assert with_seeded_instructions("P", history) == "P\n\nbe brief"
    assert with_seeded_instructions("P", history) == "P\n\nbe brief"  # the same again
    longer = [*history, message("assistant", "hello"), message("system", "use metric units")]
    assert with_seeded_instructions("P", longer) == "P\n\nbe brief\n\nuse metric units"
    assert with_seeded_instructions("Q", longer[:2]) == "Q\n\nbe brief"  # a shorter one
    other = [history[0], message("system", "answer in French")]  # shares only a prefix
    assert with_seeded_instructions("P", other) == "P\n\nbe brief\n\nanswer in French"
    assert with_seeded_instructions("P", [message("user", "hi")]) == "P"
    assert with_seeded_instructions("P", []) == "P"
