"""Fault injection through a real daemon: a misbehaving upstream (tests/support/servers/faultserver.py)
next to a healthy one. For every fault: the daemon stays up, the healthy upstream keeps
answering, callers get an error naming the upstream and the operation within their timeout,
and the faulty upstream is READY again and serves calls once the fault stops."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from tests.support.daemon import Daemon, stdio_faultserver, stdio_testserver, url_upstream
from tests.support.ports import free_port
from tests.support.results import text
from tests.support.servers import RunningServer, start_server
from tests.support.servers.faultserver import write_fault_file
from toolatlas.surface.unix import unix_client

CALL_TIMEOUT = 2.0
SLACK_S = 5.0  # scheduling slack on a loaded 2-core CI machine
STALL_S = 10.0


def faultserver_stdio(name: str, fault_file: Path, extra: str = "") -> str:
    return (stdio_faultserver(name, "--fault-file", str(fault_file))
            + f"timeouts = {{ call = {CALL_TIMEOUT}, connect = 5, list_tools = 5, ping = 2 }}\nping_interval = 1\n{extra}")


NET_OPTS = f"timeouts = {{ call = {CALL_TIMEOUT}, connect = 3, list_tools = 3, ping = 2 }}\nping_interval = 1\n"


class Env:
    def __init__(self, d: Daemon, fault_files: dict[str, Path], web: RunningServer, refused_port: int, tmp: Path) -> None:
        self.d, self.fault_files, self.web, self.refused_port, self.tmp = d, fault_files, web, refused_port, tmp


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("faults")
    files = {n: tmp / f"{n}.fault.json" for n in ("fs", "crashy", "web")}
    for f in files.values():
        write_fault_file(str(f), "none")
    web = start_server("faultserver", "http", "--fault-file", str(files["web"]), "--legacy-only")
    refused_port = free_port()  # nothing listens here until a test starts a server on it
    upstreams = (
        stdio_testserver("healthy")
        + faultserver_stdio("fs", files["fs"], "max_concurrency = 2\nmax_result_bytes = 1048576\n")
        + faultserver_stdio("crashy", files["crashy"])
        + url_upstream("web", "http", web.url, NET_OPTS)
        + url_upstream("refused", "http", f"http://127.0.0.1:{refused_port}/mcp", NET_OPTS)
    )
    d = Daemon(tmp, upstreams)
    try:
        with d:
            ready = {"healthy", "fs", "crashy", "web"}
            d.wait_for(lambda: ready <= {n for n, s in servers(d).items() if s["state"] == "ready"}, 60, "upstreams ready")
            yield Env(d, files, web, refused_port, tmp)
    finally:
        web.stop()


def servers(d: Daemon) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in d.status()["servers"]}


def call_within(d: Daemon, name: str, args: dict[str, Any], deadline: float) -> dict[str, Any]:
    """One call whose answer must arrive before `deadline` seconds (a socket deadline: a
    hang fails the test with a timeout, nothing measures how fast the answer came)."""
    with d.client() as c:
        c.sock.settimeout(deadline)
        return c.call_tool(name, args)  # type: ignore[no-any-return]


def healthy_answers(d: Daemon, tag: str) -> None:
    """The bystander answers (within a generous stall deadline) and the daemon is alive."""
    assert d.proc is not None and d.proc.poll() is None, "the daemon died"
    r = call_within(d, "healthy__echo", {"message": tag}, STALL_S)
    assert not r.get("isError") and text(r) == f"Echo: {tag}", r


def recovers(d: Daemon, name: str, timeout: float = 30.0) -> None:
    """READY again, and a work call succeeds."""
    d.wait_for(lambda: servers(d)[name]["state"] == "ready", timeout, f"{name} ready again")

    def ok() -> bool:
        r = d.tool(f"{name}__echo", {"message": "back"})
        return not r.get("isError") and text(r) == "Echo: back"

    d.wait_for(ok, timeout, f"{name} answers again")


def bounded_call(d: Daemon, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """A call to a faulty upstream: it must end (answer or error) before its timeout plus
    slack; a hang fails the test on the socket deadline."""
    return call_within(d, name, args, CALL_TIMEOUT + SLACK_S)


def stats(d: Daemon, server: str) -> dict[str, int]:
    r = d.tool(f"{server}__stats", {})
    assert not r.get("isError"), r
    return json.loads(text(r))


def test_crash_on_call(env: Env) -> None:
    d = env.d
    old = stats(d, "crashy")["pid"]
    write_fault_file(str(env.fault_files["crashy"]), "crash")
    try:
        r = bounded_call(d, "crashy__echo", {"message": "x"})
        assert r["isError"] and "crashy" in text(r) and "tools/call echo" in text(r), r
        healthy_answers(d, "crash")
        # Restarted processes keep crashing on call while the fault lasts (the file survives).
        d.wait_for(lambda: servers(d)["crashy"]["reconnects"] >= 1, 30, "crashy restarted")
    finally:
        write_fault_file(str(env.fault_files["crashy"]), "none")
    recovers(d, "crashy")
    assert stats(d, "crashy")["pid"] != old
    healthy_answers(d, "crash-after")


def test_hang(env: Env) -> None:
    d = env.d
    d.tool("fs__set_fault", {"fault": "hang"})
    try:
        r = bounded_call(d, "fs__echo", {"message": "x"})
        # the error is the daemon's own timeout (it names the seconds), not a transport failure
        assert r["isError"] and "fs" in text(r) and "tools/call echo" in text(r) and f"{CALL_TIMEOUT:g} s" in text(r), r
        healthy_answers(d, "hang")
        # The hung handler was cancelled upstream when the daemon gave up on it.
        d.wait_for(lambda: stats(d, "fs")["inflight"] == 0, 10, "hung call cancelled upstream")
    finally:
        d.tool("fs__heal", {})
    recovers(d, "fs")


def test_slow_responses(env: Env) -> None:
    d = env.d
    d.tool("fs__set_fault", {"fault": "slow", "delay": 0.5})
    try:
        r = bounded_call(d, "fs__echo", {"message": "slowly"})
        assert text(r) == "Echo: slowly"  # slower than usual but within the timeout: served
        d.tool("fs__set_fault", {"fault": "slow", "delay": CALL_TIMEOUT + 3})
        r = bounded_call(d, "fs__echo", {"message": "too slowly"})
        assert r["isError"] and "fs" in text(r) and f"{CALL_TIMEOUT:g} s" in text(r), r
        healthy_answers(d, "slow")
    finally:
        d.tool("fs__heal", {})
    recovers(d, "fs")


def test_garbage_on_stdout(env: Env) -> None:
    d = env.d
    d.tool("fs__reset_stats", {})
    pid = stats(d, "fs")["pid"]
    d.tool("fs__set_fault", {"fault": "garbage"})
    try:
        r = bounded_call(d, "fs__echo", {"message": "g"})
        # Either the session skipped the junk and the reply got through, or the call failed
        # with an error naming the upstream; never a hang past the timeout (bounded_call).
        assert text(r) == "Echo: g" or (r["isError"] and "fs" in text(r)), r
        healthy_answers(d, "garbage")
    finally:
        write_fault_file(str(env.fault_files["fs"]), "none")
    recovers(d, "fs")
    s = stats(d, "fs")
    if s["pid"] == pid:  # same process: the junk really went down the daemon's pipe
        assert s["garbage"] >= 1, s


# Four times fs's max_result_bytes (1 MiB): big enough to be refused, quick to produce.
HUGE = 4 * 1024 * 1024


def _huge_call(env: Env) -> dict[str, Any]:
    d = env.d
    d.tool("fs__set_fault", {"fault": "huge", "size": HUGE})
    try:
        r = bounded_call(d, "fs__echo", {"message": "big"})
        healthy_answers(d, "huge")
    finally:
        write_fault_file(str(env.fault_files["fs"]), "none")
    recovers(d, "fs")
    return r


def test_huge_result(env: Env) -> None:
    r = _huge_call(env)
    # An error naming the upstream, or the result delivered whole: never truncated.
    if r.get("isError"):
        assert "fs" in text(r), r
    else:
        assert len(text(r)) == HUGE


def test_huge_result_is_refused_for_its_size(env: Env) -> None:
    r = _huge_call(env)
    assert r.get("isError") and "fs" in text(r) and any(w in text(r).lower() for w in ("bytes", "too large", "size")), r


async def test_list_changed_storm(env: Env) -> None:
    d = env.d
    before = servers(d)["fs"]["tools"]
    answered: list[Any] = []
    with anyio.fail_after(60):
        async with Client(unix_client(d.socket)) as client:
            async def bystander(done: anyio.Event) -> None:
                while not done.is_set():
                    # a stall deadline per call, not a latency goal (bench/load.py measures latency)
                    with anyio.fail_after(STALL_S):
                        r = await client.call_tool("execute_tool", {"name": "healthy__echo", "arguments": {"message": "storm"}})
                    answered.append(r)
                    assert not r.is_error
                    await anyio.sleep(0.05)

            done = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(bystander, done)
                r = await client.call_tool("execute_tool", {"name": "fs__storm", "arguments": {"count": 500, "per_second": 1000}})
                done.set()
            assert not r.is_error and r.content[0].text == "500", r
    assert answered, "the bystander got no answer during the storm"
    assert d.proc is not None and d.proc.poll() is None
    recovers(d, "fs")
    assert servers(d)["fs"]["tools"] == before
    healthy_answers(d, "storm")


def test_http_5xx(env: Env) -> None:
    d = env.d
    write_fault_file(str(env.fault_files["web"]), "http500")
    try:
        r = bounded_call(d, "web__echo", {"message": "x"})
        assert r["isError"] and "web" in text(r), r
        # Health checks see the 503s too: the upstream leaves READY and says why.
        d.wait_for(lambda: servers(d)["web"]["state"] != "ready", 20, "web leaves ready")
        healthy_answers(d, "5xx")
        assert "web__echo" not in d.search("echo the message back", 20)
    finally:
        write_fault_file(str(env.fault_files["web"]), "none")
    recovers(d, "web", timeout=45)


def test_http_404_on_stale_session(env: Env) -> None:
    d = env.d
    assert servers(d)["web"]["protocol_version"] == "2025-11-25"  # a session-id era session
    old_pid = stats(d, "web")["pid"]
    before = servers(d)["web"]["reconnects"]
    d.tool("web__set_fault", {"fault": "stale"})
    try:
        # The next request on the forgotten session gets 404: the daemon must notice, open a
        # new session (same server process) and serve calls again.
        first = d.tool("web__echo", {"message": "stale"})
        if first.get("isError"):
            assert "web" in text(first), first
        healthy_answers(d, "stale")
        d.wait_for(lambda: servers(d)["web"]["reconnects"] > before, 30, "a new session after the 404")
    finally:
        write_fault_file(str(env.fault_files["web"]), "none")
    recovers(d, "web", timeout=45)
    assert stats(d, "web")["pid"] == old_pid


def test_refused_connection_then_server_starts(env: Env) -> None:
    d = env.d
    st = servers(d)["refused"]
    assert st["state"] != "ready" and st["reason"], st
    r = d.tool("refused__echo", {"message": "x"})
    assert r["isError"] and ("refused" in text(r)), r
    healthy_answers(d, "refused")
    late = start_server("faultserver", "http", port=env.refused_port)
    try:
        recovers(d, "refused", timeout=60)
    finally:
        late.stop()
    d.wait_for(lambda: servers(d)["refused"]["state"] != "ready", 30, "refused leaves ready when its server stops")
    healthy_answers(d, "refused-after")


def test_client_disconnect_cancels_the_upstream_call(env: Env) -> None:
    d = env.d
    d.tool("fs__reset_stats", {})
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(d.socket)
        f = s.makefile("rb")
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "quitter", "version": "0"}}}
        s.sendall(json.dumps(init).encode() + b"\n")
        assert json.loads(f.readline())["id"] == 1
        s.sendall(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "fs__work", "arguments": {"seconds": 30}}}
        s.sendall(json.dumps(call).encode() + b"\n")
        d.wait_for(lambda: stats(d, "fs")["inflight"] == 1, 10, "the call reached the upstream")
        f.close()
    # The client is gone: the daemon cancels the upstream request (notifications/cancelled),
    # and the upstream handler is cancelled long before its 30 s.
    got = d.wait_for(lambda: (s := stats(d, "fs"))["cancelled"] == 1 and s["inflight"] == 0 and s, 10, "upstream call cancelled")
    assert got["completed"] == 0
    healthy_answers(d, "disconnect")


async def test_per_upstream_concurrency_limit(env: Env) -> None:
    d = env.d
    d.tool("fs__reset_stats", {})
    n = 2  # fs has max_concurrency = 2
    results: list[Any] = []
    with anyio.fail_after(30):
        async with Client(unix_client(d.socket)) as client:
            async def one() -> None:
                results.append(await client.call_tool("fs__work", {"seconds": 0.6}))

            async with anyio.create_task_group() as tg:
                for _ in range(n + 1):
                    tg.start_soon(one)
    assert len(results) == n + 1 and not any(r.is_error for r in results), results
    s = stats(d, "fs")
    assert s["max_inflight"] == n, s
    assert s["completed"] == n + 1
