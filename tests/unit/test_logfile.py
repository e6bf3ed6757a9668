"""The shim-started daemon's log kept bounded (toolatlas.logfile): copy to `.1`, truncate,
the next line at the start of the file (append mode), on real files and descriptors."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from toolatlas import logfile
from toolatlas.logfile import max_bytes_from_env, rotate_if_large


def _open(path: Path, append: bool = True) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else 0), 0o644)


def test_a_log_past_its_bound_is_copied_aside_and_starts_again(tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    fd = _open(log)
    try:
        os.write(fd, b"x" * 100 + b"\n")
        assert rotate_if_large(fd, 200) is None and log.stat().st_size == 101  # under the bound
        os.write(fd, b"y" * 150 + b"\n")
        assert rotate_if_large(fd, 200) == str(log) + ".1"
        assert (tmp_path / "daemon.log.1").read_bytes() == b"x" * 100 + b"\n" + b"y" * 150 + b"\n"
        assert (tmp_path / "daemon.log.1").stat().st_mode & 0o777 == 0o600  # events are the users' business
        os.write(fd, b"next line\n")
        assert log.read_bytes() == b"next line\n"  # at the start: no hole where the old lines were
        os.write(fd, b"z" * 300)
        assert rotate_if_large(fd, 200) and (tmp_path / "daemon.log.1").read_bytes() == b"next line\n" + b"z" * 300
        assert not (tmp_path / "daemon.log.1.tmp").exists()
    finally:
        os.close(fd)


def test_what_is_not_an_appended_regular_file_is_left_alone(tmp_path: Path) -> None:
    log = tmp_path / "plain.log"
    fd = _open(log, append=False)  # `2> file`: truncating would leave a hole before the next line
    try:
        os.write(fd, b"x" * 500)
        assert rotate_if_large(fd, 100) is None and log.stat().st_size == 500
    finally:
        os.close(fd)
    r, w = os.pipe()
    try:
        assert rotate_if_large(w, 0) is None
    finally:
        os.close(r)
        os.close(w)


def test_the_bound_comes_from_the_shim_once(monkeypatch: pytest.MonkeyPatch) -> None:
    for text, want in (("4096", 4096), ("0", None), ("-5", None), ("lots", None), ("", None)):
        monkeypatch.setenv(logfile.ENV, text)
        assert max_bytes_from_env() == want
        assert logfile.ENV not in os.environ  # no process the daemon starts inherits it


async def test_the_daemon_side_task_keeps_the_file_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logfile, "CHECK_EVERY_S", 0.01)
    log = tmp_path / "daemon.log"
    fd = _open(log)
    try:
        os.write(fd, b"e" * 1000)
        async with anyio.create_task_group() as tg:
            await tg.start(logfile.keep_bounded, 500, fd)
            with anyio.fail_after(30):
                while not (tmp_path / "daemon.log.1").exists():
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        assert log.stat().st_size == 0 and (tmp_path / "daemon.log.1").stat().st_size == 1000
    finally:
        os.close(fd)
