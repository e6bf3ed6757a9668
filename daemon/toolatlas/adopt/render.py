"""An `Adoption` as toolatlas TOML, checked by the daemon's own config parser before anyone
sees it."""

from __future__ import annotations

import datetime as _dt
import re

from toolatlas.adopt.clients import AdoptError
from toolatlas.adopt.convert import Adopted, Adoption
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


def check(text: str, adoption: Adoption) -> None:
    """Parse `text` as the daemon would (every variable it reads set to a stand-in), so a
    config `adopt` writes always passes `check-config` once its variables are exported."""
    import os

    from toolatlas.config import parse
    from toolatlas.errors import ConfigError

    # A URL may be a variable whole (VS Code `"url": "${input:url}"`): the stand-in is a URL.
    env = {**os.environ, **{var: "http://stand-in.invalid/" for var in adoption.exports.needed}}
    try:
        parse(text, source="<adopted config>", env=env)
    except ConfigError as exc:
        raise AdoptError(f"the adopted config does not parse (a bug in adopt; please report it): {exc}") from exc
