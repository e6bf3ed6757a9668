"""`Sharing`: what a gateway shares through the store today, wired by the composition root.

- **Embeddings**: the engine looks vectors up in the shared cache before embedding and
  publishes what it embeds (vectors.py), so a second replica embeds nothing the first did.
- **Catalog change notices** (events of kind `catalog.changed`: upstream -> listing hash):
  a replica whose catalog of an upstream changed says so; another replica whose own listing
  of that upstream differs re-lists it at once (its own session: sessions are per process),
  instead of waiting for its poll or a notification it may never get.
- **Card verification results** (state of kind `card`): a card this replica verified (or
  re-attested) is shared with its verdict; another replica checks the signature with its
  own public key and adopts it when it is newer than its own card file, then re-attests.

- **Usage feedback** (events of kind `feedback`): a usage event recorded on one replica is
  learned from on the others (stored in their own usage store, its query embedded there), so
  a tool executed after a search through A ranks higher on B too, for the same principal.
  `toolatlas learning forget|reset` on any host deletes the shared copies and logs a
  `feedback.forget` event: each replica deletes its own copies up to that moment, and drops
  those that reach it later (a replica's buffered writes from before the forget).
- **Upstream approvals** (state of kind `approval`: upstream -> the operator's decision): an
  approve or reject on one replica is in force on the others that run the same upstream
  config (same fingerprint), and on a replica started later; an automatic `pending` yields.
- **Audit records** (events of kind `audit`), when `[events] audit_file` is set: each audit
  record written to the file is also spooled for the store (audit.py), for one shared trail.

Without `[store] url` none of this is built. The other features plug into `ports.Shared`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from toolatlas.catalog import signing
from toolatlas.catalog.attest import resolve_path
from toolatlas.catalog.cards import card_path, decode_card, encode_card, read_card, verify_card, write_card
from toolatlas.catalog.model import ToolRecord
from toolatlas.errors import SignatureError, ToolatlasError
from toolatlas.gateway.approval import Decision, Record
from toolatlas.retrieval.usage import UsageEvent
from toolatlas.store.ports import APPROVAL, CARD, CATALOG_CHANGED, FEEDBACK, FEEDBACK_FORGET, Change
from toolatlas.store.replica import Replica
from toolatlas.store.vectors import VectorBridge

if TYPE_CHECKING:
    from toolatlas.gateway import Gateway

log = logging.getLogger(__name__)

SYNC_INTERVAL_S = 2.0  # a change no listener announced (a card re-check) is shared within this
# The shared usage events are pruned to [learning] retention_days this often (and once connected):
# they hold users' queries, and the retention promise covers every copy.
PRUNE_EVERY_S = 3600.0


def listing_hash(listing: Sequence[ToolRecord]) -> str:
    """A digest of an upstream's listing (its tools' content hashes, in name order)."""
    h = hashlib.sha256()
    for rec in sorted(listing, key=lambda r: r.name):
        h.update(rec.name.encode() + b"\0" + (rec.content_hash or "").encode() + b"\n")
    return h.hexdigest()[:32]


class Sharing:
    """Binds one gateway to one replica; see the module docstring."""

    def __init__(self, gateway: Gateway, replica: Replica) -> None:
        self._gw = gateway
        self.replica = replica
        self._published: dict[str, str] = {}  # upstream -> listing hash this replica announced
        self._remote: dict[str, str] = {}  # upstream -> listing hash another replica announced
        self._hashes: dict[str, tuple[object, str]] = {}  # upstream -> (listing object, its hash)
        self._cards_published: dict[str, str] = {}
        self._cards_remote: dict[str, str] = {}
        self._relisting: set[str] = set()
        self.counts = dict.fromkeys(("relists_prompted", "cards_adopted", "cards_refused"), 0)
        self._wake = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None
        replica.subscribe(CATALOG_CHANGED, self._catalog_changed)
        replica.subscribe(CARD, self._card_shared)
        self._approvals: list[tuple[str, dict[str, Any]]] = []  # decisions made here, to share
        replica.subscribe(APPROVAL, self._approval_shared)
        gateway.approvals.on_decided.append(self._approval_decided)
        self._feedback: list[tuple[str, dict[str, Any]]] = []  # usage events recorded here, to share
        replica.subscribe(FEEDBACK, self._feedback_shared)
        self._forgotten: dict[str, float] = {}  # tool or "*" -> usage events up to then are forgotten
        replica.subscribe(FEEDBACK_FORGET, self._feedback_forgotten)
        gateway.learning.on_recorded.append(self._feedback_recorded)
        gateway.catalog.on_change.append(self._changed)
        if gateway.events.audit is not None:  # the audit trail is configured: share it too
            gateway.events.shared_audit = replica.audit_sink()
        gateway.status_service.sections["store"] = lambda _scope: self.status()  # the replica's, no tool figures

    def status(self) -> dict[str, Any]:
        return {**self.replica.status(), **self.counts}

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The replica's service, the engine's shared embedding cache, and the sync loop."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            await tg.start(self.replica.run)
            embedder = self._gw.cfg.search.embedder
            if embedder != "none":
                from toolatlas.retrieval.embed import DIM, document_space

                self._gw.engine.share_vectors(VectorBridge(self.replica, document_space(embedder), DIM))
            task_status.started()
            seeded, pruned = False, -math.inf
            while True:
                if not seeded and self.replica.connected:
                    # What the others last announced: a replica starting on the same catalog
                    # announces nothing (a store down at start: it announces, harmlessly).
                    seeded = True
                    for change in await self.replica.latest(CATALOG_CHANGED):
                        if change.origin != self.replica.origin:
                            self._remote.setdefault(change.key, str(change.body.get("hash")))
                    for change in await self.replica.latest(FEEDBACK_FORGET):  # for late arrivals
                        self._forget_until(change)
                await self._sync()
                if self.replica.connected and time.monotonic() - pruned > PRUNE_EVERY_S:
                    retention = self._gw.cfg.learning.retention_days * 86400.0
                    n = await self.replica.prune(FEEDBACK, time.time() - retention)
                    if n is not None:
                        pruned = time.monotonic()
                        if n:
                            log.info("store: %d shared usage event(s) past retention_days deleted", n)
                with anyio.move_on_after(SYNC_INTERVAL_S):
                    await self._wake.wait()
                self._wake = anyio.Event()

    async def _changed(self) -> None:
        self._wake.set()

    def _hash(self, server: str, listing: tuple[ToolRecord, ...]) -> str:
        got = self._hashes.get(server)
        if got is not None and got[0] is listing:
            return got[1]
        h = listing_hash(listing)
        self._hashes[server] = (listing, h)
        return h

    def _approval_decided(self, name: str, record: Record) -> None:
        self._approvals.append((name, {"decision": record.decision.value, "fingerprint": record.fingerprint,
                                       "changed_at": record.changed_at, "by": record.by, "reason": record.reason}))
        self._wake.set()

    async def _approval_shared(self, change: Change) -> None:
        """Another replica's approve or reject: in force here too when it is for the same
        upstream config; clients whose lists change are told, as for a decision made here."""
        b = change.body
        try:
            record = Record(Decision(b["decision"]), str(b["fingerprint"]), float(b["changed_at"]), str(b["by"]),
                            str(b["reason"]))
        except (KeyError, ValueError, TypeError) as exc:
            log.warning("store: an approval of %r from %s is malformed (%s); ignored", change.key, change.origin, exc)
            return
        if self._gw.approvals.adopt(change.key, record):
            await self._gw.catalog.announce()
            await self._gw.federation.reloaded()

    def _feedback_recorded(self, event: UsageEvent) -> None:
        self._feedback.append((event.tool, {"query": event.query, "tool": event.tool, "principal": event.principal,
                                            "at": event.at, "index_version": event.index_version}))
        self._wake.set()

    async def _feedback_shared(self, change: Change) -> None:
        """Another replica's usage event: learned from here too (its principal's, as there),
        unless an operator forgot its tool's events after it was recorded. Dated no later than
        now here: a replica whose clock runs ahead (by a year, say) would otherwise have its
        events kept past `retention` by as much, at full weight all the while."""
        b = change.body
        try:
            event = UsageEvent(query=str(b["query"]), tool=str(b["tool"]), principal=str(b["principal"]),
                               at=float(b["at"]), index_version=int(b["index_version"]))
        except (KeyError, ValueError, TypeError) as exc:
            log.warning("store: a usage event from %s is malformed (%s); ignored", change.origin, exc)
            return
        if not math.isfinite(event.at):
            log.warning("store: a usage event from %s has no usable time (%r); ignored", change.origin, b["at"])
            return
        if not self._forgotten_event(event.tool, event.at):
            now = time.time()
            await self._gw.learning.ingest(event if event.at <= now else dataclasses.replace(event, at=now))

    def _forgotten_event(self, tool: str, at: float) -> bool:
        return at <= max(self._forgotten.get(tool, -math.inf), self._forgotten.get("*", -math.inf))

    def _forget_until(self, change: Change) -> tuple[str | None, float] | None:
        """Note a FEEDBACK_FORGET event; (tool or None for every tool, until), or None if malformed."""
        tool, until = change.body.get("tool"), change.body.get("until")
        if not isinstance(until, (int, float)) or not (tool is None or isinstance(tool, str)):
            log.warning("store: a usage forget from %s is malformed; ignored", change.origin)
            return None
        key = tool if tool is not None else "*"
        self._forgotten[key] = max(self._forgotten.get(key, -math.inf), float(until))
        return tool, float(until)

    async def _feedback_forgotten(self, change: Change) -> None:
        """`toolatlas learning forget|reset` ran against the store: delete this replica's copies
        of those usage events (the learning service re-ranks), and from now on drop any that
        arrive late."""
        forget = self._forget_until(change)
        if forget is not None:
            n = await self._gw.learning.forget(*forget)
            log.info("store: %d usage event(s) of %s forgotten (asked through the store by %s)", n,
                     forget[0] or "every tool", change.origin)

    async def _sync(self) -> None:
        """Announce the approvals, listings and verified cards that changed here since the
        last sync (into the on-disk buffer: also while the store is down)."""
        while self._approvals:  # ordered in the store as `adopt` orders them: by when decided
            name, body = self._approvals.pop(0)
            await self._write(functools.partial(self.replica.put, at=float(body["changed_at"])), APPROVAL, name, body)
        while self._feedback:
            tool, body = self._feedback.pop(0)
            if not self._forgotten_event(tool, float(body["at"])):
                await self._write(self.replica.append, FEEDBACK, tool, body)
        view = self._gw.catalog.view
        for name, entry in sorted(view.servers.items()):
            if not entry.available or entry.listing is None:
                continue
            cached = self._hashes.get(name)
            h = (cached[1] if cached is not None and cached[0] is entry.listing
                 else await anyio.to_thread.run_sync(self._hash, name, entry.listing))
            if h != self._published.get(name) and h != self._remote.get(name):
                self._published[name] = h
                await self._write(self.replica.append, CATALOG_CHANGED, name, {"hash": h, "tools": len(entry.listing)})
            verdict = entry.verdict
            if verdict is None or verdict.card is None or verdict.card_status != "verified":
                continue
            text = encode_card(verdict.card)
            sha = hashlib.sha256(text).hexdigest()
            if sha != self._cards_published.get(name) and sha != self._cards_remote.get(name):
                self._cards_published[name] = sha
                await self._write(self.replica.put, CARD, name, {
                    "sha256": sha, "created_at": verdict.card.provenance.created_at, "card": text.decode(),
                    "status": verdict.card_status, "served": len(verdict.texts),
                    "quarantined": len(verdict.quarantined)})

    async def _write(self, how: Any, kind: str, key: str, body: dict[str, Any]) -> None:
        try:
            await how(kind, key, body)
        except Exception as exc:  # a full buffer: counted in `refused`, the next change retries
            log.warning("store.write_refused kind=%s key=%s: %s", kind, key, exc)

    # -- what other replicas say ---------------------------------------------------------------

    async def _catalog_changed(self, change: Change) -> None:
        server, remote = change.key, str(change.body.get("hash"))
        self._remote[server] = remote
        entry = self._gw.catalog.view.server(server)
        if self._gw.cfg.upstream_by_name(server) is None or not entry.available or entry.listing is None:
            return
        if self._hash(server, entry.listing) == remote or server in self._relisting or self._tg is None:
            return
        self._relisting.add(server)
        self._tg.start_soon(self._relist, server)

    async def _relist(self, server: str) -> None:
        try:
            self.counts["relists_prompted"] += 1
            log.info("store: replica reported a new catalog of %s; re-listing it here", server)
            await self._gw.admin.relist(server)
        except ToolatlasError as exc:
            log.warning("store: re-listing %s after another replica's notice failed: %s", server, exc)
        finally:
            self._relisting.discard(server)

    async def _card_shared(self, change: Change) -> None:
        server = change.key
        cfg = self._gw.cfg
        pub_path = resolve_path(cfg, cfg.cards.public_key)
        if pub_path is None or cfg.upstream_by_name(server) is None:
            return
        try:
            card = decode_card(str(change.body["card"]).encode(), source=f"shared card of {server}")
            verify_card(card, await anyio.to_thread.run_sync(signing.load_public_key, pub_path))
            if card.server.name != server:
                raise SignatureError(f"card is for server {card.server.name!r}, not {server!r}")
        except (SignatureError, KeyError, ToolatlasError) as exc:
            self.counts["cards_refused"] += 1
            log.warning("store: refused the card of %s shared by %s: %s", server, change.origin, exc)
            return
        self._cards_remote[server] = str(change.body.get("sha256"))
        path = card_path(cfg.daemon.state_dir, server)
        try:
            local = await anyio.to_thread.run_sync(read_card, path)
        except (OSError, ToolatlasError):
            local = None
        if local is not None and local.provenance.created_at >= card.provenance.created_at:
            return
        await anyio.to_thread.run_sync(write_card, path, card)
        self.counts["cards_adopted"] += 1
        log.info("store: adopted the card of %s signed %s (shared by %s)", server, card.provenance.created_at,
                 change.origin)
        await self._gw.catalog.recheck([server])


__all__ = ["Sharing", "listing_hash"]
