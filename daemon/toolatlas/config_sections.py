"""The [http], [http.oauth], [events] and [[endpoint]] tables of the config (re-exported by
toolatlas.config, which parses the whole file), and the one parser of listen addresses."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable
from typing import Annotated, Literal

import msgspec

from toolatlas.errors import ConfigError

NAME_RE = r"^[a-z0-9][a-z0-9-]*$"
_Seconds = Annotated[float, msgspec.Meta(gt=0)]
UpstreamName = Annotated[str, msgspec.Meta(pattern=NAME_RE, max_length=48)]
# The upstream label of refused or unroutable calls in metrics and events: no upstream may be named so.
RESERVED_NAMES = frozenset({"unknown", "none"})


class SurfaceSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What the model reads (toolatlas.guidance): `templates` is a folder overriding the
    shipped tool_search.md, execute_tool.md, catalog_status.md, instructions.md ("" = the
    defaults); `publisher_text = "append"` adds a carded tool's (sanitized) publisher
    description after the card's text in tool_search matches, "omit" leaves it out."""

    templates: str = ""
    publisher_text: Literal["omit", "append"] = "omit"


class StoreSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """State shared by replicas in PostgreSQL (see toolatlas/store); off while `url` is "".

    `url` is a libpq URL (`postgresql://user:${PGPASSWORD}@host:5432/db`); its password and
    every `${VAR}` put into it are secrets (redacted everywhere). Writes wait in an on-disk
    buffer under state_dir (at most `buffer_max_bytes`) while the database is unreachable."""

    url: str = ""
    connect_timeout: _Seconds = 5.0
    # Seconds between catch-up reads (a missed notification is picked up by the next one).
    catchup_interval: _Seconds = 1.0
    # Seconds between reconnect attempts while the database is down.
    retry_interval: _Seconds = 1.0
    buffer_max_bytes: Annotated[int, msgspec.Meta(ge=4096)] = 64 * 1024 * 1024


