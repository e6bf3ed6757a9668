"""Shared fixtures: real upstream MCP servers as subprocesses on 127.0.0.1, and config builders.

- ``free_port``: an unused TCP port on 127.0.0.1.
- ``spawn_server(module="testserver", transport="http", args=(), name=None)``: start
  ``python -m toolatlas.examples.<module>`` on sse/http with ``--port 0`` and wait for its
  ``READY <port>`` line; returns a ``RunningServer`` (``.url``, ``.port``, ``.pid``,
  ``.kill()``). Every server is killed at teardown.
- ``testserver_http_url`` / ``testserver_sse_url``: one shared test server each for the
  whole session (do not kill or mutate them; use ``spawn_server`` for that).
- ``spawn_everything(transport="http"|"sse")``: npm's server-everything on a free port
  (skips when tests/npm is not installed); ``everything_stdio``: its stdio upstream config.
- ``make_upstream(name, transport, **fields)``: a ``toolatlas.config`` upstream struct with
  short test timeouts; ``stdio_testserver(name, *args)`` (fixture ``testserver_stdio``): a stdio upstream running the
  test server.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from toolatlas.config import HttpUpstream, SseUpstream, StdioUpstream, Timeouts, Upstream

REPO = Path(__file__).resolve().parents[1]
EVERYTHING_BIN = REPO / "tests" / "npm" / "node_modules" / ".bin" / "mcp-server-everything"
START_TIMEOUT = 30.0

# Short enough that a broken test fails fast, long enough for 2 loaded CI cores.
TEST_TIMEOUTS = Timeouts(connect=15.0, list_tools=10.0, call=20.0, ping=5.0)


def get_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def free_port() -> int:
    return get_free_port()


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (checked through /proc, no psutil)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # Field 3, after the parenthesised command name (which may itself contain spaces).
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` from /proc (alive or zombie)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def _python_module_cmd(module: str) -> list[str]:
    return [sys.executable, "-m", f"toolatlas.examples.{module}"]


@dataclass
class RunningServer:
    proc: subprocess.Popen[bytes]
    port: int
    url: str
    log: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def _wait_ready_line(proc: subprocess.Popen[bytes], log: Path) -> int:
    assert proc.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT
    buf = b""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            buf += chunk
            for line in buf.decode(errors="replace").splitlines():
                if line.startswith("READY "):
                    return int(line.split()[1])
    raise RuntimeError(f"server did not print READY within {START_TIMEOUT} s: {log.read_text()[-2000:]}")


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listened on 127.0.0.1:{port} within {START_TIMEOUT} s")


class ServerFactory:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.running: list[RunningServer] = []

    def python(self, module: str = "testserver", transport: str = "http", args: Sequence[str] = ()) -> RunningServer:
        if transport not in ("sse", "http"):
            raise ValueError("spawn_server runs network transports; use testserver_stdio for stdio")
        log = self.tmp / f"{module}-{transport}-{len(self.running)}.log"
        with log.open("wb") as err:
            proc = subprocess.Popen(
                [*_python_module_cmd(module), "--transport", transport, "--port", "0", *args],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, start_new_session=True,
            )
        srv = RunningServer(proc, 0, "", log)
        self.running.append(srv)
        srv.port = _wait_ready_line(proc, log)
        path = "/sse" if transport == "sse" else "/mcp"
        srv.url = f"http://127.0.0.1:{srv.port}{path}"
        return srv

    def everything(self, transport: str = "http") -> RunningServer:
        if not EVERYTHING_BIN.exists():
            pytest.skip("npm server-everything is not installed (make npm)")
        port = get_free_port()
        log = self.tmp / f"everything-{transport}-{len(self.running)}.log"
        mode = {"http": "streamableHttp", "sse": "sse"}[transport]
        with log.open("wb") as err:
            proc = subprocess.Popen(
                [str(EVERYTHING_BIN), mode], env={**os.environ, "PORT": str(port)},
                stdin=subprocess.DEVNULL, stdout=err, stderr=subprocess.STDOUT, start_new_session=True,
            )
        srv = RunningServer(proc, port, "", log)
        self.running.append(srv)
        _wait_port(port, proc, log)
        srv.url = f"http://127.0.0.1:{port}" + ("/mcp" if transport == "http" else "/sse")
        return srv

    def close(self) -> None:
        for srv in self.running:
            srv.stop()


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[ServerFactory]:
    f = ServerFactory(tmp_path)
    try:
        yield f
    finally:
        f.close()


@pytest.fixture
def spawn_server(server_factory: ServerFactory) -> Callable[..., RunningServer]:
    return server_factory.python


@pytest.fixture
def spawn_everything(server_factory: ServerFactory) -> Callable[..., RunningServer]:
    return server_factory.everything


@pytest.fixture(scope="session")
def _session_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerFactory]:
    f = ServerFactory(tmp_path_factory.mktemp("servers"))
    try:
        yield f
    finally:
        f.close()


@pytest.fixture(scope="session")
def testserver_http_url(_session_servers: ServerFactory) -> str:
    return _session_servers.python("testserver", "http", ["--tools", "3"]).url


@pytest.fixture(scope="session")
def testserver_sse_url(_session_servers: ServerFactory) -> str:
    return _session_servers.python("testserver", "sse", ["--tools", "3"]).url


def make_upstream(name: str, transport: str, **fields: Any) -> Upstream:
    """Build a config upstream struct; ``timeouts`` default to TEST_TIMEOUTS."""
    fields.setdefault("timeouts", TEST_TIMEOUTS)
    cls: type[Upstream] = {"stdio": StdioUpstream, "sse": SseUpstream, "http": HttpUpstream}[transport]  # type: ignore[assignment]
    return cls(name=name, **fields)


def stdio_testserver(name: str = "ts", *args: str, **fields: Any) -> StdioUpstream:
    up = make_upstream(name, "stdio", command=sys.executable,
                       args=["-m", "toolatlas.examples.testserver", *args], **fields)
    assert isinstance(up, StdioUpstream)
    return up


def stdio_everything(name: str = "everything", **fields: Any) -> StdioUpstream:
    if not EVERYTHING_BIN.exists():
        pytest.skip("npm server-everything is not installed (make npm)")
    up = make_upstream(name, "stdio", command=str(EVERYTHING_BIN), args=["stdio"], **fields)
    assert isinstance(up, StdioUpstream)
    return up


def replace(up: Upstream, **changes: Any) -> Upstream:
    return msgspec.structs.replace(up, **changes)


@pytest.fixture(name="make_upstream")
def make_upstream_fixture() -> Callable[..., Upstream]:
    return make_upstream


@pytest.fixture
def testserver_stdio() -> Callable[..., StdioUpstream]:
    return stdio_testserver


@pytest.fixture
def everything_stdio() -> StdioUpstream:
    return stdio_everything()


async def pool_call(pool: Any, server: str, tool: str, arguments: dict[str, Any] | None, **kw: Any) -> Any:
    """One tools/call through an upstream Pool as the gateway makes it (an UpstreamCall);
    returns the SDK CallToolResult the upstream answered."""
    import mcp_types

    from toolatlas.calls import UpstreamCall

    reply = await pool.call_tool(UpstreamCall(server=server, tool=tool, arguments=arguments, **kw))
    assert isinstance(reply.payload, mcp_types.CallToolResult) and reply.is_error == bool(reply.payload.is_error)
    return reply.payload
