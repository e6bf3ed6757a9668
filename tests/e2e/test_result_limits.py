"""`max_result_bytes` through a real daemon, on every upstream transport (issue #15, items 9
and 10): a result over the limit fails that one call with an error naming the limit and the
upstream, and the next call goes over the same session; a result between the SDK's 1 MiB
SSE event size and the limit is delivered whole, also over SSE."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import Daemon, stdio_testserver, url_upstream
from tests.support.results import text
from tests.support.servers import RunningServer, start_server

# Part of the hostile suite (#15): `pytest -m hostile` runs it alone.
pytestmark = pytest.mark.hostile

MiB = 1024 * 1024
LIMIT = 8 * MiB
LIMIT_KEY = f"max_result_bytes = {LIMIT}\n"
TRANSPORTS = ("stdio", "sse", "http")
# (upstream, stream): over streamable HTTP a result comes as a JSON body, or, after a
# notification, as an event stream.
CASES = pytest.mark.parametrize(
    ("name", "stream"), [("stdio", False), ("sse", False), ("http", False), ("http", True)],
    ids=["stdio", "sse", "http-json", "http-events"],
)


class Env:
    def __init__(self, d: Daemon, servers: dict[str, RunningServer]) -> None:
        self.d, self.servers = d, servers


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("limits")
    servers = {t: start_server("testserver", t, "--blob", log=tmp / f"{t}.log") for t in ("sse", "http")}
    try:
        upstreams = (
            stdio_testserver("stdio", "--blob") + LIMIT_KEY
            + url_upstream("sse", "sse", servers["sse"].url, LIMIT_KEY)
            + url_upstream("http", "http", servers["http"].url, LIMIT_KEY)
            # the default limit (16 MiB), for the memory check
            + url_upstream("http16", "http", servers["http"].url)
        )
        with Daemon(tmp, upstreams) as d:
            names = {*TRANSPORTS, "http16"}
            d.wait_for(lambda: names <= {n for n, s in states(d).items() if s == "ready"}, 60, "upstreams ready")
            yield Env(d, servers)
    finally:
        for srv in servers.values():
            srv.stop()


def states(d: Daemon) -> dict[str, str]:
    return {s["name"]: s["state"] for s in d.status()["servers"]}


def reconnects(d: Daemon, name: str) -> int:
    return next(int(s["reconnects"]) for s in d.status()["servers"] if s["name"] == name)


def pid_of(d: Daemon, name: str) -> str:
    r = d.tool(f"{name}__pid", {})
    assert not r.get("isError"), r
    return text(r)


def blob(d: Daemon, name: str, size: int, stream: bool = False) -> dict[str, Any]:
    return d.tool(f"{name}__blob", {"size": size, "stream": stream})


def why(d: Daemon, r: dict[str, Any]) -> str:
    """A failed check's message: the result's text, then the daemon log's tail (a lost session
    says there why)."""
    return f"{text(r)[:500]}\n--- daemon log (tail) ---\n{d.log.read_text()[-4000:]}"


def vm_hwm_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc status")


@pytest.mark.timeout(120)
@CASES
def test_result_over_the_limit_fails_that_call_only(env: Env, name: str, stream: bool) -> None:
    d = env.d
    pid, before = pid_of(d, name), reconnects(d, name)
    r = blob(d, name, LIMIT + MiB, stream)
    assert r.get("isError"), why(d, r)
    message = text(r)
    assert "max_result_bytes" in message and repr(name) in message and str(LIMIT) in message, why(d, r)
    # The same session answers the next call: same server process, no reconnect.
    r = d.tool(f"{name}__echo", {"message": "after"})
    assert not r.get("isError") and text(r) == "Echo: after", r
    assert pid_of(d, name) == pid
    assert reconnects(d, name) == before and states(d)[name] == "ready"


@pytest.mark.timeout(120)
@CASES
def test_result_over_1mib_under_the_limit_is_delivered(env: Env, name: str, stream: bool) -> None:
    d = env.d
    pid = pid_of(d, name)
    size = 3 * MiB
    r = blob(d, name, size, stream)
    assert not r.get("isError"), why(d, r)
    assert text(r) == "x" * size
    assert pid_of(d, name) == pid


@pytest.mark.timeout(120)
def test_a_50mb_http_result_keeps_the_daemon_memory_bounded(env: Env) -> None:
    d = env.d
    assert d.proc is not None
    try:
        r = blob(d, "http16", 50 * 1000 * 1000)
    finally:
        hwm = vm_hwm_bytes(d.proc.pid)
        print(f"daemon VmHWM after a 50 MB result over http (max_result_bytes 16 MiB): {hwm / MiB:.0f} MiB")
    assert r.get("isError") and "max_result_bytes" in text(r), why(d, r)
    assert hwm < 300 * MiB, f"daemon VmHWM {hwm / MiB:.0f} MiB"
    r = d.tool("http16__echo", {"message": "after"})
    assert not r.get("isError") and text(r) == "Echo: after", r
