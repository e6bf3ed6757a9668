"""Card text generators: `bootstrap` (deterministic, from the schema), `llm` (an operator's
OpenAI-compatible endpoint), `publisher` (the upstream's text verbatim, unattested).

Each generator turns one server's tool records into a `CardDraft` (drafts.py); `build_card`
adds the schema hashes, identity and provenance and signs it. Generators never see the key.
This module holds the deterministic generators and the factory; the llm one, the only one
with I/O, is llm_generator.py.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from toolatlas.catalog.cards import Card, Provenance, ServerIdentity, ToolCard, now_iso, sign_card
from toolatlas.catalog.drafts import (
    BOOTSTRAP_VERSION,
    GENERATORS,
    LLM_VERSION,
    PUBLISHER_VERSION,
    CardDraft,
    Generator,
    GeneratorError,
    ToolDraft,
    is_directive,
)
from toolatlas.catalog.llm_generator import LlmGenerator
from toolatlas.catalog.sanitize import BLOCK, addresses_model, strip_hidden
from toolatlas.catalog.model import ToolRecord, schema_hash

# The draft types and the llm generator live in drafts.py and llm_generator.py; callers keep
# importing them from here.
__all__ = [
    "BOOTSTRAP_VERSION", "GENERATORS", "LLM_VERSION", "PUBLISHER_VERSION", "BootstrapGenerator", "CardDraft",
    "Generator", "GeneratorError", "LlmGenerator", "PublisherGenerator", "ToolDraft", "bootstrap_summary",
    "build_card", "hint", "is_directive", "make_generator", "name_words", "shown_summary",
]


def build_card(
    identity: ServerIdentity,
    draft: CardDraft,
    tools: Sequence[ToolRecord],
    key: Any,
    *,
    created_at: str | None = None,
    reattested: Sequence[str] = (),
) -> Card:
    """Signed card for `tools` from `draft` (every tool must have a draft entry)."""
    by_name = {t.tool: t for t in draft.tools}
    cards: list[ToolCard] = []
    for rec in tools:
        td = by_name.get(rec.tool)
        if td is None:
            raise GeneratorError(f"{draft.generator} generator gave no summary for tool {rec.tool!r}")
        cards.append(
            ToolCard(
                tool=rec.tool,
                summary=td.summary,
                examples=list(td.examples),
                schema_sha256=schema_hash(rec.tool, rec.description, rec.input_schema),
            )
        )
    prov = Provenance(
        generator=draft.generator,
        generator_version=draft.generator_version,
        created_at=created_at or now_iso(),
        attested=draft.attested,
        key_id="",
        model=draft.model,
        reattested=sorted(reattested),
    )
    card = Card(server=identity, summary=draft.summary, tags=list(draft.tags), tools=cards, provenance=prov, signature="")
    return sign_card(card, key)


# --------------------------------------------------------------------------- bootstrap

_STOP = frozenset(
    """a an and are as at be by for from get has have in into is it its of on or set the this
    that to use used uses using via with your you will can any all api v1 v2 v3 id""".split()
)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NONWORD = re.compile(r"[^A-Za-z0-9]+")
_TAGS = re.compile(r"<[^>]{0,200}>")
_MD = re.compile(r"[*_`#]+|\[([^\]]*)\]\([^)]*\)")
_URL = re.compile(r"https?://\S+")
_SENT = re.compile(r"(?<=[.!?])\s+")
# A block the publisher marks up for the model (<IMPORTANT>...</IMPORTANT>, <system>...) is
# dropped whole (sanitize.BLOCK, shared with what tool_search shows of publisher text).
_ENUM_CHARS = 40  # an allowed value longer than this is prose, not a value: not copied


def name_words(name: str) -> list[str]:
    """`getUserById` / `get_user-by.id` / `/v1/nutrition` -> lowercase words."""
    spaced = _CAMEL.sub(" ", name)
    return [w.lower() for w in _NONWORD.split(spaced) if w and not re.fullmatch(r"v\d+", w.lower())]


def hint(text: str | None, *, max_chars: int = 220) -> str:
    """The publisher's description reduced to a hint: markup, URLs and sentences that address
    the model removed; the first sentences up to `max_chars`, cut at a word."""
    if not text:
        return ""
    t = BLOCK.sub(" ", strip_hidden(text))
    t = _TAGS.sub(" ", t)
    t = _MD.sub(lambda m: m.group(1) or " ", t)
    t = _URL.sub(" ", t)
    t = re.sub(r"\s+", " ", t).strip()
    out: list[str] = []
    size = 0
    for sent in _SENT.split(t):
        sent = sent.strip()
        if not sent or addresses_model(sent):
            continue
        if size and size + len(sent) + 1 > max_chars:
            break
        out.append(sent)
        size += len(sent) + 1
    res = " ".join(out)
    if len(res) > max_chars:
        res = res[:max_chars].rsplit(" ", 1)[0].rstrip(",;:") + "..."
    return res


def _param_phrase(name: str, spec: Any) -> str:
    if not isinstance(spec, dict):
        spec = {}
    phrase = " ".join(name_words(name)) or strip_hidden(name)
    enum = spec.get("enum")
    if isinstance(enum, list) and enum:
        # Hidden characters go before the check: a zero-width space must not hide an order.
        values = [strip_hidden(str(v)).strip() for v in enum[:6]]
        values = [v for v in values if v and len(v) <= _ENUM_CHARS and not addresses_model(v)]
        if values:
            phrase += " (" + "|".join(values) + ("|..." if len(enum) > 6 else "") + ")"
    desc = hint(spec.get("description"), max_chars=80)
    if desc:
        phrase += f": {desc.rstrip('.')}"
    props = spec.get("properties")
    if isinstance(props, dict) and props:
        inner = ", ".join(w for w in (" ".join(name_words(k)) or strip_hidden(k) for k in list(props)[:6]) if w)
        if inner:
            phrase += f" [fields: {inner}]"
    return phrase


def bootstrap_summary(rec: ToolRecord) -> str:
    """Deterministic card text for one tool: what its name says, the publisher's hint, and its
    parameters (required first) with their allowed values. Types and required flags stay in the
    inputSchema: as text they only make sibling tools look alike (measured: no retrieval gain,
    larger Rift clusters)."""
    words = name_words(rec.tool)
    title = " ".join(words).capitalize() or strip_hidden(rec.tool)
    parts = [title + "."]
    h = hint(rec.description)
    if h and h.lower().rstrip(".") != title.lower():
        parts.append(h if h.endswith((".", "!", "?", "...")) else h + ".")
    schema = rec.input_schema if isinstance(rec.input_schema, dict) else {}
    raw = schema.get("properties")
    props: dict[str, Any] = raw if isinstance(raw, dict) else {}
    req = set(schema.get("required") or []) if isinstance(schema.get("required"), list) else set()
    ordered = sorted(props, key=lambda k: (k not in req, list(props).index(k)))
    if ordered:
        phrases = [_param_phrase(k, props[k]) for k in ordered[:12]]
        # A parameter name can carry an order too ("ignore_previous_instructions"): left out.
        parts.append("Inputs: " + "; ".join(p for p in phrases if p and not addresses_model(p)) + ".")
    else:
        parts.append("Takes no inputs.")
    return " ".join(parts)


_INPUTS_PART = re.compile(r" (Inputs: .*?\.|Takes no inputs\.)(?= \(upstream name '[^']*'\)$|$)", re.DOTALL)


def shown_summary(summary: str, generator: str) -> str:
    """A card summary as a tool_search match shows it: a bootstrap summary without its
    "Inputs: ..." part, which only restates the inputSchema shown beside it (it is there for
    retrieval: parameter words in the indexed text)."""
    if generator != "bootstrap":
        return summary
    return _INPUTS_PART.sub("", summary, count=1) or summary


class BootstrapGenerator:
    """Deterministic cards from the schema; the publisher text is only a filtered hint."""

    name = "bootstrap"

    def generate(self, server: str, tools: Sequence[ToolRecord]) -> CardDraft:
        drafts: list[ToolDraft] = []
        seen: Counter[str] = Counter()
        for rec in tools:
            text = bootstrap_summary(rec)
            seen[text] += 1
            if seen[text] > 1:  # two upstream names with the same words: keep them apart
                text = f"{text} (upstream name {rec.tool!r})"
            drafts.append(ToolDraft(tool=rec.tool, summary=text))
        tags = _server_tags(tools)
        return CardDraft(
            summary=_server_summary(server, tools, tags),
            tags=tuple(tags),
            tools=tuple(drafts),
            generator=self.name,
            generator_version=BOOTSTRAP_VERSION,
        )


def _server_tags(tools: Sequence[ToolRecord], n: int = 6) -> list[str]:
    counts: Counter[str] = Counter()
    for rec in tools:
        ws = set(name_words(rec.tool))
        props = rec.input_schema.get("properties") if isinstance(rec.input_schema, dict) else None
        if isinstance(props, dict):
            for k in props:
                ws.update(name_words(k))
        counts.update(w for w in ws if len(w) > 2 and w not in _STOP and not w.isdigit())
    return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


def _server_summary(server: str, tools: Sequence[ToolRecord], tags: Sequence[str]) -> str:
    n = len(tools)
    about = f" about {', '.join(tags[:4])}" if tags else ""
    return f"{server}: {n} tool{'s' if n != 1 else ''}{about}."


# --------------------------------------------------------------------------- publisher


class PublisherGenerator:
    """The upstream's own description verbatim; provenance marks the card unattested."""

    name = "publisher"

    def generate(self, server: str, tools: Sequence[ToolRecord]) -> CardDraft:
        return CardDraft(
            summary="",
            tags=(),
            tools=tuple(ToolDraft(tool=r.tool, summary=r.description) for r in tools),
            generator=self.name,
            generator_version=PUBLISHER_VERSION,
            attested=False,
        )


def make_generator(kind: str, cfg: Any = None) -> Generator:
    """The generator named `kind`; `cfg` (toolatlas.config.Config) supplies [cards.llm]."""
    import os

    if kind == "bootstrap":
        return BootstrapGenerator()
    if kind == "publisher":
        return PublisherGenerator()
    if kind == "llm":
        if cfg is None:
            raise GeneratorError("the llm generator needs a config with a [cards.llm] section")
        llm = cfg.cards.llm
        key = None
        if llm.api_key_env:
            key = os.environ.get(llm.api_key_env)
            if key is None:
                raise GeneratorError(f"[cards.llm] api_key_env names ${llm.api_key_env}, which is not set")
        return LlmGenerator(url=llm.url, model=llm.model, api_key=key, timeout=llm.timeout, max_retries=llm.max_retries)
    raise GeneratorError(f"unknown card generator {kind!r}; expected one of {', '.join(GENERATORS)}")
