"""The `mcp` section of config.yaml and the names MCP tools are offered under."""

from __future__ import annotations

import socket
from pathlib import Path

import mcp_types
import pytest
from pydantic import ValidationError

from metis.config import load_file_settings
from metis.core.errors import ConfigError
from metis.core.tools.mcp.settings import (
    McpServerSettings,
    McpSettings,
    args_secrets,
    configured_secrets,
    displayed_args,
    displayed_url,
    expand,
    url_secrets,
)
from metis.core.tools.mcp.tools import (
    UnusableSchema,
    compile_validator,
    offered_schema,
    result_blocks,
    tool_name,
    validate_with,
)
from metis.core.tools.settings import TOOL_NAME_RE


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/mcp",
        "http://localhost/mcp",
        "http://[::1]:80/mcp",
        "https://x.example/mcp",
    ],
)
def test_loopback_http_or_https_urls_are_accepted(url: str) -> None:
    assert McpServerSettings(url=url).transport == "http"


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"url": "http://example.com/mcp"}, "loopback"),
        ({"url": "http://10.0.0.1/mcp"}, "loopback"),
        ({"url": "ftp://127.0.0.1/mcp"}, "http(s)"),
        ({"command": "x", "url": "https://a.example"}, "either"),
        ({}, "either"),
        ({"url": "https://a.example", "env": {"A": "b"}}, "command"),
        ({"command": "x", "headers": {"A": "b"}}, "url"),
        ({"command": "x", "env": {"BAD-NAME": "1"}}, "invalid environment"),
        ({"command": "x", "policy": "sometimes"}, "policy"),
    ],
)
def test_invalid_servers_are_refused(fields: dict[str, object], problem: str) -> None:
    with pytest.raises(ValidationError) as refused:
        McpServerSettings.model_validate(fields)
    assert problem in str(refused.value)


def test_server_names_must_give_distinct_tool_names() -> None:
    with pytest.raises(ValidationError, match="same tool names"):
        McpSettings.model_validate({"servers": {"a-b": {"command": "x"}, "a_b": {"command": "y"}}})
    with pytest.raises(ValidationError, match="invalid server names"):
        McpSettings.model_validate({"servers": {"a b": {"command": "x"}}})


def test_config_file_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("mcp:\n  servers:\n    web:\n      url: http://example.com/mcp\n")
    with pytest.raises(ConfigError) as refused:
        load_file_settings(path)
    assert "config.yaml:" in refused.value.message and "mcp.servers.web" in refused.value.message
    path.write_text(
        "mcp:\n  servers:\n    git: {command: uvx, args: [mcp-server-git], policy: auto}\n"
    )
    assert load_file_settings(path).mcp.servers["git"].mode_for("git_log") == "auto"


def test_references_come_from_the_daemon_environment() -> None:
    assert expand("Bearer ${TOKEN}", {"TOKEN": "t0k"}, where="x") == "Bearer t0k"
    with pytest.raises(ConfigError, match=r"\$\{MISSING\} is not set"):
        expand("${MISSING}", {}, where="mcp.servers.a.env.B")


def test_tool_names_are_valid_unique_and_bounded() -> None:
    assert tool_name("git", "git_log") == "mcp__git__git_log"
    assert tool_name("files", "Read-File.v2") == "mcp__files__read_file_v2"
    long_a, long_b = tool_name("srv", "a" * 80), tool_name("srv", "a" * 81)
    assert len(long_a) == 64 and long_a != long_b
    for name in (long_a, long_b, tool_name("x", "ÜBER tool")):
        assert TOOL_NAME_RE.match(name)


def test_input_is_validated_against_the_servers_schema() -> None:
    schema = offered_schema(
        {
            "type": "object",
            "properties": {
                "n": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
                "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}},
            },
            "required": ["tags"],
            "$defs": {"tag": {"type": "string", "maxLength": 3}},
        }
    )
    validator = compile_validator(schema)
    assert validate_with(validator, {"tags": ["ok"], "n": None}).ok
    bad = validate_with(validator, {"tags": ["long", 1], "n": "x"})
    assert {e.path for e in bad.errors} == {"$.n", "$.tags[0]", "$.tags[1]"}
    assert not validate_with(validator, {}).ok
    assert offered_schema(None) == {"type": "object", "properties": {}}


def test_a_backtracking_pattern_is_checked_without_backtracking() -> None:
    """`(a+)+$` against 40 a's and a `!` takes Python's `re` minutes (the event loop with it);
    the validator's engine answers at once."""
    validator = compile_validator(
        offered_schema({"properties": {"a": {"type": "string", "pattern": "(a+)+$"}}})
    )
    bad = validate_with(validator, {"a": "a" * 40 + "!"})
    assert [e.path for e in bad.errors] == ["$.a"] and "does not match" in bad.errors[0].message
    assert validate_with(validator, {"a": "aaa"}).ok


def test_a_schema_referring_to_another_document_is_unusable_and_never_fetched() -> None:
    with socket.socket() as listener:  # the address the schema names: nothing may connect
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/schema.json"
        for ref in (url, "other.json"):
            with pytest.raises(UnusableSchema, match="not"):
                compile_validator(offered_schema({"properties": {"a": {"$ref": ref}}}))
        with pytest.raises(BlockingIOError):
            listener.accept()
    with pytest.raises(UnusableSchema):
        compile_validator({"type": 5})


