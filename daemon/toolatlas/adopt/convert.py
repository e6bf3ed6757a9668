"""Client server entries -> toolatlas upstreams (pure).

Every entry ends up either adopted (an `Adopted` upstream) or `Skipped` with the reason; none
is dropped silently. Names become valid upstream names (`[a-z0-9][a-z0-9-]*`, unique), secrets
stay out (see `values`), and what was changed or guessed is said in `notes`.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from toolatlas.adopt.clients import ClientFile, SourceEntry, Where
from toolatlas.adopt.values import Context, Exports, Unsupported
from toolatlas.config_sections import RESERVED_NAMES

NAME_MAX = 48  # config.UpstreamName
_TYPES = {"stdio": "stdio", "sse": "sse", "http": "http", "streamable-http": "http", "streamablehttp": "http",
          "streamable_http": "http", "streamable": "http"}
# Keys clients keep for their own use; toolatlas has no use for them (said in a note, not an error).
_CLIENT_KEYS = frozenset({"autoApprove", "alwaysAllow", "disabledTools", "enabledTools", "timeout", "description",
                          "trust", "includeTools", "excludeTools", "dev", "gallery", "version", "autoStart",
                          "alwaysLoad", "icon", "name", "networkTimeout"})
_ENTRY_KEYS = frozenset({"command", "args", "env", "cwd", "type", "transport", "transportType", "url", "serverUrl",
                         "httpUrl", "headers", "disabled", "enabled", "envFile"})


@dataclass(frozen=True)
class Adopted:
    name: str
    transport: str  # stdio | sse | http
    label: str  # where it was in the client file
    source_name: str = ""  # its name there
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)

    def same_server(self, other: Adopted) -> bool:
        return (self.transport, self.command, self.args, self.env, self.cwd, self.url, self.headers) == (
            other.transport, other.command, other.args, other.env, other.cwd, other.url, other.headers)


@dataclass(frozen=True)
class Skipped:
    name: str
    label: str
    reason: str


@dataclass
class Adoption:
    """What `adopt` makes of one client file."""

    source: ClientFile
    upstreams: list[Adopted] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    exports: Exports = field(default_factory=Exports)
    # Entries the rewritten client file no longer needs: the adopted ones and old shim entries.
    replaced: list[Where] = field(default_factory=list)


def upstream_name(raw: str, taken: set[str]) -> str:
    """`raw` as an upstream name: lower case, runs of other characters as one '-', at most
    48 characters, "-2", "-3"... appended when `taken` has it already or it is reserved."""
    base = re.sub(r"[^a-z0-9]+", "-", raw.lower()).strip("-")[:NAME_MAX].strip("-") or "server"
    name, i = base, 2
    while name in taken or name in RESERVED_NAMES:
        suffix = f"-{i}"
        name, i = base[: NAME_MAX - len(suffix)].rstrip("-") + suffix, i + 1
    return name


def is_toolatlas_shim(spec: dict[str, Any]) -> bool:
    """Whether an entry already launches `toolatlas shim` (a second adopt must not wrap it)."""
    argv = [spec.get("command")] + list(spec.get("args") or [])
    words = [os.path.basename(a) if isinstance(a, str) else "" for a in argv]
    return "shim" in words and "toolatlas" in words


def _strings(value: Any, what: str, *, allow_scalars: bool = True) -> list[str]:
    if not isinstance(value, list):
        raise Unsupported(f"{what} is a JSON {type(value).__name__}, not a list")
    return [_string(v, f"{what}[{i}]", allow_scalars) for i, v in enumerate(value)]


def _string(value: Any, what: str, allow_scalars: bool = True) -> str:
    if isinstance(value, str):
        return value
    if allow_scalars and isinstance(value, (int, float, bool)):
        return json.dumps(value)
    raise Unsupported(f"{what} is a JSON {type(value).__name__}, not a string")


def _mapping(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise Unsupported(f"{what} is a JSON {type(value).__name__}, not an object")
    return {str(k): _string(v, f"{what}.{k}") for k, v in value.items()}


def shown_url(url: object) -> str:
    """A URL as messages may show it: scheme, host and path (no userinfo, query or fragment,
    where secrets live)."""
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(str(url))
    except ValueError:
        return "(an unparsable url)"
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}{parts.path}"[:120] if parts.scheme else "(not a URL)"


def _transport(spec: dict[str, Any], ctx: Context) -> str:
    declared = spec.get("type", spec.get("transport", spec.get("transportType")))
    url = spec.get("url") or spec.get("serverUrl") or spec.get("httpUrl")
    if declared is not None:
        key = str(declared).lower()
        if key not in _TYPES:
            raise Unsupported(f"transport {declared!r} is not supported (toolatlas speaks stdio, sse and http)")
        return _TYPES[key]
    if "command" in spec and url:
        raise Unsupported("it has both a command and a url, and no type to choose between them")
    if "command" in spec:
        return "stdio"
    if url:
        scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", str(url))
        if scheme and scheme[1].lower() not in ("http", "https"):  # ws://: no transport to guess
            raise Unsupported(f"its url {shown_url(url)} is not http(s) (toolatlas speaks stdio, sse and http)")
        if "httpUrl" in spec:
            return "http"
        guess = "sse" if str(url).rstrip("/").endswith("/sse") else "http"
        ctx.notes.append(f"{ctx.label}: no type given; {shown_url(url)} taken as "
                         f"{'SSE' if guess == 'sse' else 'streamable HTTP'} (set transport in the TOML if wrong)")
        return guess
    raise Unsupported("it has neither a command nor a url")


def _env_file(path: str, ctx: Context) -> dict[str, str]:
    """The keys of an `envFile`, each as `${KEY}`: their values stay in that file and must
    reach the daemon's environment."""
    p = Path(ctx.text(path)).expanduser()
    if not p.is_absolute() and ctx.base_dir is not None:
        p = ctx.base_dir / p
    try:
        lines = p.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise Unsupported(f"its envFile {str(p)!r} cannot be read ({exc})") from exc
    out = {}
    for line in lines:
        key = line.strip().removeprefix("export ").partition("=")[0].strip()
        if key and not key.startswith("#") and "=" in line and re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            ctx.exports.need(key, f"from the envFile {str(p)!r} of {ctx.label}")
            out[key] = f"${{{key}}}"
    return out


