"""max_result_bytes counts what the SDK would hold, not what crossed the wire: a compressed
HTTP reply is measured decoded (toolatlas.upstream.bounded.limit_hook on a real httpx2
client against a real HTTP server on 127.0.0.1)."""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anyio
import httpx2
import pytest

from tests.support.configs import make_upstream
from toolatlas.config import HttpUpstream
from toolatlas.upstream.bounded import limit_hook

# Part of the hostile suite (#15): `pytest -m hostile` runs it alone.
pytestmark = pytest.mark.hostile

LIMIT = 1024 * 1024


def reply(request_id: int, size: int) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {"text": "x" * size}}).encode()


class GzipHandler(BaseHTTPRequestHandler):
    """Answers POST /<size> with a gzip-compressed JSON-RPC reply of about `size` bytes."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = gzip.compress(reply(5, int(self.path.strip("/"))))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-encoding", "gzip")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), GzipHandler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


async def post(url: str, size: int) -> bytes:
    up = make_upstream("gz", "http", url=url, max_result_bytes=LIMIT)
    assert isinstance(up, HttpUpstream)
    with anyio.fail_after(30):
        async with httpx2.AsyncClient(event_hooks={"response": [limit_hook(up)]}) as client:
            request = {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {}}
            response = await client.post(f"{url}/{size}", json=request)
            return response.content


@pytest.mark.timeout(60)
async def test_a_compressed_reply_under_the_limit_arrives_decoded(server: str) -> None:
    assert await post(server, 1000) == reply(5, 1000)


@pytest.mark.timeout(60)
async def test_a_compressed_reply_over_the_limit_decoded_is_refused(server: str) -> None:
    size = 4 * LIMIT  # a few kB on the wire, 4 MiB decoded
    body = json.loads(await post(server, size))
    assert body["id"] == 5 and "result" not in body, str(body)[:300]
    assert "'gz'" in body["error"]["message"] and f"max_result_bytes ({LIMIT} bytes)" in body["error"]["message"]
