"""What a card generator produces: a `CardDraft` of `ToolDraft`s, before `build_card` adds
schema hashes, identity and provenance and signs it; and the errors and names generators share.

Below generators.py (bootstrap, publisher, the factory) and llm_generator.py, so both speak
these types without importing each other.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from toolatlas.catalog.model import ToolRecord
from toolatlas.errors import ToolatlasError

BOOTSTRAP_VERSION = "1"
LLM_VERSION = "1"
PUBLISHER_VERSION = "1"
GENERATORS = ("bootstrap", "llm", "publisher")


class GeneratorError(ToolatlasError):
    """A card generator could not produce a valid draft (the message says why)."""


@dataclass(frozen=True)
class ToolDraft:
    tool: str
    summary: str
    examples: tuple[str, ...] = ()


@dataclass(frozen=True)
class CardDraft:
    summary: str
    tags: tuple[str, ...]
    tools: tuple[ToolDraft, ...]
    generator: str
    generator_version: str
    attested: bool = True
    model: str = ""


class Generator(Protocol):
    name: str

    def generate(self, server: str, tools: Sequence[ToolRecord]) -> CardDraft: ...


# Sentences that address the model rather than describe the tool: never copied into a card.
# Phrasings from published tool-poisoning and prompt-injection examples: orders to the model,
# role switches, secrecy, and reaching for files the tool has no business with (words that a
# real tool may use, such as "password" or "credentials", are not on the list).
_DIRECTIVE = re.compile(
    r"\b(ignore (all|any|previous|prior|the above|your)|disregard|forget (all|any|previous|prior|your|the)|"
    r"you must|you should|you are now|you will now|from now on|act as|pretend|"
    r"always (use|call|prefer|choose|run|invoke)|never (use|call|tell|mention)|"
    r"do not (tell|mention|use|inform|reveal|show|call)|don'?t (tell|mention|inform|reveal)|"
    r"without (telling|asking|informing)|instead of [^.]{0,40}\btools?\b|use this (tool )?instead|system prompt|important:|override|jailbreak|"
    r"developer mode|new instructions|instructions? (above|below)|"
    r"before (using|calling|you use|you call|any|every|each)|prefer this|best tool|the only tool|"
    r"(every ?time|whenever) you (call|use|run|invoke)|"
    r"(assistant|system|user)\s*:|tell the user|upset the user|the user (must|should) not|"
    r"pass (its|the|their) contents?|sidenote|exfiltrat\w*|id_rsa|\.ssh/|mcp\.json)",
)
# `_DIRECTIVE` (all lower case) searches the text lower-cased: the matches of re.IGNORECASE on
# the text, 4x faster (a case-blind search of a long alternation is Python's slow path; on the
# dev catalogs' texts 89 -> 20 us a text). Besides what str.lower() maps, IGNORECASE equates
# three letters with ASCII ones, and str.lower() makes two characters of the dotted capital I.
_CASE = str.maketrans({"\u0130": "i", "\u0131": "i", "\u017f": "s"})


def is_directive(text: str) -> bool:
    """Whether `text` addresses the model (see `_DIRECTIVE`) rather than describing a tool."""
    return bool(_DIRECTIVE.search((text if text.isascii() else text.translate(_CASE)).lower()))
