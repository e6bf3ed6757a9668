"""One tool_search match: what tools/list would give for the tool, with the operator's text
where a verified card vouches for it and the publisher's text sanitized where none does.

- Carded (the server's card verified, the tool's schema hash as signed): `description` is
  the card's summary (a bootstrap card's without its "Inputs:" part, which restates the
  schema), `examples` the card's first EXAMPLES_SHOWN within EXAMPLE_CHARS together
  (`shown_examples`), `attested: true` and `provenance` (generator, key_id, created_at).
  The publisher's description is left out, or appended after the card's, sanitized and
  labelled, with `[surface] publisher_text = "append"`.
- Otherwise: `attested: false`, the publisher's description sanitized
  (`catalog.sanitize`): hidden characters, markup addressed to the model, unsafe links and
  instruction-like sentences removed, length capped.
- Either way every `description` and `title` inside `inputSchema` is sanitized too, and so
  are the tool's `title`, the text inside `outputSchema` and `annotations.title`: all of it is
  publisher text a model reads. No structure is changed (keys, types, hints), so a client
  can still validate structured results against `outputSchema`. `score` keeps SCORE_DIGITS significant digits
  (the ranker's scale varies with the mode: fused z-scores, RRF, BM25).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any

from toolatlas.catalog.attest import AttestResult
from toolatlas.catalog.model import ToolRecord
from toolatlas.catalog.generators import shown_summary
from toolatlas.catalog.sanitize import PARAM_CHARS, cap, sanitize_schema, sanitize_text
from toolatlas.gateway.view import CatalogView

SANITIZED_CACHE = 8192  # tools whose sanitized texts are kept (keyed by content hash)
PUBLISHER_LABEL = "Publisher's description (not attested):"
# What a match shows of a card's examples (the card keeps them all): at most EXAMPLES_SHOWN,
# together at most EXAMPLE_CHARS characters, each cut at a word with "..." to what is left;
# a later one only while EXAMPLE_MIN characters are left. Two short phrasings show whole; a
# long one is cut. Measured in bench/tokens.py (issue 18's budget of a top-5 answer): ToolLens
# examples are user requests of 72 characters median (p75 111), 2 x 120 cost ~190 tokens.
EXAMPLES_SHOWN = 2
EXAMPLE_CHARS = 100
EXAMPLE_MIN = 40
SCORE_DIGITS = 4


def shown_examples(examples: Sequence[str]) -> list[str]:
    """The examples a match shows of a card's (see EXAMPLES_SHOWN)."""
    out: list[str] = []
    left = EXAMPLE_CHARS
    for example in examples[:EXAMPLES_SHOWN]:
        if out and left < EXAMPLE_MIN:
            break
        text = cap(example, left)
        out.append(text)
        left -= len(text)
    return out


_GONE = object()  # what a kept verdict that has been collected compares as: nothing current


def _held(ref: weakref.ref[AttestResult] | None) -> object:
    """The verdict `ref` holds: None for none, _GONE once it has been collected."""
    if ref is None:
        return None
    verdict = ref()
    return _GONE if verdict is None else verdict


@dataclass(frozen=True, slots=True)
class _Clean:
    """A tool definition's publisher text as matches show it (shared between matches: read only)."""

    description: str
    input_schema: Any
    title: str | None
    output_schema: Any
    annotations: Any
    source: tuple[Any, ...]  # the listed (title, outputSchema, annotations): the content hash does not cover them


