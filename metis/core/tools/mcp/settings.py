"""The `mcp` section of `config.yaml`: MCP servers whose tools join the offered tool set.

```yaml
mcp:
  servers:
    files:                                  # tools are offered as mcp__files__<tool>
      command: npx
      args: ["-y", "@modelcontextprotocol/server-filesystem", "/home/me/notes"]
      env: {LOG_LEVEL: warn, API_TOKEN: "${NOTES_TOKEN}"}   # ${VAR}: from the daemon's env
      policy: prompt                        # prompt (default) | prompt_once | auto | deny
      tools: {read_file: {policy: auto}}
    search:
      url: https://mcp.example.com/mcp      # Streamable HTTP: https, or http on loopback
      headers: {Authorization: "Bearer ${SEARCH_TOKEN}"}
```

A server is either a stdio command or a Streamable HTTP url. Its process gets a minimal
environment (PATH, HOME, USER, LOGNAME, SHELL, TERM) plus its own `env`: provider keys and the
daemon's key reach it only when `env` names them explicitly.
"""

import ipaddress
import os
import re
from collections.abc import Mapping, Sequence
from typing import Literal, Self
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import ConfigDict, Field, field_validator, model_validator

from metis.core.config.checks import join
from metis.core.datamodel import DataModel
from metis.core.errors import ConfigError

McpMode = Literal["auto", "prompt", "prompt_once", "deny"]

SERVER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}\Z")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_REFERENCE_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_LOOPBACK_NAMES = frozenset({"localhost"})
_URL_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


