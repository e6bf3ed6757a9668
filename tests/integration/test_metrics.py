"""Metrics: exposition parsed back, scrape-time state gauges, the HTTP listener, promtool."""

from __future__ import annotations

import enum
import importlib.util
import shutil
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import anyio
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from toolatlas.metrics import SEARCH_BUCKETS, Metrics, MetricsBindError, StateSnapshot


def _families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _fed() -> tuple[Metrics, list[StateSnapshot]]:
    m = Metrics()
    m.observe_search(0.004, mode="hybrid", cache_hit=False, results=5)
    m.observe_search(0.0002, mode="hybrid", cache_hit=True, results=5)
    m.observe_search(0.03, mode="bm25", cache_hit=False, results=0)
    m.observe_execute(0.012, upstream="files", outcome="ok")
    m.observe_execute(60.0, upstream="files", outcome="timeout")
    m.observe_execute(0.0001, upstream="", outcome="bad_input")
    m.observe_upstream_call(0.002, upstream="files", operation="call_tool")
    m.count_error("UpstreamTimeout")
    m.count_fallback("bm25-only")
    m.count_reconnect("files")
    m.count_list_changed("everything")
    m.count_reindex()
    m.count_embeddings(40)
    snaps = [
        StateSnapshot(
            upstreams=[("files", "ready", 14), ("everything", "degraded", 0)],
            index_size=14, index_version=7, clients=2, quarantined=1,
        )
    ]
    m.set_state_source(lambda: snaps[0])
    return m, snaps


def test_exposition_has_every_family_and_bounded_labels() -> None:
    m, _ = _fed()
    body, ctype = m.expose()
    assert ctype.startswith("text/plain")
    text = body.decode()
    fams = _families(text)
    expected_types = {
        "toolatlas_search_latency_seconds": "histogram",
        "toolatlas_execute_latency_seconds": "histogram",
        "toolatlas_upstream_call_latency_seconds": "histogram",
        "toolatlas_search_results": "histogram",
        "toolatlas_searches": "counter",
        "toolatlas_calls": "counter",
        "toolatlas_errors": "counter",
        "toolatlas_fallbacks": "counter",
        "toolatlas_search_cache_hits": "counter",
        "toolatlas_search_cache_misses": "counter",
        "toolatlas_upstream_reconnects": "counter",
        "toolatlas_upstream_list_changed": "counter",
        "toolatlas_reindexes": "counter",
        "toolatlas_embeddings_computed": "counter",
        "toolatlas_upstream_state": "gauge",
        "toolatlas_upstream_tools": "gauge",
        "toolatlas_index_tools": "gauge",
        "toolatlas_index_version": "gauge",
        "toolatlas_connected_clients": "gauge",
        "toolatlas_quarantined_tools": "gauge",
        "toolatlas_build_info": "gauge",
    }
    for name, typ in expected_types.items():
        assert name in fams, name
        assert fams[name].type == typ, name  # type: ignore[attr-defined]

    s = _samples(text)
    assert s[("toolatlas_search_latency_seconds_count", (("cache", "miss"), ("mode", "hybrid")))] == 1
    assert s[("toolatlas_search_latency_seconds_count", (("cache", "hit"), ("mode", "hybrid")))] == 1
    assert s[("toolatlas_search_latency_seconds_bucket", (("cache", "miss"), ("le", "0.005"), ("mode", "hybrid")))] == 1
    assert s[("toolatlas_search_latency_seconds_bucket", (("cache", "miss"), ("le", "0.0025"), ("mode", "hybrid")))] == 0
    assert s[("toolatlas_searches_total", (("mode", "hybrid"),))] == 2
    assert s[("toolatlas_search_cache_hits_total", ())] == 1
    assert s[("toolatlas_search_cache_misses_total", ())] == 2
    assert s[("toolatlas_search_results_bucket", (("le", "0.0"), ("mode", "bm25")))] == 1
    assert s[("toolatlas_execute_latency_seconds_count", (("outcome", "timeout"), ("upstream", "files")))] == 1
    assert s[("toolatlas_calls_total", (("outcome", "ok"), ("upstream", "files")))] == 1
    assert s[("toolatlas_calls_total", (("outcome", "bad_input"), ("upstream", "none")))] == 1
    assert s[("toolatlas_upstream_call_latency_seconds_count", (("operation", "call_tool"), ("upstream", "files")))] == 1
    assert s[("toolatlas_errors_total", (("type", "UpstreamTimeout"),))] == 1
    assert s[("toolatlas_fallbacks_total", (("kind", "bm25-only"),))] == 1
    assert s[("toolatlas_upstream_reconnects_total", (("upstream", "files"),))] == 1
    assert s[("toolatlas_upstream_list_changed_total", (("upstream", "everything"),))] == 1
    assert s[("toolatlas_reindexes_total", ())] == 1
    assert s[("toolatlas_embeddings_computed_total", ())] == 40

    # One series per upstream x state, exactly one of them 1.
    state = {k[1]: v for k, v in s.items() if k[0] == "toolatlas_upstream_state"}
    assert state[(("state", "ready"), ("upstream", "files"))] == 1
    assert state[(("state", "degraded"), ("upstream", "everything"))] == 1
    for up in ("files", "everything"):
        assert sum(v for lab, v in state.items() if ("upstream", up) in lab) == 1
        assert len([lab for lab in state if ("upstream", up) in lab]) >= 5
    assert s[("toolatlas_upstream_tools", (("upstream", "files"),))] == 14
    assert s[("toolatlas_index_tools", ())] == 14
    assert s[("toolatlas_index_version", ())] == 7
    assert s[("toolatlas_connected_clients", ())] == 2
    assert s[("toolatlas_quarantined_tools", ())] == 1

    # No label anywhere holds something other than a bounded identifier.
    labels = {k for key in s for k in key[1]}
    assert {name for name, _ in labels} <= {"mode", "cache", "upstream", "outcome", "operation",
                                             "type", "kind", "state", "le", "version"}


