"""What the model reads of the gateway itself: the meta-tools' descriptions, their parameter
descriptions and the MCP `instructions`, rendered from template files.

Defaults ship in `toolatlas/templates/`; `[surface] templates = "DIR"` overrides any of
`tool_search.md`, `execute_tool.md`, `catalog_status.md`, `instructions.md` (a file missing
from DIR falls back to the default). A template's text is the description; a line
`## parameter: NAME` starts the description of that parameter (tool templates only).
`<!-- comments -->` are dropped. Placeholders are `{domains}`, `{servers}`, `{environment}`,
`{tool_count}` and `{default_top_k}`; `{{name}}` writes a literal `{name}`; other braces (JSON examples) are
text. An unknown placeholder, parameter or file is a ConfigError naming the file.

A `Guidance` is a value (templates + environment label), so each endpoint or connection can
be given its own; rendering is pure (no mcp, no I/O) and cheap enough for every tools/list.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolatlas.errors import ConfigError
from toolatlas.meta_tools import CATALOG_STATUS, EXECUTE_TOOL, META_TOOLS, TOOL_SEARCH

DEFAULTS_DIR = Path(__file__).resolve().parent / "templates"
PLACEHOLDERS = ("domains", "servers", "environment", "tool_count", "default_top_k")
INSTRUCTIONS = "instructions"
# text name -> file name; a tool's text is its description plus its parameters'.
FILES: Mapping[str, str] = {
    TOOL_SEARCH: "tool_search.md", EXECUTE_TOOL: "execute_tool.md", CATALOG_STATUS: "catalog_status.md",
    INSTRUCTIONS: "instructions.md",
}
MAX_TEMPLATE_CHARS = 8192  # every character of a template is paid for in each client's context
# {domains} is held to about 90 tokens (a 20-server list included) so the three meta-tools
# stay under 400 tokens: servers past the budget are counted, not named.
DOMAINS_MAX_CHARS = 250
DOMAIN_ENTRY_CHARS = 60
SERVERS_MAX_CHARS = 500  # {servers}: a gateway of hundreds of upstreams is not a page of names in every context
DEFAULT_ENVIRONMENT = "default"

_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_PARAM = re.compile(r"^## parameter:[ \t]*(\S*)[ \t]*\r?$", re.MULTILINE)
_LITERAL = re.compile(r"\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}")
_FIELD = re.compile(r"\{\{[A-Za-z_][A-Za-z0-9_]*\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _params_of(name: str) -> tuple[str, ...]:
    for t in META_TOOLS:
        if t["name"] == name:
            return tuple(t["inputSchema"].get("properties", {}))
    return ()


@dataclass(frozen=True)
class Template:
    """One text: a description and, for a tool, its parameters' descriptions (unrendered)."""

    source: str
    description: str
    params: Mapping[str, str] = field(default_factory=dict)


def parse_template(text: str, name: str, source: str) -> Template:
    """`text` of template `name` (a FILES key) read from `source` (named in every error)."""
    if len(text) > MAX_TEMPLATE_CHARS:
        raise ConfigError(f"template {source}: {len(text)} characters, more than {MAX_TEMPLATE_CHARS}; "
                          "every character is read by the model at each connection")
    body = _COMMENT.sub("", text)
    for m in _FIELD.finditer(body):
        if m.group(1) is not None and m.group(1) not in PLACEHOLDERS:
            raise ConfigError(f"template {source}: unknown placeholder {{{m.group(1)}}}; known placeholders: "
                              + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS) + " (write {{name}} for a literal {name})")
    parts = _PARAM.split(body)
    description = parts[0].strip()
    if not description:
        raise ConfigError(f"template {source}: no description text")
    allowed = _params_of(name)
    params: dict[str, str] = {}
    for pname, ptext in zip(parts[1::2], parts[2::2]):
        if pname not in allowed:
            known = ", ".join(allowed) if allowed else "none (this text has no parameters)"
            raise ConfigError(f"template {source}: unknown parameter {pname!r} in '## parameter:'; "
                              f"{name} takes: {known}")
        if not ptext.strip():
            raise ConfigError(f"template {source}: parameter {pname!r} has no description text")
        params[pname] = ptext.strip()
    return Template(source=source, description=description, params=params)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"template {path}: not UTF-8 text") from exc
    except OSError as exc:
        raise ConfigError(f"template {path}: cannot read it: {exc.strerror}") from exc


