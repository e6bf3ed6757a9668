"""The daemon as a Linux service: sd_notify, reload, Prometheus metrics, token figures."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.daemon import Daemon, stdio_testserver
from tests.support.ports import free_port


class NotifyListener:
    """A notify socket read by a thread from before the daemon starts, as systemd reads it:
    a socket nobody reads fills up (10 datagrams on Linux) while the daemon is starting."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.05)
        self.messages: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            self.messages.append((time.monotonic(), data.decode()))

    def ready_times(self) -> list[float]:
        return [t for t, m in list(self.messages) if "READY=1" in m.split("\n")]

    def wait_for(self, predicate: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not seen within {timeout} s: {self.messages}")
            time.sleep(0.02)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


def test_sd_notify_ready_watchdog_stopping(tmp_path: Path) -> None:
    listener = NotifyListener(str(tmp_path / "notify.sock"))
    d = Daemon(tmp_path, stdio_testserver("one"))
    env = {"NOTIFY_SOCKET": listener.path, "WATCHDOG_USEC": "400000"}
    assert not os.path.exists(d.socket)
    d.start(env=env)
    try:
        def pings() -> list[float]:
            ready = listener.ready_times()
            return [t for t, m in list(listener.messages) if m == "WATCHDOG=1" and ready and t > ready[0]]

        listener.wait_for(lambda: len(pings()) >= 5, 30, "READY=1 and then 5 watchdog pings")
        log_tail = d.log.read_text()[-3000:]
        assert len(listener.ready_times()) == 1, (listener.messages, log_tail)
        assert len(pings()) >= 5, (listener.messages, log_tail)  # every 0.2 s: half of WatchdogSec
        # The upstream children never see our notify socket.
        pid = int(d.tool("one__pid", {})["content"][0]["text"])
        with open(f"/proc/{pid}/environ", "rb") as fh:
            assert b"NOTIFY_SOCKET" not in fh.read()
        assert d.stop(signal.SIGTERM) == 0
        listener.wait_for(lambda: any(m == "STOPPING=1" for _, m in listener.messages), 10, "STOPPING=1")
    finally:
        listener.close()
        if d.proc and d.proc.poll() is None:
            d.stop()


def test_ready_comes_only_after_the_socket_accepts(tmp_path: Path) -> None:
    notify_path = str(tmp_path / "notify.sock")
    nsock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    nsock.bind(notify_path)
    nsock.settimeout(60)
    d = Daemon(tmp_path, stdio_testserver("one"))
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "toolatlas", "serve", "--config", str(d.config)],
                            env=dict(os.environ, NOTIFY_SOCKET=notify_path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            msg = nsock.recv(4096).decode()
            if "READY=1" in msg.split("\n"):
                break
        # At READY=1 the socket already accepts and the index answers.
        with socket.socket(socket.AF_UNIX) as c:
            c.connect(d.socket)
        assert d.status()["index"]["ready"] is True
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        nsock.close()


def test_sighup_reload_adds_removes_and_keeps_unchanged_warm(tmp_path: Path) -> None:
    keep, drop = stdio_testserver("keep"), stdio_testserver("drop")
    with Daemon(tmp_path, keep + drop) as d:
        d.wait_for(lambda: all(s["state"] == "ready" for s in d.status()["servers"]), 30, "ready")
        keep_pid = int(d.tool("keep__pid", {})["content"][0]["text"])
        text = d.config.read_text().replace(drop, stdio_testserver("added"))
        d.config.write_text(text)
        assert d.proc is not None
        d.proc.send_signal(signal.SIGHUP)
        seen_ok = 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            # Searches keep succeeding throughout the reload.
            assert "keep__echo" in d.search("echo a message", 20)
            seen_ok += 1
            names = {s["name"]: s["state"] for s in d.status()["servers"]}
            if names == {"keep": "ready", "added": "ready"} and "added__echo" in d.search("echo a message", 20):
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"reload did not converge: {d.status()['servers']}")
        assert seen_ok >= 1
        assert int(d.tool("keep__pid", {})["content"][0]["text"]) == keep_pid
        assert not [n for n in d.search("echo a message", 20) if n.startswith("drop__")]
        gone = d.tool("drop__echo", {"message": "x"})
        assert gone["isError"] and "unknown tool" in gone["content"][0]["text"]
        # An invalid config is rejected and the running one stays.
        d.config.write_text(text + "\n[daemon]\nbogus = 1\n")
        d.proc.send_signal(signal.SIGHUP)
        d.wait_for(lambda: "reload rejected" in d.log.read_text(), 10, "rejection logged")
        assert d.proc.poll() is None
        assert int(d.tool("keep__pid", {})["content"][0]["text"]) == keep_pid


