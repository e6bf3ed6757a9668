"""A fork server for the suite's test servers, the examples and daemons: imports paid once, not per start.

    python forkserver.py --serve SOCKET                  # one per pytest worker (servers.forkserver_socket)
    python -S forkserver.py --via SOCKET SCRIPT.py ARGS...   # what a stdio upstream's config runs

Starting ``testserver.py`` costs about a CPU second, nearly all of it importing ``mcp`` (its
pydantic models); the suite starts some 250 of them, a quarter of its CPU. The server mode imports
the test servers once and waits on a Unix socket. The launcher (``--via``, run with ``-S``: the
standard library only, ~20 ms) is the process the daemon under test spawns: it hands its stdin,
stdout and stderr to the fork server, which forks a child that runs the server's ``main`` on
them, the same code on the same pipes as an exec'd server. The launcher then stands in for it:
the signals it gets go to the child, and when the child ends it ends the same way (its exit
code, or killed by the same signal). A launcher that dies (SIGKILL) takes its child along: the
fork server kills a child whose launcher's connection closes. The servers' ``pid`` answers name
the launcher, the process their client started and signals.

With no fork server to reach, the launcher execs the server itself. What a launcher cannot stand
in for (SIGSTOP, the process tree under the daemon) needs the server exec'd: ``testserver_args``
and ``faultserver_args`` take ``exec_=True`` for those tests. The user examples (``notes``,
``weather``, ``units``: ``EXAMPLES``) start the same way (``example_args``), by their files in
``toolatlas/examples``.

Test servers over sse or http (``start_server``) are forked with no launcher: the test holds
the connection itself (``forked.Forked``), so the process it holds, signals and waits for is the
server, and a server killed and started again on its port finds the port free once the wait
returns (a launcher's child would die a moment after its launcher).

Daemons under test start here too (``"script": "toolatlas"``, ``tests.support.daemon.Daemon``): a
daemon with one stdio server, started, asked once and stopped, cost 1.45 CPU s exec'd and 0.25 s
forked (``bench/suite_daemon.py``, a 2-core VM), the difference nearly all importing
``toolatlas.app`` (the SDK, numpy, ...), and the suite starts some 190. The fork server imports
the package once; the child runs ``toolatlas.cli.main`` (what ``python -m toolatlas`` runs) on
the request's argv, environment and folder, with its own stdio. There is no launcher: the pytest worker holds the
connection itself (``forked.Forked``, a Popen stand-in with the daemon's real pid), so signals
go straight to the daemon and its process tree is its own. What only a fresh interpreter shows
(signals during the imports, the process group a shell starts, an environment read at import)
needs the daemon exec'd: ``Daemon.start(exec_=True)``.
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import struct
import sys
import types
from collections.abc import Mapping

SCRIPTS = ("testserver", "faultserver")
EXAMPLES = ("notes", "weather", "units")  # the user examples, toolatlas.examples.NAME
SERVERS = SCRIPTS + EXAMPLES  # what it forks besides daemons
DAEMON = "toolatlas"  # a request for a daemon: `python -m toolatlas ARGV`
_HEADER = struct.Struct("!I")
_RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


# --- the launcher (standard library only: it runs with -S) --------------------------------------

def script_path(script: str) -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    if script in EXAMPLES:  # daemon/toolatlas/examples/, from tests/support/servers/
        return os.path.normpath(os.path.join(here, "..", "..", "..", "daemon", "toolatlas", "examples", f"{script}.py"))
    return os.path.join(here, f"{script}.py")


def send_request(conn: socket.socket, script: str, argv: list[str], env: Mapping[str, str], cwd: str,
                 fds: tuple[int, int, int], launcher: int | None = None) -> None:
    """Ask the fork server on `conn` for a child running `script` (in SCRIPTS or EXAMPLES, or DAEMON)
    with `argv`, `env` and folder `cwd` on `fds` as its stdin, stdout and stderr. It answers
    "P <pid>" once forked, then "S <wait status>" when the child has ended. `launcher`: the pid
    a test server names as its own (`pid` tool); None when the child is not behind a launcher."""
    body = json.dumps({"script": script, "argv": argv, "env": dict(env), "cwd": cwd,
                       "launcher": launcher}).encode()
    conn.sendmsg([_HEADER.pack(len(body)) + body],
                 [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])


def launch(sock_path: str, path: str, argv: list[str]) -> None:
    """Run the test server at `path` with `argv` on this process's stdio in a child of the fork
    server at `sock_path` (or exec it here when that is not reachable), and end as that child
    ends. The path, not a name, so that the command line still names the server's file."""
    script = os.path.basename(path).removesuffix(".py")
    if script not in SERVERS:
        sys.exit(f"forkserver: {path} is not one of the servers it runs ({', '.join(SERVERS)})")
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(sock_path)
        send_request(conn, script, argv, os.environ, os.getcwd(), (0, 1, 2), launcher=os.getpid())
        reader = conn.makefile("rb")
        first = reader.readline()
    except OSError:
        first = b""
    if not first.startswith(b"P "):  # no fork server: be the server
        conn.close()
        os.execv(sys.executable, [sys.executable, path, *argv])
    child = int(first[2:])
    for sig in _RELAYED:
        signal.signal(sig, lambda signum, frame: _relay(child, signum))
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the child alone holds the pipes: their EOF is its end
        os.dup2(devnull, fd)
    os.close(devnull)
    line = reader.readline()
    if not line.startswith(b"S "):  # the fork server went away, and its children with it (PDEATHSIG)
        os._exit(1)
    status = int(line[2:])
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _relay(child: int, signum: int) -> None:
    try:
        os.kill(child, signum)
    except ProcessLookupError:
        pass


