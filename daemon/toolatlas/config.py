"""Configuration: TOML parsed once into frozen msgspec structs.

Unknown keys and wrong types are errors that name the key and its table; `${VAR}` in any
string expands from the environment (an unset variable is an error naming the key). Relative
paths (socket, state_dir, stdio cwd) resolve against the config file's folder.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

# The tables of config_sections are the config's public names too (explicit re-exports).
from toolatlas.config_sections import (
    ASYMMETRIC_ALGORITHMS as ASYMMETRIC_ALGORITHMS,
    AccessRule as AccessRule,
    NAME_RE as NAME_RE,
    RESERVED_NAMES as RESERVED_NAMES,
    Endpoint as Endpoint,
    EventsSection as EventsSection,
    HttpSection as HttpSection,
    HttpToken as HttpToken,
    OAuthIssuer as OAuthIssuer,
    OAuthSection as OAuthSection,
    StoreSection as StoreSection,
    SurfaceSection as SurfaceSection,
    UpstreamName as UpstreamName,
    host_port as host_port,
    url_secrets as url_secrets,
    check_access,
    header_problem,
    check_http,
    url_problem,
)
from toolatlas.errors import ConfigError
from toolatlas.paths import (config_environment, default_state_dir, expand_vars, no_nul, read_config, resolve_path,
                             socket_path, unix_socket_path)
from toolatlas.redact import Redactor

Seconds = Annotated[float, msgspec.Meta(gt=0)]
# Defaults of the per-upstream ingest bounds (also what a record made without a config gets).
MAX_DESCRIPTION_CHARS = 8192
MAX_SCHEMA_BYTES = 64 * 1024


class Timeouts(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Named timeouts for every await on an upstream, in seconds."""

    connect: Seconds = 20.0
    list_tools: Seconds = 20.0
    call: Seconds = 60.0
    # A call that reports progress runs `call` seconds past its last progress, up to this in all.
    call_max: Seconds = 600.0
    ping: Seconds = 10.0


