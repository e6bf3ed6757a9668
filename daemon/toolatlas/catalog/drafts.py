"""What a card generator produces: a `CardDraft` of `ToolDraft`s, before `build_card` adds
schema hashes, identity and provenance and signs it; and the errors and names generators share.

Below generators.py (bootstrap, publisher, the factory) and llm_generator.py, so both speak
these types without importing each other.
"""

from __future__ import annotations

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