def test_a_reload_that_removes_an_upstream_drops_its_metric_series(tmp_path: Path) -> None:
    """/metrics after a reload shows only configured upstreams. Before, the calls, latencies
    and reconnects of a removed upstream were exported until the daemon restarted, so every
    renamed upstream left series behind (and dashboards listed servers that were gone)."""
    port = free_port()
    keep, drop = stdio_testserver("keep"), stdio_testserver("drop")
    with Daemon(tmp_path, keep + drop, daemon_extra=f'metrics_addr = "127.0.0.1:{port}"') as d:
        d.wait_for(lambda: all(s["state"] == "ready" for s in d.status()["servers"]), 30, "ready")
        assert not d.tool("drop__echo", {"message": "x"})["isError"]
        assert not d.tool("keep__echo", {"message": "x"})["isError"]

        def scrape() -> str:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()

        assert 'toolatlas_calls_total{outcome="ok",upstream="drop"} 1.0' in scrape()
        d.config.write_text(d.config.read_text().replace(drop, ""))
        assert d.proc is not None
        d.proc.send_signal(signal.SIGHUP)
        d.wait_for(lambda: [s["name"] for s in d.status()["servers"]] == ["keep"], 30, "drop removed")
        body = d.wait_for(lambda: next((b for b in [scrape()] if 'upstream="drop"' not in b), None), 10,
                          "drop's series gone")
        assert 'toolatlas_calls_total{outcome="ok",upstream="keep"} 1.0' in body


def test_metrics_endpoint_and_token_figures(tmp_path: Path) -> None:
    port = free_port()
    with Daemon(tmp_path, stdio_testserver("m", "--tools", "40"), daemon_extra=f'metrics_addr = "127.0.0.1:{port}"') as d:
        d.search("echo a message")
        d.tool("execute_tool", {"name": "m__echo", "arguments": {"message": "x"}})
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert 'toolatlas_search_latency_seconds_count{cache="miss",mode=' in body
        assert 'toolatlas_execute_latency_seconds_count{outcome="ok",upstream="m"} 1.0' in body
        assert 'upstream="m"' in body and "toolatlas_upstream_state" in body
        assert 'toolatlas_upstream_call_latency_seconds_count{operation="call_tool",upstream="m"} 1.0' in body
        events = [json.loads(line) for line in d.log.read_text().splitlines() if line.startswith("{")]
        assert {"event": "upstream_state_changed", "new": "ready"}.items() <= next(
            e for e in events if e["event"] == "upstream_state_changed" and e.get("new") == "ready").items()
        assert "query" not in next(e for e in events if e["event"] == "tool_search_completed")
        tokens = d.wait_for(lambda: d.status()["tokens"].get("tools") == 49 and d.status()["tokens"], 60, "tokens")
        assert tokens["tools"] == 49
        assert tokens["meta_tools_tokens"] < tokens["full_catalog_tokens"]
        assert "anthropic-tokenizer" in tokens["tokenizer"]
        assert tokens["mean_top5_search_result_tokens"] > 0
        # counted by a child process: the tokenizer's ~33 MB vocabulary never enters the daemon
        maps = Path(f"/proc/{d.proc.pid}/maps").read_text()
        assert "anthropic_tokenizer" not in maps and "msgspec/_core" in maps


