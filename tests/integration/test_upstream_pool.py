"""The upstream pool against real servers: subprocesses, real sockets, no mocks."""

from __future__ import annotations

import gc
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types
import pytest

from tests.support.configs import make_upstream, replace, stdio_everything, stdio_testserver
from tests.support.ports import free_port as get_free_port
from tests.support.processes import children_of, pid_alive
from tests.support.results import pool_call, text
from tests.support.waits import until
from toolatlas.config import Timeouts
from toolatlas.errors import UpstreamTimeout, UpstreamUnavailable
from toolatlas.catalog.model import ToolRecord
from toolatlas.upstream.pool import Pool, UpstreamStatus, list_tools_once
from toolatlas.upstream.state import UpstreamState

READY, DEGRADED = UpstreamState.READY, UpstreamState.DEGRADED


class Recorder:
    """The pool's tools callback: remembers the latest list per upstream, wakes waiters."""

    def __init__(self) -> None:
        self.latest: dict[str, list[str] | None] = {}
        self.history: list[tuple[str, list[str] | None]] = []
        self._changed = anyio.Event()

    async def __call__(self, name: str, tools: list[ToolRecord] | None) -> None:
        names = None if tools is None else [t.tool for t in tools]
        self.latest[name] = names
        self.history.append((name, names))
        self._changed.set()
        self._changed = anyio.Event()

    async def wait(self, pred: Callable[[], bool], timeout: float = 30.0) -> None:
        with anyio.fail_after(timeout):
            while True:
                evt = self._changed
                if pred():
                    return
                await evt.wait()


async def wait_status(pool: Pool, name: str, pred: Callable[[UpstreamStatus], bool], timeout: float = 30.0) -> UpstreamStatus:
    """Poll the pool's status (cheap, in-memory) until ``pred`` holds, with a deadline."""
    with anyio.fail_after(timeout):
        while True:
            st = pool.get(name)
            if st is not None and pred(st):
                return st
            await anyio.sleep(0.02)


@asynccontextmanager
async def running(pool: Pool) -> AsyncIterator[Pool]:
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run)
        try:
            yield pool
        finally:
            tg.cancel_scope.cancel()


def no_backoff(_attempt: int) -> float:
    return 0.0


async def test_discovery_and_calls_across_stdio_sse_and_http(testserver_http_url: str, testserver_sse_url: str) -> None:
    rec = Recorder()
    ups = [
        stdio_testserver("local", "--tools", "2"),
        make_upstream("remote-sse", "sse", url=testserver_sse_url),
        make_upstream("remote-http", "http", url=testserver_http_url),
        make_upstream("off", "http", url="http://127.0.0.1:9/mcp", enabled=False),
    ]
    with anyio.fail_after(60):
        async with running(Pool(ups, rec)) as pool:
            await pool.wait_settled(45)
            states = {s.name: s for s in pool.status()}
            assert [s.name for s in pool.status()] == ["local", "remote-sse", "remote-http", "off"]
            for name in ("local", "remote-sse", "remote-http"):
                assert states[name].state is READY, states[name]
                assert "echo" in (rec.latest[name] or [])
                assert states[name].tools == len(rec.latest[name] or [])
                assert states[name].protocol_version
                result = await pool_call(pool, name, "echo", {"message": f"hi {name}"})
                assert text(result) == f"Echo: hi {name}"
            assert states["local"].pid is not None and pid_alive(states["local"].pid)
            assert states["remote-http"].pid is None
            assert states["off"].state is UpstreamState.DISABLED and "off" not in rec.latest
            assert "local" in repr(pool) and "ready" in repr(pool)
            with pytest.raises(UpstreamUnavailable, match="disabled"):
                await pool_call(pool, "off", "echo", {"message": "x"})
            with pytest.raises(UpstreamUnavailable, match="no upstream named 'nope'"):
                await pool_call(pool, "nope", "echo", {})


@pytest.mark.slow
async def test_server_everything_over_stdio_and_http(spawn_everything: Any) -> None:
    srv = spawn_everything("http")
    rec = Recorder()
    ups = [stdio_everything("ev-stdio"), make_upstream("ev-http", "http", url=srv.url)]
    with anyio.fail_after(60):
        async with running(Pool(ups, rec)) as pool:
            await pool.wait_settled(45)
            for name in ("ev-stdio", "ev-http"):
                st = pool.get(name)
                assert st is not None and st.state is READY, st
                assert st.tools >= 10 and "echo" in (rec.latest[name] or [])
                result = await pool_call(pool, name, "echo", {"message": "hello"})
                assert text(result) == "Echo: hello"


