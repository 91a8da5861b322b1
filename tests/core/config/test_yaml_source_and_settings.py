"""Positions in YAML diagnostics and config.yaml handling (file, line and key in every error)."""

from __future__ import annotations

from pathlib import Path

import pytest

from metis.config import load_settings
from metis.core.config.yaml_source import load_yaml_bytes
from metis.core.errors import ConfigError


def test_duplicate_keys_are_errors_with_their_line() -> None:
    doc = load_yaml_bytes(b"a: 1\nb: 2\na: 3\n")
    assert [d.code for d in doc.errors] == ["duplicate_key"]
    assert doc.errors[0].line == 3


def test_duplicate_key_diagnostics_carry_the_full_dotted_path() -> None:
    """`path` is the duplicate's dotted path and the message starts with it."""
    doc = load_yaml_bytes(
        b"providers:\n  anthropic:\n    adapter: a\n    adapter: b\n"
        b"workspaces:\n  /home/u/x:\n    rules:\n      - {name: a, name: b}\n"
        b"top: 1\ntop: 2\n"
    )
    assert [(d.code, d.path, d.line, d.message) for d in doc.errors] == [
        (
            "duplicate_key",
            "providers.anthropic.adapter",
            4,
            "providers.anthropic.adapter: duplicate key 'adapter'",
        ),
        (
            "duplicate_key",
            'workspaces["/home/u/x"].rules[0].name',
            8,
            "workspaces[\"/home/u/x\"].rules[0].name: duplicate key 'name'",
        ),
        ("duplicate_key", "top", 10, "top: duplicate key 'top'"),
    ]


def test_config_duplicate_key_names_file_line_and_path(tmp_path: Path) -> None:
    home = tmp_path / "h"
    home.mkdir()
    (home / "config.yaml").write_text("limits:\n  turn_timeout_s: 5\n  turn_timeout_s: 6\n")
    with pytest.raises(ConfigError) as info:
        load_settings(home=home)
    assert (
        f"{home / 'config.yaml'}:3: limits.turn_timeout_s: duplicate key 'turn_timeout_s'"
        in info.value.message
    )


def test_syntax_errors_carry_a_position() -> None:
    doc = load_yaml_bytes(b"a: [1, 2\nb: 3\n")
    assert doc.errors[0].code == "yaml_syntax" and doc.errors[0].line is not None


def test_bom_is_tolerated_and_non_utf8_refused() -> None:
    assert load_yaml_bytes(b"\xef\xbb\xbfa: 1\n").data == {"a": 1}
    assert load_yaml_bytes(b"a: \xff\n").errors[0].code == "not_utf8"


def test_too_large_files_are_refused() -> None:
    assert load_yaml_bytes(b"a: 1\n", max_bytes=2).errors[0].code == "too_large"


def test_keys_remember_their_lines() -> None:
    doc = load_yaml_bytes(b"top:\n  inner: 1\n  other: 2\n")
    assert doc.data["top"].key_line("other") == 3


def test_home_is_created_private(tmp_path: Path) -> None:
    home = tmp_path / "h"
    load_settings(home=home)
    assert home.stat().st_mode & 0o777 == 0o700


def test_precedence_is_flag_then_env_then_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "h"
    home.mkdir()
    (home / "config.yaml").write_text("port: 9001\n")
    monkeypatch.delenv("METIS_PORT", raising=False)
    assert load_settings(home=home).port == 9001
    monkeypatch.setenv("METIS_PORT", "9002")
    assert load_settings(home=home).port == 9002
    assert load_settings(home=home, port=9003).port == 9003


