"""Upstream config structs for tests that drive ``toolatlas.upstream`` directly (no daemon);
the daemon's TOML lives with its harness in ``tests.support.daemon``."""

from __future__ import annotations

from typing import Any

import json
import sys
from pathlib import Path

import msgspec

from toolatlas.config import HttpUpstream, SseUpstream, StdioUpstream, Timeouts, Upstream

from tests.support.servers import EVERYTHING_BIN, testserver_args

# Short enough that a broken test fails fast, long enough for 2 loaded CI cores.
TEST_TIMEOUTS = Timeouts(connect=15.0, list_tools=10.0, call=20.0, ping=5.0)


def make_upstream(name: str, transport: str, **fields: Any) -> Upstream:
    """A config upstream struct; ``timeouts`` default to TEST_TIMEOUTS."""
    fields.setdefault("timeouts", TEST_TIMEOUTS)
    cls: type[Upstream] = {"stdio": StdioUpstream, "sse": SseUpstream, "http": HttpUpstream}[transport]  # type: ignore[assignment]
    return cls(name=name, **fields)


def stdio_testserver(name: str = "ts", *args: str, **fields: Any) -> StdioUpstream:
    """A stdio upstream running the project's test server with ``args`` (from the suite's fork
    server: ``testserver_args``)."""
    up = make_upstream(name, "stdio", command=sys.executable, args=testserver_args(*args), **fields)
    assert isinstance(up, StdioUpstream)
    return up


def stdio_everything(name: str = "everything", **fields: Any) -> StdioUpstream:
    """A stdio upstream running npm's server-everything (skips when it is not installed)."""
    if not EVERYTHING_BIN.exists():
        import pytest

        pytest.skip("npm server-everything is not installed (make npm)")
    up = make_upstream(name, "stdio", command=str(EVERYTHING_BIN), args=["stdio"], **fields)
    assert isinstance(up, StdioUpstream)
    return up


def replace(up: Upstream, **changes: Any) -> Upstream:
    return msgspec.structs.replace(up, **changes)


__all__ = ["TEST_TIMEOUTS", "make_upstream", "replace", "stdio_everything", "stdio_testserver"]


def write_carded_testserver_config(folder: Path) -> Path:
    """`folder/toolatlas.toml`: one stdio test server (3 generated tools) and [cards] keys
    `op.key`/`op.key.pub` in `folder` (make them with `toolatlas keygen`); state under it. The
    server waits the seconds in `folder/start-delay` before serving, while that file exists."""
    cfg = folder / "toolatlas.toml"
    cfg.write_text(
        f"""
[daemon]
state_dir = "state"
socket = "sock"
metrics_addr = ""
[cards]
public_key = "op.key.pub"
private_key = "op.key"
[[upstream]]
name = "test"
transport = "stdio"
command = "{sys.executable}"
args = {json.dumps(testserver_args("--tools", "3", "--start-delay-file", str(folder / "start-delay")))}
"""
    )
    return cfg
