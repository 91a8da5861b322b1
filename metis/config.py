"""Daemon settings: where data lives, how the daemon binds, and every tunable limit.

Precedence is CLI flag > environment > `METIS_HOME/config.yaml` > default. Every number the
contracts call "a setting" lives here so tests can lower it instead of sleeping. A bad
`config.yaml` stops start-up with a message naming the file, line and key.
"""

import argparse
import logging
import os
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Self
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails

from metis.core.canonical.content import MAX_IMAGE_BYTES
from metis.core.config.checks import type_name, yaml_key
from metis.core.config.start_up import digests_at_start
from metis.core.config.yaml_source import MarkedDict, line_of, read_yaml_file, suggest
from metis.core.datamodel import DataModel
from metis.core.errors import ConfigError
from metis.core.tools.mcp.settings import McpSettings
from metis.core.tools.settings import BUILTINS_ONLY, ToolsSettings

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8421
NOT_A_PORT = "is not a port number (0–65535)"
DB_FILE = "metis.db"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
# The shipped `models.yaml` and `routing.yaml`, used when METIS_HOME has none. They live inside the
# package (package data in pyproject.toml) so a wheel or a plain `pip install .` carries them too.
SHIPPED_CONFIG_DIR = Path(__file__).resolve().parent / "defaults"


_DEFAULT_PORTS = {"http": 80, "https": 443}


def browser_origin(entry: str) -> str:
    """An allowed origin written as a browser sends its `Origin` header: `scheme://host[:port]`,
    lowercase, the scheme's default port left out.

    Origins are compared as strings, so an entry with a path or a trailing slash, or without a
    scheme, would never match any request: refused, not left to allow nothing in silence."""
    try:
        url = urlsplit(entry.strip())
        port = url.port
    except ValueError:
        url, port = None, None
    if (
        url is None
        or url.scheme.lower() not in _DEFAULT_PORTS
        or not url.hostname
        or url.username is not None
        or url.password is not None
        or url.path
        or url.query
        or url.fragment
        or entry.strip().endswith(("?", "#"))
    ):
        raise ValueError(
            "not an origin: write scheme://host[:port], e.g. http://localhost:5173 (no path, "
            "no trailing slash)"
        )
    scheme, host = url.scheme.lower(), url.hostname
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}" + ("" if port in (None, _DEFAULT_PORTS[scheme]) else f":{port}")


def _cors_origin(entry: str) -> str:
    """An AAP CORS origin: an origin, or `*` for any."""
    return "*" if entry.strip() == "*" else browser_origin(entry)


Origin = Annotated[str, AfterValidator(browser_origin)]
CorsOrigin = Annotated[str, AfterValidator(_cors_origin)]


def _anchored_path(entry: str) -> str:
    """A directory named in config.yaml: absolute, or under `~`. A relative one would be read
    against whatever directory `metis serve` was started in (`/` under systemd), so
    `allowed_workspace_roots: [code]` would allow `/code`, not `~/code`: refused instead."""
    if not Path(entry).expanduser().is_absolute():
        raise ValueError(
            "must be an absolute path or start with ~ (a relative one would depend on where metis serve starts)"
        )
    return entry


DirPath = Annotated[str, AfterValidator(_anchored_path)]


