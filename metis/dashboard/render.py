"""Markdown → safe HTML: markdown-it-py renders, Pygments highlights, nh3 sanitizes.

Model output is untrusted (a prompt injection can make it write anything), so raw HTML in the
source is escaped by markdown-it (`html: False`) and the result goes through an nh3 allow-list
anyway: no script, no event handler attributes, no style, only http(s)/mailto links.

The three libraries are imported on first use, not with the daemon: together they cost ~6 MiB
and ~50 ms at every start, for a dashboard that may never be opened.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from markdown_it import MarkdownIt
    from pygments.formatters import HtmlFormatter

_TAGS = {
    "a", "b", "blockquote", "br", "code", "del", "div", "em", "h1", "h2", "h3", "h4", "h5",
    "h6", "hr", "i", "li", "ol", "p", "pre", "s", "span", "strong", "table", "tbody", "td",
    "th", "thead", "tr", "ul",
}  # fmt: skip
_ATTRIBUTES = {
    "a": {"href", "title"},
    "code": {"class"},
    "div": {"class"},
    "pre": {"class"},
    "span": {"class"},
    "td": {"align"},
    "th": {"align"},
    "ol": {"start"},
}
_SCHEMES = {"http", "https", "mailto"}


@lru_cache(maxsize=1)
def _formatter() -> HtmlFormatter[str]:
    from pygments.formatters import HtmlFormatter

    return HtmlFormatter(nowrap=True, classprefix="hl-")


def _highlight(code: str, lang: str, _attrs: Any) -> str:
    """Pygments spans for a fenced block with a known language; "" lets markdown-it escape."""
    from pygments import highlight
    from pygments.lexers import get_lexer_by_name
    from pygments.util import ClassNotFound

    if not lang:
        return ""
    try:
        lexer = get_lexer_by_name(lang.split()[0])
    except ClassNotFound:
        return ""
    html: str = highlight(code, lexer, _formatter())
    return html


_ALIGNS = {"text-align:left": "left", "text-align:center": "center", "text-align:right": "right"}


def _align_cells(state: Any) -> None:
    """A table column's alignment (`|--:|`) as the cells' `align` attribute: markdown-it writes it
    as a `style`, which nh3 strips (and the page's Content-Security-Policy would ignore)."""
    for token in state.tokens:
        if token.type in ("th_open", "td_open") and "style" in token.attrs:
            align = _ALIGNS.get(str(token.attrs.pop("style")))
            if align:
                token.attrs["align"] = align


def _image_as_link(self: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
    """An image as a link naming it (`image: a diagram`): the page loads no picture a model
    names (its address could carry what it read out to any server), and the sanitizer drops
    `<img>`, which left nothing where the image was, not even its description."""
    from markdown_it.common.utils import escapeHtml

    token = tokens[idx]
    alt = self.renderInlineAsText(token.children or [], options, env)
    src = str(token.attrGet("src") or "")
    return f'<a href="{escapeHtml(src)}">image: {escapeHtml(alt or src)}</a>'


@lru_cache(maxsize=1)
def _parser() -> MarkdownIt:
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "highlight": _highlight})
    md.enable(["table", "strikethrough"])
    md.core.ruler.push("align_cells", _align_cells)
    md.add_render_rule("image", _image_as_link)
    return md


def render_markdown(text: str) -> str:
    """Sanitized HTML for one markdown text (safe to assign to innerHTML)."""
    import nh3

    return nh3.clean(
        _parser().render(text),
        tags=_TAGS,
        attributes=_ATTRIBUTES,
        url_schemes=_SCHEMES,
        link_rel="noopener noreferrer nofollow",
        strip_comments=True,
    )


CODE_STYLES = ("xcode", "lightbulb")
"""The Pygments themes of highlighted code, light and dark: of those Pygments ships, ones whose
every colour reads against their background at WCAG's 4.5:1 (the earlier `friendly` drew
comments at 2.6:1)."""


def highlight_css() -> str:
    """The Pygments theme for highlighted code: light by default, dark under the media query."""
    from pygments.formatters import HtmlFormatter

    light, dark = (
        HtmlFormatter(style=style, classprefix="hl-").get_style_defs(".md pre")  # type: ignore[no-untyped-call]
        for style in CODE_STYLES
    )
    return f"{light}\n@media (prefers-color-scheme: dark) {{\n{dark}\n}}\n"
