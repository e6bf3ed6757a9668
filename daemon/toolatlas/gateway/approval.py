"""The approval lifecycle of upstreams (`[daemon] require_approval`).

An operator's decision per upstream is `pending`, `approved` or `rejected`. With
`require_approval = true`, an upstream new to the config starts `pending`: it is connected and
listed (its tools are indexed) but serves nothing (visibility leaves it out) until
`toolatlas upstream approve NAME`; `reject` keeps it off. An approved upstream whose command,
arguments, URL or card key changed goes back to `pending` (its fingerprint no longer matches).
Decisions persist in `state_dir/approvals.json` (through `ApprovalStore`, so another store can
keep them) across restarts and reloads; an upstream removed from the config loses its record
(re-added, it is new again).

What catalog_status, `toolatlas upstream list`, events and metrics show is the lifecycle,
SCOUT's five states: `pending` and `rejected` (the decision), and for an approved upstream its
connection: `active` (ready), `degraded` (connecting or reconnecting) or `inactive` (disabled
or closed). Without require_approval every upstream counts as approved.

The decisions are pure (`plan_reconcile`); `Approvals` applies them and persists.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from toolatlas import events as ev
from toolatlas.config import Config, Upstream
from toolatlas.errors import BadInput
from toolatlas.metrics import Metrics
from toolatlas.paths import read_regular, write_atomic

log = logging.getLogger(__name__)

APPROVALS_FILE = "approvals.json"


class Decision(enum.Enum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"


# The lifecycle states shown (catalog_status, upstream list, metrics).
LIFECYCLE_STATES = ("pending", "active", "degraded", "inactive", "rejected")


@dataclass(frozen=True)
class Record:
    """One upstream's decision: what it is, for which fingerprint, when and by whom."""

    decision: Decision
    fingerprint: str
    changed_at: float
    by: str  # the principal that decided, or "daemon" for an automatic transition
    reason: str


@dataclass(frozen=True)
class Transition:
    upstream: str
    old: str | None  # None: no record before
    new: str
    by: str
    reason: str


class ApprovalStore(Protocol):
    """Where decisions persist: `load` returns what `save` last stored ({} at first)."""

    def load(self) -> dict[str, Record]: ...

    def save(self, records: Mapping[str, Record]) -> None: ...


