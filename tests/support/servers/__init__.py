"""MCP servers for the tests, as subprocesses on 127.0.0.1.

- ``testserver.py`` / ``faultserver.py`` (this folder): the project's test servers. They are
  run by file path (``server_command``), so a child started by a daemon under test finds them
  without the repository on its PYTHONPATH; they import only ``toolatlas`` and ``mcp``. Over
  stdio (``testserver_args``/``faultserver_args``) the suite starts them from a fork server
  (``forkserver.py``, one per pytest worker), so the SDK is imported once, not once a server;
  over sse or http (``start_server``) too.
- ``weather`` / ``units`` / ``notes``: the user examples in ``toolatlas.examples`` (over stdio
  through the fork server with ``example_args``).
- npm's server-everything (``EVERYTHING_BIN``, ``ServerFactory.everything``).

``start_server`` runs one over sse or http with ``--port 0`` (or a given port) and waits for
its ``READY <port>`` line; ``ServerFactory`` keeps what it started and stops it at teardown.
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.support import REPO
from tests.support.ports import free_port
from tests.support.processes import die_with_parent
from tests.support.servers.forkserver import EXAMPLES, SERVERS, script_path

if TYPE_CHECKING:
    from tests.support.forked import Forked

HERE = Path(__file__).resolve().parent
TESTSERVER = HERE / "testserver.py"
FAULTSERVER = HERE / "faultserver.py"
HOSTILE = HERE / "hostile.py"
FORKSERVER = HERE / "forkserver.py"
RAWRPC = HERE / "rawrpc.py"  # plain JSON-RPC lines: what an SDK server never sends
INJECTED = HERE / "injected.py"  # tools whose texts are the sanitizer's injection corpus
INJECTIONS = HERE.parent / "corpus" / "injections.jsonl"
EVERYTHING_BIN = REPO / "tests" / "npm" / "node_modules" / ".bin" / "mcp-server-everything"
START_TIMEOUT = 30.0
_FILES = {"testserver": TESTSERVER, "faultserver": FAULTSERVER, "rawrpc": RAWRPC}


def server_command(module: str) -> list[str]:
    """argv that runs ``module``: "testserver"/"faultserver" (this folder, by path), a user
    example by short name ("weather") or any dotted module ("toolatlas.examples.units")."""
    if module in _FILES:
        return [sys.executable, str(_FILES[module])]
    return [sys.executable, "-m", module if "." in module else f"toolatlas.examples.{module}"]


# Set (to "1") by tests/conftest.py: stdio test servers in this process's configs start from a
# fork server (forkserver.py), one per pytest worker. Bench scripts leave it unset.
FORKSERVER_ENV = "TOOLATLAS_TEST_FORKSERVER"
_forkserver: tuple[subprocess.Popen[bytes], str] | None = None


def forkserver_socket() -> str | None:
    """The socket of this process's fork server, started on first use; None when the suite
    does not use one or it did not come up (callers then exec the server)."""
    global _forkserver
    if os.environ.get(FORKSERVER_ENV) != "1":
        return None
    if _forkserver is not None:
        return _forkserver[1] if _forkserver[0].poll() is None else None
    import tempfile

    sock = os.path.join(tempfile.mkdtemp(prefix="toolatlas-fork-"), "fork.sock")
    # Its stdin is a pipe this process holds open: EOF there ends it once this process is gone.
    # (Not PR_SET_PDEATHSIG: that fires when the *thread* that started it ends, and any thread
    # building a server's args may be the first.)
    proc = subprocess.Popen([sys.executable, str(FORKSERVER), "--serve", sock], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL)
    _forkserver = (proc, sock)
    atexit.register(_stop_forkserver, proc, os.path.dirname(sock))
    deadline = time.monotonic() + START_TIMEOUT
    while not os.path.exists(sock) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return sock if os.path.exists(sock) and proc.poll() is None else None


def _stop_forkserver(proc: subprocess.Popen[bytes], folder: str) -> None:
    import shutil

    proc.kill()
    proc.wait()
    shutil.rmtree(folder, ignore_errors=True)


def _stdio_args(script: str, extra: tuple[str, ...], exec_: bool) -> list[str]:
    sock = None if exec_ else forkserver_socket()
    tail = ["--transport", "stdio", *extra]
    if sock is None:
        return [str(_FILES[script]), *tail] if script in _FILES else ["-m", f"toolatlas.examples.{script}", *tail]
    return ["-S", str(FORKSERVER), "--via", sock, script_path(script), *tail]


def example_args(name: str, *extra: str, exec_: bool = False) -> list[str]:
    """args for a stdio upstream ``command = sys.executable`` running the user example `name`
    ("notes", "weather", "units"): through the fork server unless `exec_` or there is none,
    then ``-m toolatlas.examples.NAME`` as a user's config runs it."""
    if name not in EXAMPLES:
        raise ValueError(f"{name!r} is not one of the examples {EXAMPLES}")
    return _stdio_args(name, extra, exec_)


def testserver_args(*extra: str, exec_: bool = False) -> list[str]:
    """args for a stdio upstream ``command = sys.executable`` running the test server: through
    the suite's fork server (see forkserver.py) unless `exec_`, which a test of the process
    itself needs (SIGSTOP, the daemon's process tree)."""
    return _stdio_args("testserver", extra, exec_)


testserver_args.__test__ = False  # type: ignore[attr-defined]  # not a test, whatever its name


