"""Run-time attestation: which text the daemon may index for an upstream's tools.

For each catalog refresh the daemon calls `Attestor.attest(server, live_tools)`. The card at
`state_dir/cards/<server>.json` is read (cached by inode, mtime and size), checked for canonical
form, signature (public key only) and identity; each live tool is then matched against the
schema hash it was signed for:

* hash matches -> its card summary, the card's server summary and tags are indexed;
* hash differs, or the tool is not in the card -> quarantined (a possible rug-pull): not
  searchable, not callable, reported with the reason; with policy "reattest" and a configured
  private key (matching the public key) the tool is instead re-described with the bootstrap
  generator and the card re-signed and rewritten atomically;
* no card, or a refused card (tampered, wrong key, wrong server) -> `required = false`: the
  publisher's text is served, marked unattested; `required = true`: every tool is quarantined.

Every live tool lands in exactly one of `texts` and `quarantined`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from toolatlas.catalog import signing
from toolatlas.catalog.cards import Card, card_path, identity_of, read_card, verify_card, write_card
from toolatlas.catalog.model import ToolRecord, schema_hash
from toolatlas.config import secrets
from toolatlas.errors import ConfigError, SignatureError, ToolatlasError
from toolatlas.redact import Redactor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AttestResult:
    texts: dict[str, tuple[str, str, tuple[str, ...]]]  # tool -> (tool summary, server summary, tags)
    quarantined: dict[str, str]  # tool -> reason
    card_status: str  # "verified" | "missing" | "refused: <reason>" | "unattested"
    card: Card | None = None  # the verified card the texts came from


def resolve_path(cfg: Any, value: str) -> Path | None:
    """A [cards] path: `~` expanded, relative to the config file's folder."""
    if not value:
        return None
    p = Path(os.path.expanduser(value))
    if not p.is_absolute() and cfg.source and cfg.source != "<string>":
        p = Path(cfg.source).resolve().parent / p
    return p


@dataclass(frozen=True)
class _Loaded:
    card: Card | None
    error: str | None  # None = file missing when card is None