def _project_relative(base: Path, command: str, args: Any) -> bool:
    """Whether `command` or an argument is a relative path (`./run.sh`, `dist/server.js`, `.`)
    that names something in the project folder `base`."""
    words = [command, *(a for a in args if isinstance(a, str))] if isinstance(args, list) else [command]
    return base.is_dir() and any(
        w.startswith(("./", "../")) or (w and not w.startswith(("/", "~", "$", "-")) and (base / w).exists())
        for w in words)


def convert_entry(entry: SourceEntry, name: str, ctx: Context) -> Adopted:
    """One client entry as an upstream named `name`; Unsupported says why it cannot be."""
    spec = entry.spec
    if not isinstance(spec, dict):
        raise Unsupported(f"the entry is a JSON {type(spec).__name__}, not an object")
    if spec.get("disabled") is True or spec.get("enabled") is False:
        raise Unsupported("it is disabled in the client")
    ignored = sorted(k for k in spec if k not in _ENTRY_KEYS)
    if ignored:
        unknown = [k for k in ignored if k not in _CLIENT_KEYS]
        ctx.notes.append(f"{ctx.label}: not carried over (client-only settings): {', '.join(ignored)}"
                         + (" (unknown keys, check them)" if unknown else ""))
    transport = _transport(spec, ctx)
    if transport == "stdio":
        command = spec.get("command")
        if not isinstance(command, str) or not command.strip():
            raise Unsupported("a stdio entry without a command")
        env = {k: ctx.env_value(k, v) for k, v in _mapping(spec.get("env") or {}, "env").items()}
        if isinstance(spec.get("envFile"), str):
            env = {**_env_file(spec["envFile"], ctx), **env}
        cwd = spec.get("cwd")
        if cwd is not None:
            cwd = ctx.text(_string(cwd, "cwd", allow_scalars=False))
            if not cwd.startswith(("/", "$", "~")) and entry.base_dir is not None:
                cwd = str(entry.base_dir / cwd)
        elif entry.base_dir is not None and _project_relative(entry.base_dir, command, spec.get("args")):
            # The client starts a project's server in the project folder: `node dist/server.js`
            # and `./run.sh` name files there, and the daemon must start it there too.
            cwd = str(entry.base_dir)
            ctx.notes.append(f"{ctx.label}: cwd {cwd!r}, the project folder the client starts it in "
                             "(its command or arguments name files there)")
        return Adopted(name, "stdio", entry.label, entry.name, command=ctx.text(command),
                       args=tuple(ctx.args(_strings(spec.get("args") or [], "args"))), env=env, cwd=cwd)
    url = spec.get("url") or spec.get("serverUrl") or spec.get("httpUrl")
    if not isinstance(url, str) or not url:
        raise Unsupported(f"a {transport} entry without a url")
    if "command" in spec:
        ctx.notes.append(f"{ctx.label}: its command is ignored: it is a {transport} server at {shown_url(url)}")
    out_url = ctx.url(url)
    if not out_url.startswith(("http://", "https://", "${")):
        raise Unsupported(f"url {shown_url(url)} is not http:// or https://")
    headers = {k: ctx.header_value(k, v) for k, v in _mapping(spec.get("headers") or {}, "headers").items()}
    return Adopted(name, transport, entry.label, entry.name, url=out_url, headers=headers)


def adopt(source: ClientFile, held: Mapping[str, str] | None = None) -> Adoption:
    """Convert every entry of `source`; see the module docstring. `held`: the variables the
    environment file already holds (a secret there keeps its name)."""
    result = Adoption(source, exports=Exports(held=dict(held or {})))
    taken: set[str] = set()
    for entry in source.entries:
        if isinstance(entry.spec, dict) and is_toolatlas_shim(entry.spec):
            result.skipped.append(Skipped(entry.name, entry.label, "it is already the toolatlas shim"))
            result.replaced.append(entry.where)
            continue
        name = upstream_name(entry.name, taken)
        if name != upstream_name(entry.name, set()) and entry.where[0] == "projects" and entry.base_dir:
            name = upstream_name(f"{entry.name}-{entry.base_dir.name}", taken)  # git-app, git-other
        ctx = Context(name, entry.label, result.exports, source.inputs, entry.base_dir, result.notes)
        mark, noted = result.exports.mark(), len(result.notes)
        try:
            up = convert_entry(entry, name, ctx)
        except Unsupported as exc:
            # What the entry's values said before the one that failed is not for this config.
            result.exports.restore(mark)
            del result.notes[noted:]
            result.skipped.append(Skipped(entry.name, entry.label, str(exc)))
            continue
        twin = next((u for u in result.upstreams if u.same_server(up) and entry.name == u.source_name), None)
        if twin is not None:
            result.notes.append(f"{entry.label}: the same server as {twin.label}; adopted once as {twin.name!r}")
            result.replaced.append(entry.where)
            continue
        if name != entry.name:
            result.notes.append(f"{entry.label}: upstream name {name!r} (names are [a-z0-9][a-z0-9-]*, unique, not 'unknown' or 'none')")
        taken.add(name)
        result.upstreams.append(up)
        result.replaced.append(entry.where)
    return result