def config_error(home: Path, text: str) -> str:
    """The start-up error a `config.yaml` of `text` gives."""
    home.mkdir()
    (home / "config.yaml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(home=home)
    return info.value.message


def test_a_misspelled_key_inside_a_map_of_sections_gets_its_suggestion(tmp_path: Path) -> None:
    text = config_error(
        tmp_path / "h",
        "mcp:\n  servers:\n    files:\n      comand: npx\n      tools: {read: {polcy: auto}}\n",
    )
    assert "config.yaml:4: mcp.servers.files.comand: unknown key; did you mean 'command'?" in text
    assert "mcp.servers.files.tools.read.polcy: unknown key; did you mean 'policy'?" in text


def test_a_section_that_is_not_a_mapping_says_what_it_is_not_a_class_name(
    tmp_path: Path,
) -> None:
    text = config_error(tmp_path / "h", "limits: 5\ntools: [1]\nmcp:\n  servers: {a: x}\n")
    assert "config.yaml:1: limits: expected a mapping, got integer" in text
    assert "config.yaml:2: tools: expected a mapping, got list" in text
    assert "mcp.servers.a: expected a mapping, got string" in text
    assert "Settings" not in text and "instance of" not in text


def test_a_port_of_true_is_no_port(tmp_path: Path) -> None:
    """YAML's true is an int to a lax validator: port 1."""
    text = config_error(tmp_path / "h", "port: true\n")
    assert "config.yaml:1: port: expected an integer, got boolean" in text


def test_bad_config_names_file_line_and_key(tmp_path: Path) -> None:
    home = tmp_path / "h"
    text = config_error(
        home, "port: 9001\nlimits:\n  max_request_bytez: 5\nwebsocket:\n  ping_interval_s: nope\n"
    )
    assert (
        f"{home / 'config.yaml'}:3: limits.max_request_bytez: unknown key; did you mean 'max_request_bytes'?"
        in text
    )
    assert ":5: websocket.ping_interval_s:" in text
    assert "nope" not in text  # values are never echoed


def test_the_errors_of_a_config_yaml_are_listed_in_its_line_order(tmp_path: Path) -> None:
    """pydantic reports unknown keys after the other errors; a person reads the file down."""
    text = config_error(
        tmp_path / "h", "port: 99999999\nbogus: 1\nlimits:\n  max_request_bytes: -5\nnope: 2\n"
    )
    assert [line.split(": ")[0].rsplit(":", 1)[1] for line in text.splitlines()] == [
        "1",
        "2",
        "4",
        "5",
    ]


def test_config_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "h"
    home.mkdir()
    (home / "config.yaml").write_text("- a\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_settings(home=home)


def test_an_allowed_origin_that_no_browser_sends_is_refused(tmp_path: Path) -> None:
    """Origins are compared as strings: a trailing slash, a path or a missing scheme would
    match no request, so such an entry stops start-up instead of allowing nothing."""
    config = (
        "allowed_origins: [http://ok.example:8080]\n"
        "aap:\n  cors_origins:\n    - http://app.example/\n    - localhost:3000\n"
    )
    lines = config_error(tmp_path / "h", config).splitlines()
    problem = "not an origin: write scheme://host[:port], e.g. http://localhost:5173"
    assert [line.split(": ", 1)[1] for line in lines] == [
        f"aap.cors_origins.0: {problem} (no path, no trailing slash)",
        f"aap.cors_origins.1: {problem} (no path, no trailing slash)",
    ]


def test_allowed_origins_are_kept_as_browsers_write_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "h"
    home.mkdir()
    (home / "config.yaml").write_text(
        "allowed_origins: ['HTTP://Tool.Example:80', 'https://[::1]:8443']\n"
        "aap: {cors_origins: ['*', 'https://app.example:443']}\n"
    )
    settings = load_settings(home=home)
    assert settings.file.allowed_origins == ("http://tool.example", "https://[::1]:8443")
    assert settings.file.aap.effective_cors_origins() == ("*", "https://app.example")
    monkeypatch.setenv("METIS_AAP_CORS_ORIGINS", "http://a.example, http://b.example/x")
    with pytest.raises(ConfigError) as refused:
        settings.file.aap.effective_cors_origins()
    assert refused.value.message == (
        "METIS_AAP_CORS_ORIGINS: entry 2: not an origin: write scheme://host[:port], "
        "e.g. http://localhost:5173 (no path, no trailing slash)"
    )


def test_a_log_level_is_taken_in_any_case(tmp_path: Path) -> None:
    home = tmp_path / "h"
    home.mkdir()
    (home / "config.yaml").write_text("log_level: debug\n")
    assert load_settings(home=home).file.log_level == "DEBUG"
    (home / "config.yaml").write_text("log_level: loud\n")
    with pytest.raises(ConfigError, match="log_level: Input should be 'DEBUG', 'INFO'"):
        load_settings(home=home)


def test_a_page_size_given_in_part_keeps_the_default_of_the_other_key(tmp_path: Path) -> None:
    """Every key of config.yaml has a default, those of a page size too."""
    home = tmp_path / "h"
    home.mkdir()
    (home / "config.yaml").write_text(
        "pages:\n  sessions: {maximum: 500}\n  events: {default: 10}\n"
    )
    pages = load_settings(home=home).pages
    assert (pages.sessions.default, pages.sessions.maximum) == (50, 500)
    assert (pages.events.default, pages.events.maximum) == (10, 1000)
    assert (pages.messages.default, pages.messages.maximum) == (50, 200)


def test_a_page_default_over_the_maximum_it_keeps_is_refused(tmp_path: Path) -> None:
    text = config_error(tmp_path / "h", "pages:\n  sessions: {default: 500}\n")
    assert "config.yaml:2: pages.sessions: default must not exceed maximum" in text


def test_an_unknown_key_is_told_the_keys_its_section_allows(tmp_path: Path) -> None:
    text = config_error(tmp_path / "h", "prot: 9001\nauth:\n  bogus: 1\n")
    assert "config.yaml:1: prot: unknown key; did you mean 'port'? (allowed: host, port," in text
    assert (
        "config.yaml:3: auth.bogus: unknown key "
        "(allowed: required, login_token_ttl_s, browser_session_ttl_s)"
    ) in text


def test_a_value_of_the_wrong_type_is_told_what_yaml_is_wanted(tmp_path: Path) -> None:
    """pydantic's "a valid tuple" means nothing in a YAML file: a list is what is written."""
    text = config_error(
        tmp_path / "h",
        "port: '8000'\nallowed_workspace_roots: /srv/code\nauth: {required: maybe}\n"
        "limits: {turn_timeout_s: soon}\n",
    )
    assert "config.yaml:1: port: expected an integer, got string" in text
    assert "config.yaml:2: allowed_workspace_roots: expected a list, got string" in text
    assert "config.yaml:3: auth.required: expected true or false, got string" in text
    assert "config.yaml:4: limits.turn_timeout_s: expected a number, got string" in text
    assert "Input should" not in text and "tuple" not in text
    assert "/srv/code" not in text and "maybe" not in text and "soon" not in text


def test_a_config_yaml_that_cannot_be_read_as_text_gets_no_made_up_line(tmp_path: Path) -> None:
    home = tmp_path / "h"
    (home / "config.yaml").mkdir(parents=True)
    with pytest.raises(ConfigError) as info:
        load_settings(home=home)
    config = home / "config.yaml"
    assert info.value.message == f"{config}: cannot read {config}: Is a directory"
    config.rmdir()
    config.write_bytes(b"port: 1\n\xff\n")
    with pytest.raises(ConfigError) as info:
        load_settings(home=home)
    assert info.value.message.startswith(f"{config}: file is not UTF-8")


def test_a_directory_of_config_yaml_must_not_depend_on_where_the_daemon_starts(
    tmp_path: Path,
) -> None:
    """`[code]` meant ~/code; read against the start directory it was /code under systemd."""
    text = config_error(
        tmp_path / "h",
        "allowed_workspace_roots: [code, ~/work, /srv]\ndefault_workspace: ./ws\n"
        "aap:\n  workspace_roots: [scratch]\n",
    )
    assert text.splitlines() == [
        f"{tmp_path / 'h' / 'config.yaml'}:{line}: {key}: must be an absolute path or start "
        "with ~ (a relative one would depend on where metis serve starts)"
        for line, key in (
            (1, "allowed_workspace_roots.0"),
            (2, "default_workspace"),
            (4, "aap.workspace_roots.0"),
        )
    ]


def test_a_key_left_empty_or_null_is_named_null_at_its_own_line(tmp_path: Path) -> None:
    """YAML reads `~:` and an empty key as null; a message names it as YAML writes it, never
    as Python's `None`, in a section (an unknown key) and in a map of names alike."""
    text = config_error(
        tmp_path / "h",
        "limits:\n  ~: 1\nmcp:\n  servers:\n    ? \n    : {command: x}\n"
        "tools:\n  timeouts:\n    per_tool:\n      true: 3\n",
    )
    assert "config.yaml:2: limits.null: unknown key (allowed: max_request_bytes," in text
    assert "config.yaml:5: mcp.servers.null: not a valid key: expected a string, got null" in text
    assert (
        "config.yaml:10: tools.timeouts.per_tool.true: not a valid key: expected a string, "
        "got boolean"
    ) in text
    assert "None" not in text and "[key]" not in text and ".1:" not in text


def test_a_null_key_at_the_top_is_an_unknown_key(tmp_path: Path) -> None:
    text = config_error(tmp_path / "h", "port: 9001\n~: 1\n")
    assert "config.yaml:2: null: unknown key (allowed: host, port," in text


def test_a_null_key_given_twice_is_a_duplicate_named_null() -> None:
    """`~` and `null` are the same key to YAML."""
    doc = load_yaml_bytes(b"a:\n  ~: 1\n  null: 2\n")
    assert [(d.path, d.line, d.message) for d in doc.errors] == [
        ("a.null", 3, "a.null: duplicate key null")
    ]