class _UpstreamBase(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    name: UpstreamName
    enabled: bool = True
    timeouts: Timeouts = msgspec.field(default_factory=Timeouts)
    # Seconds between health pings of a ready session; 0 disables pinging.
    ping_interval: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    # Seconds between periodic tools/list refreshes; 0 disables polling.
    relist_interval: Annotated[float, msgspec.Meta(ge=0)] = 60.0
    max_concurrency: Annotated[int, msgspec.Meta(ge=1)] = 32
    # A message from the upstream larger than this (bytes) is refused, not buffered: the
    # call it answers fails with an error saying so.
    max_result_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 16 * 1024 * 1024
    # A result with more content blocks than this is refused the same way (converting a
    # few hundred thousand blocks would hold the event loop for seconds).
    max_result_blocks: Annotated[int, msgspec.Meta(ge=1)] = 1000
    # A tool's description longer than this (characters) is cut, and an inputSchema larger
    # than this (bytes of JSON) is replaced by an open `{"type": "object"}`; catalog_status
    # lists each cut under the server's `problems`.
    max_description_chars: Annotated[int, msgspec.Meta(ge=256)] = MAX_DESCRIPTION_CHARS
    max_schema_bytes: Annotated[int, msgspec.Meta(ge=1024)] = MAX_SCHEMA_BYTES
    card_generator: Literal["bootstrap", "llm", "publisher"] = "bootstrap"


class StdioUpstream(_UpstreamBase, tag_field="transport", tag="stdio", frozen=True):
    command: str
    args: list[str] = []
    env: dict[str, str] = {}
    cwd: str | None = None


class SseUpstream(_UpstreamBase, tag_field="transport", tag="sse", frozen=True):
    url: str
    headers: dict[str, str] = {}


class HttpUpstream(_UpstreamBase, tag_field="transport", tag="http", frozen=True):
    url: str
    headers: dict[str, str] = {}


Upstream = StdioUpstream | SseUpstream | HttpUpstream


class DaemonSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    socket: str = ""
    socket_mode: Annotated[str, msgspec.Meta(pattern=r"^0?[0-7]{3}$")] = "0660"
    socket_owner: str | None = None
    socket_group: str | None = None
    state_dir: str = ""
    metrics_addr: str = "127.0.0.1:9464"
    # Clients (matched on clientInfo.name) that get the full namespaced tool list.
    passthrough_clients: list[str] = []
    # Seconds in-flight calls may take to finish on shutdown.
    drain_timeout: Seconds = 10.0
    max_message_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 4 * 1024 * 1024
    # Client connections: at most this many at once (socket and HTTP each), and per socket
    # peer uid; a client must finish each message it starts (its first one too) within
    # message_timeout seconds, or the connection is closed (a stalled or slowloris peer).
    max_clients: Annotated[int, msgspec.Meta(ge=1)] = 1024
    max_clients_per_uid: Annotated[int, msgspec.Meta(ge=1)] = 256
    message_timeout: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    # Seconds a socket connection may go with no traffic either way before it is closed; 0:
    # never (MCP clients hold sessions open for days; set it above the longest tool call).
    idle_timeout: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # What a client that matches no [[access]] rule may use: "allow" (every upstream; the
    # single-user default) or "deny" (nothing).
    access_default: Literal["allow", "deny"] = "allow"
    # Structured events never carry query text unless this is set.
    log_queries: bool = False
    # An upstream new to the config serves nothing until `toolatlas upstream approve NAME`.
    require_approval: bool = False
    # "uvloop" when installed (the default), else asyncio's own loop.
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    # Free text naming what this daemon serves ("production", "staging", "dev"): it appears in
    # the meta-tool descriptions, instructions, catalog_status and events, so a model told of
    # two gateways side by side can tell them apart.
    environment: Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[^\x00-\x1f\x7f]+$")] = "default"


class SearchSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    mode: Literal["hybrid", "bm25", "dense", "two-stage"] = "hybrid"
    default_top_k: Annotated[int, msgspec.Meta(ge=1, le=20)] = 5
    # Embedding runtime: "onnx" (fp32 documents, int8 queries; exported once into state_dir),
    # "onnx-fp32" / "onnx-int8" (one precision), "torch" (the reference) or "none" (BM25 only).
    embedder: Literal["onnx", "onnx-fp32", "onnx-int8", "torch", "none"] = "onnx"
    # Threads (spinning, capped at the usable cores) for a search's query while searches do
    # not overlap; overlapping ones take one each. 1: never more than one.
    query_threads: Annotated[int, msgspec.Meta(ge=1, le=64)] = 2
    cache_size: Annotated[int, msgspec.Meta(ge=0)] = 1024
    cache_ttl: Annotated[float, msgspec.Meta(ge=0)] = 300.0
    # Static scope: only these upstreams are searchable/callable by default ([] = all).
    scope: list[str] = []


class LearningSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Retrieval that learns from use: a search followed, within `window` seconds on the same
    connection, by a successful call of one of its results is a usage event (query, tool,
    principal) kept `retention_days` in state_dir/learning.sqlite3 (0600), the newest
    `max_events` of them at most (memory and the cost of each learned state grow with them).
    A query over 8,192 characters is not learned from (gateway.learning.MAX_QUERY_CHARS)."""
    enabled: bool = True
    window: Seconds = 600.0
    retention_days: Annotated[float, msgspec.Meta(gt=0)] = 180.0
    max_events: Annotated[int, msgspec.Meta(gt=0)] = 50_000


class CardsLlmSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """OpenAI-compatible chat-completions endpoint for the `llm` card generator."""

    url: str = ""  # e.g. "http://127.0.0.1:8000/v1" (".../chat/completions" is appended)
    model: str = ""
    api_key_env: str = ""  # name of the environment variable holding the key ("" = none)
    timeout: Seconds = 60.0
    max_retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 2


class CardsSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Operator-attested capability cards (see catalog/attest.py).

    Paths are relative to the config file's folder. The daemon needs only `public_key`;
    `private_key` is read by `toolatlas cards generate` and by policy "reattest".
    `required = false` (the default) serves an upstream without a valid card with its
    publisher text, marked unattested in catalog_status; `true` serves none of its tools.
    """

    public_key: str = ""
    private_key: str = ""
    policy: Literal["quarantine", "reattest"] = "quarantine"
    required: bool = False
    # Seconds between re-checks of the card files of connected upstreams, so a tampered,
    # replaced or re-signed card takes effect without waiting for a catalog change; 0 disables.
    recheck_interval: Annotated[float, msgspec.Meta(ge=0)] = 5.0
    llm: CardsLlmSection = msgspec.field(default_factory=CardsLlmSection)


class Config(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    daemon: DaemonSection = msgspec.field(default_factory=DaemonSection)
    surface: SurfaceSection = msgspec.field(default_factory=SurfaceSection)
    events: EventsSection = msgspec.field(default_factory=EventsSection)
    search: SearchSection = msgspec.field(default_factory=SearchSection)
    learning: LearningSection = msgspec.field(default_factory=LearningSection)
    cards: CardsSection = msgspec.field(default_factory=CardsSection)
    upstream: list[Upstream] = []
    access: list[AccessRule] = []
    http: HttpSection = msgspec.field(default_factory=HttpSection)
    endpoint: list[Endpoint] = []
    store: StoreSection = msgspec.field(default_factory=StoreSection)
    # Where the file was read from (not a TOML key; set by load()).
    source: str = ""
    # The values `${VAR}` put into upstream tables, for `secrets` (not a TOML key; set by parse()).
    expanded_secrets: tuple[str, ...] = ()

    def endpoint_by_name(self, name: str) -> Endpoint | None:
        """The [[endpoint]] `name` ("default" is the [daemon] socket and /mcp: None)."""
        for ep in self.endpoint:
            if ep.name == name:
                return ep
        return None

    def upstream_by_name(self, name: str) -> Upstream | None:
        for up in self.upstream:
            if up.name == name:
                return up
        return None


# Keys set by the code, never by the file.
_DERIVED_KEYS = ("source", "expanded_secrets")
# Upstream keys whose `${VAR}` values are not secrets (paths and names: redacting `${HOME}`
# would mangle every path in the log).
_NOT_SECRET_KEYS = frozenset({"name", "command", "cwd"})
_UPSTREAM_KEY_RE = re.compile(r"upstream\[\d+\]\.([^.\[]+)")
# Shorter values are never redacted (they would mangle every line); query values are only
# taken for secrets from this length (`format=json` is not one).
MIN_SECRET_CHARS = 4


def _expand(value: Any, path: str, env: dict[str, str], found: list[str]) -> Any:
    """`value` with `${VAR}` expanded in every string; values put into upstream tables (but
    not their `_NOT_SECRET_KEYS`) are appended to `found`."""
    if isinstance(value, str):
        key = _UPSTREAM_KEY_RE.match(path)
        secret = (key is not None and key.group(1) not in _NOT_SECRET_KEYS) or path == "store.url"
        return no_nul(expand_vars(value, env, path, found if secret else None), path)
    if isinstance(value, dict):
        return {no_nul(k, f"{path}.{k!r}" if path else repr(k)): _expand(v, f"{path}.{k}" if path else k, env, found)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, f"{path}[{i}]", env, found) for i, v in enumerate(value)]
    return value


def _friendly(exc: msgspec.ValidationError, raw: dict[str, Any]) -> str:
    """Turn msgspec's `... - at `$.upstream[0].foo`` into a message naming key and table."""
    msg = str(exc)
    m = re.search(r" - at `\$(.*)`$", msg)
    where = m.group(1).lstrip(".") if m else ""
    text = msg[: m.start()] if m else msg
    unknown = re.match(r"Object contains unknown field `(.+)`", text)
    table = where or "top level"
    if where.startswith("upstream["):
        idx = int(where[len("upstream[") : where.index("]")])
        try:
            table = f"upstream {raw['upstream'][idx].get('name', idx)!r} ({where})"
        except (KeyError, IndexError, AttributeError, TypeError):
            pass
    if unknown:
        return f"unknown key {unknown.group(1)!r} in [{table}]"
    if where.endswith(".transport") or text.startswith("Object missing required field `transport`"):
        return f"{text} in [{table}]; transport must be one of stdio, sse, http"
    return f"{text} at [{table}]" if where else text


def parse(text: str, *, source: str = "<string>", env: dict[str, str] | None = None) -> Config:
    """Parse TOML text into a Config, raising ConfigError with a message naming the key."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from exc
    for key in _DERIVED_KEYS:
        if key in raw:
            raise ConfigError(f"{source}: unknown key {key!r} in [top level]")
    found: list[str] = []
    try:
        raw = _expand(raw, "", config_environment() if env is None else env, found)
    except ConfigError as exc:  # a variable that is not set: the message names the key
        raise ConfigError(f"{source}: {exc}") from exc
    raw["expanded_secrets"] = tuple(dict.fromkeys(found))
    try:
        cfg = msgspec.convert(raw, Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {_friendly(exc, raw)}") from exc
    names = [u.name for u in cfg.upstream]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"{source}: upstream name {dupes[0]!r} is used more than once")
    reserved = sorted(RESERVED_NAMES.intersection(names))
    if reserved:
        raise ConfigError(f"{source}: upstream name {reserved[0]!r} is reserved (metrics and events label calls "
                          f"that reach no upstream so); choose another name")
    unknown_scope = [s for s in cfg.search.scope if s not in names]
    if unknown_scope:
        raise ConfigError(f"{source}: [search] scope names unknown upstream {unknown_scope[0]!r}")
    check_access(cfg.access, names, [i.issuer for i in cfg.http.oauth.issuers], source)
    for up in cfg.upstream:
        if isinstance(up, StdioUpstream) and not up.command.strip():
            raise ConfigError(f"{source}: upstream {up.name!r} has an empty command")
        problem = url_problem(up.url, ("http", "https"), Redactor(secrets(cfg))) if not isinstance(up, StdioUpstream) else None
        if problem:
            raise ConfigError(f"{source}: upstream {up.name!r} url {problem}")
        for header, value in ({} if isinstance(up, StdioUpstream) else up.headers).items():
            if problem := header_problem(header, value):
                raise ConfigError(f"{source}: upstream {up.name!r} header {header!r} {problem}")
    problem = url_problem(cfg.store.url, ("postgresql", "postgres"), Redactor(secrets(cfg)),
                          libpq=True) if cfg.store.url else None
    if problem:
        raise ConfigError(f"{source}: [store] url {problem}")
    if cfg.daemon.metrics_addr:
        host_port(cfg.daemon.metrics_addr, key="[daemon] metrics_addr", source=source)
    check_http(cfg.http, source)
    _check_endpoints(cfg, names, source)
    cfg = _resolve_paths(cfg, Path(source).parent if source != "<string>" else Path.cwd(), source)
    from toolatlas.guidance import TemplateSet

    # A bad template fails here, naming file and placeholder (the daemon's and each endpoint's).
    for folder in (cfg.surface.templates, *(ep.templates for ep in cfg.endpoint if ep.templates)):
        try:
            TemplateSet.load(folder)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from exc
    return cfg


def _check_endpoints(cfg: Config, upstreams: list[str], source: str) -> None:
    seen: set[str] = set()
    paths: set[str] = set()
    for ep in cfg.endpoint:
        where = f"[[endpoint]] {ep.name!r}"
        if ep.name == "default" or ep.name in seen:
            raise ConfigError(f"{source}: {where}: the name is used more than once (\"default\" is the "
                              "[daemon] socket's)")
        seen.add(ep.name)
        if not ep.socket and not ep.http_path:
            raise ConfigError(f"{source}: {where} has neither a socket nor an http_path; give it one or both")
        if ep.http_path:
            if not cfg.http.listen:
                raise ConfigError(f"{source}: {where} has http_path {ep.http_path!r} but [http] listen is not set")
            if ep.http_path.rstrip("/") == "/mcp" or ep.http_path.startswith("/.well-known") or ep.http_path in paths:
                raise ConfigError(f"{source}: {where}: http_path {ep.http_path!r} is taken (by /mcp, the well-known "
                                  "metadata or another endpoint)")
            paths.add(ep.http_path)
        unknown = [u for u in ep.upstreams if u != "*" and u not in upstreams]
        if unknown:
            raise ConfigError(f"{source}: {where} names unknown upstream {unknown[0]!r}")
        if not ep.upstreams:
            raise ConfigError(f"{source}: {where} lists no upstreams; name them (or \"*\" for all)")


def listen_address(http: HttpSection) -> tuple[str, int]:
    """(host, port) of the HTTP endpoint's `[http] listen` (checked by `parse`)."""
    return host_port(http.listen, key="[http] listen")


def metrics_address(cfg: Config) -> tuple[str, int] | None:
    """(host, port) of the Prometheus endpoint, or None when `metrics_addr` is ""."""
    if not cfg.daemon.metrics_addr:
        return None
    return host_port(cfg.daemon.metrics_addr, key="[daemon] metrics_addr", source=cfg.source)


def _stdio_command(command: str, cwd: str | None, base: Path) -> str:
    """A stdio upstream's command as the daemon starts it: a leading `~` is the home folder
    (as doctor looks for it); a relative path (`./bin/server`) is from the config file's
    folder without a `cwd`, from the `cwd` with one (exec's rule); a bare name is on PATH."""
    command = os.path.expanduser(command) if command.startswith("~") else command
    if "/" in command and not os.path.isabs(command) and not cwd:
        return str(base / command)
    return command


def _resolve_paths(cfg: Config, base: Path, source: str) -> Config:
    daemon = msgspec.structs.replace(
        cfg.daemon,
        socket=socket_path(cfg.daemon.socket, base),
        state_dir=resolve_path(cfg.daemon.state_dir, base) or default_state_dir(),
    )
    ups = [
        msgspec.structs.replace(u, cwd=resolve_path(u.cwd, base) if u.cwd else u.cwd,
                                command=_stdio_command(u.command, u.cwd, base))
        if isinstance(u, StdioUpstream) else u
        for u in cfg.upstream
    ]
    surface = msgspec.structs.replace(cfg.surface, templates=resolve_path(cfg.surface.templates, base) or "")
    events = msgspec.structs.replace(cfg.events, audit_file=resolve_path(cfg.events.audit_file, base) or "")
    endpoints = [msgspec.structs.replace(ep, socket=resolve_path(ep.socket, base), templates=resolve_path(ep.templates, base))
                 for ep in cfg.endpoint]
    sockets = [unix_socket_path(s, source) for s in (daemon.socket, *(ep.socket for ep in endpoints if ep.socket))]
    if len(set(sockets)) != len(sockets):
        raise ConfigError(f"{source}: [[endpoint]] socket: two endpoints (or one and [daemon] socket) share a path")
    for ep in endpoints:
        if ep.templates and not os.path.isdir(ep.templates):
            raise ConfigError(f"{source}: [[endpoint]] {ep.name!r}: templates {ep.templates!r} is not a folder")
    return msgspec.structs.replace(cfg, daemon=daemon, surface=surface, events=events, upstream=ups, endpoint=endpoints,
                                   source=source)


def load(path: str | os.PathLike[str], *, env: dict[str, str] | None = None) -> Config:
    """Read and parse a config file (`${VAR}` from `env`, default the environment);
    ConfigError if it is missing or invalid."""
    p = Path(path)
    try:
        text = read_config(p)
    except OSError as exc:
        raise ConfigError(f"cannot read config {str(p)!r}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read config {str(p)!r}: it is not UTF-8 text") from exc
    return parse(text, source=str(p), env=env)


def secrets(cfg: Config) -> list[str]:
    """Values that must never appear in logs, events, status, errors or card files: every
    upstream env and header value, every value `${VAR}` put into an upstream (args, url,
    env, headers) or into `[store] url`, and a URL's password and query values. See `toolatlas.redact`."""
    out: list[str] = list(cfg.expanded_secrets)
    for up in cfg.upstream:
        if isinstance(up, StdioUpstream):
            out.extend(up.env.values())
        else:
            out.extend(up.headers.values())
            out.extend(url_secrets(up.url))
    out.extend(url_secrets(cfg.store.url))
    return [v for v in dict.fromkeys(out) if len(v) >= MIN_SECRET_CHARS]
