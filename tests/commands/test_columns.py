"""Text cut and padded in terminal columns: a wide character counts two, and is never split."""

from __future__ import annotations

from metis.commands.columns import columns, cut, cut_start, pad
from metis.commands.sessions import _for_a_person


def test_a_line_of_wide_characters_is_cut_to_the_columns_it_may_take() -> None:
    title = "修复登录页面的缓存问题并补上测试"  # 16 characters, 32 columns
    assert columns(title) == 32
    assert cut(title, 11) == "修复登录页…" and columns(cut(title, 11)) == 11
    assert cut(title, 10) == "修复登录…"  # a character that would straddle the edge goes
    assert columns(cut(title, 10)) == 9
    assert cut("ascii text", 10) == "ascii text" and cut("ascii text", 6) == "ascii…"
    assert (cut("日本", 1), cut("日本", 0)) == ("…", "")


def test_the_end_of_a_name_is_kept_in_columns_and_cells_are_padded_in_columns() -> None:
    assert cut_start("プロジェクト", 7) == "…ェクト" and columns(cut_start("プロジェクト", 7)) == 7
    assert cut_start("プロジェクト", 12) == "プロジェクト"
    assert pad("名前", 6) == "名前  " and pad("name", 6) == "name  "


def test_a_listed_session_with_a_cjk_title_stays_within_the_terminal() -> None:
    session = {
        "id": "sess_" + "0" * 26,
        "status": "active",
        "title": "修复登录页面的缓存问题并补上测试，然后检查所有服务的网关超时设置",
        "workspace_path": "/srv/项目/客户端/平台/服务/账单",
        "turn_count": 1,
        "cost_so_far_usd": "0",
        "created_at": "2026-11-29T10:00:00Z",
    }
    for width in (80, 60, 40):
        lines = _for_a_person(session, width)
        assert all(columns(line) <= width for line in lines), (width, lines)
        assert lines[0].startswith("修复登录") and "…" in lines[0]
        assert lines[0].endswith(" · active · 1 turn · $0")
        assert lines[1].endswith("/账单") or width < 60  # narrower: the id fills the line