def test_state_gauges_are_computed_at_scrape_time() -> None:
    m, snaps = _fed()
    snaps[0] = StateSnapshot(upstreams=[("files", "connecting", 0)], index_size=0,
                             index_version=8, clients=0, quarantined=0)
    s = _samples(m.expose()[0].decode())
    assert s[("toolatlas_upstream_state", (("state", "connecting"), ("upstream", "files")))] == 1
    assert s[("toolatlas_upstream_state", (("state", "ready"), ("upstream", "files")))] == 0
    assert ("toolatlas_upstream_tools", (("upstream", "everything"),)) not in s
    assert s[("toolatlas_index_version", ())] == 8

    # A state outside the defaults is exported, and stays exported (as 0) afterwards.
    snaps[0] = StateSnapshot(upstreams=[("files", "draining", 3)])
    s = _samples(m.expose()[0].decode())
    assert s[("toolatlas_upstream_state", (("state", "draining"), ("upstream", "files")))] == 1
    snaps[0] = StateSnapshot(upstreams=[("files", "ready", 3)])
    s = _samples(m.expose()[0].decode())
    assert s[("toolatlas_upstream_state", (("state", "draining"), ("upstream", "files")))] == 0

    # The upstream package's enum can be passed as is.
    class UpstreamState(enum.Enum):
        DEGRADED = "degraded"

    snaps[0] = StateSnapshot(upstreams=[("files", UpstreamState.DEGRADED, 0)])  # type: ignore[list-item]
    s = _samples(m.expose()[0].decode())
    assert s[("toolatlas_upstream_state", (("state", "degraded"), ("upstream", "files")))] == 1


def test_broken_state_source_does_not_break_the_scrape(caplog: pytest.LogCaptureFixture) -> None:
    m = Metrics()
    m.count_reindex()

    def boom() -> StateSnapshot:
        raise RuntimeError("pool is gone")

    m.set_state_source(boom)
    s = _samples(m.expose()[0].decode())
    assert s[("toolatlas_reindexes_total", ())] == 1
    assert ("toolatlas_index_version", ()) not in s
    assert "state source failed" in caplog.text


def test_unbounded_label_values_are_refused() -> None:
    m = Metrics()
    with pytest.raises(ValueError, match="outcome"):
        m.observe_execute(0.1, upstream="files", outcome="weird")
    with pytest.raises(ValueError, match="fallback kind"):
        m.count_fallback("because")
    with pytest.raises(ValueError, match="not a short identifier"):
        m.count_error("find me a tool that sends email to bob@example.com")
    with pytest.raises(ValueError, match="not a short identifier"):
        m.observe_search(0.1, mode="hybrid search please", cache_hit=False, results=1)
    with pytest.raises(ValueError, match="negative"):
        m.count_embeddings(-1)


def test_registries_are_private_or_injected() -> None:
    a, b = Metrics(), Metrics()  # two private registries: no duplicate-timeseries error
    a.count_reindex()
    assert "toolatlas_reindexes_total 0.0" in b.expose()[0].decode()
    reg = CollectorRegistry()
    c = Metrics(reg)
    assert c.registry is reg
    with pytest.raises(ValueError, match="Duplicated"):
        Metrics(reg)


