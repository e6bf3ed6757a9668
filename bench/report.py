"""The benchmark report: run every bench script, then write bench/REPORT.md and its PNG plots.

    .venv/bin/python bench/report.py                 # run every bench, then render (also: make bench)
    .venv/bin/python bench/report.py --quick         # the same with smaller sample counts
    .venv/bin/python bench/report.py --from-json     # render from bench/out/*.json, run nothing
    .venv/bin/python bench/report.py --only tokens,startup   # run these benches, render everything

Each bench runs as its own process (`sys.executable bench/NAME.py ...`, from the repo root).
Its JSON lands in bench/out/NAME.json (scripts that only print JSON get their stdout saved
there), and bench/out/report_runs.json records how each was run: the command, UTC start,
wall seconds, exit status, load averages before and after, and the machine. The report is
rendered only from those files: no figure in it is typed in here. The only constants are the
goals from the issues and the published reference points of other systems (Cartograph,
SCOUT), which the report labels as theirs. A bench that failed, or whose JSON is missing,
shows as "not measured: <error>".

Plots (matplotlib, Agg) go to bench/report/*.png; REPORT.md links them relatively.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
OUT = BENCH / "out"
PLOTS = BENCH / "report"
REPORT = BENCH / "REPORT.md"
RUNS = OUT / "report_runs.json"
# A bench is marked noisy when the 1-minute load average before it started exceeded this on
# 2 cores (its own processes add about 1-2 while it runs, so "after" is not a fair measure).
NOISY_LOAD = 3.0

# Published reference points of other systems (their numbers, from their papers/READMEs),
# shown next to ours and labelled as theirs. Nothing of ours is hard-coded.
REFERENCES = {
    "cartograph_tokens": {"who": "Cartograph (published)", "full": 42450, "meta": 475},
    "scout_tokens": {"who": "SCOUT (published)", "full": 140200, "meta": 1300},
    "cartograph_oneshot_ms": {"who": "Cartograph one-shot (published)", "median_ms": 676},
}


# -- the benches -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Bench:
    name: str                      # bench/out/NAME.json
    script: str                    # bench/SCRIPT
    measures: str
    full: tuple[str, ...] = ()
    quick: tuple[str, ...] = ()
    stdout_json: bool = False      # the script prints JSON but does not write bench/out/NAME.json
    timeout: float = 1800
    setup: str | None = None       # a context that adds arguments (see SETUPS)
    optional: bool = False         # run only if the script exists (being written by someone else)
    extra_notes: tuple[str, ...] = field(default=())


# Run order: cheap and acceptance-critical first, the long quality runs last.
BENCHES: tuple[Bench, ...] = (
    Bench("tokens", "tokens.py", "tokens of the full tools/list vs the three meta-tools, and of a top-5 tool_search "
          "result, at 374 and 2,000 tools (benchdata catalogs replicated)",
          full=("--tools", "374", "--tools", "2000"), quick=("--tools", "374", "--tools", "2000"), stdout_json=True, timeout=300),
    Bench("tokens_example", "tokens.py", "the same token figures for the live upstreams of conf/example.toml "
          "(its SSE and HTTP example servers started on free loopback ports)",
          stdout_json=True, timeout=300, setup="example_config"),
    Bench("startup", "startup.py", "daemon cold start and warm restart with 2,000 tools, RSS, tool_search "
          "latency end to end over the Unix socket",
          full=(), quick=("--restarts", "1", "--queries", "100"), timeout=3600),
    Bench("call_overhead", "call_overhead.py", "execute_tool: direct warm SDK session vs gateway socket vs shim vs "
          "a fresh session per call (one-shot)",
          full=("--calls", "200", "--oneshot-calls", "50"), quick=("--calls", "50", "--oneshot-calls", "10"), timeout=1800),
    Bench("shim_start", "shim_start.py", "`toolatlas shim` spawn to first byte relayed",
          full=("--runs", "30"), quick=("--runs", "10"), timeout=600),
    Bench("catalog_freshness", "catalog_freshness.py", "upstream tools/list_changed to the new tool ranked first by tool_search",
          full=("--rounds", "20"), quick=("--rounds", "5"), timeout=900),
    Bench("cards_sign", "cards_sign.py", "capability card sign and verify for a 50-tool server",
          full=(), quick=("--repeat", "50"), timeout=600),
    Bench("prometheus_scrape", "prometheus_scrape.py", "a real Prometheus scrapes the metrics endpoint and returns "
          "the search-latency histogram (standalone: synthetic observations)",
          stdout_json=True, timeout=300),
    Bench("search_latency", "search_latency.py", "tool_search latency through the daemon's Unix socket against catalog "
          "size (500 to 100,000 tools): cache misses, hits, one-upstream scope; the same in process; engine cold indexing and restart",
          full=(), quick=("--quick", "--skip-cold"), timeout=5400),
    Bench("rift_report", "rift_report.py", "Rift confusable clusters by risk on the dev sets, full CLI wall time",
          full=(), quick=("--sets", "mcptoolbenchpp"), timeout=1800),
    Bench("eval_report", "eval_report.py", "retrieval quality on the dev sets for every mode, the RRF baseline, "
          "and the default ranker per embedder runtime (same code as `toolatlas eval`)",
          full=("--embedders", "onnx,onnx-int8,onnx-fp32,torch"), quick=("--embedders", ""), timeout=3600),
    Bench("load", "load.py", "concurrent clients (1, 10, 100) against the daemon: throughput, latency, errors, RSS and fds",
          full=("--final-duration", "300"), quick=("--duration", "15"), timeout=2400, optional=True),
)
BY_NAME = {b.name: b for b in BENCHES}


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_gib = 0.0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    return {"cores": os.cpu_count(), "cpu": model, "mem_gib": mem_gib, "python": platform.python_version(),
            "kernel": platform.release()}


def machine_text(m: dict[str, Any]) -> str:
    return f"{m.get('cores')} cores ({m.get('cpu') or 'unknown CPU'}), {m.get('mem_gib')} GiB, Python {m.get('python')}"


@contextlib.contextmanager
def example_config() -> Iterator[tuple[str, ...]]:
    """conf/example.toml with its SSE and HTTP example servers on free loopback ports."""
    sys.path.insert(0, str(REPO))
    from tests.support.servers import start_server

    text = (REPO / "conf" / "example.toml").read_text()
    servers = []
    try:
        weather = start_server("weather", "sse")
        servers.append(weather)
        units = start_server("units", "http")
        servers.append(units)
        with tempfile.TemporaryDirectory(prefix="toolatlas-report-") as tmp:
            text = text.replace("http://127.0.0.1:8931/sse", weather.url).replace("http://127.0.0.1:8932/mcp", units.url)
            text = text.replace('command = "python3"', f'command = "{sys.executable}"')
            text = re.sub(r'(?m)^socket = .*$', f'socket = "{tmp}/toolatlas.sock"', text)
            text = re.sub(r'(?m)^state_dir = .*$', f'state_dir = "{tmp}/state"', text)
            cfg = Path(tmp) / "example.toml"
            cfg.write_text(text)
            yield ("--config", str(cfg))
    finally:
        for s in servers:
            s.stop()


SETUPS: dict[str, Callable[[], contextlib.AbstractContextManager[tuple[str, ...]]]] = {"example_config": example_config}


def display_command(b: Bench, args: tuple[str, ...]) -> str:
    shown = []
    for a in args:
        shown.append("conf/example.toml (ports rewritten)" if a.endswith("example.toml") else a)
    quoted = [f'"{a}"' if (a == "" or " " in a) else a for a in shown]
    return " ".join([".venv/bin/python", f"bench/{b.script}", *quoted])


def last_json(text: str) -> Any:
    """The JSON object a script printed (the whole stdout, else its last `{` ... block)."""
    text = text.strip()
    try:
        return json.loads(text)
    except ValueError:
        pass
    for m in reversed([m.start() for m in re.finditer(r"(?m)^\{", text)]):
        with contextlib.suppress(ValueError):
            return json.loads(text[m:])
    raise ValueError("no JSON object on stdout")


def run_bench(b: Bench, quick: bool) -> dict[str, Any]:
    args = b.quick if quick else b.full
    out_path = OUT / f"{b.name}.json"
    rec: dict[str, Any] = {"started_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                           "quick": quick, "machine": machine(), "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    t0 = time.time()
    err: str | None = None
    rc: int | None = None
    try:
        with SETUPS[b.setup]() if b.setup else contextlib.nullcontext(()) as extra:
            full_args = (*args, *extra)
            rec["command"] = display_command(b, full_args)
            print(f"report: {rec['command']}", file=sys.stderr, flush=True)
            proc = subprocess.run([sys.executable, str(BENCH / b.script), *full_args], cwd=REPO, capture_output=True,
                                  text=True, timeout=b.timeout, check=False)
        rc = proc.returncode
        if b.stdout_json:
            try:
                js = last_json(proc.stdout)
                OUT.mkdir(parents=True, exist_ok=True)
                out_path.write_text(json.dumps(js, indent=2) + "\n")
            except ValueError as exc:
                err = f"exit status {rc}, {exc}"
        fresh = out_path.exists() and out_path.stat().st_mtime >= t0 - 1
        if not fresh and err is None:
            err = f"exit status {rc}, no bench/out/{b.name}.json written"
        tail = [ln for ln in (proc.stderr or "").strip().splitlines() if ln.strip()][-3:]
        if err is not None:
            err = f"{err}: {' | '.join(tail)}" if tail else err
        elif rc != 0:  # JSON written, but the script failed later or reported a missed goal by its exit status
            rec["warning"] = f"exit status {rc}" + (f": {' | '.join(tail)}" if tail else "")
    except subprocess.TimeoutExpired:
        err = f"timed out after {b.timeout:.0f} s"
    except Exception as exc:  # noqa: BLE001 - a failed bench is reported, the others still run
        err = f"{type(exc).__name__}: {exc}"
    rec.update({"seconds": round(time.time() - t0, 1), "exit_status": rc, "error": err,
                "loadavg_after": [round(x, 2) for x in os.getloadavg()]})
    rec.setdefault("command", display_command(b, args))
    print(f"report: {b.name} {'FAILED: ' + err if err else 'ok'} ({rec['seconds']} s)", file=sys.stderr, flush=True)
    return rec


def load_runs() -> dict[str, Any]:
    try:
        return json.loads(RUNS.read_text())
    except (OSError, ValueError):
        return {}


# -- formatting helpers ------------------------------------------------------------------------

def fnum(x: Any, digits: int = 1) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        return f"{x:.{digits}f}"
    return str(x)


def table(head: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    out += ["| " + " | ".join(fnum(c) if not isinstance(c, str) else c for c in r) + " |" for r in rows]
    return out + [""]


class Ctx:
    """What the renderers read: the JSON of each bench and how it was run."""

    def __init__(self, runs: dict[str, Any]) -> None:
        self.runs = runs
        self.data: dict[str, Any] = {}
        self.errors: dict[str, str] = {}
        for b in BENCHES:
            run = runs.get(b.name)
            path = OUT / f"{b.name}.json"
            if run and run.get("error"):
                self.errors[b.name] = run["error"]
                continue
            if not path.exists():
                self.errors[b.name] = (f"bench/out/{b.name}.json is missing (run `{display_command(b, b.full)}`)"
                                       if not b.optional or (BENCH / b.script).exists() else f"bench/{b.script} does not exist yet")
                continue
            try:
                self.data[b.name] = json.loads(path.read_text())
            except ValueError as exc:
                self.errors[b.name] = f"bench/out/{b.name}.json is not JSON: {exc}"

    def measured(self, name: str) -> str:
        """One line: how the figures of bench `name` were measured."""
        b = BY_NAME[name]
        run = self.runs.get(name)
        path = OUT / f"{name}.json"
        if run:
            la_b, la_a = run.get("loadavg_before") or [], run.get("loadavg_after") or []
            load = f"load average {la_b[0] if la_b else '?'} -> {la_a[0] if la_a else '?'}"
            return (f"*Measured:* `{run['command']}` on {machine_text(run.get('machine') or {})}, "
                    f"{run.get('started_utc')}, {run.get('seconds')} s wall, {load}"
                    + (" (**noisy machine**)" if la_b and la_b[0] > NOISY_LOAD else "")
                    + (" (--quick sample counts)" if run.get("quick") else "") + "."
                    + (f" The script ended with {run['warning']}." if run.get("warning") else ""))
        when = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC") if path.exists() else "?"
        own = (self.data.get(name) or {}).get("command")
        cmd = (f"`{own}` (as recorded in its JSON; run by hand, not by report.py)" if isinstance(own, str)
               else f"`{display_command(b, b.full)}` (run by hand, not by report.py: exact arguments unknown)")
        return f"*Measured:* {cmd} on {machine_text(machine())}, JSON written {when}."

    def missing(self, name: str) -> list[str]:
        return [f"**Not measured:** {self.errors.get(name, 'no data')}", ""]


def plot_setup() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    PLOTS.mkdir(parents=True, exist_ok=True)
    return plt


def save(plt: Any, fig: Any, name: str) -> str:
    fig.tight_layout()
    fig.savefig(PLOTS / name, dpi=100)
    plt.close(fig)
    return f"![{name}](report/{name})"


# -- sections ----------------------------------------------------------------------------------

def sec_tokens(c: Ctx) -> list[str]:
    lines = ["## Tokens: full catalog vs the meta-tool surface", ""]
    rows: list[list[Any]] = []
    bars: list[tuple[str, int, int]] = []
    tok = c.data.get("tokens")
    ex = c.data.get("tokens_example")
    tokenizer = (tok or ex or {}).get("tokenizer", "?")
    if ex:
        r = ex["runs"][0]
        up = ", ".join(f"{k} {v}" for k, v in ex.get("upstreams", {}).items())
        label = f"toolatlas, conf/example.toml ({up})"
        if ex.get("unreachable"):
            label += f"; unreachable: {', '.join(ex['unreachable'])}"
        rows.append([label, r["tools"], r["full_catalog_tokens"], r["meta_tools_tokens"], f"{r['reduction'] * 100:.2f}%",
                     fnum(r.get("mean_top5_search_result_tokens"), 0)])
        bars.append(("example config", r["full_catalog_tokens"], r["meta_tools_tokens"]))
    if tok:
        for r in tok["runs"]:
            rows.append([f"toolatlas, benchdata catalog x{r['tools']}", r["tools"], r["full_catalog_tokens"], r["meta_tools_tokens"],
                         f"{r['reduction'] * 100:.2f}%", fnum(r.get("mean_top5_search_result_tokens"), 0)])
            bars.append((f"{r['tools']:,} tools", r["full_catalog_tokens"], r["meta_tools_tokens"]))
    for key in ("cartograph_tokens", "scout_tokens"):
        ref = REFERENCES[key]
        rows.append([f"*{ref['who']}: their figure, their catalog*", "-", ref["full"], ref["meta"],
                     f"*{(1 - ref['meta'] / ref['full']) * 100:.2f}%*", "-"])
        bars.append((ref["who"].replace(" (published)", "\n(theirs)"), ref["full"], ref["meta"]))
    lines += table(["catalog", "tools", "full tools/list tokens", "meta-tools tokens", "reduction", "mean top-5 tool_search result tokens"], rows)
    lines.append(f"Tokens counted with {tokenizer} over the exact JSON a client receives. The Cartograph and SCOUT rows "
                 "are the figures those projects published for their own catalogs and tokenizers, shown for scale only.")
    lines.append("")
    if bars:
        plt = plot_setup()
        fig, ax = plt.subplots(figsize=(8, 4))
        xs = range(len(bars))
        theirs = ["(theirs)" in b[0] for b in bars]
        ax.bar([x - 0.2 for x in xs], [b[1] for b in bars], 0.4, label="full tools/list",
               color=["#b0b0b0" if t else "C0" for t in theirs], hatch=None)
        ax.bar([x + 0.2 for x in xs], [b[2] for b in bars], 0.4, label="meta-tools",
               color=["#606060" if t else "C1" for t in theirs])
        for x, b in zip(xs, bars):
            ax.text(x - 0.2, b[1], f"{b[1]:,}", ha="center", va="bottom", fontsize=7)
            ax.text(x + 0.2, b[2], f"{b[2]:,}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(list(xs), [b[0] for b in bars], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("tokens")
        ax.set_title("Tool definitions sent to the model (grey: published figures of other systems)")
        ax.legend()
        ax.grid(True, axis="y", which="both", alpha=0.3)
        lines += [save(plt, fig, "tokens.png"), ""]
    for name in ("tokens_example", "tokens"):
        lines += [c.measured(name) if name in c.data else f"**Not measured ({name}):** {c.errors.get(name)}", ""]
    return lines


MODE_ORDER = ("keyword", "bm25", "dense", "hybrid", "two-stage")


def sec_retrieval(c: Ctx) -> list[str]:
    lines = ["## Retrieval quality on the dev sets", ""]
    ev = c.data.get("eval_report")
    if not ev:
        return lines + c.missing("eval_report")
    lines += ["Same ranking code as `toolatlas eval` and the daemon. ToolLens is scored on its test queries "
              "(tuning used `queries-train.jsonl` only); binary relevance; each figure is a mean over queries.", ""]
    plt = plot_setup()
    sets = list(ev["sets"].items())
    fig, axes = plt.subplots(1, len(sets), figsize=(5 * len(sets), 3.8), squeeze=False)
    for ax, (ds, e) in zip(axes[0], sets):
        modes = e["modes"]
        ks = sorted({int(k.split("@")[1]) for m in modes.values() for k in m if k.startswith("recall@")})
        lines += [f"### {ds}: {e['tools']} tools, {e['queries']} queries", ""]
        head = ["mode", *[f"recall@{k}" for k in ks], *[f"nDCG@{k}" for k in ks], "MRR", "p50 ms", "p95 ms"]
        rows = []
        order = [m for m in MODE_ORDER if m in modes] + [m for m in modes if m not in MODE_ORDER]
        for m in order:
            r = modes[m]
            rows.append([f"**{m}** (default)" if m == "hybrid" else m, *[fnum(r.get(f"recall@{k}"), 3) for k in ks],
                         *[fnum(r.get(f"ndcg@{k}"), 3) for k in ks], fnum(r.get("mrr"), 3), fnum(r.get("p50_ms"), 2), fnum(r.get("p95_ms"), 2)])
        if "rrf_baseline" in e:
            r = e["rrf_baseline"]
            rows.append(["plain RRF k=60 (baseline)", *["" if k != 5 else fnum(r.get("recall@5"), 3) for k in ks],
                         *["" if k != 5 else fnum(r.get("ndcg@5"), 3) for k in ks], fnum(r.get("mrr"), 3),
                         fnum(r.get("p50_ms"), 2), fnum(r.get("p95_ms"), 2)])
        lines += table(head, rows)
        lines += [f"Command for one set: `{e.get('modes_command', '?')}`. Latencies are in-process ranking (query embedding included).", ""]
        if e.get("embedders"):
            erows = []
            for kind, v in e["embedders"].items():
                erows.append([kind, v.get("name", "?"), fnum(v["hybrid"].get("recall@5"), 3), fnum(v["hybrid"].get("ndcg@5"), 3),
                              fnum(v["dense"].get("ndcg@5"), 3), fnum(e.get("ndcg5_delta_vs_torch", {}).get(kind), 4)])
            lines += ["Embedder runtimes (hybrid and dense; the rule: default within 0.005 nDCG@5 of torch):", ""]
            lines += table(["runtime", "model", "hybrid recall@5", "hybrid nDCG@5", "dense nDCG@5", "hybrid nDCG@5 - torch"], erows)
        xs = range(len(order))
        ax.bar([x - 0.2 for x in xs], [modes[m].get("recall@5", 0) for m in order], 0.4, label="recall@5")
        ax.bar([x + 0.2 for x in xs], [modes[m].get("ndcg@5", 0) for m in order], 0.4, label="nDCG@5")
        ax.set_xticks(list(xs), order, fontsize=8)
        for x, m in zip(xs, order):
            ax.text(x - 0.2, modes[m].get("recall@5", 0), f"{modes[m].get('recall@5', 0):.3f}", ha="center", va="bottom", fontsize=6)
            ax.text(x + 0.2, modes[m].get("ndcg@5", 0), f"{modes[m].get('ndcg@5', 0):.3f}", ha="center", va="bottom", fontsize=6)
        ax.set_ylim(0, 1.15)
        ax.set_title(f"{ds} ({e['queries']} queries)")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", ncol=2)
    lines += [save(plt, fig, "retrieval.png"), "", c.measured("eval_report"), ""]
    return lines


def sec_latency(c: Ctx) -> list[str]:
    lines = ["## Search latency against catalog size", ""]
    sl = c.data.get("search_latency")
    st = c.data.get("startup")
    if sl and "socket" in sl:
        so = sl["socket"]
        sizes = sorted(so["sizes"], key=int)
        rows = []
        for size in sizes:
            r = so["sizes"][size]
            nar = r.get("narrow_scope_miss") or {}
            rows.append([int(size), r.get("upstreams"), r.get("vectors", "?"), r.get("embeddings_computed"),
                         fnum(r.get("start_to_indexed_s"), 1), fnum(r["miss"]["p50_ms"], 2), fnum(r["miss"]["p95_ms"], 2),
                         fnum(r["miss"]["max_ms"], 1), fnum(r["hit"]["p50_ms"], 2), fnum(r["hit"]["p95_ms"], 2),
                         fnum(nar.get("p50_ms"), 2), fnum(nar.get("p95_ms"), 2), fnum(r.get("daemon_rss_mb"), 0)])
        lines += [f"tool_search end to end through a real daemon's Unix socket ({so['mode']}, top_k={so['top_k']}, "
                  f"{so['queries']} distinct real queries over one connection; {so['client']}):", ""]
        lines += table(["tools", "upstreams", "vectors", "embeddings computed", "start to indexed s", "miss p50 ms",
                        "miss p95 ms", "miss max ms", "hit p50 ms", "hit p95 ms", "one-upstream scope p50 ms",
                        "one-upstream scope p95 ms", "daemon RSS MB"], rows)
        lines += ["miss = a new query (the daemon embeds it, then ranks); hit = the same queries again (result-cache "
                  "hit); one-upstream scope = `servers` naming one upstream, query vector cached. Above 2,000 tools "
                  "the daemon's embedding cache is seeded with synthetic vectors (a base tool's real embedding plus "
                  "noise) and it computes none, as the bench's docstring explains.", ""]
    if sl and "engine" in sl:
        s = sl["engine"]
        sizes = sorted(s["sizes"], key=int)
        rows = []
        for size in sizes:
            r = s["sizes"][size]
            rows.append([int(size), r.get("vectors", "?"), fnum(r.get("index_s"), 1),
                         fnum(r["miss"]["p50_ms"], 2), fnum(r["miss"]["p95_ms"], 2), fnum(r["hit"]["p50_ms"], 3), fnum(r["hit"]["p95_ms"], 3),
                         fnum(r["narrow_scope_miss"]["p50_ms"], 2), fnum(r["narrow_scope_miss"]["p95_ms"], 2),
                         fnum(r.get("ranking_only", {}).get("p50_ms"), 2), fnum(r.get("ranking_only", {}).get("p95_ms"), 2)])
        lines += [f"Where the time goes: `Engine.search` in process, the same sizes and queries ({s['mode']}, "
                  f"top_k={s['top_k']}; servers are varied per copy, so one-server scopes are narrow):", ""]
        lines += table(["tools", "vectors", "index s", "miss p50 ms", "miss p95 ms", "hit p50 ms", "hit p95 ms",
                        "one-server scope p50 ms", "one-server scope p95 ms", "ranking only p50 ms", "ranking only p95 ms"], rows)
        lines += ["ranking only = result-cache miss with the query vector already cached (ranking cost alone).", ""]
    if sl and ("socket" in sl or "engine" in sl):
        plt = plot_setup()
        fig, ax = plt.subplots(figsize=(9, 4.2))
        for section, color, kind, label in (("socket", "C0", "miss", "socket miss"), ("socket", "C2", "hit", "socket cache hit"),
                                            ("engine", "C4", "miss", "in-process miss")):
            if section not in sl:
                continue
            sz = sorted(sl[section]["sizes"], key=int)
            for pct, style, marker in (("p50_ms", "-", "o"), ("p95_ms", "--", "s")):
                ax.plot([int(x) for x in sz], [sl[section]["sizes"][k][kind][pct] for k in sz], style, marker=marker,
                        color=color, label=f"{label} {pct[:3]}")
        for y in (15, 30, 2):
            ax.axhline(y, color="grey", lw=0.7, ls=":")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("catalog size (tools)")
        ax.set_ylabel("latency (ms)")
        ax.set_title("tool_search latency against catalog size (dotted: the goals 2, 15, 30 ms)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
        lines += [save(plt, fig, "search_latency.png"), "", c.measured("search_latency"), ""]
    if not sl or not ("socket" in sl or "engine" in sl):
        lines += c.missing("search_latency")
    if st and st.get("socket_search_latency"):
        sk = st["socket_search_latency"]
        last = st["warm"][-1]
        when = last.get("latency_timed_from_s", last.get("rift_settled_s"))
        rift = last.get("rift_status_before_latency")
        rift_note = ""
        if rift is not None:
            rift_note = ("; the daemon's Rift analysis had finished" if rift.get("available")
                         else f"; the daemon's Rift analysis was not available ({rift.get('reason')})")
        lines += [f"End to end through the daemon's Unix socket ({st['tools']:,} tools, {sk['queries']} distinct ToolLens "
                  f"test queries over one connection, top_k={sk['top_k']}, after a warm restart, timed from "
                  f"{fnum(when, 0)} s after spawn{rift_note}):", ""]
        lines += table(["", "p50 ms", "p95 ms", "max ms", "n"],
                       [[k, fnum(sk[k]["p50_ms"], 2), fnum(sk[k]["p95_ms"], 2), fnum(sk[k]["max_ms"], 2), sk[k]["n"]] for k in ("miss", "hit")])
        lines += [c.measured("startup"), ""]
    return lines


def sec_calls(c: Ctx) -> list[str]:
    lines = ["## Call overhead: execute_tool", ""]
    co = c.data.get("call_overhead")
    if not co:
        return lines + c.missing("call_overhead")
    paths = [("direct warm SDK session (no gateway)", "direct_warm"), ("gateway, Unix socket", "gateway_socket"),
             ("gateway, `toolatlas shim`", "gateway_shim"), ("one-shot: fresh stdio session per call", "oneshot_fresh_session")]
    rows = [[label, co[k]["median_ms"], co[k]["p95_ms"], co[k]["min_ms"], co[k]["n"]] for label, k in paths if k in co]
    ref = REFERENCES["cartograph_oneshot_ms"]
    rows.append([f"*{ref['who']}: their figure, their machine*", f"*{ref['median_ms']}*", "-", "-", "-"])
    lines += [f"Upstream: {co.get('upstream')}.", ""]
    lines += table(["path", "median ms", "p95 ms", "min ms", "calls"],
                   [[r[0], *[fnum(x, 2) if isinstance(x, float) else x for x in r[1:]]] for r in rows])
    lines += [f"Gateway overhead over direct warm (median): socket {fnum(co.get('gateway_overhead_ms'), 2)} ms, "
              f"shim {fnum(co.get('gateway_shim_overhead_ms'), 2)} ms; one-shot / gateway socket = "
              f"{fnum(co.get('oneshot_over_gateway_ratio'), 1)}x.", ""]
    plt = plot_setup()
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    labels = [p[0].replace(": ", ":\n").replace(", ", ",\n") for p in paths if p[1] in co] + ["Cartograph one-shot\n(published, theirs)"]
    vals = [co[p[1]]["median_ms"] for p in paths if p[1] in co] + [ref["median_ms"]]
    colors = ["C0"] * (len(vals) - 1) + ["C7"]
    ax.bar(range(len(vals)), vals, color=colors)
    for i, v in enumerate(vals):
        ax.text(i, v, f"{v:.1f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(vals)), labels, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("median ms per call")
    ax.set_title("execute_tool latency by path")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    lines += [save(plt, fig, "call_overhead.png"), "", c.measured("call_overhead"), ""]
    return lines


def sec_startup(c: Ctx) -> list[str]:
    lines = ["## Cold start, warm restart and memory", ""]
    st = c.data.get("startup")
    if st:
        cold, warm = st["cold"], st["warm"]
        catalog = str(st["catalog"]).replace(str(st["tools"]), f"{st['tools']:,}", 1)
        lines += [f"A real `toolatlas serve` with one stdio upstream listing {catalog}; embedder {st['embedder']}. "
                  "Times from spawning the daemon: the socket answers, `index.ready` (READY), all tools in the engine, "
                  "first tool_search with a match. Cold = empty state_dir (the one-time ONNX export linked in); "
                  f"warm = same state_dir, unchanged catalog ({len(warm)} restart{'s' if len(warm) != 1 else ''}, median).", ""]

        def row(label: str, r: dict[str, Any]) -> list[Any]:
            return [label, fnum(r.get("socket_answers_s"), 2), fnum(r.get("ready_s"), 2), fnum(r.get("indexed_s"), 2),
                    fnum(r.get("first_search_s"), 2), r["index"].get("embeddings_computed"), r["index"].get("snapshot_restored"),
                    fnum(r["memory_mb"].get("VmRSS"), 0), fnum(r["memory_mb"].get("VmHWM"), 0)]

        rows = [row("cold", cold)] + [row(f"warm #{i + 1}", w) for i, w in enumerate(warm)]
        wm = st.get("warm_median", {})
        rows.append(["**warm median**", "", fnum(wm.get("ready_s"), 2), fnum(wm.get("indexed_s"), 2), fnum(wm.get("first_search_s"), 2),
                     f"max {wm.get('embeddings_computed_max')}", "", fnum(wm.get("rss_mb"), 0), ""])
        lines += table(["start", "socket answers s", "READY s", "all indexed s", "first search s", "embeddings computed",
                        "snapshot restored", "daemon RSS MB", "daemon peak RSS MB"], rows)
        early = [label for label, r in [("cold", cold)] + [(f"warm #{i + 1}", w) for i, w in enumerate(warm)]
                 if (r.get("ready_s") or 0) < (r.get("indexed_s") or 0) - 0.5]
        if early:
            lines += [f"In the {', '.join(early)} start the daemon declared READY before all tools were in the engine "
                      "(it stopped waiting for its first reindex); until then searches cover the tools indexed so far.", ""]
        lines += [f"RSS is the daemon process alone (VmRSS from /proc, after 54 searches; the peak column is VmHWM, the "
                  "highest resident size since the daemon started, which for a cold start falls during embedding); "
                  "its upstream child used "
                  f"{fnum(cold.get('upstream_rss_mb'), 0)} MB more. Load average during the run: {st.get('loadavg_start')} -> "
                  f"{st.get('loadavg_end')}.", ""]
        plt = plot_setup()
        fig, ax = plt.subplots(figsize=(7, 3.6))
        labels = ["socket answers", "READY", "all indexed", "first search"]
        keys = ["socket_answers_s", "ready_s", "indexed_s", "first_search_s"]
        xs = range(len(keys))
        ax.bar([x - 0.2 for x in xs], [cold.get(k) or 0 for k in keys], 0.4, label="cold (empty state_dir)")
        from toolatlas.evaluation.metrics import percentile  # the one percentile of every bench figure

        wmed = [percentile([w.get(k) or 0 for w in warm], 50) for k in keys]
        ax.bar([x + 0.2 for x in xs], wmed, 0.4, label="warm restart (median)")
        for x, cv, wv in zip(xs, [cold.get(k) or 0 for k in keys], wmed):
            ax.text(x - 0.2, cv, f"{cv:.1f}", ha="center", va="bottom", fontsize=8)
            ax.text(x + 0.2, wv, f"{wv:.1f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(xs), labels)
        ax.set_ylabel("seconds from spawn")
        ax.set_title(f"Daemon start with {st['tools']:,} tools")
        ax.legend()
        ax.grid(True, axis="y", alpha=0.3)
        lines += [save(plt, fig, "startup.png"), "", c.measured("startup"), ""]
    else:
        lines += c.missing("startup")
    sl = c.data.get("search_latency")
    cr = (sl or {}).get("cold_and_restart")
    if cr:
        cold, rs = cr["cold"], cr["restart"]
        lines += [f"Engine alone, in a fresh process each ({cr['tools']:,} tools, from `bench/search_latency.py`):", ""]
        lines += table(["phase", "embedder load s", "indexed / re-listed s", "first search s", "embeddings computed", "RSS MB", "peak RSS MB"], [
            ["cold", fnum(cold.get("embedder_load_s"), 2), fnum(cold.get("index_s"), 2), "-", cold.get("embeddings_computed"),
             fnum(cold.get("rss_mb"), 0), fnum(cold.get("peak_rss_mb"), 0)],
            ["restart", fnum(rs.get("embedder_load_s"), 2), fnum(rs.get("relist_done_s"), 2), fnum(rs.get("time_to_first_search_s"), 2),
             rs.get("embeddings_computed"), fnum(rs.get("rss_mb"), 0), fnum(rs.get("peak_rss_mb"), 0)],
        ])
        lines += [c.measured("search_latency"), ""]
    return lines


def sec_shim_fresh(c: Ctx) -> list[str]:
    lines = ["## Shim start and catalog freshness", ""]
    rows = []
    sh = c.data.get("shim_start")
    if sh:
        s = sh["spawn_to_first_byte"]
        rows.append(["`toolatlas shim` spawn to first byte relayed", fnum(s["median_ms"], 1), fnum(s["p95_ms"], 1), s["n"],
                     "heavy modules imported: " + (", ".join(sh.get("heavy_modules_imported") or []) or "none")])
    fr = c.data.get("catalog_freshness")
    if fr:
        s = fr["list_changed_to_searchable"]
        rows.append([f"list_changed to searchable ({fr.get('catalog_tools')} tools, {fr.get('embedder')})",
                     fnum(s["median_ms"], 1), fnum(s["p95_ms"], 1), s["n"], ""])
    if rows:
        lines += table(["figure", "median ms", "p95 ms", "n", "note"], rows)
    for name in ("shim_start", "catalog_freshness"):
        lines += [c.measured(name) if name in c.data else f"**Not measured ({name}):** {c.errors.get(name)}", ""]
    return lines


def flatten(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (int, float, str, bool)) or obj is None:
        yield prefix, obj


def sec_load(c: Ctx) -> list[str]:
    lines = ["## Load: concurrent clients", ""]
    ld = c.data.get("load")
    if not ld:
        return lines + c.missing("load")
    if not ld.get("levels"):  # an unexpected shape: show every scalar rather than guess
        rows = [[k, fnum(v, 3) if isinstance(v, float) else v] for k, v in flatten(ld) if not isinstance(v, str) or len(v) < 120]
        return lines + table(["field", "value"], rows[:80]) + [c.measured("load"), ""]
    w = ld.get("workload", {})
    lines += [f"One daemon, {w.get('catalog_tools')} catalog tools ({w.get('embedder')}); each client ({ld.get('client')}) "
              f"runs a closed loop: tool_search with probability {w.get('search_share')}, else execute_tool, then an "
              f"exponential think time with mean {w.get('think_mean_s')} s. Queries: {w.get('queries')}.", ""]
    rows = []
    for r in ld["levels"]:
        se, ex, dm = r["latency"]["search"], r["latency"]["execute"], r["daemon"]
        rows.append([r["clients"], fnum(r["duration_s"], 0), fnum(r["throughput_ops_s"], 1),
                     fnum(se.get("p50_ms"), 1), fnum(se.get("p95_ms"), 1), fnum(se.get("p99_ms"), 1),
                     fnum(ex.get("p50_ms"), 1), fnum(ex.get("p99_ms"), 1), r["errors"],
                     f"{fnum(dm['start']['rss_mb'], 0)} -> {fnum(dm['end']['rss_mb'], 0)}",
                     f"{dm['start']['fds']} -> {dm['end']['fds']}"])
    lines += table(["clients", "s", "ops/s", "search p50 ms", "search p95 ms", "search p99 ms", "execute p50 ms",
                    "execute p99 ms", "errors", "daemon RSS MB", "daemon fds"], rows)
    acc = ld.get("acceptance")
    if acc:
        lines += [f"Acceptance run ({acc.get('run')}): search p99 / 1-client p99 = {fnum(acc.get('p99_search_ratio_vs_1_client'), 2)} "
                  f"(<= 4: {fnum(acc.get('p99_ratio_ok'))}), zero errors: {fnum(acc.get('zero_errors'))}, no fd growth: "
                  f"{fnum(acc.get('no_fd_growth'))}, no RSS growth: {fnum(acc.get('no_rss_growth'))}.", ""]
    plt = plot_setup()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    first = {}
    for r in ld["levels"]:
        first.setdefault(r["clients"], r)
    ns = sorted(first)
    for pctl, style in (("p50_ms", "-o"), ("p95_ms", "--s"), ("p99_ms", ":^")):
        ax.plot(ns, [first[n]["latency"]["search"].get(pctl) for n in ns], style, color="C0", label=f"search {pctl[:3]}")
        ax.plot(ns, [first[n]["latency"]["execute"].get(pctl) for n in ns], style, color="C1", label=f"execute {pctl[:3]}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("latency (ms)")
    ax2 = ax.twinx()
    ax2.bar(ns, [first[n]["throughput_ops_s"] for n in ns], width=[n * 0.3 for n in ns], alpha=0.2, color="grey")
    ax2.set_ylabel("ops/s (grey bars)")
    ax.set_zorder(ax2.get_zorder() + 1)  # lines over the bars
    ax.patch.set_visible(False)
    ax.set_title("Latency and throughput against concurrent clients")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    lines += [save(plt, fig, "load.png"), "", c.measured("load"), ""]
    return lines


def sec_cards(c: Ctx) -> list[str]:
    lines = ["## Capability cards: sign and verify", ""]
    cs = c.data.get("cards_sign")
    if not cs:
        return lines + c.missing("cards_sign")
    lines += table(["tools", "card bytes", "sign median ms", "verify median ms", "bootstrap draft median ms", "repeats"],
                   [[cs["tools"], cs["card_bytes"], fnum(cs["sign_median_ms"], 3), fnum(cs["verify_median_ms"], 3),
                     fnum(cs.get("bootstrap_generate_median_ms"), 2), cs.get("repeat")]])
    lines += [c.measured("cards_sign"), ""]
    return lines


def sec_rift(c: Ctx) -> list[str]:
    lines = ["## Rift: confusable clusters", ""]
    rr = c.data.get("rift_report")
    if not rr:
        return lines + c.missing("rift_report")
    rows = []
    for ds, e in rr["sets"].items():
        for label, r in e.items():
            cnt = r["counts"]
            rows.append([ds, label, r["tools"], r["clusters"], r["clustered_tools"], cnt.get("high"), cnt.get("medium"),
                         cnt.get("low"), cnt.get("unrated"), r["regenerate"], fnum(r["wall_s"], 1)])
    lines += [f"Embedder {rr.get('embedder')}. Text: `publisher` = the catalog's own descriptions, `bootstrap` = bootstrap "
              "card text, `no_margin` = ablation without margin analysis (clusters unrated).", ""]
    lines += table(["set", "text", "tools", "clusters", "clustered tools", "high", "medium", "low", "unrated", "REGENERATE", "wall s"], rows)
    pd = rr.get("planted_duplicates")
    if pd:
        lines += [f"Planted duplicates (three MCPToolBench++ tools copied to a server `mirror`): all HIGH with REGENERATE: "
                  f"{fnum(pd.get('all_high_regenerate'))}.", ""]
    lines += [c.measured("rift_report"), ""]
    return lines


def sec_prometheus(c: Ctx) -> list[str]:
    lines = ["## Prometheus scrape", ""]
    pr = c.data.get("prometheus_scrape")
    if not pr:
        return lines + c.missing("prometheus_scrape")
    if pr.get("error"):
        return lines + [f"**Not measured:** {pr['error']}", ""]
    lines += [f"{pr.get('prometheus')}: target health `{pr.get('target_health')}`, {pr.get('bucket_series')} bucket series "
              f"of `{pr.get('histogram')}` stored, first scrape after {fnum(pr.get('seconds_to_first_scrape'), 1)} s. "
              "The standalone mode feeds the metrics object synthetic observations, so its quantiles are a plumbing "
              "check, not a latency figure.", "", c.measured("prometheus_scrape"), ""]
    return lines


# -- goals -------------------------------------------------------------------------------------

def goals(c: Ctx) -> list[str]:
    """Acceptance goals from the issues against the measured figures."""
    checks: list[tuple[str, str, str, Callable[[], tuple[Any, bool | None]]]] = []

    def add(issue: str, what: str, goal: str, f: Callable[[], tuple[Any, bool | None]]) -> None:
        checks.append((issue, what, goal, f))

    d = c.data

    def n_tools() -> str:
        n = d["startup"]["tools"]
        return "" if n == 2000 else f" (measured at {n:,} tools, not 2,000)"

    add("5", "meta-tools vs full tools/list at 2,000 tools", ">= 99% smaller", lambda: (
        (r := next(x for x in d["tokens"]["runs"] if x["tools"] == 2000)) and f"{r['reduction'] * 100:.2f}% smaller",
        r["reduction"] >= 0.99))
    for ds, rec, extra in (("toollens", 0.375, 0.365), ("mcptoolbenchpp", 0.97, None)):
        def q(ds: str = ds, rec: float = rec, extra: float | None = extra) -> tuple[Any, bool]:
            m = d["eval_report"]["sets"][ds]["modes"]
            h = m["hybrid"]
            above = all(h["recall@5"] > m[b]["recall@5"] and h["ndcg@5"] > m[b]["ndcg@5"] for b in ("bm25", "dense"))
            ok = h["recall@5"] >= rec and (extra is None or h["ndcg@5"] >= extra) and above
            return (f"recall@5 {h['recall@5']:.3f}, nDCG@5 {h['ndcg@5']:.3f}, above both branches: {'yes' if above else 'no'}", ok)
        add("3", f"default ranker on {ds}", f"recall@5 >= {rec}" + (f", nDCG@5 >= {extra}" if extra else "") + ", above BM25 and dense", q)

    def lat(size: str, limit: float) -> Callable[[], tuple[Any, bool]]:
        def f() -> tuple[Any, bool]:
            v = d["search_latency"]["socket"]["sizes"][size]["miss"]["p95_ms"]
            return f"{v:.2f} ms (through the socket, `search_latency.py`)", v <= limit
        return f

    add("3", "search p95 through the daemon socket, cache miss, 2,000 tools", "<= 15 ms", lat("2000", 15))
    add("3", "search p95 through the daemon socket, cache miss, 100,000 tools", "<= 30 ms", lat("100000", 30))
    add("3", "search p95 through the socket, miss, 2,000 tools, after a warm restart (`startup.py`)", "<= 15 ms", lambda: (
        f"{(v := d['startup']['socket_search_latency']['miss']['p95_ms']):.2f} ms" + n_tools(), v <= 15))
    add("3", "search p95 through the socket, cache hit", "<= 2 ms", lambda: (
        f"{(v := max(s['hit']['p95_ms'] for s in d['search_latency']['socket']['sizes'].values())):.2f} ms (worst size)", v <= 2))
    add("3", "cold indexing of 2,000 tools (daemon, spawn to all indexed)", "<= 60 s", lambda: (
        f"{(v := d['startup']['cold']['indexed_s']):.1f} s" + n_tools(), v <= 60))
    add("3", "restart: first search (daemon, median)", "<= 5 s", lambda: (
        f"{(v := d['startup']['warm_median']['first_search_s']):.2f} s" + n_tools(), v <= 5))
    add("3", "restart: new embeddings", "0", lambda: (
        f"{(v := d['startup']['warm_median']['embeddings_computed_max'])}" + n_tools(), v == 0))
    add("3", "daemon RSS with 2,000 tools indexed", "<= 400 MB", lambda: (
        f"{(v := max([d['startup']['cold']['memory_mb']['VmRSS'], *(w['memory_mb']['VmRSS'] for w in d['startup']['warm'])])):.0f} MB (worst start)" + n_tools(),
        v <= 400))
    add("2", "gateway overhead over direct warm (median)", "<= 1.5 ms", lambda: (
        f"{(v := d['call_overhead']['gateway_overhead_ms']):.2f} ms", v <= 1.5))
    add("2", "list_changed to searchable (median)", "<= 1,000 ms", lambda: (
        f"{(v := d['catalog_freshness']['list_changed_to_searchable']['median_ms']):.0f} ms", v <= 1000))
    add("2", "shim start to first byte (median)", "<= 150 ms", lambda: (
        f"{(v := d['shim_start']['spawn_to_first_byte']['median_ms']):.1f} ms", v <= 150))
    add("6", "load: 100 clients, zero errors, no RSS/fd growth, search p99 <= 4x 1 client", "all four", lambda: (
        (a := d["load"]["acceptance"]) and f"{a['run']}: p99 ratio {a['p99_search_ratio_vs_1_client']}, errors "
        f"{'none' if a['zero_errors'] else 'some'}, fd growth {'no' if a['no_fd_growth'] else 'yes'}, RSS growth "
        f"{'no' if a['no_rss_growth'] else 'yes'}",
        None if a["p99_search_ratio_vs_1_client"] is None and a["zero_errors"] and a["no_fd_growth"] and a["no_rss_growth"]
        else bool(a["p99_ratio_ok"] and a["zero_errors"] and a["no_fd_growth"] and a["no_rss_growth"])))
    add("4", "card sign / verify, 50 tools (median)", "< 50 ms each", lambda: (
        f"{d['cards_sign']['sign_median_ms']:.2f} / {d['cards_sign']['verify_median_ms']:.2f} ms",
        d["cards_sign"]["sign_median_ms"] < 50 and d["cards_sign"]["verify_median_ms"] < 50))
    add("4", "Rift full CLI run on ToolLens", "< 30 s", lambda: (
        f"{(v := d['rift_report']['sets']['toollens']['publisher']['wall_s']):.1f} s", v < 30))
    add("5", "Prometheus scrapes the search-latency histogram", "ok", lambda: (
        f"{d['prometheus_scrape'].get('bucket_series')} bucket series", bool(d["prometheus_scrape"].get("ok"))))

    rows = []
    for issue, what, goal, f in checks:
        try:
            value, ok = f()
            verdict = "incomplete (a part was not measured)" if ok is None else ("met" if ok else "**not met**")
            rows.append([f"#{issue}", what, goal, str(value), verdict])
        except (KeyError, StopIteration, TypeError, IndexError) as exc:
            rows.append([f"#{issue}", what, goal, f"not measured ({type(exc).__name__}: {exc})", "-"])
    return ["## Goals at a glance", "", *table(["issue", "figure", "goal", "measured", "verdict"], rows),
            "Each figure comes from the section below that names its command.", ""]


# -- the report --------------------------------------------------------------------------------

def header(c: Ctx, mode: str) -> list[str]:
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    runs = [r for r in c.runs.values() if isinstance(r, dict)]
    loads = [x for r in runs for x in ((r.get("loadavg_before") or [None])[0], (r.get("loadavg_after") or [None])[0]) if x is not None]
    quick = any(r.get("quick") for r in runs)
    m = next((r["machine"] for r in runs if r.get("machine")), machine())
    lines = ["# toolatlas benchmark report", "",
             "Generated by `.venv/bin/python bench/report.py` (also `make bench`); re-render without re-running with "
             "`.venv/bin/python bench/report.py --from-json`. Do not edit by hand.", "",
             f"- Rendered: {now} ({mode}).",
             f"- Machine: {machine_text(m)}, kernel {m.get('kernel')}.",
             "- Medians are quoted unless a column says otherwise; every section names the command and date of its run."]
    if runs:
        starts = sorted(r["started_utc"] for r in runs if r.get("started_utc"))
        lines.append(f"- Bench runs: {starts[0]} to {starts[-1]}; 1-minute load average between {min(loads):.1f} and {max(loads):.1f}.")
    noisy = sorted(n for n, r in c.runs.items() if isinstance(r, dict) and (r.get("loadavg_before") or [0])[0] > NOISY_LOAD)
    if noisy:
        lines.append(f"- **Noisy machine** for {', '.join(noisy)}: the 1-minute load average was above {NOISY_LOAD:g} on "
                     f"{m.get('cores')} cores when they started (other work shared the CPUs; highest {max(loads):.1f}). Their "
                     "timings are pessimistic; quality, token and count figures are not affected. Each section's "
                     "*Measured* line gives its load.")
    if quick:
        lines.append("- **Quick run** (`--quick`) for some benches: smaller sample counts (and fewer catalog sizes) "
                     "than the full run; each section's command shows which.")
    failed = sorted(c.errors)
    if failed:
        lines.append(f"- Not measured: {', '.join(failed)} (the sections say why).")
    return lines + [""]


def runs_section(c: Ctx) -> list[str]:
    rows = []
    for b in BENCHES:
        r = c.runs.get(b.name)
        if not isinstance(r, dict):
            rows.append([b.name, "not run by report.py", "", "", "", ""])
            continue
        la_b, la_a = (r.get("loadavg_before") or ["?"])[0], (r.get("loadavg_after") or ["?"])[0]
        status = "failed: " + r["error"] if r.get("error") else ("ok" if not r.get("warning") else r["warning"])
        rows.append([b.name, f"`{r.get('command')}`", r.get("started_utc", "?"), fnum(r.get("seconds"), 0), f"{la_b} -> {la_a}",
                     status.replace("|", "/")])
    return ["## Runs", "", *table(["bench", "command", "started", "wall s", "load average", "status"], rows)]


def index_section() -> list[str]:
    rows = [[f"`bench/{b.script}`" + (" (config mode)" if b.setup else ""), b.measures, f"bench/out/{b.name}.json"] for b in BENCHES]
    return ["## The benches", "", *table(["script", "measures", "JSON"], rows)]


SECTIONS: tuple[Callable[[Ctx], list[str]], ...] = (
    sec_tokens, sec_retrieval, sec_latency, sec_calls, sec_startup, sec_load, sec_shim_fresh, sec_cards, sec_rift, sec_prometheus,
)


def render(mode: str) -> str:
    c = Ctx(load_runs())
    lines = header(c, mode) + goals(c)
    for sec in SECTIONS:
        try:
            lines += sec(c)
        except Exception as exc:  # noqa: BLE001 - a JSON shape a renderer did not expect must not sink the report
            lines += [f"## {sec.__name__.removeprefix('sec_')}", "", f"**Not rendered:** {type(exc).__name__}: {exc}", ""]
    lines += runs_section(c)
    lines += index_section()
    text = "\n".join(lines).rstrip() + "\n"
    REPORT.write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--from-json", action="store_true", help="render from bench/out/*.json without running any bench")
    g.add_argument("--quick", action="store_true", help="run every bench with smaller sample counts")
    p.add_argument("--only", help="comma-separated bench names to run (the others keep their last JSON)")
    a = p.parse_args(argv)
    if not a.from_json:
        names = [n.strip() for n in a.only.split(",")] if a.only else [b.name for b in BENCHES]
        unknown = sorted(set(names) - set(BY_NAME))
        if unknown:
            p.error(f"unknown bench(es) {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
        OUT.mkdir(parents=True, exist_ok=True)
        for name in names:
            b = BY_NAME[name]
            if b.optional and not (BENCH / b.script).exists():
                print(f"report: skipping {name}: bench/{b.script} does not exist", file=sys.stderr)
                continue
            rec = run_bench(b, a.quick)
            runs = load_runs()
            runs[name] = rec
            RUNS.write_text(json.dumps(runs, indent=2) + "\n")
    mode = "from existing JSON" if a.from_json else (
        f"{'quick' if a.quick else 'full'} run of " + (a.only.replace(",", ", ") if a.only else "every bench"))
    render(mode)
    print(f"report: wrote {REPORT.relative_to(REPO)} and {PLOTS.relative_to(REPO)}/*.png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
