"""MCP client config files: read them (JSON with comments), tell which client wrote them, and
list their server entries with where each one sits in the file.

Pure, stdlib only. The formats (what each client keeps where):

- Claude Desktop `claude_desktop_config.json`, Cursor `~/.cursor/mcp.json` (and a project's
  `.cursor/mcp.json`), Windsurf `mcp_config.json`, Claude Code's project `.mcp.json`: a
  top-level `mcpServers` object, name -> entry.
- Claude Code's user file `~/.claude.json`: a top-level `mcpServers` (user scope) and one per
  project under `projects.<absolute path>.mcpServers` (local scope).
- VS Code `.vscode/mcp.json` (or the user `mcp.json`): `servers` plus `inputs` (prompted
  values, referenced as `${input:ID}`); a `settings.json` keeps the same under `mcp`.
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolatlas.errors import ToolatlasError

Where = tuple[str, ...]


class AdoptError(ToolatlasError):
    """A client config cannot be adopted (unreadable, not JSON, no servers); the message says why."""


class ClientKind(enum.Enum):
    CLAUDE_DESKTOP = "Claude Desktop"
    CLAUDE_CODE_PROJECT = "Claude Code project (.mcp.json)"
    CLAUDE_CODE_USER = "Claude Code user config (~/.claude.json)"
    CURSOR = "Cursor"
    VSCODE = "VS Code"
    WINDSURF = "Windsurf"
    GENERIC = "mcpServers JSON"


@dataclass(frozen=True)
class SourceEntry:
    """One server entry of a client file: its name, its JSON value, and `where` (the keys that
    lead to it, e.g. ("projects", "/home/me/app", "mcpServers", "git")). `base_dir` is the
    workspace folder the client runs it for (None for user-level files)."""

    name: str
    spec: Any
    where: Where
    base_dir: Path | None = None

    @property
    def label(self) -> str:
        return ".".join(self.where)


@dataclass(frozen=True)
class ClientFile:
    path: Path
    kind: ClientKind
    data: dict[str, Any]
    raw: bytes
    had_comments: bool
    entries: list[SourceEntry] = field(default_factory=list)
    # VS Code `inputs`: id -> its description (what the client would prompt for).
    inputs: dict[str, str] = field(default_factory=dict)
    # The object the toolatlas shim entry goes into when the file is rewritten.
    servers_table: Where = ("mcpServers",)


def strip_jsonc(text: str) -> tuple[str, bool]:
    """JSON text with `//` and `/* */` comments and trailing commas removed (VS Code and
    Claude Desktop files may have them), and whether any were found. Strings are kept intact."""
    out: list[str] = []
    i, n, changed = 0, len(text), False
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i, changed = (n if j < 0 else j), True
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i, changed = (n if j < 0 else j + 2), True
        elif c in "}]":
            k = len(out) - 1
            while k >= 0 and (not out[k] or out[k].isspace()):
                k -= 1
            if k >= 0 and out[k] == ",":
                out[k], changed = "", True
            out.append(c)
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out), changed


def _base_dir(path: Path) -> Path | None:
    """The workspace a project-level file belongs to (`.vscode`/`.cursor` -> its parent)."""
    parent = path.parent
    if parent.name in (".vscode", ".cursor"):
        return None if parent.parent == Path.home() else parent.parent
    if path.name == ".mcp.json":
        return parent
    return None


def detect(path: Path, data: Any) -> tuple[ClientKind, Where]:
    """Which client's format `data` (read from `path`) is, and where its servers live."""
    if not isinstance(data, dict):
        raise AdoptError(f"{path}: the file holds a JSON {type(data).__name__}, not an object")
    if isinstance(data.get("servers"), dict):
        return ClientKind.VSCODE, ("servers",)
    if isinstance(data.get("mcp"), dict) and isinstance(data["mcp"].get("servers"), dict):
        return ClientKind.VSCODE, ("mcp", "servers")
    if path.name == ".claude.json" or isinstance(data.get("projects"), dict):
        return ClientKind.CLAUDE_CODE_USER, ("mcpServers",)
    servers = data.get("mcpServers")
    if not isinstance(servers, dict):
        raise AdoptError(
            f"{path}: no MCP servers found: expected a top-level \"mcpServers\" object (Claude Desktop, "
            "Cursor, Windsurf, Claude Code .mcp.json), \"servers\" (VS Code) or \"projects\" (~/.claude.json)"
        )
    lowered = str(path).lower()
    if path.name == "claude_desktop_config.json":
        return ClientKind.CLAUDE_DESKTOP, ("mcpServers",)
    if path.name == ".mcp.json":
        return ClientKind.CLAUDE_CODE_PROJECT, ("mcpServers",)
    if (path.name == "mcp_config.json" or "windsurf" in lowered or "codeium" in lowered
            or any(isinstance(e, dict) and "serverUrl" in e for e in servers.values())):
        return ClientKind.WINDSURF, ("mcpServers",)
    if path.parent.name == ".cursor":
        return ClientKind.CURSOR, ("mcpServers",)
    return ClientKind.GENERIC, ("mcpServers",)


def _table_entries(data: dict[str, Any], where: Where, base: Path | None) -> list[SourceEntry]:
    table: Any = data
    for key in where:
        table = table.get(key) if isinstance(table, dict) else None
    if not isinstance(table, dict):
        return []
    return [SourceEntry(name, spec, (*where, name), base) for name, spec in table.items()]


def read_client_file(path: str | Path) -> ClientFile:
    """Read and recognise a client config; AdoptError when it cannot be read or holds no servers."""
    from toolatlas.paths import read_regular

    p = Path(path)
    try:
        raw = read_regular(p)
    except OSError as exc:
        raise AdoptError(f"cannot read {str(p)!r}: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise AdoptError(f"{p}: not UTF-8 text") from exc
    clean, had_comments = strip_jsonc(text)
    try:
        data = json.loads(clean)
    except ValueError as exc:
        raise AdoptError(f"{p}: not valid JSON: {exc}") from exc
    kind, table = detect(p, data)
    entries = _table_entries(data, table, _base_dir(Path(os.path.abspath(p))))
    if kind is ClientKind.CLAUDE_CODE_USER:
        for project, conf in data.get("projects", {}).items():
            if isinstance(conf, dict):
                entries += _table_entries(data, ("projects", project, "mcpServers"), Path(project))
    inputs: dict[str, str] = {}
    if kind is ClientKind.VSCODE:
        holder = data if table == ("servers",) else data["mcp"]
        for item in holder.get("inputs") or []:
            if isinstance(item, dict) and isinstance(item.get("id"), str):
                inputs[item["id"]] = str(item.get("description") or "")
    return ClientFile(p, kind, data, raw, had_comments, entries, inputs, table)
