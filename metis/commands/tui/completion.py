"""Tab completion of the prompt, and the hints listed under it while typing.

Commands, `/model`'s aliases, `/export`'s formats, `/copy code` and `@alias` overrides are all
completed the same way: Tab fills in what every option shares, the hints show what is left to
choose from; once they share nothing more, Tab puts each in the prompt in turn.
What can be completed depends only on the prompt's text and the configured aliases, so this is
kept apart from sending and from the commands themselves.
"""

from __future__ import annotations

from typing import Any, Protocol

from rich.text import Text
from textual.widgets import Static

from metis.commands.tui.slash_commands import COMMANDS
from metis.commands.tui.widgets import PromptInput

MAX_HINTS = 12  # completions listed under the prompt


class CompletionHost(Protocol):
    """What of the app completing uses: the prompt, the hints line and the model aliases."""

    aliases: list[str]
    models: dict[str, dict[str, Any]]

    @property
    def prompt(self) -> PromptInput: ...

    @property
    def hints(self) -> Static: ...


class PromptCompletion:
    """Tab (`complete`), the hints as the text changes (`text_changed`), and hiding them."""

    def __init__(self, host: CompletionHost) -> None:
        self.host = host
        self._cycle: list[str] = []  # the options Tab goes through, while one is in the prompt

    def completions(self, text: str) -> list[str]:
        """What Tab could complete the prompt's text to (whole replacement texts)."""
        aliases = self.host.aliases
        if text.startswith("/") and " " not in text:
            return [c for c in COMMANDS if c.startswith(text)]
        if text.startswith("/model "):
            arg = text.removeprefix("/model ")
            return [f"/model {a}" for a in [*aliases, "-"] if a.startswith(arg)]
        if text.startswith("/export "):
            arg = text.removeprefix("/export ")
            return [f"/export {f}" for f in ("md", "json") if f.startswith(arg) and arg != f]
        if text.startswith("/copy "):
            arg = text.removeprefix("/copy ")
            return ["/copy code"] if "code".startswith(arg) and arg != "code" else []
        head, _, word = text.rpartition(" ")
        if word.startswith("@"):
            prefix = f"{head} " if head else ""
            return [f"{prefix}@{a} " for a in aliases if a.startswith(word[1:])]
        return []

    def complete(self) -> None:
        """Tab: the one option, else what the options share, else the next option (Tab with
        nothing more to fill in did nothing: a choice had to be typed out)."""
        prompt = self.host.prompt
        cycling = prompt.text in self._cycle
        options = self._cycle if cycling else self.completions(prompt.text)
        if not options:
            return
        if len(options) == 1:
            prompt.set_text(options[0] if options[0].endswith(" ") else options[0] + " ")
            self.show_hints([])
            return
        common = options[0]
        for option in options[1:]:
            while not option.startswith(common):
                common = common[:-1]
        if not cycling and len(common) > len(prompt.text):
            prompt.set_text(common)
            return
        self._cycle = options
        after = options.index(prompt.text) + 1 if prompt.text in options else 0
        prompt.set_text(options[after % len(options)])

    def text_changed(self) -> None:
        """The hints for the prompt's text; while Tab goes through options, all of them, the
        one in the prompt marked."""
        text = self.host.prompt.text
        if text in self._cycle:
            self.show_hints(self._cycle, chosen=text)
            return
        self._cycle = []
        self.show_hints(
            self.completions(text) if text.startswith(("/", "@")) or " @" in text else []
        )

    def _meaning(self, option: str) -> str:
        """What a completion of an argument stands for: the model an alias names, what `-`
        does (`/model scripted  local:scripted`, `/model -  routing decides`)."""
        last = option.rstrip().rpartition(" ")[2]
        if option.startswith("/model "):
            alias = last
        elif last.startswith("@"):
            alias = last[1:]
        else:
            return ""
        if alias == "-":
            return "routing decides"
        named = (m for m, d in self.host.models.items() if alias in d.get("aliases", []))
        return next(named, "")

    def show_hints(self, options: list[str], chosen: str | None = None) -> None:
        """List `options` under the prompt (`chosen` marked); none hides the list."""
        hints = self.host.hints
        if not options:
            hints.remove_class("shown")
            return
        # one per line, every command (11); a long list of aliases ends with how many more.
        # Each line is cut, not wrapped, at the terminal's width (#hints' CSS): wrapped, the
        # list of commands pushed the prompt off a short terminal
        text = Text()
        for option in options[:MAX_HINTS]:
            usage, _, what = COMMANDS.get(option, option).partition("  ")
            what = what or self._meaning(option)
            marked = "reverse" if option == chosen else ""
            text.append(f"{usage.rstrip()}  ", style=f"bold {marked}")
            text.append(f"{what}\n", style=marked)
        if len(options) > MAX_HINTS:
            text.append(f"… {len(options) - MAX_HINTS} more\n")
        text.rstrip()
        hints.update(text)
        hints.add_class("shown")