@pytest.mark.parametrize(
    ("transport", "mode", "generation"),
    [("stdio", "legacy", "2025"), ("stdio", "auto", "2026"), ("http", "legacy", "2025"), ("http", "auto", "2026")],
)
async def test_list_changed_reaches_the_callback(spawn_server: Any, transport: str, mode: str, generation: str) -> None:
    if transport == "stdio":
        up = stdio_testserver("dyn", relist_interval=0)
    else:
        up = make_upstream("dyn", "http", url=spawn_server("testserver", "http").url, relist_interval=0)
    rec = Recorder()
    with anyio.fail_after(60):
        async with running(Pool([up], rec, mode=mode)) as pool:
            await pool.wait_settled(30)
            st = pool.get("dyn")
            assert st is not None and st.state is READY
            assert st.protocol_version is not None and st.protocol_version.startswith(generation)
            assert "weather_lookup" not in (rec.latest["dyn"] or [])
            await pool_call(pool, "dyn", "add_tool", {"name": "weather_lookup", "description": "Look up weather."})
            await rec.wait(lambda: "weather_lookup" in (rec.latest.get("dyn") or []), timeout=10)
            result = await pool_call(pool, "dyn", "weather_lookup", {"text": "oslo"})
            assert text(result) == "weather_lookup: oslo"
            await pool_call(pool, "dyn", "remove_tool", {"name": "weather_lookup"})
            await rec.wait(lambda: "weather_lookup" not in (rec.latest.get("dyn") or []), timeout=10)


