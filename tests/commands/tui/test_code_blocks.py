"""`code_blocks`: what `/copy code` takes from a reply."""

from __future__ import annotations

from metis.commands.tui.code_blocks import code_blocks


def test_fenced_and_indented_blocks_in_order_as_written() -> None:
    reply = (
        "Run:\n\n```bash\nmake test\n```\n\nThen\n\n    indented\n    block\n\n"
        "- in a list:\n\n  ~~~\n  nested\n  ~~~\n\n> ```\n> quoted\n> ```\n"
    )
    assert code_blocks(reply) == ["make test", "indented\nblock", "nested", "quoted"]


def test_inline_code_and_an_unclosed_fence() -> None:
    assert code_blocks("use `ls` here") == []
    assert code_blocks("```py\nprint(1)\n") == ["print(1)"]  # still streaming: what came