class _Section(DataModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LimitsSettings(_Section):
    max_request_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    # at most the store's ceiling (canonical.MAX_IMAGE_BYTES, also Anthropic's per-image limit)
    max_image_bytes: int = Field(default=MAX_IMAGE_BYTES, ge=1, le=MAX_IMAGE_BYTES)
    max_output_tokens_per_call: int = Field(default=8192, ge=1)
    max_llm_calls_per_turn: int = Field(default=50, ge=1)
    turn_timeout_s: float | None = Field(default=None, gt=0)
    turn_release_wait_s: float = Field(default=2.0, ge=0)
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    max_reason_chars: int = Field(default=1000, ge=1)  # a confirmation's deny reason
    # A connection must deliver a whole request head (request line and headers) within this
    # long of its opening or of the end of its previous response, else it is closed: a client
    # that sends its headers a byte at a time, or sends nothing, cannot hold it open.
    header_read_timeout_s: float = Field(default=60.0, gt=0)
    # A request's body must have arrived within this long of its head: a client that stops
    # sending half-way cannot hold its handler (and the memory of what it sent) open.
    body_read_timeout_s: float = Field(default=60.0, gt=0)


class WebSocketSettings(_Section):
    attach_token_ttl_s: float = Field(default=60.0, gt=0)
    attach_tokens_per_session_max: int = Field(default=100, ge=1)
    subscribe_timeout_s: float = Field(default=10.0, gt=0)
    queue_max_events: int = Field(default=1000, ge=1)
    # A live client (WebSocket or AAP stream) that takes nothing from its queue for this long
    # while a turn waits for room is closed as too slow; one that keeps reading never is.
    slow_client_timeout_s: float = Field(default=10.0, gt=0)
    replay_max_events: int = Field(default=10_000, ge=1)
    snapshot_messages: int = Field(default=50, ge=1)
    ping_interval_s: float = Field(default=30.0, gt=0)
    ping_missed_max: int = Field(default=3, ge=1)
    close_timeout_s: float = Field(default=5.0, gt=0)
    max_inbound_frame_bytes: int = Field(default=65536, ge=1024)


class PageSize(_Section):
    """One list endpoint's `limit`: used when absent, and the largest a client may ask for."""

    default: int = Field(ge=1)
    maximum: int = Field(ge=1)

    @model_validator(mode="after")
    def _default_within_maximum(self) -> Self:
        if self.default > self.maximum:
            raise ValueError("default must not exceed maximum")
        return self


class PagesSettings(_Section):
    """Page sizes of the REST list endpoints."""

    sessions: PageSize = PageSize(default=50, maximum=200)
    messages: PageSize = PageSize(default=50, maximum=200)
    events: PageSize = PageSize(default=100, maximum=1000)

    @model_validator(mode="before")
    @classmethod
    def _unset_keys_keep_their_defaults(cls, data: Any) -> Any:
        """`sessions: {maximum: 500}` changes the maximum only: every key of config.yaml has a
        default, so a page size given in part keeps the shipped value of the other key instead
        of being refused as incomplete."""
        if not isinstance(data, dict):
            return data
        filled = dict(data)
        for name, field in cls.model_fields.items():
            given = data.get(name)
            if isinstance(given, dict) and isinstance(field.default, PageSize):
                filled[name] = {**field.default.model_dump(), **given}
        return filled


class EventsSettings(_Section):
    strict: bool = False
    flush_batch_events: int = Field(default=100, ge=1)
    flush_interval_ms: int = Field(default=50, ge=1)
    max_batch_events: int = Field(default=500, ge=1)
    writer_warn_pending: int = Field(default=10_000, ge=1)
    writer_max_pending: int = Field(default=100_000, ge=1)


class AuthSettings(_Section):
    """Who may drive the metis REST and WebSocket surface (AAP always requires the key)."""

    # false: the metis surface takes requests without the key (clients of the seed API); the
    # daemon logs a WARNING at start-up. The AAP façade keeps requiring it either way.
    required: bool = True
    login_token_ttl_s: float = Field(default=300.0, gt=0)  # a login URL's one-time token
    browser_session_ttl_s: float = Field(default=12 * 3600.0, gt=0)  # a browser session


# -- the `aap` section ---------------------------------------------------------------------------
# Every AAP default lives here, with the rest of the file's schema, so loading the config never
# loads the AAP surface. Unknown keys are refused so a typo stops the daemon instead of silently
# widening CORS or the workspace roots. `METIS_AAP_CORS_ORIGINS` (comma-separated) overrides
# `cors_origins` when set, so a browser app can be allowed without editing the file.

CORS_ENV = "METIS_AAP_CORS_ORIGINS"


class AapSettings(DataModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cors_origins: tuple[CorsOrigin, ...] = ()
    workspace_roots: tuple[DirPath, ...] = ()
    page_size: int = Field(default=20, ge=1, le=200)
    max_request_bytes: int = Field(default=20 * 1024 * 1024, ge=1024)
    max_image_bytes: int = Field(default=MAX_IMAGE_BYTES, ge=1, le=MAX_IMAGE_BYTES)
    sse_heartbeat_seconds: float = Field(default=15.0, gt=0)
    stream_queue_limit: int = Field(default=10_000, ge=1)

    def effective_cors_origins(self) -> tuple[str, ...]:
        """The env override wins over the file; empty entries are ignored, one that is not an
        origin stops start-up as the file's would."""
        raw = os.environ.get(CORS_ENV)
        if raw is None:
            return self.cors_origins
        origins = []
        for n, entry in enumerate((o for o in raw.split(",") if o.strip()), start=1):
            try:
                origins.append(_cors_origin(entry))
            except ValueError as exc:
                raise ConfigError(f"{CORS_ENV}: entry {n}: {exc}") from None
        return tuple(origins)


class FileSettings(_Section):
    """The schema of `config.yaml` (every key optional)."""

    host: str = DEFAULT_HOST
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535, strict=True)  # `true` is no port
    allowed_origins: tuple[Origin, ...] = ()
    allowed_workspace_roots: tuple[DirPath, ...] = ()
    # The AAP `workspace` option's default (a top-level key, not under `aap`);
    # None → METIS_HOME/workspaces/default.
    default_workspace: DirPath | None = None
    # `metis serve`'s log level unless `--log-level` says otherwise
    log_level: Annotated[  # `debug` as well: a level is a name, not a spelling
        Literal["DEBUG", "INFO", "WARNING", "ERROR"],
        BeforeValidator(lambda v: v.upper() if isinstance(v, str) else v),
    ] = "INFO"
    limits: LimitsSettings = LimitsSettings()
    pages: PagesSettings = PagesSettings()
    websocket: WebSocketSettings = WebSocketSettings()
    events: EventsSettings = EventsSettings()
    tools: ToolsSettings = ToolsSettings()
    mcp: McpSettings = McpSettings()  # MCP servers as tool sources (metis/core/tools/mcp/)
    aap: AapSettings = AapSettings()
    auth: AuthSettings = AuthSettings()


class Settings(DataModel):
    """Effective settings of one daemon process (file settings plus paths and overrides)."""

    model_config = ConfigDict(frozen=True)

    home: Path
    host: str
    port: int
    requested_host: str
    offline: bool
    api_key: str | None = Field(default=None, repr=False, exclude=True)
    file: FileSettings
    # what `load_settings` merged into the file's settings (tests), kept so that a re-read of
    # the file (`current_file_settings`) gives what start-up gave
    overrides: dict[str, Any] = Field(default_factory=dict, repr=False, exclude=True)
    # the sha256 of each file read once at start-up (config.yaml, models.yaml), None for one
    # the home did not hold: what `GET /server/version` reports, so that a client can tell an
    # edit since, not in force, from a save that changed nothing (`metis.core.config.start_up`)
    start_up_digests: dict[str, str | None] = Field(default_factory=dict, repr=False, exclude=True)

    @property
    def db_path(self) -> Path:
        return self.home / DB_FILE

    @property
    def scratch_workspaces_path(self) -> Path:
        """AAP's scratch workspaces: the one part of METIS_HOME a session may work in."""
        return self.home / "workspaces"

    @property
    def config_path(self) -> Path:
        return self.home / "config.yaml"

    @property
    def routing_path(self) -> Path:
        return self.home / "routing.yaml"

    @property
    def models_path(self) -> Path:
        """The user's `models.yaml`, else the shipped default."""
        user = self.home / "models.yaml"
        return user if user.exists() else SHIPPED_CONFIG_DIR / "models.yaml"

    @property
    def shipped_routing_path(self) -> Path:
        return SHIPPED_CONFIG_DIR / "routing.yaml"

    @property
    def limits(self) -> LimitsSettings:
        return self.file.limits

    @property
    def pages(self) -> PagesSettings:
        return self.file.pages

    @property
    def websocket(self) -> WebSocketSettings:
        return self.file.websocket

    @property
    def events(self) -> EventsSettings:
        return self.file.events

    @property
    def tools(self) -> ToolsSettings:
        return self.file.tools

    @property
    def mcp(self) -> McpSettings:
        return self.file.mcp

    @property
    def allowed_workspace_roots(self) -> tuple[Path, ...]:
        return tuple(Path(p).expanduser().resolve() for p in self.file.allowed_workspace_roots)


def default_home() -> Path:
    return Path(os.environ.get("METIS_HOME") or Path.home() / ".metis").expanduser()


def home_from(flag: str | Path | None) -> Path:
    """METIS_HOME as every command resolves it: `--home DIR`, else the environment, else
    ~/.metis."""
    return Path(flag).expanduser() if flag else default_home()


def home_not_a_directory(home: Path) -> ConfigError:
    """What is said, by `serve` and clients alike, when a file stands where METIS_HOME is."""
    return ConfigError(f"METIS_HOME {home} is not a directory")


def ensure_home(home: Path) -> Path:
    """Create METIS_HOME with mode 0700 (it holds the API key and the trace store); a
    ConfigError when a file is in its place."""
    try:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
    except (FileExistsError, NotADirectoryError):
        raise home_not_a_directory(home) from None
    try:
        home.chmod(0o700)
    except OSError:  # pragma: no cover - foreign ownership; still usable
        log.warning("could not set mode 0700 on %s", home)
    return home


# pydantic's type errors in the words a YAML file is written in ("a valid tuple" is a list there)
_EXPECTED = {
    "tuple_type": "a list",
    "list_type": "a list",
    "dict_type": "a mapping",
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
}


_KEY_ITSELF = "[key]"
"""How pydantic's location of an error ends when it is the mapping's key that is wrong."""


def _loc_to_message(path: Path, data: Any, error: ErrorDetails) -> tuple[int, str]:
    """One pydantic error as `file:line: key: problem`, never echoing the value, with its line
    (0 when unknown) to put the file's errors in its order."""
    about_key = error["type"] == "invalid_key" or error["loc"][-1:] == (_KEY_ITSELF,)
    keys, line = _located(data, error, about_key)
    key = ".".join(yaml_key(k) for k in keys) or "(root)"
    problem = error["msg"]
    expected = _EXPECTED.get(error["type"])
    if error["type"] in ("extra_forbidden", "invalid_key"):  # invalid_key: one not a string
        parent = _section_at([str(k) for k in keys[:-1]])
        hint = ""
        if parent is not None:
            allowed = list(parent.model_fields)
            close = suggest(keys[-1], allowed) if isinstance(keys[-1], str) else ""
            hint = f"{close} (allowed: {', '.join(allowed)})"
        problem = f"unknown key{hint}"
    elif error["type"] == "value_error":  # a validator's own words, without pydantic's prefix
        problem = problem.removeprefix("Value error, ")
    elif about_key:  # a map of names (`mcp.servers`) given a key that is not a name (`~:`)
        said = f"expected {expected}, got {type_name(error['input'])}" if expected else problem
        problem = f"not a valid key: {said}"
    elif error["type"] == "model_type":  # pydantic names the section's class
        problem = f"expected a mapping, got {type_name(error['input'])}"
    elif expected is not None:  # "a valid tuple": the YAML words for what is wanted
        problem = f"expected {expected}, got {type_name(error['input'])}"
    where = f"{path}:{line}" if line else str(path)
    return line or 0, f"{where}: {key}: {problem}"


def _located(data: Any, error: ErrorDetails, about_key: bool) -> tuple[list[Any], int | None]:
    """The keys (and list indexes) leading to the error as the file has them, and the line
    of the last one found in it. Pydantic's location writes a key that is not a string as
    `str()` does (`None` for YAML's null): the key named is the document's, so that the
    message spells it as the user wrote it."""
    parts = list(error["loc"])
    if parts[-1:] == [_KEY_ITSELF]:
        parts.pop()
    keys: list[Any] = []
    node, line = data, None
    for i, part in enumerate(parts):
        if about_key and i == len(parts) - 1:
            key: Any = error["input"]  # the wrong key itself, whatever YAML made of it
        elif isinstance(node, MarkedDict):
            key = _document_key(node, part)
        else:
            key = part
        keys.append(key)
        found = (isinstance(node, MarkedDict) and key in node) or (
            isinstance(node, list) and isinstance(key, int) and key < len(node)
        )
        if not found:  # a key the file does not have (a required one): where its mapping is
            if isinstance(node, MarkedDict):
                line = line_of(node, key) or node.line or line
            return keys + parts[i + 1 :], line
        line = line_of(node, key) or line
        node = node[key]
    return keys, line


def _document_key(node: MarkedDict, part: str | int) -> Any:
    """The key of `node` that a part of pydantic's location stands for: the part itself (the
    key `true` where pydantic wrote 1), else the key that is not a string it wrote as `str()`
    does (`None`, `1.5`)."""
    if part in node:
        return next(key for key in node if key == part)
    return next((key for key in node if not isinstance(key, str) and str(key) == part), part)


def _section_at(path: list[str]) -> type[BaseModel] | None:
    """The settings model a key path leads to, through the maps and lists on the way
    (`mcp.servers.<name>.tools.<tool>`), for the unknown key's "did you mean"."""
    current: Any = FileSettings
    for part in path:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(part)
            if field is None:
                return None
            current = field.annotation
        elif typing.get_origin(current) is dict:
            current = typing.get_args(current)[1]
        elif typing.get_origin(current) in (list, tuple):
            current = typing.get_args(current)[0]
        else:
            return None
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


CONFIG_FILE_CONTEXT = {BUILTINS_ONLY: True}
"""How config.yaml is validated: its tool settings name builtins only."""


def load_file_settings(path: Path) -> FileSettings:
    """Parse `config.yaml`; raise ConfigError naming file, line and key on any problem."""
    if not path.exists():
        return FileSettings()
    doc = read_yaml_file(path)
    if doc.errors:
        # a problem of the whole file (unreadable, not UTF-8) has no line: none is made up
        raise ConfigError(
            "; ".join(
                f"{path}:{d.line}: {d.message}" if d.line else f"{path}: {d.message}"
                for d in doc.errors
            )
        )
    if doc.data is None:
        return FileSettings()
    if not isinstance(doc.data, dict):
        raise ConfigError(f"{path}:1: the top level must be a mapping")
    try:
        return FileSettings.model_validate(doc.data, context=CONFIG_FILE_CONTEXT)
    except ValidationError as exc:
        located = sorted(
            (_loc_to_message(path, doc.data, e) for e in exc.errors()), key=lambda m: m[0]
        )
        raise ConfigError("\n".join(message for _, message in located)) from None


class AddressError(ValueError):
    """METIS_PORT that is not a port number. Not a ConfigError (a file's): `metis.cli.main` says
    it in one line, exit 2, whichever command met it."""


def _port(text: str) -> int | None:
    """`text` as a port number (0: any free one), None when it is not one."""
    port = int(text) if text.isascii() and text.isdigit() else -1
    return port if 0 <= port <= 65535 else None


def port_argument(text: str) -> int:
    """The type of every `--port` flag, so `--port 70000` is a usage error naming the flag."""
    port = _port(text)
    if port is None:
        raise argparse.ArgumentTypeError(f"{text!r} {NOT_A_PORT}")
    return port


def env_port() -> int | None:
    """METIS_PORT, None when unset or empty; AddressError when it is not a port number."""
    raw = os.environ.get("METIS_PORT")
    if not raw:
        return None
    port = _port(raw)
    if port is None:
        raise AddressError(f"METIS_PORT={raw!r} {NOT_A_PORT}")
    return port


def resolve_address(
    file_settings: FileSettings, *, host: str | None = None, port: int | None = None
) -> tuple[str, int]:
    """The requested host and port: argument > METIS_HOST / METIS_PORT > config.yaml > default.
    The daemon binds with it and every client (`metis.commands.daemon_client`) connects with it.
    Raises AddressError for a METIS_PORT it would use that is not a port number."""
    requested_host = host or os.environ.get("METIS_HOST") or file_settings.host
    if port is None:
        port = env_port()
    return requested_host, file_settings.port if port is None else port


def load_settings(
    *,
    home: Path | None = None,
    host: str | None = None,
    port: int | None = None,
    overrides: dict[str, Any] | None = None,
) -> Settings:
    """Effective settings: CLI arguments > environment > config.yaml > defaults.

    `overrides` (tests) are merged into the file settings section by section.
    """
    if port is None:
        port = env_port()  # before the home is made: a bad METIS_PORT leaves nothing behind
    home = ensure_home(home or default_home())
    start_up_digests = digests_at_start(home)  # before the files are read
    file_settings = _file_settings(home / "config.yaml", overrides)
    requested_host, effective_port = resolve_address(file_settings, host=host, port=port)
    bound_host = requested_host
    if requested_host not in LOOPBACK_HOSTS:
        log.error(
            "refusing to bind non-loopback host %r; binding %s instead",
            requested_host,
            DEFAULT_HOST,
        )
        bound_host = DEFAULT_HOST
    return Settings(
        home=home,
        host=bound_host,
        port=effective_port,
        requested_host=requested_host,
        offline=os.environ.get("METIS_OFFLINE") == "1",
        api_key=os.environ.get("METIS_API_KEY") or None,
        file=file_settings,
        overrides=overrides or {},
        start_up_digests=start_up_digests,
    )


def _file_settings(path: Path, overrides: dict[str, Any] | None) -> FileSettings:
    """config.yaml's settings with `overrides` merged in, section by section."""
    file_settings = load_file_settings(path)
    if not overrides:
        return file_settings
    merged = file_settings.model_dump()
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return FileSettings.model_validate(merged, context=CONFIG_FILE_CONTEXT)


def current_file_settings(settings: Settings) -> FileSettings:
    """config.yaml as it is now, read as the daemon read it at start (its overrides merged in):
    for a part that applies a changed file without a restart (an MCP server's restart). Raises
    ConfigError, naming file, line and key, when the file has become invalid."""
    return _file_settings(settings.config_path, settings.overrides)