def test_results_map_to_text_and_image_blocks() -> None:
    result = mcp_types.CallToolResult(
        content=[
            mcp_types.TextContent(type="text", text="hello"),
            mcp_types.ImageContent(type="image", data="aGk=", mime_type="image/png"),
            mcp_types.ImageContent(type="image", data="aGk=", mime_type="image/tiff"),
            mcp_types.EmbeddedResource(
                type="resource",
                resource=mcp_types.TextResourceContents(uri="file:///a.txt", text="A"),
            ),
            mcp_types.ResourceLink(type="resource_link", name="b", uri="file:///b"),
        ]
    )
    blocks = [b.model_dump() for b in result_blocks(result)]
    assert blocks[0] == {"type": "text", "text": "hello"}
    assert blocks[1]["type"] == "image" and blocks[1]["source"]["media_type"] == "image/png"
    assert blocks[2] == {"type": "text", "text": "[image: image/tiff, not shown]"}
    assert blocks[3]["text"] == "[resource file:///a.txt]\nA"
    assert blocks[4]["text"] == "[resource link: b file:///b]"
    empty = mcp_types.CallToolResult(content=[], structured_content={"k": 1})
    assert [b.model_dump() for b in result_blocks(empty)] == [{"type": "text", "text": '{"k": 1}'}]


def test_only_referenced_and_credential_named_values_are_secrets() -> None:
    environ = {"GH": "ghp_from_the_environment", "LEVEL": "debug"}
    raw = {
        "LOG_LEVEL": "warn",
        "GIT_AUTHOR_NAME": "metis",
        "GITHUB_TOKEN": "${GH}",
        "API_KEY": "literal-key-1234",
        "VERBOSITY": "${LEVEL}",
    }
    expanded = {k: expand(v, environ, where=k) for k, v in raw.items()}
    secrets = configured_secrets(raw, expanded, environ)
    assert sorted(secrets) == ["debug", "ghp_from_the_environment", "literal-key-1234"]
    assert "warn" not in secrets and "metis" not in secrets
    headers = {"Authorization": "Bearer abc123456", "Accept": "application/json"}
    assert configured_secrets(headers, headers, environ) == ["Bearer abc123456"]


def test_get_mcp_shows_a_url_without_the_credentials_written_into_it() -> None:
    shown = displayed_url("http://user:urlpass-8888@127.0.0.1:1/mcp?token=querysecret-777&v=2")
    assert shown == "http://***@127.0.0.1:1/mcp?token=***&v=2"
    assert displayed_url("https://example.com/mcp") == "https://example.com/mcp"
    assert displayed_url("https://tok@example.com/mcp?api_key=k") == (
        "https://***@example.com/mcp?api_key=***"
    )


def test_the_credentials_of_a_url_are_secrets_and_the_rest_is_not() -> None:
    assert url_secrets("http://user:urlpass-8888@127.0.0.1:1/mcp?token=q-777&v=2") == [
        "urlpass-8888",
        "q-777",
    ]
    assert url_secrets("https://ghp_tok@example.com/mcp") == ["ghp_tok"]  # a token as user
    assert url_secrets("http://127.0.0.1:1/mcp?api_key=qk-secret-999&x=1") == ["qk-secret-999"]
    assert url_secrets("https://example.com/mcp?v=2") == []


def test_get_mcp_shows_urls_among_the_arguments_without_their_credentials() -> None:
    args = [
        "postgresql://admin:hunter2pw@db.example/prod",
        "--db=mysql://root:pw-4321@db/x?sslmode=require",
        "https://example.com/docs",
        "plain:thing@host",
    ]
    assert displayed_args(args) == [
        "postgresql://***@db.example/prod",
        "--db=mysql://***@db/x?sslmode=require",
        "https://example.com/docs",
        "plain:thing@host",
    ]
    assert args_secrets(args) == ["hunter2pw", "pw-4321"]


def test_get_mcp_shows_arguments_without_the_value_of_a_credential_option() -> None:
    args = [
        "--api-key",
        "S1",
        "--verbose",
        "--token=S2",
        "serve",
        "--auth-header",
        "S3",
        "--port",
        "1",
    ]
    assert displayed_args(args) == [
        "--api-key",
        "***",
        "--verbose",
        "--token=***",
        "serve",
        "--auth-header",
        "***",
        "--port",
        "1",
    ]


def test_the_timeout_keys_name_the_tools_own_override_first_and_only_it_once_set() -> None:
    """What a timed-out call tells a person to raise: the tool's own override, which alone
    counts once set; a tool name that is not a plain key is quoted as config errors quote it."""
    server = McpServerSettings(command="x", tools={"slow": {"timeout_seconds": 5}})
    assert server.timeout_keys("files", "slow") == ("mcp.servers.files.tools.slow.timeout_seconds",)
    assert server.timeout_keys("files", "read.file") == (
        'mcp.servers.files.tools["read.file"].timeout_seconds',
        "mcp.servers.files.timeout_seconds",
    )