class _Section(DataModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class McpToolSettings(_Section):
    """Overrides for one tool of a server: its confirmation policy and call timeout."""

    policy: McpMode | None = None
    timeout_seconds: float | None = Field(default=None, gt=0)


def is_loopback_host(host: str) -> bool:
    """Whether a host name or address is loopback: plain `http` is allowed only there, so headers
    never cross the network in clear."""
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class McpServerSettings(_Section):
    """One MCP server: either a stdio `command` or a Streamable HTTP `url`, its environment or
    headers (secrets, kept out of repr), its policy and timeouts."""

    command: str | None = Field(default=None, min_length=1)
    args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict, repr=False)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    policy: McpMode = "prompt"
    tools: dict[str, McpToolSettings] = Field(default_factory=dict)
    enabled: bool = True
    timeout_seconds: float = Field(default=120, gt=0)  # one tool call
    connect_timeout_seconds: float = Field(default=30, gt=0)  # start + initialize + list

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [n for n in value if not _ENV_NAME_RE.match(n)]
        if bad:
            raise ValueError(f"invalid environment variable names: {', '.join(bad)}")
        return value

    @model_validator(mode="after")
    def _one_transport(self) -> Self:
        if (self.command is None) == (self.url is None):
            raise ValueError("a server has either `command` (stdio) or `url` (Streamable HTTP)")
        if self.url is not None:
            if self.args or self.env or self.cwd:
                raise ValueError("args, env and cwd belong to a `command` server")
            parts = urlsplit(self.url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError("url must be an http(s) URL")
            if parts.scheme == "http" and not is_loopback_host(parts.hostname):
                raise ValueError("an http url must be on loopback; use https for other hosts")
        elif self.headers:
            raise ValueError("headers belong to a `url` server")
        return self

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"

    def mode_for(self, tool: str) -> McpMode:
        """The confirmation mode of one tool: its own override, else the server's policy."""
        configured = self.tools.get(tool)
        return configured.policy if configured and configured.policy else self.policy

    def timeout_for(self, tool: str) -> float:
        """The call timeout of one tool: its own override, else the server's."""
        configured = self.tools.get(tool)
        if configured and configured.timeout_seconds is not None:
            return configured.timeout_seconds
        return self.timeout_seconds

    def timeout_keys(self, server: str, tool: str) -> tuple[str, ...]:
        """The config.yaml keys that raise the call timeout of `tool` of this server (named
        `server` there), the narrowest first: the tool's own override (only that one when it is
        set, the server's no longer applies), then the server's."""
        entry = join(join("mcp", "servers"), server)
        own = join(join(join(entry, "tools"), tool), "timeout_seconds")
        configured = self.tools.get(tool)
        if configured and configured.timeout_seconds is not None:
            return (own,)
        return own, join(entry, "timeout_seconds")


class McpSettings(_Section):
    """The `mcp` section: the servers by name, and the restart backoff and ping interval they share."""

    servers: dict[str, McpServerSettings] = Field(default_factory=dict)
    restart_initial_seconds: float = Field(default=1.0, gt=0)  # first backoff after a death
    restart_max_seconds: float = Field(default=60.0, gt=0)
    ping_interval_seconds: float = Field(default=15.0, gt=0)  # liveness of HTTP servers

    @field_validator("servers")
    @classmethod
    def _server_names(cls, value: dict[str, McpServerSettings]) -> dict[str, McpServerSettings]:
        bad = [n for n in value if not SERVER_NAME_RE.match(n)]
        if bad:
            raise ValueError(
                f"invalid server names (letters, digits, - and _; at most 32): {', '.join(bad)}"
            )
        prefixes: dict[str, str] = {}
        for name in value:
            key = server_key(name)
            if key in prefixes:
                raise ValueError(f"servers {prefixes[key]!r} and {name!r} give the same tool names")
            prefixes[key] = name
        return value


def server_key(name: str) -> str:
    """The server's part of its tools' names: lower case, `-` → `_`."""
    return name.lower().replace("-", "_")


_CREDENTIAL_WORDS = frozenset(
    {"auth", "authorization", "cookie", "credential", "credentials", "passwd", "password", "pat"}
)


def _names_a_credential(name: str) -> bool:
    """`GITHUB_TOKEN`, `X-Api-Key`, `Authorization`, `DB_PASSWORD`; not `GIT_AUTHOR_NAME`."""
    words = re.split(r"[^a-z0-9]+", name.lower())
    return any(w in _CREDENTIAL_WORDS or w.endswith(("key", "token", "secret")) for w in words)


HIDDEN = "***"


def displayed_url(url: str) -> str:
    """A server URL as `GET /mcp` shows it: credentials written into it (`user:pass@`, a
    credential-named query parameter such as `?token=`) hidden, the rest as configured."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{HIDDEN}@{netloc.rpartition('@')[2]}"
    query = urlencode(
        [(k, HIDDEN if _names_a_credential(k) else v) for k, v in parse_qsl(parts.query, True)],
        safe="*",
    )
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def url_secrets(url: str) -> list[str]:
    """What to redact of a URL, wherever it might surface: the password written into it (the
    user name when there is none: `https://TOKEN@host`) and the value of a credential-named
    query parameter. The rest (host, path, a user name beside a password) stays readable."""
    parts = urlsplit(url)
    found = [parts.password or parts.username or ""] if "@" in parts.netloc else []
    found += [v for k, v in parse_qsl(parts.query, True) if _names_a_credential(k)]
    return [value for value in found if value]


def _url_arg(arg: str) -> tuple[str, str] | None:
    """An argument that is a URL (`postgresql://admin:pw@db/prod`), or an option's URL value
    (`--db=postgresql://…`): what comes before the URL, and the URL; None for any other."""
    option, equals, value = arg.partition("=") if arg.startswith("-") else ("", "", arg)
    return (option + equals, value) if _URL_RE.match(value) else None


def args_secrets(args: Sequence[str]) -> list[str]:
    """What to redact of a command's arguments: the credentials of the URLs among them."""
    return [secret for arg in args if (url := _url_arg(arg)) for secret in url_secrets(url[1])]


def _displayed_arg(arg: str) -> str:
    """An argument with the credentials of its URL hidden, as `displayed_url` hides them."""
    url = _url_arg(arg)
    return arg if url is None else url[0] + displayed_url(url[1])


def displayed_args(args: Sequence[str]) -> list[str]:
    """A command's arguments as `GET /mcp` shows them: the value of a credential-named option
    (`--api-key X`, `--token=X`) hidden, and the credentials written into a URL."""
    shown: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next:
            shown.append(HIDDEN)
            hide_next = False
        elif arg.startswith("-") and "=" in arg and _names_a_credential(arg.partition("=")[0]):
            shown.append(f"{arg.partition('=')[0]}={HIDDEN}")
        else:
            shown.append(_displayed_arg(arg))
            hide_next = arg.startswith("-") and _names_a_credential(arg)
    return shown


def configured_secrets(
    raw: Mapping[str, str], expanded: Mapping[str, str], environ: Mapping[str, str] | None = None
) -> list[str]:
    """What to redact wherever it might surface, of an `env` or `headers` map: the values `${NAME}`
    references brought in from the daemon's environment, and the whole value of an entry whose
    name says it is a credential (`GITHUB_TOKEN`, `Authorization`). Other literal values are not
    secrets: redacting `LOG_LEVEL: warn` would blank "warn" in every message of every session."""
    env = os.environ if environ is None else environ
    found: list[str] = []
    for name, value in raw.items():
        found += [env[ref] for ref in _REFERENCE_RE.findall(value) if ref in env]
        if _names_a_credential(name):
            found.append(expanded[name])
    return list(dict.fromkeys(found))


def expand(value: str, environ: Mapping[str, str] | None = None, *, where: str) -> str:
    """`${NAME}` references replaced from the daemon's environment (a missing one is an error)."""
    env = os.environ if environ is None else environ

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in env:
            raise ConfigError(f"{where}: ${{{name}}} is not set in the daemon's environment")
        return env[name]

    return _REFERENCE_RE.sub(one, value)
