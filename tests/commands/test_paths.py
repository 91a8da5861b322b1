"""Paths shortened for a narrow space: the terminal app's status bar, `metis sessions list`."""

from __future__ import annotations

from metis.commands.paths import short_path


def test_a_path_keeps_home_as_tilde_and_elides_whole_directories_from_the_middle() -> None:
    home = "/home/me"
    assert short_path("/home/me/code/demo", 40, home) == "~/code/demo"
    assert short_path("/home/me", 40, home) == "~"
    assert short_path("/home/meat/x", 40, home) == "/home/meat/x"
    long = "/home/me/code/clients/acme/platform/services/billing/api"
    assert short_path(long, 30, home) == "~/…/services/billing/api"
    assert len(short_path(long, 30, home)) <= 30
    assert short_path("/srv/projects/one/two/three/four", 22, home) == "/srv/…/two/three/four"
    assert short_path("/srv/" + "x" * 50, 20, home) == "…" + "x" * 19


def test_a_path_of_wide_characters_is_shortened_in_terminal_columns() -> None:
    path = "/srv/项目/客户端/平台/服务/账单"
    assert short_path(path, 40, "/home/me") == path  # 30 columns
    assert short_path(path, 22, "/home/me") == "/srv/…/平台/服务/账单"
    assert short_path("/srv/" + "名" * 30, 9, "/home/me") == "…" + "名" * 4