def test_status_cache_and_search_counts_are_the_clients_as_the_metrics_count_them(tmp_path: Path) -> None:
    """The token figure's sample queries (a top-5 search per sampled tool) went through the
    result cache: catalog_status showed 8 misses and 8 searches before any client searched,
    against 0 in /metrics. Now both count the clients' searches alone."""
    port = free_port()
    with Daemon(tmp_path, stdio_testserver("m", "--tools", "40"), daemon_extra=f'metrics_addr = "127.0.0.1:{port}"') as d:
        d.wait_for(lambda: d.status()["tokens"].get("tools") == 49, 60, "tokens counted (its samples searched)")
        d.search("echo a message")
        d.search("echo a message")
        index = d.status()["index"]
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert (index["cache"]["hits"], index["cache"]["misses"], index["searches"]) == (1, 1, 1), index
    assert "toolatlas_search_cache_hits_total 1.0" in body and "toolatlas_search_cache_misses_total 1.0" in body


def test_sighup_while_the_daemon_starts_is_a_reload_not_its_death(tmp_path: Path) -> None:
    """SIGHUP's default action ends a process: until the daemon took SIGHUP over (late in its
    start, after the heavy imports), one killed it without a word. It is noted from the start
    and becomes one reload once the daemon serves."""
    import subprocess
    import sys

    from tests.support.processes import descendants

    d = Daemon(tmp_path, stdio_testserver("one"))
    d._logfh = open(d.log, "wb")
    d.proc = subprocess.Popen([sys.executable, "-m", "toolatlas", "serve", "--config", str(d.config)],
                              stdout=d._logfh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        # its stdio child is started early (prespawn), while the daemon itself is still importing
        deadline = time.monotonic() + 60
        while not descendants(d.proc.pid) and d.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        d.proc.send_signal(signal.SIGHUP)
        d.wait_for(lambda: d.proc is not None and d.proc.poll() is None and d.status()["index"]["ready"], 60,
                   "the daemon serving after a SIGHUP during its start")
        assert "SIGHUP arrived while the daemon started" in d.log.read_text()
    finally:
        d._halt(signal.SIGTERM)
    assert d.proc.returncode == 0, (d.proc.returncode, d.log.read_text()[-2000:])


def test_sigterm_while_the_daemon_starts_stops_its_early_children(tmp_path: Path) -> None:
    """The stdio children are started beside the daemon's imports, before it takes SIGTERM
    over: a SIGTERM then killed the daemon at once and left a child that does not read its
    stdin (so never sees the daemon go) running. It still ends the daemon, and its children."""
    import subprocess
    import sys

    from tests.support.processes import descendants, kill_all, wait_gone

    deaf = '[[upstream]]\nname = "deaf"\ntransport = "stdio"\ncommand = "/bin/sh"\nargs = ["-c", "exec sleep 300"]\n'
    d = Daemon(tmp_path, deaf)
    d._logfh = open(d.log, "wb")
    d.proc = subprocess.Popen([sys.executable, "-m", "toolatlas", "serve", "--config", str(d.config)],
                              stdout=d._logfh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              env=dict(os.environ, PYTHONUNBUFFERED="1"))
    kids: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while not kids and d.proc.poll() is None and time.monotonic() < deadline:
            kids = descendants(d.proc.pid)
            time.sleep(0.005)
        assert kids, d.log.read_text()
        code = d.stop(signal.SIGTERM)
        assert code in (0, -signal.SIGTERM), (code, d.log.read_text()[-2000:])
        assert wait_gone(kids, timeout=10) == [], "a stdio child outlived the daemon"
    finally:
        d._halt(signal.SIGKILL)
        kill_all(kids)
