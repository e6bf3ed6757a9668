"""A real HTTP listener on 127.0.0.1 that records every GET it gets: the target a test plants
in hostile schemas, to prove the daemon never contacts it."""

from __future__ import annotations

import http.server
import threading
import time
from typing import Any


class RecordingListener:
    """Records request paths in `hits`. With `answer`, GETs get it as JSON; without, they
    get no answer (the handler waits 30 s), as a server that hangs."""

    def __init__(self, answer: bytes | None = None) -> None:
        self.hits: list[str] = []
        hits = self.hits

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                hits.append(self.path)
                if answer is None:
                    time.sleep(30)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *a: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