class MatchBuilder:
    """Builds matches; sanitizing is cached per tool definition (content hash), and all of a
    match but its score per (record, verdict, publisher_text): a repeated answer builds each
    match from two kept dicts. The kept values (schema, examples, provenance) are shared
    between matches: read them, never change them."""

    def __init__(self) -> None:
        self._clean: OrderedDict[tuple[str, str], _Clean] = OrderedDict()
        # (name, content hash, publisher_text) -> (record, verdict, fields before the score, after
        # it). The verdict is held weakly: a card re-check or relist replaces it, and the kept
        # entries of tools nobody searches since must not keep the old ones (and their cards) alive.
        self._parts: OrderedDict[tuple[str, str, str], tuple[ToolRecord, weakref.ref[AttestResult] | None,
                                                              dict[str, Any], dict[str, Any]]] = OrderedDict()

    def sanitized(self, rec: ToolRecord) -> _Clean:
        """`rec`'s publisher text sanitized (see the module docstring)."""
        key = (rec.name, rec.content_hash)
        hit = self._clean.get(key)
        source = (rec.title, rec.output_schema, rec.annotations)
        if hit is None or hit.source != source:
            hit = self._clean[key] = _Clean(
                description=sanitize_text(rec.description), input_schema=sanitize_schema(rec.input_schema),
                title=sanitize_text(rec.title, PARAM_CHARS) if rec.title else rec.title,
                output_schema=sanitize_schema(rec.output_schema) if rec.output_schema else rec.output_schema,
                annotations=sanitize_schema(rec.annotations, PARAM_CHARS) if rec.annotations else rec.annotations,
                source=source)
            while len(self._clean) > SANITIZED_CACHE:
                self._clean.popitem(last=False)
        return hit

    def match(self, rec: ToolRecord, verdict: AttestResult | None, score: float, *, publisher_text: str = "omit",
              ) -> dict[str, Any]:
        key = (rec.name, rec.content_hash, publisher_text)
        kept = self._parts.get(key)
        if kept is None or kept[0] is not rec or _held(kept[1]) is not verdict:
            held = weakref.ref(verdict) if verdict is not None else None
            kept = self._parts[key] = (rec, held, *self._build(rec, verdict, publisher_text))
            while len(self._parts) > SANITIZED_CACHE:
                self._parts.popitem(last=False)
        out = dict(kept[2])
        out["score"] = float(f"{float(score):.{SCORE_DIGITS}g}")
        out.update(kept[3])
        return out

    def _build(self, rec: ToolRecord, verdict: AttestResult | None, publisher_text: str,
               ) -> tuple[dict[str, Any], dict[str, Any]]:
        """A match's fields before its score and after it."""
        clean = self.sanitized(rec)
        description = clean.description
        out: dict[str, Any] = {"name": rec.name, "server": rec.server, "tool": rec.tool}
        if clean.title:
            out["title"] = clean.title
        card = verdict.card if verdict is not None and verdict.card_status == "verified" else None
        entry = card.tool(rec.tool) if card is not None else None
        # A tool re-attested automatically has bootstrap's text, whatever made the rest of the card.
        generator = "bootstrap" if card is not None and rec.tool in card.provenance.reattested else (
            card.provenance.generator if card is not None else "")
        if card is not None and entry is not None:
            text = shown_summary(entry.summary, generator)
            if publisher_text == "append" and description:
                text = f"{text}\n\n{PUBLISHER_LABEL} {description}"
            out["description"] = text
        else:
            out["description"] = description
        out["inputSchema"] = clean.input_schema
        if clean.output_schema:
            out["outputSchema"] = clean.output_schema
        if clean.annotations:
            out["annotations"] = clean.annotations
        after: dict[str, Any] = {}
        if card is not None and entry is not None:
            after["attested"] = True
            after["examples"] = shown_examples(entry.examples)
            prov = card.provenance
            after["provenance"] = {"generator": generator, "key_id": prov.key_id, "created_at": prov.created_at}
        else:
            after["attested"] = False
        return out, after

    def definitions(self, view: CatalogView, servers: set[str]) -> list[dict[str, Any]]:
        """Every callable tool of `servers` in `view`, as a match shows it without a score,
        sorted by name (what `toolatlas stubs` writes modules from). Tools of an upstream that
        is down are included (calls fail until it is back); quarantined ones are not."""
        out = []
        for rec in sorted((r for r in view.by_name.values() if r.server in servers), key=lambda r: r.name):
            match = self.match(rec, view.server(rec.server).verdict, 0.0)
            del match["score"]
            out.append(match)
        return out


__all__ = ["EXAMPLES_SHOWN", "EXAMPLE_CHARS", "EXAMPLE_MIN", "MatchBuilder", "PUBLISHER_LABEL", "SCORE_DIGITS",
           "shown_examples"]