# --- the fork server ----------------------------------------------------------------------------

def serve(sock_path: str) -> None:
    """Import the test servers, then fork one child per launcher until this process is killed
    (or its stdin, a pipe from the pytest worker that started it, reads EOF: the worker is gone)."""
    import ctypes  # noqa: F401  (imported here, not in each child)
    import gc
    import importlib
    import importlib.util
    import selectors

    modules = {}
    for script in SCRIPTS:
        spec = importlib.util.spec_from_file_location(f"_forked_{script}", script_path(script))
        assert spec is not None and spec.loader is not None
        modules[script] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(modules[script])
    for script in EXAMPLES:
        modules[script] = importlib.import_module(f"toolatlas.examples.{script}")
    modules[DAEMON] = _import_daemon()
    _import_web()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path + ".new")
    listener.listen(64)
    os.rename(sock_path + ".new", sock_path)  # the socket appears only once it accepts
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    gc.freeze()  # the imported modules' objects stay shared with every child, not copied on write
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    sel.register(0, selectors.EVENT_READ, "parent")  # a pipe from the pytest process: EOF when it is gone
    children: dict[int, socket.socket] = {}  # child pid -> its launcher's connection
    while True:
        for key, _ in sel.select():
            if key.data == "parent":
                if not os.read(0, 4096):
                    os._exit(0)  # the children die with this process (PR_SET_PDEATHSIG)
            elif key.data == "wake":
                os.read(wake_r, 4096)
                _reap(children, sel)
            elif key.data == "accept":
                conn, _ = listener.accept()
                pid = _fork_one(conn, modules, [listener.fileno(), wake_r, wake_w, sel.fileno(),
                                                *(c.fileno() for c in children.values())])
                if pid is None:
                    conn.close()
                    continue
                children[pid] = conn
                sel.register(conn, selectors.EVENT_READ, pid)
            else:  # a launcher's connection: readable only when it closed (the launcher died)
                try:
                    os.kill(key.data, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                sel.unregister(key.fileobj)
        _reap(children, sel)


def _reap(children: dict[int, socket.socket], sel: object) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        try:
            sel.unregister(conn)  # type: ignore[attr-defined]
        except (KeyError, ValueError):
            pass
        try:
            conn.sendall(b"S %d\n" % status)
        except OSError:
            pass
        conn.close()


def _fork_one(conn: socket.socket, modules: dict[str, types.ModuleType], close: list[int]) -> int | None:
    """Read one launcher's request and fork its child; the child's pid, or None."""
    conn.settimeout(10)
    try:
        head, fds = _recv_fds(conn, _HEADER.size)
        (size,) = _HEADER.unpack(head)
        body = b""
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                raise OSError("launcher hung up")
            body += chunk
        req = json.loads(body)
        module = modules[req["script"]]
    except (OSError, ValueError, KeyError, struct.error):
        return None
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return None
    pid = os.fork()
    if pid == 0:  # the child: become the server
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _die_with_parent()  # a fork server that dies takes its children along
            for fd in close:
                os.close(fd)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            conn.close()
            os.setsid()
            os.chdir(req["cwd"])
            os.environ.clear()
            os.environ.update(req["env"])
            if req["script"] == DAEMON:
                code = _run_daemon(module, req["argv"])
            else:
                sys.argv = [script_path(req["script"]), *req["argv"]]
                if req["script"] in SCRIPTS:
                    module.PROCESS_ID = req["launcher"]  # type: ignore[attr-defined]
                module.main(req["argv"])
                code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    for fd in fds:
        os.close(fd)
    try:
        conn.settimeout(None)
        conn.sendall(b"P %d\n" % pid)
    except OSError:  # the launcher is gone already
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return None
    return pid


def _import_web() -> None:
    """What a test server over sse or http imports on top of the SDK (uvicorn and its h11
    protocol, ~0.06 s), once: such servers start here too (servers.start_server)."""
    import uvicorn.lifespan.on  # noqa: F401
    import uvicorn.loops.auto  # noqa: F401
    import uvicorn.protocols.http.h11_impl  # noqa: F401


def _import_daemon() -> types.ModuleType:
    """What `python -m toolatlas serve` imports before it serves (cli, then app), once."""
    import toolatlas.app  # noqa: F401
    import toolatlas.cli

    return toolatlas.cli


def _run_daemon(cli: types.ModuleType, argv: list[str]) -> int:
    """In the forked child: end as `python -m toolatlas ARGV` ends. Unbuffered stdio when the
    request's environment asks for it (the fork server's own streams were made at its start);
    then the interpreter's own shutdown, as far as a forked child can have it: non-daemon
    threads joined, then the atexit handlers (the exit code is os._exit's, in the caller)."""
    import atexit
    import io
    import threading

    if os.environ.get("PYTHONUNBUFFERED"):
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True,
                                      errors="backslashreplace")
    sys.argv = [os.path.join(os.path.dirname(cli.__file__ or ""), "__main__.py"), *argv]
    try:
        return int(cli.main(argv))
    finally:  # also on SystemExit (argparse's), which the caller turns into the exit code
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()


def _die_with_parent() -> None:
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _recv_fds(conn: socket.socket, size: int) -> tuple[bytes, list[int]]:
    fds = array.array("i")
    msg, ancdata, _, _ = conn.recvmsg(size, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    while len(msg) < size:
        more = conn.recv(size - len(msg))
        if not more:
            raise OSError("launcher hung up")
        msg += more
    return msg, list(fds)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"] and len(sys.argv) == 3:
        serve(sys.argv[2])
    elif sys.argv[1:2] == ["--via"] and len(sys.argv) >= 4:
        launch(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        sys.exit(__doc__)