@dataclass(frozen=True)
class TemplateSet:
    """Every text, the operator's where DIR has it, else the shipped default (a parameter a
    template leaves out keeps the default's description)."""

    texts: Mapping[str, Template]
    folder: str = ""

    @classmethod
    def load(cls, folder: str | None = None) -> TemplateSet:
        """The defaults overlaid with `folder`'s files; ConfigError naming the file on a bad
        template, a folder that does not exist, or a `.md` file that is no known template."""
        texts = {name: parse_template(_read(DEFAULTS_DIR / fname), name, str(DEFAULTS_DIR / fname))
                 for name, fname in FILES.items()}
        if not folder:
            return cls(texts=texts)
        root = Path(folder)
        if not root.is_dir():
            raise ConfigError(f"[surface] templates: folder {folder!r} does not exist")
        known = set(FILES.values())
        for path in sorted(root.glob("*.md")):
            if path.name not in known:
                raise ConfigError(f"template {path}: unknown template file {path.name!r}; expected one of "
                                  + ", ".join(sorted(known)))
        for name, fname in FILES.items():
            path = root / fname
            if path.exists():
                own = parse_template(_read(path), name, str(path))
                texts[name] = Template(own.source, own.description, {**texts[name].params, **own.params})
        return cls(texts=texts, folder=str(root))


def render(text: str, values: Mapping[str, str]) -> str:
    """`text` with each `{placeholder}` replaced and `{{name}}` made `{name}` (one pass, so a
    value holding braces is never expanded again)."""

    def sub(m: re.Match[str]) -> str:
        if m.group(1) is None:
            lit = _LITERAL.fullmatch(m.group(0))
            return "{" + (lit.group(1) if lit else "") + "}"
        return values.get(m.group(1), m.group(0))

    return _FIELD.sub(sub, text)


# The instructions of a `[daemon] passthrough_clients` client: its tools/list has every tool.
PASSTHROUGH = ("toolatlas gateway for the {environment} environment: {tool_count} tools from these servers: {servers}. "
               "Every tool is in tools/list under its namespaced name (server__tool); call it by that name.")


@dataclass(frozen=True)
class MetaTools:
    """The three meta-tool definitions as one caller sees them, and a fingerprint of them
    (a client that saw another fingerprint is told tools/list_changed)."""

    tools: tuple[Mapping[str, Any], ...]
    fingerprint: str


@dataclass(frozen=True)
class Domain:
    """One server for `{domains}`: its name and, from a verified card, summary and tags."""

    server: str
    summary: str = ""
    tags: tuple[str, ...] = ()


def _about(d: Domain) -> list[str]:
    """What a server is about, most telling first: its card's tags, else its card summary."""
    tags = [t for t in d.tags if t.lower() != d.server.lower()]  # a tag that repeats the name says nothing
    if tags:
        return tags[:3]
    summary = d.summary.strip()
    if summary.startswith(f"{d.server}:"):
        summary = summary.split(":", 1)[1].strip()
    summary = summary.rstrip(".")
    if len(summary) > DOMAIN_ENTRY_CHARS:
        summary = summary[:DOMAIN_ENTRY_CHARS].rsplit(" ", 1)[0].rstrip(",;") + "..."
    return [summary] if summary else []


def _fit(names: Sequence[str], max_chars: int) -> tuple[int, int]:
    """How many of `names` (each with a 2-character separator) fit in `max_chars` beside "and
    N more" for the rest, and the characters left over."""
    def used(shown: int) -> int:
        return sum(len(n) + 2 for n in names[:shown]) + (len(f"and {len(names) - shown} more") if shown < len(names) else 0)
    shown = len(names)
    while shown and used(shown) > max_chars:
        shown -= 1
    return shown, max_chars - used(shown)


