"""`make run`: start the bundled SSE and HTTP example servers, then the daemon on a config.

The stdio example is started by the daemon itself. Ctrl-C stops everything; no process is
left behind. While the daemon starts, what it is waiting for (upstreams connecting, the
embedding model exporting on a fresh state_dir) is printed as it changes, from its
catalog_status.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from toolatlas.config import SseUpstream, HttpUpstream, load

# The example upstreams reachable over the network, by upstream name -> module.
NETWORK_EXAMPLES = {"weather": "toolatlas.examples.weather", "units": "toolatlas.examples.units"}


def _wait_port(host: str, port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def _cannot_listen(host: str, port: int) -> str | None:
    """Why an example server could not listen on host:port (another program has it), or None.
    Asked before it starts: else the wait for its port is answered by that other program, the
    example dies with a traceback, and the daemon waits on an upstream that is not there."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the example binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


# How often the start-up report asks the daemon, and how long it keeps asking at most.
REPORT_POLL_S = 1.0
REPORT_FOR_S = 900.0


def _status(sock: str) -> dict[str, Any] | None:
    from toolatlas.surface.rawclient import RawClient, RpcError

    try:
        with RawClient(sock, timeout=10) as client:
            result = client.call_tool("catalog_status", {})
    except (OSError, ConnectionError, ValueError, RpcError):
        return None
    content = result.get("structuredContent")
    return content if isinstance(content, dict) and not result.get("isError") else None


def report_startup(sock: str, daemon: subprocess.Popen[bytes], out: Any = sys.stderr) -> None:
    """Print what the starting daemon waits for whenever that changes (seconds aside), then
    when BM25 search serves and when hybrid search is ready; stops there, or when the daemon
    exits, or after REPORT_FOR_S."""
    last: list[str] | None = None
    serving = False
    deadline = time.monotonic() + REPORT_FOR_S
    while daemon.poll() is None and time.monotonic() < deadline:
        st = _status(sock)
        if st is not None:
            waiting = [str(w) for w in st.get("waiting_for") or []]
            shape = [w.split(" (")[0] for w in waiting]
            if shape != last:
                print("toolatlas: waiting for: " + ("; ".join(waiting) or "nothing"), file=out, flush=True)
                last = shape
            if st.get("index", {}).get("ready") and not serving:
                serving = True
                how = st["index"].get("degraded") or "hybrid"
                print(f"toolatlas: serving {st.get('tools', 0)} tools (search: {how})", file=out, flush=True)
            if serving and not waiting:
                print("toolatlas: ready, nothing left to wait for", file=out, flush=True)
                return
        time.sleep(REPORT_POLL_S)


def main(argv: list[str]) -> int:
    config = argv[0] if argv else "conf/example.toml"
    cfg = load(config)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    children: list[subprocess.Popen[bytes]] = []
    try:
        for up in cfg.upstream:
            if not isinstance(up, (SseUpstream, HttpUpstream)) or up.name not in NETWORK_EXAMPLES:
                continue
            url = urlparse(up.url)
            transport = "sse" if isinstance(up, SseUpstream) else "http"
            host, port = url.hostname or "127.0.0.1", url.port or 80
            if why := _cannot_listen(host, port):
                print(f"example server {up.name} cannot listen on {host}:{port} ({why}): stop what uses that "
                      f"port, or give upstream {up.name!r} another url in {config}", file=sys.stderr)
                return 1
            cmd = [sys.executable, "-m", NETWORK_EXAMPLES[up.name], "--transport", transport,
                   "--host", host, "--port", str(port)]
            children.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL))
            if not _wait_port(host, port, 20):
                print(f"example server {up.name} did not start on {up.url}", file=sys.stderr)
                return 1
        print(
            "\ntoolatlas is starting on the example config.\n"
            f"  socket:  {cfg.daemon.socket}\n"
            f"  try:     .venv/bin/toolatlas search 'convert miles to km' --socket {cfg.daemon.socket}\n"
            f"           .venv/bin/toolatlas status --socket {cfg.daemon.socket}\n"
            f"  clients: register the command `{Path(sys.executable).parent / 'toolatlas'} shim "
            f"--socket {cfg.daemon.socket}` as a stdio MCP server\n"
            + (f"  metrics: http://{cfg.daemon.metrics_addr}/metrics\n" if cfg.daemon.metrics_addr else "")
            + "  Ctrl-C stops it.\n",
            file=sys.stderr,
        )
        daemon = subprocess.Popen([sys.executable, "-m", "toolatlas", "serve", "--config", config], env=env)
        children.append(daemon)
        threading.Thread(target=report_startup, args=(cfg.daemon.socket, daemon), daemon=True).start()
        # Forward Ctrl-C and SIGTERM to the daemon (explicit handlers: a background job may
        # have inherited SIGINT ignored), then wait for its orderly shutdown.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: daemon.send_signal(signal.SIGTERM))
        return daemon.wait()
    finally:
        for child in reversed(children):
            if child.poll() is None:
                child.terminate()
                try:
                    child.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    child.kill()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
