"""`toolatlas learning show|forget|reset` on a usage store it cannot use: one line saying
which file and why, exit 74 (EX_IOERR), never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolatlas import learning_cli


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "toolatlas.toml"
    config.write_text(f'[daemon]\nsocket = "{tmp_path / "s.sock"}"\nstate_dir = "{tmp_path / "state"}"\n'
                      'metrics_addr = ""\n')
    return config


@pytest.mark.parametrize("action", [["show", "notes__add_note"], ["forget", "notes__add_note"], ["reset"]])
@pytest.mark.parametrize("store", ["a directory", "not a database"])
def test_an_unusable_store_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            action: list[str], store: str) -> None:
    path = tmp_path / "state" / "learning.sqlite3"
    if store == "a directory":
        path.mkdir(parents=True)
    else:
        path.parent.mkdir(parents=True)
        path.write_bytes(b"this is not an SQLite database. " * 256)
    code = learning_cli.main([*action, "--config", str(_config(tmp_path))])
    err = capsys.readouterr().err
    assert code == 74, err
    assert err.startswith(f"toolatlas learning: cannot use the usage store {path}: "), err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("action", [["show", "notes__add_note"], ["forget", "notes__add_note"], ["reset"]])
def test_a_store_path_that_cannot_be_looked_at_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                action: list[str]) -> None:
    """Whether the store exists is asked inside the same error handling: a state_dir the
    operator may not enter (the daemon's user owns it, 0750) raises EACCES there. Tests run
    as root, who may enter anything, so a name too long (ENAMETOOLONG) stands in for it."""
    config = tmp_path / "toolatlas.toml"
    state = tmp_path / ("x" * 300)
    config.write_text(f'[daemon]\nsocket = "{tmp_path / "s.sock"}"\nstate_dir = "{state}"\nmetrics_addr = ""\n')
    code = learning_cli.main([*action, "--config", str(config)])
    err = capsys.readouterr().err
    assert code == 74, err
    assert err.startswith(f"toolatlas learning: cannot use the usage store {state / 'learning.sqlite3'}: "), err
    assert len(err.strip().splitlines()) == 1, err


def test_reset_without_a_store_makes_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`sudo toolatlas learning reset` before the daemon made its store must not make one:
    root's file, 0600, would be one the daemon's user cannot open (learning would fail)."""
    config = _config(tmp_path)
    assert learning_cli.main(["reset", "--config", str(config), "--json"]) == 0
    assert '"reset": 0' in capsys.readouterr().out
    assert not (tmp_path / "state").exists()


def test_show_writes_a_querys_control_characters_as_escapes(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A query is whatever any principal typed: its escape sequences must not reach the
    operator's terminal, nor its newlines forge rows of `learning show`."""
    import time

    from toolatlas.retrieval.usage import UsageEvent, open_store

    config = _config(tmp_path)
    store = open_store(tmp_path / "state")
    hostile = "add a note\x1b[2J\x1b]0;pwned\x07\r\n    999  2020-01-01T00:00:00Z  forged row\u202e"
    store.add([UsageEvent(query=hostile, tool="notes__add_note", principal="token:other", at=time.time())])
    store.close()
    assert learning_cli.main(["show", "notes__add_note", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) == 2 and "forged row" in lines[1], out
    assert all(c.isprintable() for line in lines for c in line), out
    assert "\\x1b[2J" in lines[1] and "\\u202e" in lines[1], out


def test_reset_deletes_the_copies_moved_aside_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unreadable store the daemon moved aside (`learning.sqlite3.corrupt-<time>`) still
    holds users' queries; `reset` promises them all gone, so it deletes those copies too."""
    from toolatlas.retrieval.usage import open_store

    config = _config(tmp_path)
    state = tmp_path / "state"
    open_store(state).close()
    for name in ("learning.sqlite3.corrupt-1700000000", "learning.sqlite3.corrupt-1700000000-wal"):
        (state / name).write_bytes(b"a query a user typed " * 64)
    assert learning_cli.main(["reset", "--config", str(config), "--json"]) == 0
    assert '"moved_aside_deleted": 1' in capsys.readouterr().out
    assert sorted(p.name for p in state.iterdir() if "corrupt" in p.name) == []


@pytest.mark.parametrize("action", ["show", "forget"])
def test_a_tool_name_without_events_names_the_tools_with_some(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              action: str) -> None:
    """`forget notes_add_note` (one underscore) must not read as done while
    notes__add_note's events stay: stderr names the tools that have events."""
    import time

    from toolatlas.retrieval.usage import UsageEvent, open_store

    config = _config(tmp_path)
    store = open_store(tmp_path / "state")
    store.add([UsageEvent(query="add a note", tool="notes__add_note", principal="uid:0", at=time.time())] * 2)
    store.close()
    assert learning_cli.main([action, "notes_add_note", "--config", str(config), "--json"]) == 0
    captured = capsys.readouterr()
    assert '"notes_add_note"' in captured.out
    assert "no usage events of notes_add_note; tools with events: notes__add_note (2)" in captured.err, captured.err
    assert learning_cli.main(["show", "notes__add_note", "--config", str(config)]) == 0
    assert capsys.readouterr().err == ""


def test_show_says_when_a_query_was_last_used_not_last_stored(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """With `[store]`, another replica's event is stored here when it arrives, possibly
    after a newer local one: `last` is the newest event's time all the same."""
    import json
    import time

    from toolatlas.retrieval.usage import UsageEvent, open_store

    config = _config(tmp_path)
    now = time.time()
    store = open_store(tmp_path / "state")
    store.add([UsageEvent(query="add a note", tool="notes__add_note", principal="uid:0", at=at)
               for at in (now, now - 3600.0)])
    store.close()
    assert learning_cli.main(["show", "notes__add_note", "--config", str(config), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["queries"]
    assert row["count"] == 2 and row["last"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)), row


def test_forgotten_and_reset_queries_leave_no_text_on_disk(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`forget` and `reset` promise the words gone: with the daemon's store open (as while it
    runs), no file of state_dir still holds a deleted query, in the write-ahead log or in the
    database file's free space; nor after the daemon's own retention prune."""
    import time

    from toolatlas.retrieval.usage import UsageEvent, open_store

    def on_disk(text: bytes) -> list[str]:
        return [p.name for p in (tmp_path / "state").iterdir() if p.is_file() and text in p.read_bytes()]

    config = _config(tmp_path)
    daemon = open_store(tmp_path / "state")  # the running daemon's connection, open throughout
    try:
        now = time.time()
        daemon.add([UsageEvent(query=f"{word} query {i}", tool=f"notes__{word}", principal="uid:0", at=now - i)
                    for i in range(100) for word in ("diagnosis", "holiday", "payroll")])
        assert on_disk(b"diagnosis query") and on_disk(b"holiday query")
        assert learning_cli.main(["forget", "notes__diagnosis", "--config", str(config)]) == 0
        assert on_disk(b"diagnosis query") == [] and on_disk(b"holiday query")
        assert daemon.prune(now - 49.5) == 100  # the payroll events past retention
        assert on_disk(b"payroll query 50") == [] and on_disk(b"payroll query 49")
        assert learning_cli.main(["reset", "--config", str(config)]) == 0
        assert on_disk(b"holiday query") == [] and on_disk(b"payroll query") == []
    finally:
        daemon.close()
    capsys.readouterr()


@pytest.mark.parametrize("action", ["show", "forget"])
@pytest.mark.parametrize("tool", ["", "   "])
def test_an_empty_tool_name_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], action: str, tool: str) -> None:
    """`learning show ""` printed ": 0 usage event(s)" and exited 0, as if it had looked."""
    with pytest.raises(SystemExit) as stop:
        learning_cli.main([action, tool, "--config", str(_config(tmp_path))])
    assert stop.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "TOOL is empty; give a namespaced tool name, e.g. notes__add_note" in captured.err, captured.err
