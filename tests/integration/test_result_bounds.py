"""max_result_bytes counts what the SDK would hold, not what crossed the wire: a compressed
HTTP reply is measured decoded; and a reply the connection cuts off answers its request with
an error (toolatlas.upstream.bounded.limit_hook on a real httpx2 client against a real HTTP
server on 127.0.0.1)."""

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
    """Answers POST /<size> with a gzip-compressed JSON-RPC reply of about `size` bytes, and
    POST /cut/<size> with the first half of a plain one, then closes the connection."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        cut = self.path.startswith("/cut/")
        body = reply(5, int(self.path.rpartition("/")[2]))
        if not cut:
            body = gzip.compress(body)
        self.send_response(200)
        self.send_header("content-type", "application/json")
        if not cut:
            self.send_header("content-encoding", "gzip")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2] if cut else body)
        self.close_connection = cut

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


async def post(url: str, size: int | str) -> bytes:
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


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", [1000, 3 * LIMIT])
async def test_a_reply_cut_off_by_the_connection_answers_its_request_with_an_error(server: str, size: int) -> None:
    # Without this the SDK's transport raises, and the whole session (every call in flight
    # on it) ends over one cut reply. Over the limit, the refusal is read before the cut.
    body = json.loads(await post(server, f"cut/{size}"))
    assert body["id"] == 5 and "result" not in body, str(body)[:300]
    message = body["error"]["message"]
    if size > LIMIT:
        assert f"max_result_bytes ({LIMIT} bytes)" in message, message
    else:
        assert "the connection to upstream 'gz' broke while its reply was being read" in message, message
        assert "RemoteProtocolError" in message and "may or may not have run" in message, message
