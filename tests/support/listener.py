"""A real HTTP listener on 127.0.0.1 that records every request it gets: the target a test
plants in hostile schemas, to prove the daemon never contacts it, or an upstream that refuses
every request (`status=401`)."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Callable
from typing import Any


class RecordingListener:
    """Records request paths (GET and POST) in `hits`. With `status`, every request gets that
    status and a short plain-text body; with `answer`, it as JSON (200; a callable gives the body at each request); with neither, no
    answer (the handler waits 30 s), as a server that hangs."""

    def __init__(self, answer: bytes | Callable[[], bytes] | None = None, *, status: int | None = None) -> None:
        self.hits: list[str] = []
        hits = self.hits

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                hits.append(self.path)
                if status is not None:
                    self._send(status, "text/plain", b"refused by the test listener")
                    return
                if answer is None:
                    time.sleep(30)
                    return
                self._send(200, "application/json", answer() if callable(answer) else answer)

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.do_GET()

            def _send(self, code: int, content_type: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
