"""The running turn's line fits the terminal: what matters least goes first."""

from __future__ import annotations

from metis.commands.tui.turn import spinner_line

STATUS = "working 3.0 s · local:scripted"


def test_a_wide_terminal_shows_the_whole_line_with_the_cancel_hint() -> None:
    line = spinner_line("⠋", STATUS, True, 120).plain
    assert line == f"⠋ {STATUS} · waiting for your answer (Ctrl-O)   Esc / Ctrl-C cancels"
    assert spinner_line("⠋", STATUS, False, 0).plain.endswith("Esc / Ctrl-C cancels")


def test_at_80_columns_the_cancel_hint_goes_before_the_question_is_shortened() -> None:
    line = spinner_line("⠋", STATUS, True, 78).plain
    assert line == f"⠋ {STATUS} · waiting for your answer (Ctrl-O)"


def test_narrower_still_the_question_reads_short_and_nothing_else_is_cut() -> None:
    assert spinner_line("⠋", STATUS, True, 60).plain == f"⠋ {STATUS} · answer with Ctrl-O"
    assert spinner_line("⠋", STATUS, False, 40).plain == f"⠋ {STATUS}"
    # too narrow for even that: the short form, for the terminal to crop
    assert spinner_line("⠋", STATUS, True, 20).plain == f"⠋ {STATUS} · answer with Ctrl-O"
