"""An `Adoption` as toolatlas TOML, checked by the daemon's own config parser before anyone
sees it."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import re
import tomllib
from collections.abc import Iterable
from typing import Any

from toolatlas.adopt.clients import AdoptError
from toolatlas.adopt.convert import Adopted, Adoption, upstream_name
from toolatlas.paths import default_socket_path, default_state_dir

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def toml_string(value: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters (DEL too) escaped."""
    out = []
    for ch in value:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        elif 0xD800 <= ord(ch) <= 0xDFFF:
            raise AdoptError("a value holds a lone surrogate (\\ud800-\\udfff), which is not valid Unicode")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else toml_string(key)


def _table(values: dict[str, str]) -> str:
    return "{ " + ", ".join(f"{_key(k)} = {toml_string(v)}" for k, v in values.items()) + " }" if values else "{}"


def _upstream(up: Adopted) -> list[str]:
    lines = [f"# from {up.label}", "[[upstream]]", f"name = {toml_string(up.name)}", f'transport = "{up.transport}"']
    if up.transport == "stdio":
        lines.append(f"command = {toml_string(up.command)}")
        lines.append("args = [" + ", ".join(toml_string(a) for a in up.args) + "]")
        lines.append(f"env = {_table(up.env)}")
        if up.cwd:
            lines.append(f"cwd = {toml_string(up.cwd)}")
    else:
        lines.append(f"url = {toml_string(up.url)}")
        lines.append(f"headers = {_table(up.headers)}")
    return lines


def render(adoption: Adoption, *, today: _dt.date | None = None) -> str:
    """The config text: a [daemon] section with laptop defaults (the socket and state folder
    every toolatlas command finds without flags; see paths.py) and one [[upstream]] per
    adopted server."""
    day = (today or _dt.date.today()).isoformat()
    src = adoption.source
    lines = [
        f"# Adopted from {src.path} ({src.kind.value}) by `toolatlas adopt` on {day}.",
        "# Check it with `toolatlas check-config FILE`; `toolatlas doctor --config FILE` checks the setup.",
    ]
    if adoption.exports.needed:
        lines.append("# The daemon's environment must set: " + ", ".join(sorted(adoption.exports.needed)))
    lines += [
        "",
        "[daemon]",
        "# The socket and state folder toolatlas uses by default for this user.",
        f"socket = {toml_string(default_socket_path())}",
        f"state_dir = {toml_string(default_state_dir())}",
        'socket_mode = "0600"                 # only this user may connect',
        'metrics_addr = ""                    # Prometheus /metrics off; e.g. "127.0.0.1:9464"',
    ]
    for up in adoption.upstreams:
        lines += ["", *_upstream(up)]
    text = "\n".join(lines) + "\n"
    check(text, adoption)
    return text


def _same(have: dict[str, Any], up: Adopted) -> bool:
    """Whether an [[upstream]] table of an existing config runs the same server as `up`."""
    mine = {"transport": up.transport, "command": up.command, "args": list(up.args), "env": up.env,
            "cwd": up.cwd, "url": up.url, "headers": up.headers}
    defaults: dict[str, Any] = {"command": "", "args": [], "env": {}, "cwd": None, "url": "", "headers": {}}
    return all(have.get(k, defaults.get(k)) == v for k, v in mine.items())


def merge(existing: str, adoption: Adoption, where: str) -> tuple[str, list[str], list[str]]:
    """`existing` (a toolatlas config's text, kept byte for byte) with the adopted upstreams
    it does not have yet appended; a server it already runs is not added twice. Returns the
    text, the names added, and notes (what was found there already, what was renamed)."""
    try:
        have = tomllib.loads(existing).get("upstream", [])
    except tomllib.TOMLDecodeError as exc:
        raise AdoptError(f"{where} exists and is not a toolatlas config ({exc}); pass --force to replace it") from exc
    have = [h for h in have if isinstance(h, dict)]
    taken = {str(h.get("name")) for h in have}
    lines: list[str] = []
    added: list[str] = []
    notes: list[str] = []
    for up in adoption.upstreams:
        twin = next((h for h in have if _same(h, up)), None)
        if twin is not None:
            notes.append(f"{up.label}: {where} already has this server as {twin.get('name')!r}")
            continue
        name = upstream_name(up.name, taken)
        if name != up.name:
            notes.append(f"{up.label}: upstream name {name!r} ({where} has {up.name!r} already)")
        taken.add(name)
        added.append(name)
        lines += ["", *_upstream(dataclasses.replace(up, name=name))]
    text = existing if existing.endswith("\n") or not existing else existing + "\n"
    if lines:
        text += "\n".join([f"# added by `toolatlas adopt {adoption.source.path}` on {_dt.date.today().isoformat()}",
                           *lines[1:]]).join(["\n", "\n"])
    check(text, adoption)
    return text, added, notes


def stand_in_env(text: str, needed: Iterable[str]) -> dict[str, str]:
    """The environment with every variable `text` reads (and `needed`) set to a stand-in: a URL
    where a value is the variable whole (VS Code `"url": "${input:url}"`), else a plain word
    (inside a URL a password or query value: "://" there would make the URL unparsable)."""
    import os

    referenced = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", text)) | set(needed)
    whole = set(re.findall(r'"\$\{([A-Za-z_][A-Za-z0-9_]*)\}"', text))
    return {**os.environ, **{var: "http://stand-in.invalid/" if var in whole else "stand-in"
                             for var in referenced if var != "HOME"}}


def check(text: str, adoption: Adoption) -> None:
    """Parse `text` as the daemon would (every variable it reads set to a stand-in), so a
    config `adopt` writes always passes `check-config` once its variables are exported."""
    from toolatlas.config import parse
    from toolatlas.errors import ConfigError

    try:
        parse(text, source="<adopted config>", env=stand_in_env(text, adoption.exports.needed))
    except ConfigError as exc:
        raise AdoptError(f"the adopted config does not parse (a bug in adopt; please report it): {exc}") from exc
