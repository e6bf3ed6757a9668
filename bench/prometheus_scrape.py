"""A real Prometheus scrapes toolatlas metrics; its query API returns the search-latency histogram.

Starts Debian's `prometheus` (apt-get install -y prometheus) on a free loopback port with a
generated config that scrapes one target every second, waits until the target is up and
scraped, then queries the HTTP API and prints one JSON object: the target's health, the
`toolatlas_search_latency_seconds` series Prometheus stored, and p50/p95 per (mode, cache)
computed by PromQL `histogram_quantile`. Prometheus and its data folder are removed at exit.

Run (from the repo root):

    # standalone: a Metrics().serve() on 127.0.0.1:<free port>, fed with synthetic searches
    .venv/bin/python bench/prometheus_scrape.py

    # against a running daemon ([daemon] metrics_addr in its config, e.g. conf/example.toml)
    .venv/bin/python bench/prometheus_scrape.py --target 127.0.0.1:9464

Exit status 0 when Prometheus scraped the target and returned the histogram, 1 otherwise
(the JSON then says what was missing). A daemon must have served at least one tool_search
for the histogram to have series.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "daemon"))

HISTOGRAM = "toolatlas_search_latency_seconds"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def api(base: str, path: str, **params: str) -> Any:
    url = f"{base}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = json.loads(resp.read())
    if body.get("status") != "success":
        raise RuntimeError(f"{url}: {body}")
    return body["data"]


def wait_ready(base: str, proc: subprocess.Popen[bytes], deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError("prometheus did not become ready")


def wait_scraped(base: str, target: str, deadline: float) -> dict[str, Any]:
    """The active target once it has been scraped successfully (and its histogram is queryable)."""
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        for t in api(base, "/api/v1/targets")["activeTargets"]:
            if t["scrapeUrl"].startswith(f"http://{target}/"):
                last = t
        if last.get("health") == "up" and api(base, "/api/v1/query", query=f"{HISTOGRAM}_count")["result"]:
            return last
        time.sleep(0.25)
    raise TimeoutError(f"prometheus did not scrape {target} with {HISTOGRAM} in time (target: {last})")


def scrape_with_prometheus(target: str, *, timeout: float = 60.0, prometheus: str = "prometheus") -> dict[str, Any]:
    """Run Prometheus against `target` (HOST:PORT serving /metrics) and query the histogram."""
    binary = shutil.which(prometheus)
    if binary is None:
        raise FileNotFoundError("prometheus is not installed (Debian: apt-get install -y prometheus)")
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    with tempfile.TemporaryDirectory(prefix="toolatlas-prom-") as tmp:
        cfg = Path(tmp) / "prometheus.yml"
        cfg.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: toolatlas\n    metrics_path: /metrics\n"
            f"    static_configs:\n      - targets: ['{target}']\n"
        )
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        log = (Path(tmp) / "prometheus.log").open("wb")
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [binary, f"--config.file={cfg}", f"--storage.tsdb.path={tmp}/data",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            deadline = t0 + timeout
            wait_ready(base, proc, deadline)
            ready_s = time.monotonic() - t0
            tgt = wait_scraped(base, target, deadline)
            scraped_s = time.monotonic() - t0
            series = api(base, "/api/v1/series", **{"match[]": f"{HISTOGRAM}_bucket"})
            counts = api(base, "/api/v1/query", query=f"{HISTOGRAM}_count")["result"]
            quantiles = {}
            for q in (0.5, 0.95):
                expr = f"histogram_quantile({q}, sum by (le, mode, cache) ({HISTOGRAM}_bucket))"
                for r in api(base, "/api/v1/query", query=expr)["result"]:
                    key = f"{r['metric'].get('mode')}/{r['metric'].get('cache')}"
                    quantiles.setdefault(key, {})[f"p{int(q * 100)}_ms"] = round(float(r["value"][1]) * 1000, 3)
            families = sorted({s["__name__"] for s in api(base, "/api/v1/series", **{"match[]": '{job="toolatlas"}'})})
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
    return {
        "prometheus": version.stdout.splitlines()[0] if version.stdout else binary,
        "target": target,
        "target_health": tgt.get("health"),
        "last_scrape_duration_s": tgt.get("lastScrapeDuration"),
        "seconds_to_ready": round(ready_s, 2),
        "seconds_to_first_scrape": round(scraped_s, 2),
        "histogram": HISTOGRAM,
        "bucket_series": len(series),
        "searches_by_mode_cache": {
            f"{r['metric'].get('mode')}/{r['metric'].get('cache')}": float(r["value"][1]) for r in counts
        },
        "quantiles_from_promql": quantiles,
        "families_stored": families,
    }


def standalone(n: int, timeout: float) -> dict[str, Any]:
    """Serve a fresh `Metrics` on a free loopback port, feed it, and have Prometheus scrape it."""
    import anyio

    from toolatlas.metrics import Metrics, StateSnapshot

    metrics = Metrics()
    rnd = random.Random(5)
    for _ in range(n):
        hit = rnd.random() < 0.3
        mode = rnd.choice(["hybrid", "hybrid", "bm25"])
        seconds = rnd.uniform(0.0001, 0.0005) if hit else rnd.lognormvariate(-5.5, 0.6)
        metrics.observe_search(seconds, mode=mode, cache_hit=hit, results=5)
    metrics.observe_execute(0.004, upstream="files", outcome="ok")
    metrics.set_state_source(lambda: StateSnapshot([("files", "ready", 14)], 14, 1, 1, 0))
    result: dict[str, Any] = {}

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            host, port = await tg.start(metrics.serve, "127.0.0.1", 0)
            result.update(await anyio.to_thread.run_sync(
                lambda: scrape_with_prometheus(f"{host}:{port}", timeout=timeout)))
            tg.cancel_scope.cancel()

    anyio.run(main)
    result["observed_searches"] = n
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", help="HOST:PORT of a running daemon's metrics; default: a standalone Metrics")
    ap.add_argument("--searches", type=int, default=200, help="synthetic searches in standalone mode")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the first scrape")
    args = ap.parse_args(argv)
    try:
        out = scrape_with_prometheus(args.target, timeout=args.timeout) if args.target else standalone(args.searches, args.timeout)
        ok = bool(out["bucket_series"]) and out["target_health"] == "up"
    except (OSError, RuntimeError, TimeoutError) as exc:
        out, ok = {"error": f"{type(exc).__name__}: {exc}"}, False
    print(json.dumps({"bench": "prometheus_scrape", "ok": ok, **out}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