def test_openmetrics_negotiation() -> None:
    m, _ = _fed()
    body, ctype = m.expose("application/openmetrics-text; version=1.0.0")
    assert ctype.startswith("application/openmetrics-text")
    assert body.decode().rstrip().endswith("# EOF")


def _get(url: str, accept: str = "") -> tuple[int, str, str]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.headers["Content-Type"], exc.read().decode()


async def test_serve_over_http_and_stop_on_cancel() -> None:
    m, _ = _fed()
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            host, port = await tg.start(m.serve, "127.0.0.1", 0)
            assert host == "127.0.0.1" and port > 0
            assert m.bound_address == (host, port)
            base = f"http://127.0.0.1:{port}"
            status, ctype, text = await anyio.to_thread.run_sync(_get, base + "/metrics")
            assert status == 200 and ctype.startswith("text/plain")
            s = _samples(text)
            assert s[("toolatlas_search_latency_seconds_count", (("cache", "miss"), ("mode", "hybrid")))] == 1

            # Live: an observation after the first scrape shows up in the next one.
            m.observe_search(0.001, mode="hybrid", cache_hit=False, results=3)
            _, _, text = await anyio.to_thread.run_sync(_get, base + "/metrics")
            assert _samples(text)[("toolatlas_searches_total", (("mode", "hybrid"),))] == 3

            status, ctype, text = await anyio.to_thread.run_sync(
                _get, base + "/metrics", "application/openmetrics-text; version=1.0.0"
            )
            assert status == 200 and ctype.startswith("application/openmetrics-text")
            assert (await anyio.to_thread.run_sync(_get, base + "/nope"))[0] == 404

            # A client that connects and sends garbage, or nothing, does not stop the listener.
            async with await anyio.connect_tcp("127.0.0.1", port) as junk:
                await junk.send(b"\x00\x01garbage\r\n\r\n")
                reply = await junk.receive()
                assert reply.startswith(b"HTTP/1.1 400")
            assert (await anyio.to_thread.run_sync(_get, base + "/metrics"))[0] == 200
            tg.cancel_scope.cancel()
    assert m.bound_address is None
    # The listener is closed at shutdown: the port can be listened on again (SO_REUSEADDR
    # only skips the TIME_WAIT leftovers of served connections, never a live listener).
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))
        again.listen()


async def test_bind_error_names_the_address() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        m = Metrics()
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                with pytest.raises(MetricsBindError, match=rf"127\.0\.0\.1:{port}"):
                    await tg.start(m.serve, "127.0.0.1", port)


def test_promtool_check_metrics() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian: apt-get install -y prometheus)")
    m, _ = _fed()
    body, _ = m.expose()
    proc = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    # promtool really lints: a counter without _total is reported.
    bad = b"# HELP foo_requests x\n# TYPE foo_requests counter\nfoo_requests 1\n"
    proc = subprocess.run([promtool, "check", "metrics"], input=bad, capture_output=True, timeout=60)
    assert proc.returncode != 0


@pytest.mark.slow
async def test_real_prometheus_scrapes_and_returns_the_search_histogram() -> None:
    """Debian's prometheus scrapes Metrics.serve on loopback; its query API has the histogram."""
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not installed (Debian: apt-get install -y prometheus)")
    path = Path(__file__).resolve().parents[2] / "bench" / "prometheus_scrape.py"
    spec = importlib.util.spec_from_file_location("prometheus_scrape", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    m, _ = _fed()
    with anyio.fail_after(90):
        async with anyio.create_task_group() as tg:
            host, port = await tg.start(m.serve, "127.0.0.1", 0)
            out = await anyio.to_thread.run_sync(
                lambda: bench.scrape_with_prometheus(f"{host}:{port}", timeout=60)
            )
            tg.cancel_scope.cancel()
    assert out["target_health"] == "up"
    assert out["searches_by_mode_cache"] == {"hybrid/miss": 1.0, "hybrid/hit": 1.0, "bm25/miss": 1.0}
    # 12 buckets + Inf for each of the three (mode, cache) series.
    assert out["bucket_series"] == 3 * (len(SEARCH_BUCKETS) + 1)
    assert 2.5 <= out["quantiles_from_promql"]["hybrid/miss"]["p50_ms"] <= 5.0
    assert "toolatlas_upstream_state" in out["families_stored"]
