"""A reply's links in the terminal app: the address is shown after the text, since only some
terminals make a link clickable (OSC 8) and the others would hide where it goes."""

from __future__ import annotations

from rich.console import Console

from metis.commands.tui.widgets import LeftMarkdown


def rendered(markdown: str) -> str:
    console = Console(width=100, color_system=None, record=True)
    console.print(LeftMarkdown(markdown))
    return " ".join(console.export_text().split())


def test_a_link_shows_its_address_after_its_text() -> None:
    said = rendered("Read [the **setup** guide](https://example.com/setup) first.")
    assert said == "Read the setup guide (https://example.com/setup) first."


def test_an_address_that_is_its_own_text_is_not_said_twice() -> None:
    said = rendered("See <https://example.com/a> or <dev@example.com>, or [x](https://x.io).")
    assert said == "See https://example.com/a or dev@example.com, or x (https://x.io)."
