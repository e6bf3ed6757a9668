"""The approval decisions as a pure plan (gateway.approval.plan_reconcile), the lifecycle
mapping, and the file store's persistence."""

from __future__ import annotations

import stat
from pathlib import Path

from toolatlas.config import parse
from toolatlas.gateway.approval import (
    Approvals, Decision, FileApprovalStore, Record, fingerprint, lifecycle, plan_reconcile,
)

OK = Record(Decision.APPROVED, "f1", 1.0, "uid:0", "approved by the operator")


def test_new_is_pending_changed_approved_goes_back_rejected_stays() -> None:
    records = {"a": OK, "r": Record(Decision.REJECTED, "f3", 1.0, "uid:0", "x"), "gone": OK}
    out, moves = plan_reconcile(records, {"a": "f1-changed", "r": "f3-changed", "new": "f9"}, required=True, now=5.0)
    assert out["a"].decision is Decision.PENDING and out["a"].fingerprint == "f1-changed"
    assert out["r"].decision is Decision.REJECTED
    assert out["new"].decision is Decision.PENDING and "gone" not in out
    assert [(m.upstream, m.old, m.new) for m in moves] == [("a", "approved", "pending"), ("new", None, "pending")]
    same, none = plan_reconcile({"a": OK}, {"a": "f1"}, required=True, now=5.0)
    assert same == {"a": OK} and none == []


def test_without_require_nothing_is_gated() -> None:
    out, moves = plan_reconcile({"a": OK}, {"a": "changed", "b": "f"}, required=False, now=1.0)
    assert moves == [] and "b" not in out


def test_lifecycle_maps_scouts_states() -> None:
    assert lifecycle(Decision.PENDING, "ready") == "pending"
    assert lifecycle(Decision.REJECTED, "ready") == "rejected"
    assert lifecycle(Decision.APPROVED, "ready") == "active"
    assert lifecycle(Decision.APPROVED, "degraded") == "degraded"
    assert lifecycle(Decision.APPROVED, "connecting") == "degraded"
    assert lifecycle(Decision.APPROVED, "disabled") == "inactive"


def test_fingerprint_follows_command_url_and_card_key(tmp_path: Path) -> None:
    key = tmp_path / "op.pub"
    key.write_text("key one")
    base = ('[[upstream]]\nname = "a"\ntransport = "stdio"\ncommand = "x"\nargs = ["1"]\n'
            '[[upstream]]\nname = "h"\ntransport = "http"\nurl = "http://127.0.0.1:1/mcp"\n')
    cfg = parse(f'[cards]\npublic_key = "{key}"\n' + base, source=str(tmp_path / "c.toml"))
    fa, fh = fingerprint(cfg.upstream[0], cfg), fingerprint(cfg.upstream[1], cfg)
    args = parse(f'[cards]\npublic_key = "{key}"\n' + base.replace('["1"]', '["2"]'), source=str(tmp_path / "c.toml"))
    assert fingerprint(args.upstream[0], args) != fa and fingerprint(args.upstream[1], args) == fh
    url = parse(f'[cards]\npublic_key = "{key}"\n' + base.replace(":1/", ":2/"), source=str(tmp_path / "c.toml"))
    assert fingerprint(url.upstream[1], url) != fh
    key.write_text("key two")
    assert fingerprint(cfg.upstream[0], cfg) != fa


def test_decisions_persist_in_a_private_file(tmp_path: Path) -> None:
    cfg = parse('[daemon]\nrequire_approval = true\n[[upstream]]\nname = "a"\ntransport = "stdio"\ncommand = "x"\n')
    seen: list[str] = []
    ap = Approvals(FileApprovalStore(tmp_path), on_transition=lambda t: seen.append(f"{t.old}->{t.new}"))
    ap.reconcile(cfg)
    assert ap.blocked() == {"a"}
    assert ap.decide("a", Decision.APPROVED, "uid:0") == {"upstream": "a", "approval": "approved", "previous": "pending"}
    assert ap.blocked() == frozenset() and seen == ["None->pending", "pending->approved"]
    assert stat.S_IMODE((tmp_path / "approvals.json").stat().st_mode) == 0o600
    again = Approvals(FileApprovalStore(tmp_path), on_transition=lambda t: seen.append("again"))
    again.reconcile(cfg)
    assert again.decision("a") is Decision.APPROVED and seen[-1] != "again"
    (tmp_path / "approvals.json").write_text("{not json")
    broken = Approvals(FileApprovalStore(tmp_path), on_transition=lambda t: None)
    broken.reconcile(cfg)
    assert broken.decision("a") is Decision.PENDING  # fails closed
