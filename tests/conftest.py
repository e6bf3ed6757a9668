"""Shared fixtures; the helpers behind them live in ``tests.support``.

- ``free_port``: an unused TCP port on 127.0.0.1.
- ``spawn_server(module="testserver", transport="http", args=())``: a test server or user
  example over sse/http, waited for (``READY <port>``); a ``RunningServer`` (``.url``,
  ``.port``, ``.pid``, ``.kill()``). Every server is stopped at teardown.
- ``testserver_http_url`` / ``testserver_sse_url``: one shared test server each for the
  whole session (do not kill or mutate them; use ``spawn_server`` for that).
- ``spawn_everything(transport="http"|"sse")``: npm's server-everything on a free port
  (skips when tests/npm is not installed); ``everything_stdio``: its stdio upstream config.
- ``make_upstream``: ``tests.support.configs.make_upstream``; ``testserver_stdio``:
  ``tests.support.configs.stdio_testserver``.
- ``pg_server``: one throwaway PostgreSQL per session (``tests.support.postgres.PgServer``;
  skips only when no server binaries are installed); ``pg_url``: a fresh database on it;
  ``pg_private``: a server of the test's own (to stop and start).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from toolatlas.config import StdioUpstream, Upstream

from tests.support import TEST_CACHE_HOME, TEST_CONFIG_HOME, configs, ports
from tests.support.postgres import PgServer, bindir
from tests.support.servers import FORKSERVER_ENV, RunningServer, ServerFactory


# The longest test files (their wall time in a quiet `pytest -n 4` run, stop 52's per-file
# census), longest first, go first: with `--dist loadfile` a worker takes whole files in this
# order, and one of these taken last runs alone at the end while the other workers idle. The
# rest keep their order. (pytest_configure keeps xdist from reordering files by test count.)
LONG_FILES = (
    "e2e/test_replicas.py", "e2e/test_fresh_start.py", "integration/test_upstream_pool.py",
    "e2e/test_upstream_rpc.py", "e2e/test_crash_recovery.py", "e2e/test_reload_applies.py", "e2e/test_learning.py",
    "e2e/test_state_files.py", "integration/test_retrieval.py", "e2e/test_shim_restart.py", "e2e/test_doctor.py",
    "e2e/test_cards.py", "e2e/test_daemon_rift.py", "e2e/test_fuzz.py", "e2e/test_client_limits.py",
    "e2e/test_approval.py", "e2e/test_daemon_ops.py", "integration/test_systemd_units.py",
)
_TESTS = Path(__file__).resolve().parent

# What reads the user cache (an engine with no state dir, `toolatlas eval` and `rift` without
# one, the ONNX runtime) reads the suite's own: one export of the model for the whole suite
# (tests.support.daemon.shared_onnx_models), none written into the real home directory.
os.environ["XDG_CACHE_HOME"] = str(TEST_CACHE_HOME)
os.environ["XDG_CONFIG_HOME"] = str(TEST_CONFIG_HOME)
# stdio test servers start from a fork server, the SDK imported once per worker, not once per
# server (tests/support/servers/forkserver.py: a quarter of the suite's CPU went to those imports).
os.environ[FORKSERVER_ENV] = "1"


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist's loadfile hands out files by their number of tests, most first, unless told
    # not to (`--loadscope-reorder`, its default): that set LONG_FILES' order aside, and the
    # four-test, two-minute test_fresh_start.py went out among the last and ended the run alone.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    first = {name: i for i, name in enumerate(LONG_FILES)}

    def order(item: pytest.Item) -> int:
        try:
            return first.get(item.path.resolve().relative_to(_TESTS).as_posix(), len(first))
        except ValueError:  # not under tests/
            return len(first)

    items.sort(key=order)  # stable: a file's tests stay together and in order


@pytest.fixture
def free_port() -> int:
    return ports.free_port()


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


@pytest.fixture(name="make_upstream")
def make_upstream_fixture() -> Callable[..., Upstream]:
    return configs.make_upstream


@pytest.fixture
def testserver_stdio() -> Callable[..., StdioUpstream]:
    return configs.stdio_testserver


@pytest.fixture
def everything_stdio() -> StdioUpstream:
    return configs.stdio_everything()


def _running_pg() -> Iterator[PgServer]:
    """A throwaway PostgreSQL server for the fixture's scope (skips where none is installed)."""
    if bindir() is None:
        pytest.skip("PostgreSQL server binaries (initdb) are not installed; `make setup` installs them")
    server = PgServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    yield from _running_pg()


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    return pg_server.new_database()


@pytest.fixture
def pg_private() -> Iterator[PgServer]:
    yield from _running_pg()