class FileApprovalStore:
    """`state_dir/approvals.json`, mode 0600, replaced atomically."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.path = Path(state_dir) / APPROVALS_FILE

    def load(self) -> dict[str, Record]:
        try:
            raw = json.loads(read_regular(self.path))  # a FIFO there is refused, not waited on
            return {name: Record(decision=Decision(r["decision"]), fingerprint=str(r["fingerprint"]),
                                 changed_at=float(r["changed_at"]), by=str(r["by"]), reason=str(r["reason"]))
                    for name, r in raw["upstreams"].items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            # Unreadable: everything starts pending again (fail closed), and the file is kept aside.
            log.error("approvals file %s is unreadable (%s); every upstream is pending until approved again",
                      self.path, exc)
            self.path.rename(self.path.with_name(f"{APPROVALS_FILE}.broken-{int(time.time())}"))
            return {}

    def save(self, records: Mapping[str, Record]) -> None:
        data = {"upstreams": {n: {**asdict(r), "decision": r.decision.value} for n, r in sorted(records.items())}}
        write_atomic(self.path, json.dumps(data, indent=1).encode(), mode=0o600)


def fingerprint(up: Upstream, cfg: Config) -> str:
    """What an approval is for: the upstream's transport, command and arguments (stdio) or
    URL (sse, http), and the card key (`[cards] public_key`: its path and content)."""
    key_path = cfg.cards.public_key
    key_text = ""
    if key_path:
        base = Path(cfg.source).parent if cfg.source else Path.cwd()
        try:
            key_text = hashlib.sha256((base / key_path).read_bytes()).hexdigest()
        except OSError:
            key_text = "unreadable"
    what: dict[str, Any] = {"transport": type(up).__name__, "card_key": [key_path, key_text]}
    if hasattr(up, "command"):
        what.update(command=getattr(up, "command"), args=list(getattr(up, "args", [])))
    else:
        what.update(url=getattr(up, "url", ""))
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def plan_reconcile(records: Mapping[str, Record], prints: Mapping[str, str], *, required: bool,
                   now: float) -> tuple[dict[str, Record], list[Transition]]:
    """The records after the config's upstreams (`prints`: name -> fingerprint) were read, and
    the transitions. Without `required` nothing is gated: records are kept as they are (so a
    later switch to required remembers earlier decisions) and new upstreams get none."""
    out: dict[str, Record] = {}
    moves: list[Transition] = []
    for name, print_ in prints.items():
        rec = records.get(name)
        if rec is None:
            if required:
                out[name] = Record(Decision.PENDING, print_, now, "daemon", "new upstream")
                moves.append(Transition(name, None, "pending", "daemon", "new upstream"))
            continue
        if rec.fingerprint != print_ and rec.decision is Decision.APPROVED and required:
            why = "its command, URL or card key changed since it was approved"
            out[name] = Record(Decision.PENDING, print_, now, "daemon", why)
            moves.append(Transition(name, "approved", "pending", "daemon", why))
        elif rec.fingerprint != print_ and rec.decision is Decision.PENDING:
            out[name] = replace(rec, fingerprint=print_)
        else:
            out[name] = rec
    return out, moves


class Approvals:
    """The decisions in force; see the module docstring."""

    def __init__(self, store: ApprovalStore, *, on_transition: Callable[[Transition], None]) -> None:
        self._store = store
        self._on_transition = on_transition
        self._records: dict[str, Record] = store.load()
        self.required = False
        self._prints: dict[str, str] = {}
        # Hear each operator decision made here: (upstream, its record). The shared store's wiring
        # passes them to the other replicas, which `adopt` them.
        self.on_decided: list[Callable[[str, Record], None]] = []

    def __repr__(self) -> str:
        return f"<Approvals required={self.required} {({n: r.decision.value for n, r in self._records.items()})}>"

    def reconcile(self, cfg: Config) -> list[Transition]:
        """Take the (re)loaded config: new upstreams pending, changed approved ones back to
        pending, removed ones forgotten; persisted, and each transition reported."""
        self.required = cfg.daemon.require_approval
        self._prints = {u.name: fingerprint(u, cfg) for u in cfg.upstream}
        records, moves = plan_reconcile(self._records, self._prints, required=self.required, now=time.time())
        changed = records != self._records
        self._records = records
        if changed:
            self._save()
        for move in moves:
            self._on_transition(move)
        return moves

    def blocked(self) -> frozenset[str]:
        """Upstreams that serve nothing now (pending or rejected, while approval is required)."""
        if not self.required:
            return frozenset()
        return frozenset(n for n in self._prints
                         if (r := self._records.get(n)) is None or r.decision is not Decision.APPROVED)

    def decision(self, name: str) -> Decision:
        if not self.required:
            return Decision.APPROVED
        rec = self._records.get(name)
        return Decision.PENDING if rec is None else rec.decision

    def record(self, name: str) -> Record | None:
        return self._records.get(name)

    def decide(self, name: str, decision: Decision, by: str) -> dict[str, Any]:
        """An operator's approve or reject: `{"upstream", "approval", "previous"}`. BadInput
        for an upstream not in the config, or when approval is not required."""
        if name not in self._prints:
            known = ", ".join(self._prints) or "none (the config has no [[upstream]])"
            raise BadInput(f"no upstream named {name!r}; the configured upstreams are: {known}")
        if not self.required:
            raise BadInput("approvals are off: set [daemon] require_approval = true and reload to gate upstreams")
        old = self.decision(name)
        reason = f"{decision.value} by the operator"
        if old is not decision:
            # Later than the decision it replaces, also when that one came from a replica whose
            # clock runs ahead of this host's: otherwise the others would keep the older one.
            prev = self._records.get(name)
            at = time.time() if prev is None else max(time.time(), prev.changed_at + 0.001)
            record = self._records[name] = Record(decision, self._prints[name], at, by, reason)
            self._save()
            self._on_transition(Transition(name, old.value, decision.value, by, reason))
            for hear in self.on_decided:
                hear(name, record)
        return {"upstream": name, "approval": decision.value, "previous": old.value}

    def adopt(self, name: str, record: Record) -> bool:
        """Another replica's operator decision on `name`: taken when it is for the upstream as
        configured here (same fingerprint) and newer than this replica's own operator decision
        (an automatic `pending` here yields to it). True when the decision in force changed."""
        cur = self._records.get(name)
        if self._prints.get(name) != record.fingerprint:
            return False
        if cur is not None and cur.by != "daemon" and cur.changed_at >= record.changed_at:
            return False
        old = self.decision(name)
        self._records[name] = record
        self._save()
        if old is record.decision or not self.required:
            return False
        self._on_transition(Transition(name, old.value, record.decision.value, record.by,
                                       f"{record.reason} (on another replica)"))
        return True

    def _save(self) -> None:
        try:
            self._store.save(self._records)
        except OSError as exc:
            log.error("cannot persist approvals (%s): decisions hold until the daemon stops", exc)


def transition_reporter(events: ev.Events, metrics: Metrics) -> Callable[[Transition], None]:
    """The `on_transition` that logs, counts and emits `upstream_approval_changed`."""

    def report(t: Transition) -> None:
        log.info("upstream %s: approval %s -> %s (%s, by %s)", t.upstream, t.old, t.new, t.reason, t.by)
        metrics.count_approval(t.new)
        events.emit(ev.UPSTREAM_APPROVAL_CHANGED, upstream=t.upstream, old=t.old, new=t.new, by=t.by, reason=t.reason)

    return report


def held_reason(name: str, approval: str) -> str | None:
    """Why upstream `name`, in lifecycle state `approval`, serves nothing (catalog_status's
    `not_searchable_because`, a refused call's message), or None when approval holds nothing."""
    if approval == "pending":
        return f"awaiting approval: `toolatlas upstream approve {name}`"
    if approval == "rejected":
        return "rejected by the operator"
    return None


def lifecycle(decision: Decision, state: str) -> str:
    """The lifecycle state shown for an upstream with `decision` in connection `state`."""
    if decision is not Decision.APPROVED:
        return str(decision.value)
    if state == "ready":
        return "active"
    if state in ("connecting", "degraded"):
        return "degraded"
    return "inactive"


__all__ = ["ApprovalStore", "Approvals", "Decision", "FileApprovalStore", "LIFECYCLE_STATES", "Record", "Transition",
           "fingerprint", "held_reason", "lifecycle", "plan_reconcile", "transition_reporter"]
