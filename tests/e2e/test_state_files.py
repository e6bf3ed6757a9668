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


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", UNREADABLE)
def test_an_unreadable_index_snapshot_is_logged_and_rebuilt(tmp_path: Path, kind: str) -> None:
    snapshot = tmp_path / "state" / "index" / "retrieval" / "snapshot-none.bin"
    plant_unreadable(snapshot, kind)
    with Daemon(tmp_path, stdio_testserver("alpha")) as d:
        assert "alpha__echo" in d.wait_for(lambda: d.search("echo a message back"), 30, "a search finds alpha")
        log = d.log.read_text()
        assert "retrieval.snapshot_corrupt" in log and str(snapshot) in log and "not a regular file" in log, log[-3000:]
        assert d.status()["index"]["ready"]
    assert "Traceback" not in d.log.read_text()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", UNREADABLE)
def test_an_unreadable_card_is_refused_and_the_server_still_served(tmp_path: Path, kind: str) -> None:
    key = tmp_path / "op.key"
    assert keygen_main(["--out", str(key)]) == 0
    plant_unreadable(card_path(tmp_path / "state", "alpha"), kind)
    cards = f'\n[cards]\npublic_key = "{key}.pub"\n'
    with Daemon(tmp_path, stdio_testserver("alpha"), daemon_extra=cards) as d:
        status = d.wait_for(lambda: (s := d.status()) and "alpha" in s["cards"]["servers"] and s, 30, "alpha attested")
        verdict = status["cards"]["servers"]["alpha"]["card"]
        assert verdict.startswith("refused: ") and "not a regular file" in verdict, verdict
        assert "alpha__echo" in d.search("echo a message back")
    assert "Traceback" not in d.log.read_text()
