"""The strings of an adopted entry: a client's variable syntax turned into toolatlas `${VAR}`
references, and literal secrets moved out into `${VAR}` references.

A secret's value never reaches the TOML nor any message: what is printed is the variable's
name and where the value was in the client file, so the user can export it. Pure, stdlib only.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

_REF = re.compile(r"\$\{([^}]*)\}")
IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DEFAULTED = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*):-(.*)$", re.S)
# Words of a key or header name that mark its value as a secret (GITHUB_TOKEN, apiKey, X-API-Key).
_SECRET_WORDS = frozenset({"TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL",
                           "CREDENTIALS", "APIKEY", "AUTH", "AUTHORIZATION", "PAT", "COOKIE"})
# Values that are secrets whatever their key is called (well-known token formats).
_SECRET_VALUE = re.compile(r"^(sk-|sk_live_|sk_test_|ghp_|gho_|ghs_|ghu_|ghr_|github_pat_|glpat-|xox[abprs]-"
                           r"|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{30}|eyJ[A-Za-z0-9_-]{8,}\.eyJ)")
# Values under a secret-looking key that are settings, not secrets.
_PLAIN = frozenset({"true", "false", "yes", "no", "on", "off", "none", "null", "bearer", "basic", "oauth",
                    "oauth2", "header", "query"})
_SCHEME = re.compile(r"^(Bearer|Basic|Token|token|Bot)(\s+)(\S.*)$", re.S)
_HEADER_ARG = re.compile(r"^([A-Za-z0-9-]+):(\s*)(\S.*)$", re.S)


class Unsupported(Exception):
    """An entry uses something toolatlas cannot express; the message is the reason."""


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [w.upper() for w in re.split(r"[^A-Za-z0-9]+", spaced) if w]


def secret_name(name: str) -> bool:
    """Whether a key or header name says its value is a secret."""
    return bool(set(_words(name)) & _SECRET_WORDS)


def _plain(value: str) -> bool:
    v = value.strip()
    return (len(v) < 3 or v.lower() in _PLAIN or v.isdigit() or v.startswith(("/", "~/", "./", "../", "$"))
            or "://" in v)


def secret_literal(name: str, value: str) -> bool:
    """Whether `value` (literal, under key `name`) must not be written into the TOML."""
    return bool(_SECRET_VALUE.match(value)) or (secret_name(name) and not _plain(value))


def var_name(text: str) -> str:
    """`text` as an environment variable name: upper case, [A-Z0-9_], not starting with a digit."""
    out = re.sub(r"[^A-Z0-9]+", "_", text.upper()).strip("_") or "VALUE"
    return f"V_{out}" if out[0].isdigit() else out


@dataclass
class Exports:
    """The environment variables an adopted config reads: name -> why (never the value)."""

    needed: dict[str, str] = field(default_factory=dict)
    # The variables the environment file holds already (paths.environment_file): a value there
    # keeps its name, and a name there with another value is taken. Never printed.
    held: dict[str, str] = field(default_factory=dict, repr=False)
    # Literal values moved out, so two different secrets never share a name. Never printed.
    _moved: dict[str, str] = field(default_factory=dict, repr=False)

    def need(self, var: str, why: str) -> None:
        if var != "HOME":  # every login has it; naming it would only distract
            self.needed.setdefault(var, why)

    def move(self, candidates: list[str], value: str, why: str) -> str:
        """A variable to hold the literal `value`: the name it already got, else the first
        candidate name that is free, else the last one with a numeric suffix."""
        for name, moved in (*self._moved.items(), *self.held.items()):
            if moved == value:  # one value, one name, wherever it appeared
                self._moved[name] = value
                self.need(name, why)
                return name
        names = [var_name(c) for c in candidates if c]
        for name in names + [f"{names[-1]}_{i}" for i in range(2, 1000)]:
            if self._moved.get(name, self.held.get(name, value if name not in self.needed else None)) == value:
                self._moved[name] = value
                self.need(name, why)
                return name
        raise Unsupported("too many secrets under one name")  # 1000 distinct values: not a real file

    def mark(self) -> tuple[dict[str, str], dict[str, str]]:
        """What `restore` goes back to (before an entry that may turn out unadoptable)."""
        return dict(self.needed), dict(self._moved)

    def restore(self, mark: tuple[dict[str, str], dict[str, str]]) -> None:
        """Forget what was found since `mark`: a skipped entry's variables and secrets are
        neither asked for nor kept."""
        self.needed, self._moved = dict(mark[0]), dict(mark[1])

    def to_keep(self) -> dict[str, str]:
        """The moved values the environment file does not hold yet, by name."""
        return {name: value for name, value in self._moved.items() if self.held.get(name) != value}


@dataclass
class Context:
    """What translating one entry needs: where it came from and what it has found."""

    server: str
    label: str
    exports: Exports
    inputs: dict[str, str]
    base_dir: Path | None
    notes: list[str]

    def ref(self, inner: str) -> str:
        """The toolatlas form of the client reference `${inner}`."""
        if inner.startswith("env:") and IDENT.match(inner[4:]):
            self.exports.need(inner[4:], f"read by {self.label} as ${{{inner}}}")
            return f"${{{inner[4:]}}}"
        if inner.startswith("input:"):
            input_id = inner[6:]
            var = var_name(input_id)
            desc = self.inputs.get(input_id, "")
            self.exports.need(var, f"VS Code input {input_id!r}" + (f" ({desc})" if desc else ""))
            return f"${{{var}}}"
        if inner in ("userHome", "HOME"):
            return "${HOME}"
        if inner in ("pathSeparator", "/"):
            return "/"
        if inner in ("workspaceFolder", "workspaceRoot", "workspaceFolderBasename"):
            if self.base_dir is None:
                raise Unsupported(f"uses ${{{inner}}} outside a workspace (no folder to put in its place)")
            return self.base_dir.name if inner.endswith("Basename") else str(self.base_dir)
        if IDENT.match(inner):
            self.exports.need(inner, f"read by {self.label}")
            return f"${{{inner}}}"
        m = _DEFAULTED.match(inner)
        if m:
            self.exports.need(m.group(1), f"read by {self.label} (its default in the client file is not kept)")
            self.notes.append(f"{self.label}: ${{{m.group(1)}:-...}} became ${{{m.group(1)}}}: toolatlas has no "
                              f"defaults, so {m.group(1)} must be set")
            return f"${{{m.group(1)}}}"
        raise Unsupported(f"uses ${{{inner[:40]}}}, which toolatlas cannot expand")

    def text(self, value: str) -> str:
        """`value` with every client reference translated."""
        return _REF.sub(lambda m: self.ref(m.group(1)), value)

    def secret_free(self, key: str, value: str, candidates: list[str], what: str) -> str:
        """`value` translated; a literal secret (see `secret_literal`) becomes `${VAR}`."""
        if "://" in value and not _REF.search(value):  # a URL: its password and secret query values
            return self.url(value)
        if _REF.search(value) or not secret_literal(key, value):
            return self.text(value)
        var = self.exports.move(candidates, value, f"the literal value of {what} in {self.label}")
        return f"${{{var}}}"

    def env_value(self, key: str, value: str) -> str:
        return self.secret_free(key, value, [key if IDENT.match(key) else "", f"{self.server}_{key}"],
                                f"env {key}")

    def header_value(self, name: str, value: str) -> str:
        m = _SCHEME.match(value)
        if m and not _REF.search(value) and (secret_name(name) or secret_literal(name, m.group(3))):
            var = self.exports.move([f"{self.server}_TOKEN"], m.group(3),
                                    f"the {m.group(1)} credential of header {name} in {self.label}")
            return f"{m.group(1)}{m.group(2)}${{{var}}}"
        return self.secret_free(name, value, [f"{self.server}_{name}"], f"header {name}")

    def args(self, args: list[str]) -> list[str]:
        """Arguments translated; a literal secret after a secret-named flag (`--token X`,
        `--api-key=X`, `GITHUB_TOKEN=X`) or in a known token format becomes `${VAR}`."""
        out: list[str] = []
        for i, arg in enumerate(args):
            prev = args[i - 1] if i else ""
            flag, eq, val = arg.partition("=")
            header = _HEADER_ARG.match(arg)
            if eq and (flag.startswith("-") or IDENT.match(flag)):
                candidates = [flag if IDENT.match(flag) else "", f"{self.server}_{flag}"]
                out.append(f"{flag}={self.secret_free(flag, val, candidates, f'argument {flag}')}")
            elif header and secret_name(header.group(1)):
                out.append(f"{header.group(1)}:{header.group(2)}{self.header_value(header.group(1), header.group(3))}")
            elif arg.startswith(("http://", "https://")):
                out.append(self.url(arg))
            elif prev.startswith("-") and "=" not in prev:
                out.append(self.secret_free(prev, arg, [f"{self.server}_{prev}"], f"argument {prev}"))
            else:
                out.append(self.secret_free("", arg, [f"{self.server}_SECRET"], f"argument {i + 1}"))
        return out

    def url(self, url: str) -> str:
        """The URL translated; a literal password or a secret-named query value becomes `${VAR}`."""
        parts = urllib.parse.urlsplit(url)
        netloc = parts.netloc
        if parts.password and not _REF.search(parts.password):
            var = self.exports.move([f"{self.server}_PASSWORD"], parts.password, f"the URL password in {self.label}")
            netloc = netloc.replace(f":{parts.password}@", f":${{{var}}}@", 1)
        query = []
        for pair in parts.query.split("&") if parts.query else []:
            key, eq, val = pair.partition("=")
            if eq and not _REF.search(val) and secret_literal(key, urllib.parse.unquote_plus(val)):
                var = self.exports.move([f"{self.server}_{key}"], urllib.parse.unquote_plus(val),
                                        f"URL query parameter {key} in {self.label}")
                pair = f"{key}=${{{var}}}"
            query.append(pair)
        rebuilt = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "&".join(query), parts.fragment))
        return self.text(rebuilt)