def servers_text(servers: Sequence[str], max_chars: int = SERVERS_MAX_CHARS) -> str:
    """`files, weather, units` within `max_chars`; servers past the budget are counted (`and 6 more`)."""
    shown, _ = _fit(servers, max_chars)
    return ", ".join([*servers[:shown], *([f"and {len(servers) - shown} more"] if shown < len(servers) else [])]) or "none yet"


def domains_text(domains: Sequence[Domain], max_chars: int = DOMAINS_MAX_CHARS) -> str:
    """`files (read, write, search); weather (forecast); units` within `max_chars`: every
    server's name first (past the budget: "and N more"), then, while room is left, what each
    is about from its card (tags, else summary); a server without a card is its name alone."""
    if not domains:
        return "no servers yet"
    names = [d.server for d in domains]
    shown, room = _fit(names, max_chars)
    entries = names[:shown]
    for i, d in enumerate(domains[:shown]):
        about = _about(d)
        while about:
            extra = f" ({', '.join(about)})"
            if len(extra) <= room:
                entries[i] += extra
                room -= len(extra)
                break
            about = about[:-1]
    if shown < len(names):
        entries.append(f"and {len(names) - shown} more")
    return "; ".join(entries)


@dataclass(frozen=True)
class Guidance:
    """A template set, the environment label it is rendered with, and whether carded matches
    also show publisher text (see the module doc)."""

    templates: TemplateSet
    environment: str = DEFAULT_ENVIRONMENT
    publisher_text: str = "omit"  # "append": a carded match shows the sanitized publisher text too

    @classmethod
    def load(cls, folder: str | None, environment: str = DEFAULT_ENVIRONMENT, publisher_text: str = "omit") -> Guidance:
        return cls(TemplateSet.load(folder), environment or DEFAULT_ENVIRONMENT, publisher_text)

    def values(self, *, servers: Sequence[str], domains: Sequence[Domain], tool_count: int,
               default_top_k: int = 5) -> dict[str, str]:
        return {"servers": servers_text(servers), "domains": domains_text(domains),
                "environment": self.environment, "tool_count": str(tool_count), "default_top_k": str(default_top_k)}

    def meta_tools(self, values: Mapping[str, str]) -> MetaTools:
        tools = []
        for skeleton in META_TOOLS:
            t = copy.deepcopy(skeleton)
            tpl = self.templates.texts[t["name"]]
            t["description"] = render(tpl.description, values)
            for pname, spec in t["inputSchema"].get("properties", {}).items():
                if pname in tpl.params:
                    spec["description"] = render(tpl.params[pname], values)
            tools.append(t)
        blob = json.dumps(tools, sort_keys=True, separators=(",", ":")).encode()
        return MetaTools(tools=tuple(tools), fingerprint=hashlib.sha256(blob).hexdigest()[:16])

    def instructions(self, values: Mapping[str, str], *, passthrough: bool = False) -> str:
        """The instructions template rendered; for a passthrough client (which lists every
        tool, not the meta-tools the template explains) the fixed PASSTHROUGH text."""
        return render(PASSTHROUGH if passthrough else self.templates.texts[INSTRUCTIONS].description, values)


def default_meta_tools(environment: str = DEFAULT_ENVIRONMENT, servers: Sequence[str] = ()) -> MetaTools:
    """The shipped templates rendered for `servers` without cards (benchmarks, token figures)."""
    g = Guidance.load(None, environment)
    return g.meta_tools(g.values(servers=servers, domains=[Domain(s) for s in servers], tool_count=0))


__all__ = ["DEFAULTS_DIR", "DEFAULT_ENVIRONMENT", "Domain", "FILES", "Guidance", "MetaTools", "PASSTHROUGH", "PLACEHOLDERS",
           "Template", "TemplateSet", "default_meta_tools", "domains_text", "parse_template", "render",
           "servers_text"]
