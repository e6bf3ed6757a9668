"""CLI output into a pipe whose reader has gone (`| head`): a quiet exit, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run_into_closed_pipe(args: list[str]) -> subprocess.CompletedProcess[bytes]:
    r, w = os.pipe()
    os.close(r)  # the reader is gone before the first line is written
    try:
        env = dict(os.environ, PYTHONPATH=str(ROOT / "daemon"))
        return subprocess.run([sys.executable, "-m", "toolatlas", *args], stdout=w,
                              stderr=subprocess.PIPE, env=env, timeout=60, check=False)
    finally:
        os.close(w)


@pytest.mark.parametrize("args", [["check-config", str(ROOT / "conf" / "example.toml")], ["--help"]])
def test_output_into_a_closed_pipe_exits_quietly(args: list[str]) -> None:
    done = _run_into_closed_pipe(args)
    assert b"Traceback" not in done.stderr, done.stderr.decode()
    assert b"BrokenPipeError" not in done.stderr, done.stderr.decode()
    assert done.returncode in (0, 141), (done.returncode, done.stderr.decode())


def test_real_pipe_into_head_is_quiet(tmp_path: Path) -> None:
    cmd = f"{sys.executable} -m toolatlas --help | head -c 1 >/dev/null"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "daemon"))
    done = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], stderr=subprocess.PIPE,
                          env=env, timeout=60, check=False)
    assert b"Traceback" not in done.stderr, done.stderr.decode()
    assert done.returncode in (0, 141)
