"""A tool_search match's text (issue 18): the card's summary as shown (a bootstrap card's
"Inputs:" part left out, since the schema is beside it), examples bounded, provenance."""

from __future__ import annotations

from toolatlas.catalog.attest import AttestResult
from toolatlas.catalog.cards import Card, Provenance, ServerIdentity, ToolCard
from toolatlas.catalog.generators import bootstrap_summary, shown_summary
from toolatlas.catalog.model import ToolRecord
from toolatlas.gateway.matches import EXAMPLE_CHARS, EXAMPLES_SHOWN, MatchBuilder

REC = ToolRecord.make("units", "convert_units", "Convert a value between units.",
                      {"type": "object", "properties": {"value": {"type": "number"}, "to_unit": {"type": "string"}},
                       "required": ["value"]})


def _verdict(summary: str, examples: list[str], generator: str = "bootstrap") -> AttestResult:
    card = Card(server=ServerIdentity(name="units", transport="stdio", endpoint="units"), summary="units: 1 tool.",
                tags=["convert"], tools=[ToolCard(tool=REC.tool, summary=summary, examples=examples,
                                                  schema_sha256=REC.content_hash)],
                provenance=Provenance(generator=generator, generator_version="1", created_at="2026-12-02T08:00:00Z",
                                      attested=True, key_id="abcd1234"), signature="sig")
    return AttestResult(texts={REC.tool: (summary, card.summary, ("convert",))}, quarantined={}, card_status="verified",
                        card=card)


def test_a_bootstrap_summary_is_shown_without_its_inputs_part() -> None:
    full = bootstrap_summary(REC)
    assert "Inputs: value" in full
    assert shown_summary(full, "bootstrap") == "Convert units. Convert a value between units."
    assert shown_summary("Say hi. Takes no inputs. (upstream name 'hi')", "bootstrap") == "Say hi. (upstream name 'hi')"
    assert shown_summary(full, "llm") == full  # only the bootstrap format is known to restate the schema


def test_carded_match_bounds_examples_and_carries_provenance() -> None:
    long = "convert " * 60
    m = MatchBuilder().match(REC, _verdict("Converts units. Inputs: value.", ["10 mi in km", long, "third"]), 0.5)
    assert m["description"] == "Converts units." and m["attested"] is True
    assert len(m["examples"]) == EXAMPLES_SHOWN and m["examples"][0] == "10 mi in km"
    assert len(m["examples"][1]) <= EXAMPLE_CHARS and m["examples"][1].endswith("...")
    assert m["provenance"] == {"generator": "bootstrap", "key_id": "abcd1234", "created_at": "2026-12-02T08:00:00Z"}


def test_an_unverified_card_is_publisher_text() -> None:
    verdict = _verdict("Operator text.", ["x"])
    refused = AttestResult(texts=verdict.texts, quarantined={}, card_status="refused: bad signature", card=None)
    m = MatchBuilder().match(REC, refused, 0.5)
    assert m["description"] == REC.description and m["attested"] is False and "examples" not in m