class Attestor:
    """Verifies cards with the operator's public key; thread-safe, blocking, cheap per call."""

    def __init__(self, cfg: Any) -> None:
        self._cfg = cfg
        self._redact = Redactor(secrets(cfg))  # what card endpoints are compared as
        cards = cfg.cards
        self._state_dir = cfg.daemon.state_dir
        self._policy: str = cards.policy
        self._required: bool = cards.required
        pub_path = resolve_path(cfg, cards.public_key)
        self._public: signing.Ed25519PublicKey | None = None
        if pub_path is not None:
            try:
                self._public = signing.load_public_key(pub_path)
            except SignatureError as exc:
                raise ConfigError(f"[cards] public_key: {exc}") from exc
        elif self._required:
            raise ConfigError("[cards] required = true needs [cards] public_key")
        self._private_path = resolve_path(cfg, cards.private_key)
        self._lock = threading.RLock()
        # A cache of parsed, verified card files by (inode, mtime, size); the verdicts
        # themselves belong to the catalog's view, not to this object.
        self._cache: dict[str, tuple[tuple[int, int, int], _Loaded]] = {}

    @property
    def settings(self) -> tuple[object, ...]:
        """What a verdict depends on besides the card file and the live tools: the trusted key,
        the policy, `required` and the key re-attestation signs with. A reload that changes
        them re-attests every upstream (LiveCatalog.reconfigure), card file changed or not."""
        kid = signing.key_id(self._public) if self._public else None
        return kid, self._policy, self._required, self._private_path

    def __repr__(self) -> str:
        kid = signing.key_id(self._public) if self._public else None
        return f"<Attestor key={kid} policy={self._policy} required={self._required} cached={len(self._cache)}>"

    # ------------------------------------------------------------------ loading

    def _load(self, server: str) -> _Loaded:
        path = card_path(self._state_dir, server)
        try:
            st = path.stat()
        except FileNotFoundError:
            self._cache.pop(server, None)
            return _Loaded(None, None)
        except OSError as exc:
            return _Loaded(None, f"cannot read card: {exc.strerror}")
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        hit = self._cache.get(server)
        if hit is not None and hit[0] == key:
            return hit[1]
        loaded = self._read_verified(server, path)
        self._cache[server] = (key, loaded)
        if loaded.error:
            log.warning("card for %s refused: %s", server, loaded.error)
        return loaded

    def _read_verified(self, server: str, path: Path) -> _Loaded:
        assert self._public is not None
        try:
            card = read_card(path)
            verify_card(card, self._public)
        except SignatureError as exc:
            return _Loaded(None, str(exc))
        if card.server.name != server:
            return _Loaded(None, f"card is for server {card.server.name!r}, not {server!r}")
        up = self._cfg.upstream_by_name(server)
        if up is not None:
            ident = identity_of(up, redact=self._redact)
            if (card.server.transport, card.server.endpoint) != (ident.transport, ident.endpoint):
                return _Loaded(
                    None,
                    f"card was signed for {card.server.transport} {card.server.endpoint!r}, "
                    f"config has {ident.transport} {ident.endpoint!r}",
                )
        return _Loaded(card, None)

    # ------------------------------------------------------------------ attest

    def attest(self, server: str, tools: list[ToolRecord]) -> AttestResult:
        """Decide, for one upstream's live tools, what to index and what to quarantine."""
        with self._lock:
            res, card = self._attest(server, tools)
            if card is not None:
                res = AttestResult(res.texts, res.quarantined, res.card_status, card)
            if res.quarantined:
                log.warning("%s: %d tool(s) quarantined (%s)", server, len(res.quarantined), res.card_status)
            return res

    def _publisher(self, tools: list[ToolRecord]) -> dict[str, tuple[str, str, tuple[str, ...]]]:
        return {t.tool: (t.description, "", ()) for t in tools}

    def _attest(self, server: str, tools: list[ToolRecord]) -> tuple[AttestResult, Card | None]:
        if self._public is None:
            return AttestResult(self._publisher(tools), {}, "unattested"), None
        loaded = self._load(server)
        if loaded.card is None:
            status = "missing" if loaded.error is None else f"refused: {loaded.error}"
            if self._required:
                why = "no signed card for this server" if loaded.error is None else f"card refused ({loaded.error})"
                return AttestResult({}, {t.tool: f"{why}; cards are required" for t in tools}, status), None
            return AttestResult(self._publisher(tools), {}, status), None

        card = loaded.card
        texts: dict[str, tuple[str, str, tuple[str, ...]]] = {}
        stale: dict[str, str] = {}
        tags = tuple(card.tags)
        for rec in tools:
            tc = card.tool(rec.tool)
            if tc is None:
                stale[rec.tool] = f"not in the signed card (card of {card.provenance.created_at}); regenerate the card"
            elif tc.schema_sha256 != schema_hash(rec.tool, rec.description, rec.input_schema):
                stale[rec.tool] = (
                    f"definition changed since the card was signed ({card.provenance.created_at}); "
                    "regenerate and sign the card"
                )
            else:
                texts[rec.tool] = (tc.summary, card.summary, tags)
        if stale and self._policy == "reattest":
            card, stale = self._reattest(server, card, tools, stale, texts)
        status = "verified" if card.provenance.attested else "unattested"
        return AttestResult(texts, stale, status), card

    def _reattest(
        self,
        server: str,
        card: Card,
        tools: list[ToolRecord],
        stale: dict[str, str],
        texts: dict[str, tuple[str, str, tuple[str, ...]]],
    ) -> tuple[Card, dict[str, str]]:
        from toolatlas.catalog.generators import BootstrapGenerator, ToolDraft, build_card, CardDraft

        if self._private_path is None:
            note = "; policy reattest needs [cards] private_key, none is configured"
            return card, {k: v + note for k, v in stale.items()}
        try:
            key = signing.load_private_key(self._private_path)
            assert self._public is not None
            if signing.key_id(key) != signing.key_id(self._public):
                raise SignatureError("[cards] private_key does not belong to [cards] public_key")
            live = {t.tool: t for t in tools}
            fresh = BootstrapGenerator().generate(server, [live[n] for n in stale])
            by_tool = {d.tool: d for d in fresh.tools}
            # Keep every still-valid card entry (live or not), replace the stale ones.
            kept = [tc for tc in card.tools if tc.tool not in stale]
            records: list[ToolRecord] = []
            drafts: list[ToolDraft] = []
            for tc in kept:
                rec = live.get(tc.tool)
                if rec is None:  # not live now: keep the signed entry as it was
                    continue
                records.append(rec)
                drafts.append(ToolDraft(tool=tc.tool, summary=tc.summary, examples=tuple(tc.examples)))
            for name in stale:
                records.append(live[name])
                drafts.append(by_tool[name])
            draft = CardDraft(
                summary=card.summary,
                tags=tuple(card.tags),
                tools=tuple(drafts),
                generator=card.provenance.generator,
                generator_version=card.provenance.generator_version,
                attested=card.provenance.attested,
                model=card.provenance.model,
            )
            new = build_card(card.server, draft, records, key, reattested=sorted(set(card.provenance.reattested) | set(stale)))
            # Offline entries (not live now) keep their signed text and hash.
            offline = [tc for tc in kept if tc.tool not in live]
            if offline:
                new = build_card_with_extra(new, offline, key)
            write_card(card_path(self._state_dir, server), new)
        except (ToolatlasError, OSError) as exc:
            note = f"; automatic re-attestation failed: {exc}"
            return card, {k: v + note for k, v in stale.items()}
        self._cache.pop(server, None)
        log.info("%s: re-attested %d tool(s) with bootstrap: %s", server, len(stale), ", ".join(sorted(stale)))
        for name in stale:
            signed = new.tool(name)
            assert signed is not None
            texts[name] = (signed.summary, new.summary, tuple(new.tags))
        return new, {}

    def changed_servers(self, servers: Iterable[str]) -> list[str]:
        """Those of `servers` (attested before) whose card file changed since this Attestor
        last read it (written, replaced, removed): call `attest` again for them so a
        regenerated or tampered card takes effect without waiting for the upstream's tool
        list to change. A new Attestor (after a reload) has read nothing yet, so every server
        with a card file is re-checked once. Cheap: one stat per server."""
        with self._lock:
            if self._public is None:
                return []
            out = []
            for server in servers:
                try:
                    st = card_path(self._state_dir, server).stat()
                    key: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_size)
                except FileNotFoundError:
                    key = None
                except OSError:
                    continue
                hit = self._cache.get(server)
                if key != (hit[0] if hit else None):
                    out.append(server)
            return sorted(out)

    # ------------------------------------------------------------------ status

    def summary(self, verdicts: Mapping[str, AttestResult]) -> dict[str, Any]:
        """JSON-serialisable view of `verdicts` (server -> last attestation) for catalog_status.
        Called on the event loop, so it reads only what never changes after __init__ and
        takes no lock: `attest` holds the lock in a worker while it reads, verifies and
        re-signs card files, and catalog_status would stall the daemon behind it."""
        servers: dict[str, Any] = {}
        for name, res in sorted(verdicts.items()):
            card = res.card
            entry: dict[str, Any] = {
                "card": res.card_status,
                "served": len(res.texts),
                "quarantined": dict(sorted(res.quarantined.items())),
            }
            if card is not None:
                entry["generator"] = card.provenance.generator
                entry["signed_at"] = card.provenance.created_at
                if card.provenance.reattested:
                    entry["reattested"] = list(card.provenance.reattested)
            servers[name] = entry
        return {
            "public_key": signing.key_id(self._public) if self._public else None,
            "policy": self._policy,
            "required": self._required,
            "quarantined_tools": sum(len(r.quarantined) for r in verdicts.values()),
            "refused_cards": sorted(n for n, r in verdicts.items() if r.card_status.startswith("refused")),
            "servers": servers,
        }


def build_card_with_extra(card: Card, extra: list[Any], key: Any) -> Card:
    """`card` plus already-hashed ToolCard entries `extra`, re-signed."""
    from toolatlas.catalog.cards import sign_card

    return sign_card(msgspec.structs.replace(card, tools=[*card.tools, *extra]), key)
