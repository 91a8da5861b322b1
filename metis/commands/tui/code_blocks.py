"""The code blocks of a reply's Markdown, as `/copy code` puts them on the clipboard."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from markdown_it import MarkdownIt


@lru_cache(maxsize=1)
def _parser() -> MarkdownIt:
    from markdown_it import MarkdownIt  # the parser Textual's Markdown already loads

    return MarkdownIt("commonmark")


def code_blocks(markdown: str) -> list[str]:
    """Each fenced or indented code block's code, in order, as written (without the line end
    that closes it); blocks inside lists and quotes too."""
    return [
        token.content.removesuffix("\n")
        for token in _parser().parse(markdown)
        if token.type in ("fence", "code_block")
    ]