class HttpToken(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One bearer token of the HTTP endpoint: its name (what [[access]] `tokens` match) and the
    SHA-256 of the token text in hex (the token itself is never stored)."""

    name: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    sha256: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-fA-F]{64}$")]


# Signature algorithms an OAuth access token may use: asymmetric only (never "none", never an
# HS* secret, which a public JWKS key must not be taken for).
ASYMMETRIC_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")


class OAuthIssuer(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """An authorization server whose access tokens the HTTP endpoint accepts."""

    issuer: Annotated[str, msgspec.Meta(min_length=1)]  # the token's `iss`, exactly
    jwks_url: str  # where its signing keys are published (JWKS)
    audience: str = ""  # the `aud` required; "" = the endpoint's resource URL


class OAuthSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The HTTP endpoint as an OAuth 2.1 resource server (the MCP authorization spec)."""

    issuers: list[OAuthIssuer] = []
    # The endpoint's origin as clients reach it (behind a proxy: "https://mcp.example.com");
    # "" = http://LISTEN. Each endpoint's resource URL is this plus its path.
    resource: str = ""
    algorithms: list[str] = msgspec.field(default_factory=lambda: ["RS256", "ES256"])
    leeway: Annotated[float, msgspec.Meta(ge=0, le=300)] = 30.0  # seconds of clock skew on exp/nbf/iat
    jwks_ttl: Annotated[float, msgspec.Meta(ge=1)] = 300.0  # seconds a fetched JWKS is used
    # An unknown `kid` refetches the JWKS (a rotated key), at most once per this many seconds.
    jwks_min_refresh: Annotated[float, msgspec.Meta(ge=0)] = 10.0
    scopes_supported: list[str] = []  # advertised in the protected resource metadata


class HttpSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The optional streamable-HTTP endpoint (`http://LISTEN/mcp`); off while `listen` is ""."""

    listen: str = ""  # HOST:PORT, e.g. "127.0.0.1:8765"
    # Host header values accepted (DNS-rebinding protection); [] = the listen address plus
    # localhost/127.0.0.1/[::1] at its port. "name:*" admits any port.
    allowed_hosts: list[str] = []
    # Origin header values accepted from browsers; a request without Origin is accepted.
    # [] = the endpoint's own origins (http://HOST for each allowed Host).
    allowed_origins: list[str] = []
    tokens: list[HttpToken] = []
    # The principal name given to requests WITHOUT an Authorization header ("" = refuse them
    # with 401). For loopback development and conformance runs; [[access]] `tokens` can name it.
    anonymous: str = ""
    oauth: OAuthSection = msgspec.field(default_factory=OAuthSection)


class EventsSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The audit trail: audit events (toolatlas.events.AUDIT_EVENTS) also go, as JSON lines, to
    `audit_file` (mode 0600; "" = stderr only). It is rotated when the next line would take it
    over `audit_max_bytes`; `audit_keep` rotated files (PATH.1 the newest) are kept."""

    audit_file: str = ""
    audit_max_bytes: Annotated[int, msgspec.Meta(ge=4096)] = 64 * 1024 * 1024
    audit_keep: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 5


class Endpoint(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A named endpoint: its own Unix socket and/or HTTP path (on [http] listen), serving only
    `upstreams` ("*" = all) from the daemon's one pool and index. `environment` is its label
    (e.g. "production"); `templates` a folder of meta-tool texts for its clients."""

    name: UpstreamName
    socket: str = ""
    http_path: Annotated[str, msgspec.Meta(pattern=r"^(/[A-Za-z0-9._~-]+)+$")] | Literal[""] = ""
    upstreams: list[str] = []
    environment: Annotated[str, msgspec.Meta(max_length=64)] = ""
    templates: str = ""


def host_port(addr: str, *, key: str, source: str = "<config>", default_host: str | None = "127.0.0.1") -> tuple[str, int]:
    """`HOST:PORT` (IPv6 as `[::1]:PORT`) as (host, port); the one parser of listen addresses.

    An empty host means `default_host`; with `default_host=None` a host is required. Raises
    ConfigError naming `key` when the text is not HOST:PORT with a port in 0..65535.
    """
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or int(port) > 65535 or not (host or default_host):
        raise ConfigError(f"{source}: {key} must be HOST:PORT, got {addr!r}")
    return host.strip("[]") or str(default_host), int(port)


# Query values are only taken for secrets from this length (`format=json` is not one).
MIN_QUERY_SECRET_CHARS = 8


def url_secrets(url: str) -> list[str]:
    """The password in `url`'s userinfo and its longer query values, as written and decoded.
    A URL too broken to split (the config load refuses it) is a secret whole."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return [url]
    found = [parts.password or ""]
    for pair in parts.query.split("&"):
        value = pair.partition("=")[2]
        if len(value) >= MIN_QUERY_SECRET_CHARS:
            found.append(value)
    return [form for raw in found for form in dict.fromkeys((raw, urllib.parse.unquote_plus(raw))) if form]


def url_problem(url: str, schemes: tuple[str, ...], redact: Callable[[str], str] = str, *,
                libpq: bool = False) -> str | None:
    """Why `url` cannot be used (scheme not one of `schemes`, unparsable, no host, a bad
    port), worded to follow "... url", or None. The URL is echoed through `redact`, except
    when it cannot be split (its secrets cannot be found then). `libpq`: the authority may
    list hosts, comma-separated (`db1:5432,db2:5432`), each checked, or name none when a
    `host` query parameter does (a Unix socket's folder)."""
    prefixes = tuple(f"{s}://" for s in schemes)
    if not url.startswith(prefixes):
        return f"must start with {' or '.join(prefixes)}, got {redact(url)!r}"
    try:
        parts = urllib.parse.urlsplit(url)
        hosts = parts.netloc.rpartition("@")[2].split(",") if libpq else []
        each = [urllib.parse.urlsplit(f"//{host}") for host in hosts] if len(hosts) > 1 else [parts]
        for one in each:
            one.port  # noqa: B018 - raises ValueError for a port that is not 0..65535
    except ValueError as exc:
        return f"is not a valid URL: {exc}"
    if libpq and not parts.netloc.rpartition("@")[2] and urllib.parse.parse_qs(parts.query).get("host"):
        return None
    if not all(one.hostname for one in each):
        return f"names no host, got {redact(url)!r}"
    return None


_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_VALUE_BAD = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def header_problem(name: str, value: str) -> str | None:
    """Why an upstream's HTTP header cannot be sent, worded to follow "header NAME", or None.
    The value is never echoed (headers carry tokens); a line break in one (a token pasted with
    its newline) otherwise failed every connect with an error quoting it, past the redaction."""
    if not _HEADER_NAME.fullmatch(name):
        return "is not a valid HTTP header name (letters, digits and !#$%&'*+-.^_`|~ only)"
    if _HEADER_VALUE_BAD.search(value):
        return "has a line break or another control character in its value, which HTTP does not allow; remove it"
    if value != value.strip(" \t"):
        return "has spaces at the start or end of its value, which HTTP does not allow; remove them"
    return None


class AccessRule(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Who may use which upstreams. A socket client matches a rule by its kernel-reported
    uid (`users`: names or numeric uids) or any of its groups (`groups`: names or gids);
    it may use the union of `servers` ("*" = all) of every rule it matches."""

    users: list[str | int] = []
    groups: list[str | int] = []
    # Names of HTTP bearer tokens (see [http]) this rule applies to.
    tokens: list[str] = []
    # OAuth access tokens ([http.oauth]) this rule applies to: by `sub`, by a value of the
    # `groups` or `roles` claim, or by a `scope` value; with `oauth_issuers`, only tokens of
    # those issuers (each issuer names its own subjects, groups and scopes), all of their
    # tokens when no other oauth_* key is given.
    oauth_subjects: list[str] = []
    oauth_groups: list[str] = []
    oauth_scopes: list[str] = []
    oauth_issuers: list[str] = []
    servers: list[str] = []


def check_access(rules: list[AccessRule], upstreams: list[str], issuers: list[str], source: str) -> None:
    """ConfigError for a rule naming an upstream or [http.oauth] issuer that is not
    configured, or no one at all."""
    for i, rule in enumerate(rules, 1):
        unknown = [x for x in rule.servers if x != "*" and x not in upstreams]
        if unknown:
            raise ConfigError(f"{source}: [[access]] rule {i} names unknown upstream {unknown[0]!r}")
        if strangers := [x for x in rule.oauth_issuers if x not in issuers]:
            raise ConfigError(f"{source}: [[access]] rule {i}: oauth_issuers names {strangers[0]!r}, which is not "
                              f"an [http.oauth] issuer ({', '.join(issuers) or 'none configured'})")
        if not (rule.users or rule.groups or rule.tokens or rule.oauth_subjects or rule.oauth_groups
                or rule.oauth_scopes or rule.oauth_issuers):
            raise ConfigError(f"{source}: [[access]] rule {i} names no users, groups, tokens or oauth_* claims")


def check_http(http: HttpSection, source: str) -> None:
    if not http.listen:
        return
    host_port(http.listen, key="[http] listen", source=source, default_host=None)
    names = [t.name for t in http.tokens]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"{source}: [[http.tokens]] name {dupes[0]!r} is used more than once")
    hashes: dict[str, str] = {}
    for t in http.tokens:
        if (other := hashes.setdefault(t.sha256.lower(), t.name)) != t.name:
            raise ConfigError(f"{source}: [[http.tokens]] {other!r} and {t.name!r} have the same sha256: one token would "
                              f"be both, and every request with it {t.name!r} alone; give each its own token")
    if http.anonymous and http.anonymous in names:
        raise ConfigError(f"{source}: [http] anonymous {http.anonymous!r} is also a [[http.tokens]] name: requests "
                          "without a token would be that token (its access, its sessions); give anonymous its own name")
    oauth = http.oauth
    if not http.tokens and not http.anonymous and not oauth.issuers:
        raise ConfigError(f"{source}: [http] listen is set but no [[http.tokens]] are configured "
                          "(and no [http] anonymous or [http.oauth] issuers); every request would be refused")
    bad = [a for a in oauth.algorithms if a not in ASYMMETRIC_ALGORITHMS]
    if bad or not oauth.algorithms:
        raise ConfigError(f"{source}: [http.oauth] algorithms: {bad[0] if bad else 'an empty list'!r} is not accepted; "
                          f"use asymmetric ones only: {', '.join(ASYMMETRIC_ALGORITHMS)}")
    issuers = [i.issuer for i in oauth.issuers]
    if len(set(issuers)) != len(issuers):
        raise ConfigError(f"{source}: [http.oauth] issuers: an issuer is listed more than once")
    for i in oauth.issuers:
        problem = url_problem(i.jwks_url, ("http", "https"))
        if problem:
            raise ConfigError(f"{source}: [http.oauth] issuer {i.issuer!r}: jwks_url {problem}")
        host = urllib.parse.urlsplit(i.jwks_url).hostname or ""
        plain_ok = i.jwks_url.startswith("http://") and host in ("127.0.0.1", "localhost", "::1")
        if not (i.jwks_url.startswith("https://") or plain_ok):
            raise ConfigError(f"{source}: [http.oauth] issuer {i.issuer!r}: jwks_url must start with https:// "
                              f"(http:// only on loopback), got {i.jwks_url!r}")
    problem = url_problem(oauth.resource, ("http", "https")) if oauth.resource else None
    if problem:
        raise ConfigError(f"{source}: [http.oauth] resource {problem}")


__all__ = ["ASYMMETRIC_ALGORITHMS", "AccessRule", "Endpoint", "EventsSection", "HttpSection", "HttpToken", "NAME_RE",
           "OAuthIssuer", "OAuthSection", "RESERVED_NAMES", "UpstreamName", "check_access", "check_http", "header_problem",
           "host_port", "url_problem", "url_secrets"]
