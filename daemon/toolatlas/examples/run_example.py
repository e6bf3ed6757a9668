"""`make run`: start the bundled SSE and HTTP example servers, then the daemon on a config.

The stdio example is started by the daemon itself. Ctrl-C stops everything; no process is
left behind.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
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
            cmd = [sys.executable, "-m", NETWORK_EXAMPLES[up.name], "--transport", transport,
                   "--host", url.hostname or "127.0.0.1", "--port", str(url.port)]
            children.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL))
            if not _wait_port(url.hostname or "127.0.0.1", url.port or 80, 20):
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
