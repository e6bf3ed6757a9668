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
- Either way every `description` inside `inputSchema` is sanitized too (its structure is
  never changed), and `title`, `outputSchema`, `annotations` are passed as listed, so a
  client can validate structured results. `score` keeps SCORE_DIGITS significant digits
  (the ranker's scale varies with the mode: fused z-scores, RRF, BM25).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from toolatlas.catalog.attest import AttestResult
from toolatlas.catalog.model import ToolRecord
from toolatlas.catalog.generators import shown_summary
from toolatlas.catalog.sanitize import cap, sanitize_schema, sanitize_text
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


class MatchBuilder:
    """Builds matches; sanitizing is cached per tool definition (content hash), and all of a
    match but its score per (record, verdict, publisher_text): a repeated answer builds each
    match from two kept dicts. The kept values (schema, examples, provenance) are shared
    between matches: read them, never change them."""

    def __init__(self) -> None:
        self._clean: OrderedDict[tuple[str, str], tuple[str, Any]] = OrderedDict()
        # (name, content hash, publisher_text) -> (record, verdict, fields before the score, after
        # it). The verdict is held weakly: a card re-check or relist replaces it, and the kept
        # entries of tools nobody searches since must not keep the old ones (and their cards) alive.
        self._parts: OrderedDict[tuple[str, str, str], tuple[ToolRecord, weakref.ref[AttestResult] | None,
                                                              dict[str, Any], dict[str, Any]]] = OrderedDict()

    def sanitized(self, rec: ToolRecord) -> tuple[str, Any]:
        """(description, inputSchema) of `rec` sanitized."""
        key = (rec.name, rec.content_hash)
        hit = self._clean.get(key)
        if hit is None:
            hit = self._clean[key] = (sanitize_text(rec.description), sanitize_schema(rec.input_schema))
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
        description, schema = self.sanitized(rec)
        out: dict[str, Any] = {"name": rec.name, "server": rec.server, "tool": rec.tool}
        if rec.title:
            out["title"] = rec.title
        card = verdict.card if verdict is not None and verdict.card_status == "verified" else None
        entry = card.tool(rec.tool) if card is not None else None
        if card is not None and entry is not None:
            text = shown_summary(entry.summary, card.provenance.generator)
            if publisher_text == "append" and description:
                text = f"{text}\n\n{PUBLISHER_LABEL} {description}"
            out["description"] = text
        else:
            out["description"] = description
        out["inputSchema"] = schema
        if rec.output_schema:
            out["outputSchema"] = rec.output_schema
        if rec.annotations:
            out["annotations"] = rec.annotations
        after: dict[str, Any] = {}
        if card is not None and entry is not None:
            after["attested"] = True
            after["examples"] = shown_examples(entry.examples)
            prov = card.provenance
            after["provenance"] = {"generator": prov.generator, "key_id": prov.key_id, "created_at": prov.created_at}
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