def faultserver_args(*extra: str, exec_: bool = False) -> list[str]:
    """args for a stdio upstream ``command = sys.executable`` running the fault server (through
    the fork server unless `exec_`, as testserver_args)."""
    return _stdio_args("faultserver", extra, exec_)


@dataclass
class RunningServer:
    proc: subprocess.Popen[bytes] | Forked
    port: int
    url: str
    log: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    out: int | None = None  # the read end of its stdout (start_server reads READY there)

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
        if self.out is not None:
            os.close(self.out)
            self.out = None

    def _tail(self) -> str:
        return self.log.read_text()[-2000:] if self.log is not None and self.log.exists() else ""


def _wait_ready_line(srv: RunningServer) -> int:
    proc = srv.proc
    assert srv.out is not None
    deadline = time.monotonic() + START_TIMEOUT
    buf = b""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {srv._tail()}")
        ready, _, _ = select.select([srv.out], [], [], 0.2)
        if ready:
            buf += os.read(srv.out, 4096)
            for line in buf.decode(errors="replace").splitlines():
                if line.startswith("READY "):
                    return int(line.split()[1])
    raise RuntimeError(f"server did not print READY within {START_TIMEOUT} s: {srv._tail()}")


def _wait_port(srv: RunningServer) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if srv.proc.poll() is not None:
            raise RuntimeError(f"server exited with {srv.proc.returncode}: {srv._tail()}")
        try:
            with socket.create_connection(("127.0.0.1", srv.port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listened on 127.0.0.1:{srv.port} within {START_TIMEOUT} s")


def start_server(module: str, transport: str = "http", *args: str, port: int = 0, log: Path | None = None,
                 exec_: bool = False) -> RunningServer:
    """Start ``module`` (see ``server_command``) over sse or http on 127.0.0.1 and wait for it.

    Its stderr goes to ``log`` (or is inherited); it runs in a session of its own and dies with
    the test process. The project's test servers (testserver, faultserver) and the examples are
    forked from the suite's fork server, the SDK imported there once (`exec_`: a fresh
    interpreter); the held process is the server itself either way (`pid`, signals, its
    exit). Raises RuntimeError, with the log's tail, when it exits or prints no READY line in
    time."""
    if transport not in ("sse", "http"):
        raise ValueError("start_server runs network transports; stdio upstreams are config (tests.support.configs)")
    argv = ["--transport", transport, "--host", "127.0.0.1", "--port", str(port), *args]
    sock = None if exec_ or module not in SERVERS else forkserver_socket()
    err = log.open("wb") if log is not None else None
    out, out_w = os.pipe()
    proc: subprocess.Popen[bytes] | Forked | None = None
    try:
        if sock is not None:
            from tests.support.forked import Forked

            try:
                with open(os.devnull, "rb") as devnull:
                    proc = Forked(sock, module, argv, env=os.environ, cwd=None, stdin=devnull.fileno(),
                                  stdout=out_w, stderr=err.fileno() if err is not None else 2)
            except OSError:  # the fork server went away: exec, as the stdio launcher does then
                proc = None
        if proc is None:
            proc = subprocess.Popen(
                [*server_command(module), *argv], stdin=subprocess.DEVNULL, stdout=out_w, stderr=err,
                start_new_session=True, preexec_fn=die_with_parent,
            )
    except BaseException:
        os.close(out)
        raise
    finally:
        os.close(out_w)
        if err is not None:
            err.close()
    srv = RunningServer(proc, port, "", log, out=out)
    try:
        srv.port = _wait_ready_line(srv)
    except BaseException:
        srv.stop()
        raise
    srv.url = f"http://127.0.0.1:{srv.port}" + ("/sse" if transport == "sse" else "/mcp")
    return srv


def start_everything(transport: str = "http", log: Path | None = None) -> RunningServer:
    """npm's server-everything over streamable HTTP or SSE on a free port (it binds every
    interface; only its loopback address is used). The caller checks EVERYTHING_BIN exists."""
    port = free_port()
    mode = {"http": "streamableHttp", "sse": "sse"}[transport]
    out = log.open("wb") if log is not None else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(
            [str(EVERYTHING_BIN), mode], env={**os.environ, "PORT": str(port)},
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=die_with_parent,
        )
    finally:
        if log is not None:
            out.close()  # type: ignore[union-attr]
    srv = RunningServer(proc, port, "", log)
    try:
        _wait_port(srv)
    except BaseException:
        srv.stop()
        raise
    srv.url = f"http://127.0.0.1:{port}" + ("/mcp" if transport == "http" else "/sse")
    return srv


class ServerFactory:
    """Starts servers with their logs in ``tmp`` and stops every one at ``close()``."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.running: list[RunningServer] = []

    def python(self, module: str = "testserver", transport: str = "http", args: tuple[str, ...] | list[str] = ()) -> RunningServer:
        log = self.tmp / f"{module.rsplit('.', 1)[-1]}-{transport}-{len(self.running)}.log"
        srv = start_server(module, transport, *args, log=log)
        self.running.append(srv)
        return srv

    def everything(self, transport: str = "http") -> RunningServer:
        import pytest

        if not EVERYTHING_BIN.exists():
            pytest.skip("npm server-everything is not installed (make npm)")
        srv = start_everything(transport, self.tmp / f"everything-{transport}-{len(self.running)}.log")
        self.running.append(srv)
        return srv

    def close(self) -> None:
        for srv in self.running:
            srv.stop()