async def test_a_list_changed_storm_is_logged_once_not_once_per_notification(
    spawn_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # 300 tools/list_changed wrote 300 INFO lines "upstream NAME: tools/list_changed".
    import logging

    caplog.set_level(logging.INFO, logger="toolatlas.upstream")
    up = make_upstream("stormy", "http", url=spawn_server("faultserver", "http").url, relist_interval=0)
    seen: list[str] = []
    observer = lambda _name, kind, _fields: seen.append(kind) if kind == "list_changed" else None  # noqa: E731
    with anyio.fail_after(60):
        async with running(Pool([up], Recorder(), mode="legacy", observer=observer)) as pool:
            await wait_status(pool, "stormy", lambda s: s.state is READY)
            assert text(await pool_call(pool, "stormy", "storm", {"count": 300, "per_second": 0})) == "300"
            while len(seen) < 300:  # every one is counted (metrics), and re-listed after
                await anyio.sleep(0.02)
            assert pool.get("stormy").state is READY  # type: ignore[union-attr]
    said = [r.getMessage() for r in caplog.records if "stormy" in r.getMessage() and "changed" in r.getMessage()
            and "tool list changed:" not in r.getMessage()]
    assert said == ["upstream stormy: its tools changed (tools/list_changed)"], said


async def test_periodic_relist_picks_up_changes_without_notifications(spawn_server: Any) -> None:
    # The legacy notification goes only to the session that made the change; a second
    # client's change is only seen by polling.
    url = spawn_server("testserver", "http").url
    rec = Recorder()
    watcher = make_upstream("watched", "http", url=url, relist_interval=0.3)
    changer = make_upstream("changer", "http", url=url, relist_interval=0)
    with anyio.fail_after(60):
        async with running(Pool([watcher, changer], rec, mode="legacy")) as pool:
            await pool.wait_settled(30)
            await pool_call(pool, "changer", "add_tool", {"name": "polled_tool", "description": "Seen by polling."})
            await rec.wait(lambda: "polled_tool" in (rec.latest.get("watched") or []), timeout=10)


async def test_pagination_is_followed_to_the_end() -> None:
    rec = Recorder()
    up = stdio_testserver("paged", "--tools", "25", "--page-size", "4")
    with anyio.fail_after(60):
        async with running(Pool([up], rec)) as pool:
            await pool.wait_settled(30)
            names = rec.latest["paged"] or []
            assert len(names) == 9 + 25 and len(set(names)) == len(names)
            assert names[-1] == "gen_024"
            before = len(rec.history)
            await pool.refresh("paged")  # a forced re-list also walks every page
            assert len(rec.history) == before + 1 and len(rec.history[-1][1] or []) == 34
            assert pool.get("paged").tools == 34  # type: ignore[union-attr]
    tools = await list_tools_once(up)
    assert len(tools) == 34


async def test_a_one_shot_listing_of_a_child_that_dies_says_how_it_ended() -> None:
    """`cards generate|verify` and `rift --config` list an upstream once: a stdio child that
    died at its start was 'connect failed: JSON-RPC error -32000: Connection closed'."""
    dies = make_upstream("dies", "stdio", command="/bin/sh", args=["-c", "echo 'Error: TOKEN is not set' >&2; exit 3"])
    with anyio.fail_after(30), pytest.raises(UpstreamUnavailable) as failed:
        await list_tools_once(dies)
    assert str(failed.value) == "upstream 'dies': connect failed: stdio child exited with code 3 (stderr: Error: TOKEN is not set)"


async def test_a_large_page_is_parsed_in_slices_with_the_same_tools_and_session_state(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One 3,000-tool page (~400 kB) takes the sliced parse (upstream/pages.py): the same
    tools as the SDK's own parse, every tool known to the SDK session (else its output
    validation would re-list the whole catalog on each call), and calls work after it."""
    from toolatlas.upstream import pages
    from toolatlas.upstream.client import make_client
    from toolatlas.upstream.listing import list_all_tools
    from toolatlas.upstream.transports import StdioProcess

    up = stdio_testserver("big", "--tools", "3000")

    async def listing() -> tuple[list[mcp_types.Tool], set[str]]:
        async with make_client(StdioProcess(up), mode="auto") as client:
            tools = await list_all_tools(client, up.name)
            known = set(client.session._tool_output_schemas)  # what validate_tool_result reads (mcp==2.3.0)
            assert text(await client.call_tool("echo", {"message": "after"})) == "Echo: after"
            return tools, known

    with anyio.fail_after(90):
        sliced, known = await listing()
        assert len(pages.PAGES) == 0  # taken, not left behind
        monkeypatch.setattr(pages, "BIG_PAGE_BYTES", 1 << 40)  # the SDK's own parse, for comparison
        whole, _ = await listing()
    assert len(sliced) == 3009 and [t.model_dump() for t in sliced] == [t.model_dump() for t in whole]
    assert known == {t.name for t in sliced}


async def test_killed_stdio_upstream_recovers_with_a_new_process(testserver_http_url: str) -> None:
    rec = Recorder()
    ups = [stdio_testserver("fragile"), make_upstream("steady", "http", url=testserver_http_url)]
    with anyio.fail_after(90):
        async with running(Pool(ups, rec, backoff=lambda a: 0.2)) as pool:
            await pool.wait_settled(30)
            first = pool.get("fragile")
            assert first is not None and first.state is READY and first.pid is not None
            os.kill(first.pid, signal.SIGKILL)
            down = await wait_status(pool, "fragile", lambda s: s.state is not READY)
            assert down.state in (DEGRADED, UpstreamState.CONNECTING)
            await wait_status(pool, "fragile", lambda s: "signal 9" in (s.reason or ""), timeout=5)
            await rec.wait(lambda: ("fragile", None) in rec.history)
            # The other upstream is untouched and keeps serving calls meanwhile.
            result = await pool_call(pool, "steady", "echo", {"message": "still here"})
            assert text(result) == "Echo: still here"
            back = await wait_status(pool, "fragile", lambda s: s.state is READY and s.pid not in (None, first.pid))
            assert back.pid is not None and back.pid != first.pid and back.reconnects >= 1
            assert rec.latest["fragile"] and "echo" in rec.latest["fragile"]
            result = await pool_call(pool, "fragile", "pid", {})
            assert text(result) == str(back.pid)
            steady = pool.get("steady")
            assert steady is not None and steady.state is READY and steady.reconnects == 0


async def test_a_killed_stdio_upstream_is_noticed_by_its_exit_when_a_process_it_started_holds_its_stdout() -> None:
    """The server starts a background process that inherits its stdout, so killing the server
    brings no EOF. Its exit ends the session anyway (not the health check 30 s later, and not
    a call's timeout), and the process it left behind is stopped with its group."""
    base = stdio_testserver("orphaning")
    assert isinstance(base.command, str)
    up = replace(base, command="/bin/sh", args=["-c", 'sleep 300 & exec "$0" "$@"', base.command, *base.args])
    rec = Recorder()
    with anyio.fail_after(60):
        async with running(Pool([up], rec, backoff=lambda a: 0.2)) as pool:
            await pool.wait_settled(30)
            first = pool.get("orphaning")
            assert first is not None and first.state is READY and first.pid is not None
            (holder,) = children_of(first.pid)  # the sleep, holding the server's stdout
            os.kill(first.pid, signal.SIGKILL)
            down = await wait_status(pool, "orphaning", lambda s: s.state is not READY, timeout=10)
            assert "signal 9" in (down.reason or "") or down.reconnects >= 1
            back = await wait_status(pool, "orphaning", lambda s: s.state is READY and s.pid not in (None, first.pid),
                                     timeout=20)
            assert back.reconnects >= 1
            assert text(await pool_call(pool, "orphaning", "echo", {"message": "again"})) == "Echo: again"
            with anyio.fail_after(10):
                while pid_alive(holder):
                    await anyio.sleep(0.05)


async def test_a_process_the_child_started_that_ignores_sigterm_does_not_outlive_the_pool() -> None:
    """The server leaves a background process that ignores SIGTERM (a wrapper's helper, a
    language server); stopping the upstream SIGKILLs it after the grace, not leave it running."""
    base = stdio_testserver("stubborn")
    assert isinstance(base.command, str)
    script = '(trap "" TERM; exec sleep 300) & exec "$0" "$@"'
    up = replace(base, command="/bin/sh", args=["-c", script, base.command, *base.args])
    with anyio.fail_after(60):
        async with running(Pool([up], Recorder())) as pool:
            await pool.wait_settled(30)
            first = pool.get("stubborn")
            assert first is not None and first.state is READY and first.pid is not None
            (holder,) = children_of(first.pid)
        await until(lambda: not pid_alive(holder), "end of the process the child left behind", timeout=20)


async def test_a_child_that_says_why_it_quit_on_stdout_has_that_in_its_status() -> None:
    """Many servers print their usage or a missing-setting error on stdout, not stderr, and
    exit: the reason showed only the exit code, the words were in the daemon's log alone."""
    quits = make_upstream("quits", "stdio", command="/bin/sh",
                          args=["-c", 'echo "Error: WIDGET_API_KEY is not set"; exit 1'])
    said = make_upstream("said", "stdio", command="/bin/sh",
                         args=["-c", 'echo "usage: srv [--port N]"; echo "srv: bad flag" >&2; exit 2'])
    with anyio.fail_after(30):
        async with running(Pool([quits, said], Recorder(), backoff=lambda _a: 60.0)) as pool:
            await pool.wait_settled(20)
            q, s = pool.get("quits"), pool.get("said")
            assert q is not None and q.reason == "stdio child exited with code 1 (stdout: Error: WIDGET_API_KEY is not set)"
            assert s is not None and s.reason == "stdio child exited with code 2 (stderr: srv: bad flag)"  # stderr first


async def test_a_child_stuck_at_its_start_has_its_last_words_and_the_key_in_its_status() -> None:
    """A child that never answers initialize often says why on stderr (a login URL to open, a
    download): the timeout's reason said only 'did not answer connect within N s'."""
    stuck = make_upstream("stuck", "stdio", command="/bin/sh", timeouts=Timeouts(connect=1.0),
                          args=["-c", 'echo "Please authorize: open https://auth.example/x" >&2; exec sleep 300'])
    with anyio.fail_after(30):
        async with running(Pool([stuck], Recorder(), backoff=lambda _a: 60.0)) as pool:
            await pool.wait_settled(20)
            st = pool.get("stuck")
            assert st is not None and st.reason == (
                "upstream 'stuck' did not answer connect within 1 s (stderr: Please authorize: open "
                "https://auth.example/x); a server that takes longer to start needs a larger timeouts.connect")


async def test_crash_during_a_call_fails_that_call_and_recovers() -> None:
    rec = Recorder()
    with anyio.fail_after(60):
        async with running(Pool([stdio_testserver("crashy")], rec, backoff=no_backoff)) as pool:
            await pool.wait_settled(30)
            pid = pool.get("crashy").pid  # type: ignore[union-attr]
            # the call says the child died and how, not the SDK's "Connection closed"
            with pytest.raises(UpstreamUnavailable, match=r"^upstream 'crashy' lost its session during tools/call crash: "
                               r"stdio child exited with code 3 \(stderr: testserver: crashing with code 3\)$"):
                await pool_call(pool, "crashy", "crash", {"code": 3})
            back = await wait_status(pool, "crashy", lambda s: s.state is READY and s.pid not in (None, pid))
            assert back.reconnects >= 1
            assert text(await pool_call(pool, "crashy", "echo", {"message": "again"})) == "Echo: again"


async def test_hung_call_times_out_while_other_calls_proceed() -> None:
    rec = Recorder()
    with anyio.fail_after(60):
        async with running(Pool([stdio_testserver("slow")], rec)) as pool:
            await pool.wait_settled(30)
            errors: list[BaseException] = []

            async def hang() -> None:
                try:
                    await pool_call(pool, "slow", "hang", {}, timeout=1.5)
                except UpstreamTimeout as exc:
                    errors.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(hang)
                # While the hang is in flight the same session answers other calls.
                for i in range(5):
                    assert text(await pool_call(pool, "slow", "echo", {"message": str(i)})) == f"Echo: {i}"
            assert len(errors) == 1
            err = errors[0]
            assert isinstance(err, UpstreamTimeout)
            assert (err.upstream, err.operation, err.seconds) == ("slow", "tools/call hang", 1.5)
            assert "'slow'" in str(err) and "tools/call hang" in str(err) and "1.5 s" in str(err)
            # A cancelled call does not poison the session either.
            with anyio.move_on_after(0.3):
                await pool_call(pool, "slow", "sleep", {"seconds": 5})
            assert text(await pool_call(pool, "slow", "echo", {"message": "after"})) == "Echo: after"
            assert pool.get("slow").state is READY  # type: ignore[union-attr]


async def test_progress_notifications_reach_the_caller() -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    with anyio.fail_after(60):
        async with running(Pool([stdio_testserver("prog")], Recorder())) as pool:
            await pool.wait_settled(30)
            result = await pool_call(pool, "prog", "progress", {"steps": 3}, progress=on_progress)
            assert text(result) == "done"
            assert [p for p, _, _ in seen] == [1, 2, 3]
            assert seen[-1] == (3, 3, "step 3")


async def test_unreachable_upstream_is_degraded_with_a_reason_and_others_work() -> None:
    rec = Recorder()
    dead = make_upstream("dead", "http", url=f"http://127.0.0.1:{get_free_port()}/mcp")
    with anyio.fail_after(60):
        async with running(Pool([dead, stdio_testserver("alive")], rec, backoff=lambda a: 30.0)) as pool:
            await pool.wait_settled(30)
            st = pool.get("dead")
            assert st is not None and st.state is DEGRADED
            assert st.reason and "connect failed" in st.reason
            assert st.next_retry_in is not None and 0 < st.next_retry_in <= 30.0
            assert "dead" not in rec.latest
            with pytest.raises(UpstreamUnavailable, match=r"'dead' is degraded: connect failed"):
                await pool_call(pool, "dead", "echo", {"message": "x"})
            assert pool.get("alive").state is READY  # type: ignore[union-attr]


async def test_silent_stdio_child_times_out_connect_and_is_not_left_behind(tmp_path: Any) -> None:
    import sys

    script = tmp_path / "silent.py"
    pidfile = tmp_path / "pid"
    script.write_text(f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n")
    up = make_upstream("silent", "stdio", command=sys.executable, args=[str(script)],
                       timeouts=Timeouts(connect=1.0, list_tools=1.0, call=1.0, ping=1.0))
    with anyio.fail_after(60):
        async with running(Pool([up], Recorder(), backoff=lambda a: 60.0)) as pool:
            await pool.wait_settled(30)
            st = pool.get("silent")
            assert st is not None and st.state is DEGRADED
            assert st.reason == ("upstream 'silent' did not answer connect within 1 s; a server that takes longer "
                                 "to start needs a larger timeouts.connect")
            assert st.pid is None
            child = int(pidfile.read_text())
        assert not pid_alive(child)
        assert child not in children_of(os.getpid())


async def test_a_listing_converted_slower_than_its_timeout_still_connects(monkeypatch: pytest.MonkeyPatch) -> None:
    """`timeouts.list_tools` bounds the upstream's answer, not this daemon's own work on it.
    Converting 20,000 listed tools takes seconds on a busy host; when that outlasted the
    connect deadline, whose scope also holds the transport, the deadline closed the child's
    stdin mid-conversion, the session went READY for an instant and was then lost as "stdio
    child exited with code 0", on every attempt. Here the conversion is slowed (the real
    converter behind a sleep) to twice the timeout: the first connection stays up, and a
    re-list after a change, which converts outside its timeout too, is kept."""
    from toolatlas.upstream import listing

    real = listing.records

    def slow_records(up: Any, tools: Any) -> Any:
        time.sleep(4.0)  # in the worker thread the conversion runs in
        return real(up, tools)

    monkeypatch.setattr(listing, "records", slow_records)
    up = replace(stdio_testserver("bulky"), timeouts=Timeouts(connect=20.0, list_tools=2.0, call=20.0, ping=10.0))
    rec = Recorder()
    with anyio.fail_after(60):
        async with running(Pool([up], rec, backoff=no_backoff)) as pool:
            await pool.wait_settled(30)
            st = pool.get("bulky")
            assert st is not None and st.state is READY and st.reconnects == 0, st
            assert rec.latest["bulky"] and "echo" in rec.latest["bulky"]
            assert text(await pool_call(pool, "bulky", "pid", {})) == str(st.pid)
            # a re-list (on the change this call announces) converts slowly too, and is kept
            await pool_call(pool, "bulky", "add_tool", {"name": "late_tool", "description": "Listed on a change."})
            await rec.wait(lambda: "late_tool" in (rec.latest.get("bulky") or []), timeout=30)
            after = pool.get("bulky")
            assert after is not None and after.state is READY and after.reconnects == 0 and after.pid == st.pid


async def test_no_sdk_tool_model_outlives_its_listing(tmp_path: Any) -> None:
    """The records are the one copy of a listing (issue 19): once converted, the SDK's Tool
    models of the first listing and of a re-list are garbage, not held by the owner task's
    frame for the session's life or by the re-list worker until the next re-list."""
    marker = f"Echo, as listed for {uuid.uuid4().hex}."
    (tmp_path / "echo.txt").write_text(marker)
    late = f"late_{uuid.uuid4().hex[:8]}"
    rec = Recorder()

    async def none_live() -> bool:  # polled: the SDK may hold its last response for a moment
        with anyio.move_on_after(10):
            while True:
                gc.collect()
                if not any(type(o) is mcp_types.Tool and o.description == marker for o in gc.get_objects()):
                    return True
                await anyio.sleep(0.05)
        return False

    with anyio.fail_after(60):
        async with running(Pool([stdio_testserver("once", "--echo-description-file", str(tmp_path / "echo.txt"))],
                                rec, backoff=no_backoff)) as pool:
            await pool.wait_settled(30)
            assert pool.get("once").state is READY  # type: ignore[union-attr]
            assert await none_live()  # the first listing's
            await pool_call(pool, "once", "add_tool", {"name": late, "description": marker})
            await rec.wait(lambda: late in (rec.latest.get("once") or []), timeout=30)
            assert await none_live()  # the re-list's (echo and the new tool)


async def test_shutdown_leaves_no_child_processes(testserver_http_url: str) -> None:
    ups = [stdio_testserver("one"), stdio_testserver("two"),
           make_upstream("net", "http", url=testserver_http_url)]
    pool = Pool(ups, Recorder())
    with anyio.fail_after(60):
        async with running(pool):
            await pool.wait_settled(30)
            pids = [s.pid for s in pool.status() if s.pid is not None]
            assert len(pids) == 2 and all(pid_alive(p) for p in pids)
            # A call in flight at shutdown must not keep anything alive either.
            async with anyio.create_task_group() as tg:
                tg.start_soon(pool_call, pool, "one", "hang", {})
                await anyio.sleep(0)
                tg.cancel_scope.cancel()
    assert not any(pid_alive(p) for p in pids)
    assert [p for p in children_of(os.getpid()) if p in pids] == []
    assert {s.state for s in pool.status()} == {UpstreamState.CLOSED}


@pytest.mark.slow
async def test_reconcile_keeps_unchanged_restarts_changed_adds_and_removes() -> None:
    rec = Recorder()
    keep = stdio_testserver("keep")
    change = stdio_testserver("change")
    with anyio.fail_after(90):
        async with running(Pool([keep, change], rec)) as pool:
            await pool.wait_settled(30)
            keep_pid = pool.get("keep").pid  # type: ignore[union-attr]
            change_pid = pool.get("change").pid  # type: ignore[union-attr]
            changed = replace(change, args=[*change.args, "--tools", "2"])
            added = stdio_testserver("added")
            await pool.reconcile([keep, changed, added])
            await pool.wait_settled(30)
            await wait_status(pool, "change", lambda s: s.state is READY)
            await wait_status(pool, "added", lambda s: s.state is READY)
            assert pool.get("keep").pid == keep_pid  # type: ignore[union-attr]
            assert pool.get("change").pid not in (None, change_pid)  # type: ignore[union-attr]
            assert not pid_alive(change_pid)  # type: ignore[arg-type]
            assert "gen_001" in (rec.latest["change"] or [])
            assert [s.name for s in pool.status()] == ["keep", "change", "added"]
            added_pid = pool.get("added").pid  # type: ignore[union-attr]
            await pool.reconcile([keep])
            assert [s.name for s in pool.status()] == ["keep"]
            assert rec.latest["change"] is None and rec.latest["added"] is None
            assert not pid_alive(added_pid)  # type: ignore[arg-type]
            assert pool.get("keep").pid == keep_pid  # type: ignore[union-attr]
            assert text(await pool_call(pool, "keep", "echo", {"message": "k"})) == "Echo: k"


async def test_stale_http_session_404_reconnects_and_the_call_is_made_on_the_new_session(
    spawn_server: Any, tmp_path: Any
) -> None:
    """A 2025-era session id the server no longer knows (it restarted) -> reconnect; the call
    that met the 404 did not run, and is made again on the new session (it failed with "lost
    its session")."""
    port = get_free_port()
    first = spawn_server("testserver", "http", ["--port", str(port)])
    up = make_upstream("web", "http", url=first.url, ping_interval=0, relist_interval=0)
    rec = Recorder()
    with anyio.fail_after(90):
        async with running(Pool([up], rec, mode="legacy", backoff=lambda a: 0.2)) as pool:
            await pool.wait_settled(30)
            assert pool.get("web").state is READY  # type: ignore[union-attr]
            first.kill()
            second = spawn_server("testserver", "http", ["--port", str(port)])
            assert second.port == port
            assert text(await pool_call(pool, "web", "echo", {"message": "x"})) == "Echo: x"
            st = pool.get("web")
            assert st is not None and st.state is READY and st.reconnects == 1, st
            assert "no longer knows this session (HTTP 404" in (st.last_error or ""), st
            assert text(await pool_call(pool, "web", "echo", {"message": "y"})) == "Echo: y"


async def test_a_new_http_session_s_id_stays_out_of_the_log_at_info(spawn_server: Any, caplog: pytest.LogCaptureFixture) -> None:
    # The SDK's client logged "Received session ID: <id>" at INFO on every connect: whoever
    # reads the journal could act in that session on a server that binds nothing else to it.
    import logging

    from toolatlas.app import set_log_level

    before = {name: logging.getLogger(name).level for name in ("", "mcp.client.streamable_http")}
    set_log_level("INFO")
    try:
        caplog.set_level(logging.INFO)
        srv = spawn_server("faultserver", "http", ["--legacy-only"])
        up = make_upstream("web", "http", url=srv.url, ping_interval=0, relist_interval=0)
        with anyio.fail_after(60):
            async with running(Pool([up], Recorder(), mode="legacy")) as pool:
                await wait_status(pool, "web", lambda s: s.state is READY and s.protocol_version == "2025-11-25")
        assert any("upstream web: connecting -> ready" in r.getMessage() for r in caplog.records)
        assert not [r.getMessage() for r in caplog.records if "session ID" in r.getMessage()]
    finally:
        for name, level in before.items():
            logging.getLogger(name).setLevel(level)


@pytest.mark.slow
async def test_failed_health_check_degrades(spawn_server: Any) -> None:
    srv = spawn_server("testserver", "sse")
    up = make_upstream("pinged", "sse", url=srv.url, ping_interval=0.2, relist_interval=0,
                       timeouts=Timeouts(connect=10.0, list_tools=5.0, call=5.0, ping=1.0))
    rec = Recorder()
    with anyio.fail_after(60):
        async with running(Pool([up], rec, backoff=lambda a: 30.0)) as pool:
            await pool.wait_settled(30)
            assert pool.get("pinged").state is READY  # type: ignore[union-attr]
            os.killpg(srv.pid, signal.SIGSTOP)  # frozen, not dead: only a health check can notice
            try:
                st = await wait_status(pool, "pinged", lambda s: s.state is DEGRADED, timeout=20)
                assert "did not answer" in (st.reason or "") or "health check" in (st.reason or ""), st.reason
                await rec.wait(lambda: rec.latest.get("pinged") is None)
            finally:
                os.killpg(srv.pid, signal.SIGCONT)


@pytest.mark.slow
@pytest.mark.parametrize(("transport", "mode"), [("http", "auto"), ("http", "legacy"), ("sse", "auto")])
async def test_dropped_network_upstream_degrades_and_keeps_retrying(
    spawn_server: Any, testserver_http_url: str, transport: str, mode: str
) -> None:
    srv = spawn_server("testserver", transport)
    up = make_upstream("net", transport, url=srv.url, ping_interval=0.5)
    rec = Recorder()
    attempts: list[int] = []

    def backoff(attempt: int) -> float:
        attempts.append(attempt)
        return 0.2

    with anyio.fail_after(60):
        async with running(Pool([up, make_upstream("other", "http", url=testserver_http_url)], rec,
                                backoff=backoff, mode=mode)) as pool:
            await pool.wait_settled(30)
            assert pool.get("net").state is READY  # type: ignore[union-attr]
            srv.kill()
            st = await wait_status(pool, "net", lambda s: s.state is DEGRADED, timeout=20)
            assert st.reason
            await rec.wait(lambda: rec.latest.get("net") is None)
            # It keeps trying (the owner task did not die) with growing attempt numbers...
            await wait_status(pool, "net", lambda s: s.reconnects >= 2, timeout=20)
            assert attempts[:2] == [1, 2]
            # ...and the other upstream never noticed.
            other = pool.get("other")
            assert other is not None and other.state is READY and other.reconnects == 0


@pytest.mark.hostile
async def test_stdout_garbage_is_logged_a_bounded_number_of_times(caplog: pytest.LogCaptureFixture) -> None:
    """10,000 lines that are not JSON-RPC: the first few are logged, the rest counted in a
    summary (this flooded the log with one warning per line, ~288 KiB/s)."""
    import logging
    import re
    import sys

    from toolatlas.upstream.transports import StdioProcess

    lines = 10_000
    script = f"import sys\nsys.stdout.write(''.join(f'garbage {{i}}\\n' for i in range({lines})))\n"
    up = make_upstream("noisy", "stdio", command=sys.executable, args=["-c", script])
    caplog.set_level(logging.WARNING, logger="toolatlas.upstream.transports")
    received = 0
    with anyio.fail_after(60):
        async with StdioProcess(up) as (read, _write):
            async for item in read:
                assert isinstance(item, Exception)  # each line is an error for the session, not a message
                received += 1
    warnings = [r.getMessage() for r in caplog.records if r.name == "toolatlas.upstream.transports"]
    assert received == lines
    assert len(warnings) <= 10, f"{len(warnings)} warning lines, the first: {warnings[:3]}"
    shown = sum("ignoring a stdout line" in w for w in warnings)
    counted = sum(int(m.group(1)) for w in warnings if (m := re.search(r"ignored (\d+) more", w)))
    assert shown >= 1 and shown + counted == lines, warnings


async def test_a_call_while_a_reload_restarts_its_upstream_says_it_is_closing() -> None:
    """Between a reload's stop() of a changed upstream and its new session, a call fails at
    once (the new session is not there yet); its error says the session is closing and to
    retry, never "upstream 'one' is ready" (READY while the old session tears down) or "is
    closed: closed" (torn down, the new session not yet in its place)."""
    one = stdio_testserver("one")
    with anyio.fail_after(90):
        async with running(Pool([one], Recorder())) as pool:
            await pool.wait_settled(30)
            messages: list[str] = []
            async with anyio.create_task_group() as tg:
                done = anyio.Event()

                async def reload() -> None:
                    await pool.reconcile([replace(one, args=[*one.args, "--tools", "2"])])
                    done.set()

                tg.start_soon(reload)
                for _ in range(1_000_000):  # bounded: ends with the reconcile (its teardown is bounded)
                    if done.is_set():
                        break
                    try:
                        await pool_call(pool, "one", "echo", {"message": "x"})
                    except UpstreamUnavailable as exc:
                        messages.append(str(exc))
                    await anyio.sleep(0)
            await wait_status(pool, "one", lambda s: s.state is READY)  # the new session, before the pool closes
            assert not [m for m in messages if m.endswith((" is ready", " is closed: closed"))], sorted(set(messages))
            assert any("closing its session" in m and "retry" in m for m in messages), sorted(set(messages))


async def test_local_upstreams_take_turns_and_a_slow_turn_holds_the_others_back_only_briefly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Local upstreams list and convert one at a time (listing.LISTING_GATE). Here "slow"'s
    conversion holds its turn until "quick" is READY, and "quick" converts only once "slow"
    has begun: only a turn that stops holding the others back after `hold_s` lets both
    connect (with no bound they would wait for each other until the test's deadline)."""
    from toolatlas.upstream import listing

    real = listing.records
    slow_started, slow_release = anyio.Event(), anyio.Event()
    token = anyio.lowlevel.current_token()

    def records(up: Any, tools: Any) -> Any:
        # in the worker thread the conversion runs in. Whichever lists first, the other can
        # convert only by going alongside a turn that outlasted the hold
        if up.name == "slow":
            anyio.from_thread.run_sync(slow_started.set, token=token)
            anyio.from_thread.run(slow_release.wait, token=token)
        else:
            anyio.from_thread.run(slow_started.wait, token=token)
        return real(up, tools)

    monkeypatch.setattr(listing, "records", records)
    monkeypatch.setattr(listing.LISTING_GATE, "hold_s", 1.0)
    slow, quick = stdio_testserver("slow"), stdio_testserver("quick")
    rec = Recorder()
    with anyio.fail_after(60):
        async with running(Pool([slow, quick], rec, backoff=no_backoff)) as pool:
            await slow_started.wait()
            while (st := pool.get("quick")) is None or st.state is not READY:
                await anyio.sleep(0.05)
            assert (s := pool.get("slow")) is not None and s.state is not READY  # still in its turn
            slow_release.set()
            await pool.wait_settled(30)
            assert (s := pool.get("slow")) is not None and s.state is READY and "echo" in rec.latest["slow"]


@pytest.mark.parametrize("raw", [True, False], ids=["relay", "sdk"])
async def test_progress_moves_a_call_timeout_on_up_to_call_max(raw: bool) -> None:
    """MCP lets a client reset a request's timeout on each progress notification and asks it
    to enforce a maximum. A call that reported progress every half second was cut at
    timeouts.call (3 s here) though the upstream was plainly working; it now runs 3 s past
    its last progress, and never past call_max. Without progress the cut is as before.
    (Margins are wide: progress every 0.5 s against a 3 s span.)"""
    from toolatlas.calls import UpstreamCall

    async def call(tool: str, arguments: dict[str, Any]) -> str:
        reply = await pool.call_tool(UpstreamCall(server="t", tool=tool, arguments=arguments, raw=raw))
        payload = reply.payload if isinstance(reply.payload, dict) else reply.payload.model_dump()  # the relay's is wire form
        return str(payload["content"][0]["text"])

    up = replace(stdio_testserver("t"), timeouts=Timeouts(connect=30.0, list_tools=20.0, call=3.0, call_max=7.0))
    async with running(Pool([up], Recorder())) as pool:
        await wait_status(pool, "t", lambda s: s.state is READY, 60)
        # 12 progress notifications 0.5 s apart: 6 s in all, past `call` but inside call_max
        assert await call("progress", {"steps": 12, "interval": 0.5}) == "done"
        # 40 of them: 20 s, past call_max
        with pytest.raises(UpstreamTimeout) as cut:
            await call("progress", {"steps": 40, "interval": 0.5})
        assert "did not answer tools/call progress within" in str(cut.value) and cut.value.seconds >= 6.5
        # no progress: the first span is the limit
        with pytest.raises(UpstreamTimeout) as silent:
            await call("sleep", {"seconds": 6})
        assert silent.value.seconds == 3.0
        assert await call("echo", {"message": "after"}) == "Echo: after"
