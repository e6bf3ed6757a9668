"""Issue #15 item 11: a state file under state_dir that cannot be read (a directory where the
file should be, or a FIFO, which would block a plain open() for good) is treated like a
corrupt one: the daemon starts, logs it, rebuilds, and serves. Tests run as root, so an
unreadable file is emulated by what root cannot read either: a directory or a FIFO."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.daemon import Daemon, stdio_testserver
from tests.support.files import UNREADABLE, plant_unreadable
from toolatlas.catalog.cards import card_path
from toolatlas.catalog.cards_cli import keygen_main

# Part of the hostile suite (#15): `pytest -m hostile` runs it alone.
pytestmark = pytest.mark.hostile


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", UNREADABLE)
def test_an_unreadable_snapshot_and_card_are_logged_and_the_daemon_serves(tmp_path: Path, kind: str) -> None:
    snapshot = tmp_path / "state" / "index" / "retrieval" / "snapshot-none.bin"
    plant_unreadable(snapshot, kind)
    plant_unreadable(card_path(tmp_path / "state", "alpha"), kind)
    key = tmp_path / "op.key"
    assert keygen_main(["--out", str(key)]) == 0
    with Daemon(tmp_path, stdio_testserver("alpha"), daemon_extra=f'\n[cards]\npublic_key = "{key}.pub"\n') as d:
        # the index is rebuilt from the live catalog
        assert "alpha__echo" in d.wait_for(lambda: d.search("echo a message back"), 30, "a search finds alpha")
        log = d.log.read_text()
        assert "retrieval.snapshot_corrupt" in log and str(snapshot) in log and "not a regular file" in log, log[-3000:]
        # ... and written again: what was in its place is moved aside, so the rebuilt file can take it
        index = d.wait_for(lambda: (i := d.status()["index"])["persisted_version"] == i["version"] and i, 30, "persisted")
        assert index["persist_failures"] == 0 and snapshot.is_file(), index
        assert "retrieval.state_file_unusable" in d.log.read_text()
        # the card is refused, and (cards not required) the server's tools are served all the same
        status = d.wait_for(lambda: (s := d.status()) and "alpha" in s["cards"]["servers"] and s, 30, "alpha attested")
        verdict = status["cards"]["servers"]["alpha"]["card"]
        assert verdict.startswith("refused: ") and "not a regular file" in verdict, verdict
    assert "Traceback" not in d.log.read_text()


STORE = '\n[store]\nurl = "postgresql://toolatlas@127.0.0.1:1/toolatlas"\n'  # nothing listens: unreachable


def _serves_with_the_store_down(tmp_path: Path) -> str:
    """Start a daemon whose shared store is unreachable; it must serve. Returns its log."""
    with Daemon(tmp_path, stdio_testserver("alpha"), daemon_extra=STORE) as d:
        assert "alpha__echo" in d.wait_for(lambda: d.search("echo a message back"), 30, "a search finds alpha")
        assert d.status()["store"]["configured"]
    log = d.log.read_text()
    assert "Traceback" not in log, log[-3000:]
    return log


@pytest.mark.timeout(90)
def test_a_replica_name_file_that_is_not_text_is_replaced(tmp_path: Path) -> None:
    """state_dir/store/origin holding bytes that are not UTF-8 (a corrupted file) is logged
    and a new replica name is made, as for one that cannot be read: the daemon starts."""
    origin = tmp_path / "state" / "store" / "origin"
    origin.parent.mkdir(parents=True)
    origin.write_bytes(b"\xff\xfe\x00" * 10)
    log = _serves_with_the_store_down(tmp_path)
    assert f"cannot read {origin}" in log, log[-3000:]
    assert origin.read_text().strip()  # the new name, kept


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", UNREADABLE)
@pytest.mark.parametrize("name", ["outbox.jsonl", "outbox.done"])
def test_an_unusable_store_outbox_file_is_moved_aside_and_the_daemon_serves(tmp_path: Path, name: str, kind: str) -> None:
    """The shared store's write buffer files (state_dir/store/outbox.jsonl, outbox.done) found
    to be a directory or a FIFO are moved aside, logged, and the outbox starts afresh: the
    daemon starts and serves (it crashed on a directory and hung for good on a FIFO)."""
    path = tmp_path / "state" / "store" / name
    plant_unreadable(path, kind)
    log = _serves_with_the_store_down(tmp_path)
    assert f"store.outbox_unusable {path} is not a regular file" in log, log[-3000:]
    assert path.is_file() or not path.exists()
    assert [p.name for p in path.parent.glob(f"{name}.unusable-*")], list(path.parent.iterdir())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["origin", "events.cursor"])
def test_a_fifo_as_the_replica_name_or_event_cursor_does_not_hold_up_the_start(tmp_path: Path, name: str) -> None:
    """state_dir/store/origin (the replica name) and events.cursor are read at start: a FIFO
    there (a plain read waits for a writer for good) is logged like an unreadable file, and
    the daemon starts and serves."""
    path = tmp_path / "state" / "store" / name
    plant_unreadable(path, "fifo")
    log = _serves_with_the_store_down(tmp_path)
    assert str(path) in log and "not a regular file (a FIFO)" in log, log[-3000:]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", UNREADABLE)
@pytest.mark.parametrize(("name", "event"), [("cursor", "store.audit_cursor_unusable"),
                                             ("0000000001.jsonl", "store.audit_segment_unusable")])
def test_an_unusable_audit_spool_file_is_moved_aside_and_the_daemon_serves(
        tmp_path: Path, kind: str, name: str, event: str) -> None:
    """The audit spool (state_dir/store/audit, opened at start when it is there) keeps its
    read position in `cursor` and its records in segments (NNNNNNNNNN.jsonl): either one
    found to be a directory or a FIFO is moved aside and logged, and the daemon starts (it
    crashed on a directory, and hung for good on a FIFO as the cursor)."""
    path = tmp_path / "state" / "store" / "audit" / name
    plant_unreadable(path, kind)
    log = _serves_with_the_store_down(tmp_path)
    assert f"{event} {path} is not a regular file" in log, log[-3000:]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", UNREADABLE)
def test_an_unreadable_approvals_file_leaves_every_upstream_pending_and_the_daemon_serves(tmp_path: Path, kind: str) -> None:
    """state_dir/approvals.json that is a directory or a FIFO (a plain read waits for good) is
    logged and set aside like any unreadable approvals file: every upstream pending (fail
    closed), and the daemon answers."""
    path = tmp_path / "state" / "approvals.json"
    plant_unreadable(path, kind)
    with Daemon(tmp_path, stdio_testserver("alpha"), daemon_extra="require_approval = true\n") as d:
        assert [(s["name"], s["approval"]) for s in d.status()["servers"]] == [("alpha", "pending")]
    log = d.log.read_text()
    assert f"approvals file {path} is unreadable" in log and "Traceback" not in log, log[-3000:]
    assert list(path.parent.glob("approvals.json.broken-*"))


def test_a_state_dir_that_cannot_be_made_is_one_config_error_line(tmp_path: Path) -> None:
    """A state_dir under a regular file (or a folder of another user) cannot be made: serve
    died with two tracebacks at the approvals file (exit 1), and a shim --config that started
    it could only say 'exited with status 1'. Now it is one line naming the key and the path,
    exit 78, before any upstream starts."""
    import subprocess
    import sys

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    d = Daemon(tmp_path, stdio_testserver("alpha"))
    text = d.config.read_text()
    d.config.write_text(text.replace(f'state_dir = "{tmp_path / "state"}"', f'state_dir = "{blocker / "state"}"'))
    assert str(blocker / "state") in d.config.read_text()
    r = subprocess.run([sys.executable, "-m", "toolatlas", "serve", "--config", str(d.config)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 78, r.stderr
    assert r.stderr == (f"toolatlas: config error: {d.config}: [daemon] state_dir {str(blocker / 'state')!r} "
                        "cannot be used: Not a directory\n"), r.stderr
