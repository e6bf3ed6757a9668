"""`toolatlas shim`: relay an MCP client's stdio to the daemon's Unix socket, byte for byte.

Deliberately stdlib-only (no mcp, numpy or torch): MCP clients spawn it per session, so it
must start in a few tens of milliseconds. Messages are not parsed here; the daemon answers
malformed input itself.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

from toolatlas.backoff import backoff_delay

CONNECT_WAIT_S = 5.0


def connect(path: str, wait: float = CONNECT_WAIT_S) -> socket.socket:
    """Connect to the daemon, waiting briefly in case it is just starting."""
    deadline = time.monotonic() + wait
    attempt = 0
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except OSError as exc:
            sock.close()
            if time.monotonic() >= deadline:
                raise ConnectionError(
                    f"cannot reach the toolatlas daemon at {path}: {exc.strerror or exc}. "
                    "Is `toolatlas serve` running, and is this the right --socket?"
                ) from exc
            attempt += 1
            time.sleep(backoff_delay(attempt, base=0.02, cap=0.25, jitter=0.0))


def _pump_stdin(sock: socket.socket) -> None:
    fd = sys.stdin.fileno()
    try:
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            sock.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def run(path: str) -> int:
    try:
        sock = connect(path)
    except ConnectionError as exc:
        print(f"toolatlas shim: {exc}", file=sys.stderr)
        return 1
    threading.Thread(target=_pump_stdin, args=(sock,), daemon=True).start()
    out = sys.stdout.fileno()
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                break
            view = memoryview(data)
            while view:
                n = os.write(out, view)
                view = view[n:]
    except (OSError, KeyboardInterrupt):
        pass
    finally:
        sock.close()
    return 0
