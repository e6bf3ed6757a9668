"""Run a real `toolatlas serve` subprocess on a generated TOML config, for end-to-end tests and
benches; and the TOML [[upstream]] blocks those configs are made of."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support import REPO, TEST_CACHE_HOME
from tests.support.processes import descendants, die_with_parent, kill_all
from tests.support.forked import Forked
from tests.support.servers import EVERYTHING_BIN, HOSTILE, example_args, faultserver_args, forkserver_socket, testserver_args
from tests.support.servers.forkserver import DAEMON

__all__ = ["REPO", "Daemon", "everything_upstream", "hostile_upstream", "seed_shared_models", "shared_onnx_models",
           "stdio_example", "stdio_faultserver", "stdio_testserver", "url_upstream"]


def _stdio_upstream(name: str, args: list[str], extra: str = "") -> str:
    """A TOML [[upstream]] block running this interpreter with `args` over stdio."""
    return (f'[[upstream]]\nname = "{name}"\ntransport = "stdio"\ncommand = "{sys.executable}"\n'
            f"args = {json.dumps(args)}\n{extra}")


def stdio_testserver(name: str, *extra: str) -> str:
    """A TOML [[upstream]] block running the project's test server over stdio."""
    return _stdio_upstream(name, testserver_args(*extra))


def stdio_example(name: str) -> str:
    """A TOML [[upstream]] block running the user example `name` ("notes", "weather", "units")
    over stdio, named after it (through the suite's fork server: servers.example_args)."""
    return _stdio_upstream(name, example_args(name))


def stdio_faultserver(name: str, *extra: str) -> str:
    """A TOML [[upstream]] block running the fault server (servers/faultserver.py) over stdio;
    its `stats` tool counts calls in flight, completed and cancelled."""
    return _stdio_upstream(name, faultserver_args(*extra))


def hostile_upstream(*args: str, name: str = "hostile", extra: str = "") -> str:
    """A TOML [[upstream]] block running the hostile server (servers/hostile.py) over stdio."""
    return _stdio_upstream(name, [str(HOSTILE), *args], extra)


def everything_upstream(name: str = "everything") -> str:
    """A TOML [[upstream]] block running npm's server-everything over stdio."""
    return f'[[upstream]]\nname = "{name}"\ntransport = "stdio"\ncommand = "{EVERYTHING_BIN}"\nargs = ["stdio"]\n'


def url_upstream(name: str, transport: str, url: str, extra: str = "") -> str:
    return f'[[upstream]]\nname = "{name}"\ntransport = "{transport}"\nurl = "{url}"\n{extra}'


def shared_onnx_models() -> Path:
    """The folder holding the ONNX export of the embedding model, made once per machine for the
    test suite (the export itself is what toolatlas does on first start; atomic, locked). It is
    the user cache's `toolatlas/models` under the suite's XDG_CACHE_HOME, so an engine with no
    state dir finds the same export."""
    from toolatlas.retrieval.embed import ensure_onnx_export

    root = TEST_CACHE_HOME / "toolatlas"
    ensure_onnx_export(root)
    return root / "models"


def seed_shared_models(state_dir: Path) -> Path:
    """Link the suite's ONNX export into `state_dir` (made if missing) as its `models`, unless
    it has one: a test of something else then pays no first-start export. Returns state_dir."""
    state_dir.mkdir(parents=True, exist_ok=True)
    models = state_dir / "models"
    if not models.exists():
        models.symlink_to(shared_onnx_models(), target_is_directory=True)
    return state_dir


class Daemon:
    """A daemon subprocess; `rpc(method, params)` talks to it over the socket."""

    def __init__(
        self, tmp: Path, upstreams: str, *, daemon_extra: str = "", search_extra: str = 'embedder = "none"\n',
        seed_models: bool = True,
    ) -> None:
        """`seed_models=False` leaves the ONNX export out of state_dir, so an `embedder = "onnx"`
        daemon exports the model itself, as on a user's first start (tests of that path)."""
        self.tmp = tmp
        self.socket = str(tmp / "run" / "toolatlas.sock")
        self.config = tmp / "toolatlas.toml"
        self.config.write_text(
            "[daemon]\n"
            f'socket = "{self.socket}"\n'
            f'state_dir = "{tmp / "state"}"\n'
            + ('metrics_addr = ""\n' if "metrics_addr" not in daemon_extra else "")
            +
            "drain_timeout = 5\n"
            f"{daemon_extra}\n"
            "[search]\n"
            f"{search_extra}\n"
            f"{upstreams}"
        )
        self.log = tmp / "daemon.log"
        self.proc: subprocess.Popen[bytes] | Forked | None = None
        if 'embedder = "onnx"' in search_extra and seed_models:
            seed_shared_models(tmp / "state" / "index")

    def start(self, *, wait_ready: float = 60.0, env: dict[str, str] | None = None, ready: bool = True,
              cwd: Path | None = None, exec_: bool = False) -> "Daemon":
        """Spawn the daemon (in folder `cwd`, default this process's) and wait (up to
        `wait_ready` s) until its index is ready, or with `ready=False` only until its socket
        answers catalog_status. In the suite it is forked from the worker's fork server, its
        imports done (servers/forkserver.py); `exec_` starts a fresh interpreter instead, for a
        test of what happens while the daemon imports or of the process a shell starts."""
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self._logfh = open(self.log, "wb")
        argv = ["serve", "--config", str(self.config)]
        sock = None if exec_ else forkserver_socket()
        self.proc = None
        if sock is not None:
            try:
                with open(os.devnull, "rb") as devnull:
                    self.proc = Forked(sock, DAEMON, argv, env=env, cwd=cwd, stdin=devnull.fileno(),
                                       stdout=self._logfh.fileno(), stderr=self._logfh.fileno())
            except OSError:  # the fork server went away: exec, as the stdio launcher does then
                pass
        if self.proc is None:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "toolatlas", *argv],
                stdout=self._logfh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                preexec_fn=die_with_parent,
            )
        deadline = time.monotonic() + wait_ready
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if self.status()["index"]["ready"] or not ready:
                    return self
            except (OSError, ConnectionError, KeyError, ValueError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"daemon not ready within {wait_ready} s:\n{self.log.read_text()}")

    def client(self) -> Any:
        from toolatlas.surface.rawclient import RawClient

        return RawClient(self.socket, timeout=60)

    def tool(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        with self.client() as c:
            return c.call_tool(name, args)

    def meta(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        result = self.tool(name, args)
        assert not result.get("isError"), result
        return result["structuredContent"]

    def status(self) -> dict[str, Any]:
        return self.meta("catalog_status", {})

    def search(self, query: str, top_k: int = 5, **kw: Any) -> list[str]:
        return [m["name"] for m in self.meta("tool_search", {"query": query, "top_k": top_k, **kw})["matches"]]

    def wait_for(self, predicate: Any, timeout: float = 30.0, what: str = "condition") -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = predicate()
                if last:
                    return last
            except (OSError, ConnectionError, AssertionError, KeyError):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"{what} not reached within {timeout} s (last: {last!r})\n{self.log.read_text()[-4000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
        self._logfh.close()
        return self.proc.returncode

    def __enter__(self) -> "Daemon":
        """Start it, unless `start(...)` already did (`with d.start(env=...):`)."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        try:
            return self.start()
        except BaseException:  # a daemon that never got ready must not outlive the test
            self._halt(signal.SIGKILL)
            raise

    def __exit__(self, *exc: object) -> None:
        self._halt(signal.SIGTERM)

    def _halt(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            kids = descendants(self.proc.pid)
            self.stop(sig)
            kill_all(kids)
