"""Capability cards: the operator's signed description of one upstream server.

A card holds the server's identity, an operator summary and tags, one `ToolCard` per tool
(summary, optional example phrasings, and the SHA-256 of the upstream's name+description+
inputSchema it was written for), provenance, and an Ed25519 signature over the canonical JSON
(sorted keys, compact, UTF-8) of everything but the signature.

A card file is exactly the canonical JSON of the whole card plus one newline. Reading insists
on that form, so *any* changed byte in a file is detected: it either breaks the JSON, changes
signed content (signature fails) or leaves a non-canonical file (refused as such).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from toolatlas.catalog import signing
from toolatlas.catalog.model import canonical_json
from toolatlas.errors import SignatureError
from toolatlas.paths import write_atomic

CARD_FORMAT = 1
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")


class ServerIdentity(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    name: str
    transport: str  # stdio | sse | http | catalog
    endpoint: str  # URL, or the shell-quoted command line for stdio


class ToolCard(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    tool: str  # the upstream's own name
    summary: str
    examples: list[str]
    schema_sha256: str  # toolatlas.catalog.model.schema_hash of the definition it describes


class Provenance(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    generator: str  # bootstrap | llm | publisher
    generator_version: str
    created_at: str  # ISO 8601 UTC
    attested: bool  # False for publisher text taken verbatim
    key_id: str  # fingerprint of the signing key (signing.key_id)
    model: str = ""  # the llm generator's model name
    reattested: list[str] = []  # tools re-attested automatically (policy "reattest")
    format: int = CARD_FORMAT


class Card(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, dict=True):
    server: ServerIdentity
    summary: str
    tags: list[str]
    tools: list[ToolCard]
    provenance: Provenance
    signature: str  # base64 Ed25519 over signing_payload(card)

    def tool(self, name: str) -> ToolCard | None:
        """The entry for tool `name` (the first, as a scan would find it). An index built at
        the first call and kept on the card (never encoded): attestation and matches look up
        every live tool, and a scan each made a server of n tools cost n^2 comparisons."""
        index: dict[str, ToolCard] | None = self.__dict__.get("_by_tool")
        if index is None:
            index = {}
            for t in self.tools:
                index.setdefault(t.tool, t)
            self.__dict__["_by_tool"] = index
        return index.get(name)


_decoder = msgspec.json.Decoder(Card)


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def identity_of(upstream: Any, *, redact: Callable[[str], str]) -> ServerIdentity:
    """ServerIdentity of a configured upstream (toolatlas.config.Upstream), its endpoint passed
    through `redact` (a `toolatlas.redact.Redactor` of the config's secrets): a card file never
    holds a `${VAR}` value of the command line or a password in the URL, and a card stays
    valid when only a secret is rotated."""
    transport = getattr(upstream, "transport", None) or type(upstream).__struct_config__.tag
    if transport == "stdio":
        endpoint = shlex.join([upstream.command, *upstream.args])
    else:
        endpoint = upstream.url
    return ServerIdentity(name=upstream.name, transport=str(transport), endpoint=redact(endpoint))


def signing_payload(card: Card) -> bytes:
    """Canonical JSON of every field but `signature`: the bytes the signature covers."""
    obj = msgspec.to_builtins(card)
    obj.pop("signature", None)
    return canonical_json(obj)


def sign_card(card: Card, key: signing.Ed25519PrivateKey) -> Card:
    """Return `card` with provenance.key_id set to `key`'s and a fresh signature."""
    prov = msgspec.structs.replace(card.provenance, key_id=signing.key_id(key))
    unsigned = msgspec.structs.replace(card, provenance=prov, signature="")
    return msgspec.structs.replace(unsigned, signature=signing.sign(key, signing_payload(unsigned)))


def verify_card(card: Card, key: signing.Ed25519PublicKey) -> None:
    """SignatureError unless the card's signature verifies under `key`."""
    if not card.signature:
        raise SignatureError(f"card for {card.server.name!r} is not signed")
    try:
        signing.verify(key, signing_payload(card), card.signature)
    except SignatureError as exc:
        trusted = signing.key_id(key)
        if card.provenance.key_id and card.provenance.key_id != trusted:  # the usual cause: a rotated key
            raise SignatureError(
                f"card for {card.server.name!r} was signed by key {card.provenance.key_id}, not by the trusted "
                f"public key {trusted}; sign it again with the current key (`toolatlas cards generate`)"
            ) from exc
        raise


def encode_card(card: Card) -> bytes:
    """The exact bytes of a card file."""
    return canonical_json(card) + b"\n"


def decode_card(data: bytes, *, source: str = "card") -> Card:
    """Parse card file bytes; SignatureError if malformed or not in canonical form."""
    try:
        card = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise SignatureError(f"{source} is not a valid card: {exc}") from exc
    if encode_card(card) != data:
        raise SignatureError(f"{source} is not in canonical form (edited by hand or corrupted)")
    return card


def card_filename(server: str) -> str:
    """`<server>.json` for config names; other names (catalog files) get a safe slug + hash."""
    if _NAME_RE.fullmatch(server) and len(server) <= 64:
        return f"{server}.json"
    slug = re.sub(r"[^a-z0-9]+", "-", server.lower()).strip("-")[:40] or "server"
    return f"{slug}-{hashlib.sha256(server.encode()).hexdigest()[:8]}.json"


def cards_dir(state_dir: str | os.PathLike[str]) -> Path:
    return Path(state_dir) / "cards"


def card_path(state_dir: str | os.PathLike[str], server: str) -> Path:
    return cards_dir(state_dir) / card_filename(server)


def read_card(path: str | os.PathLike[str]) -> Card:
    p = Path(path)
    data = signing.read_bytes(p, "card")
    return decode_card(data, source=f"card file {str(p)!r}")


def write_card(path: str | os.PathLike[str], card: Card) -> Path:
    """Write atomically: temp file in the same folder, fsync, rename, fsync the folder."""
    p = Path(path)
    write_atomic(p, encode_card(card), 0o644)
    return p


def format_card(card: Card) -> str:
    """Human-readable rendering for `toolatlas cards show`: the operator's review of what a
    card says, so a control character or line break in upstream-derived text is shown
    escaped, never acted on by the terminal (sanitize.visible)."""
    from toolatlas.catalog.sanitize import visible

    prov = card.provenance
    lines = [
        f"server:    {card.server.name} ({card.server.transport}: {card.server.endpoint})",
        f"summary:   {card.summary}",
        f"tags:      {', '.join(card.tags) or '-'}",
        f"generator: {prov.generator} {prov.generator_version}"
        + (f" model={prov.model}" if prov.model else "")
        + ("" if prov.attested else "  [UNATTESTED publisher text]"),
        f"created:   {prov.created_at}  key {prov.key_id}",
    ]
    if prov.reattested:
        lines.append(f"reattested: {', '.join(prov.reattested)}")
    lines.append(f"tools ({len(card.tools)}):")
    for t in card.tools:
        lines.append(f"  {t.tool}  [{t.schema_sha256[:12]}]")
        lines.append(f"    {t.summary}")
        for ex in t.examples:
            lines.append(f"    e.g. {ex}")
    return "\n".join(visible(line) for line in lines)
