"""Memory probe for a `toolatlas serve` started by bench/memory.py (issue 19 item 3).

Imported at interpreter start when this folder is on PYTHONPATH. Only in a daemon
(`serve` in argv) and only with TOOLATLAS_MEMPROBE_OUT set: SIGUSR2 writes a JSON report
there (smaps_rollup, resident MB per mapping, pymalloc statistics, RSS before and after a
malloc_trim alone, then after a gc.collect + malloc_trim, and with TOOLATLAS_MEMPROBE_TRACE=N
the tracemalloc top allocation sites, innermost toolatlas frame, N frames deep). Diagnostics
only.

TOOLATLAS_MEMPROBE_TYPES=1 (bench/soak.py --probe) adds a census: the live objects by type
(frozen ones too: the daemon freezes what it builds, memory.settle_heap), the asyncio tasks
by their await chain and the Python threads by name. With it, for diagnosis:
TOOLATLAS_MEMPROBE_COLLECT=1 also counts after a full collection (what is really reachable;
this changes the daemon's heap from then on), TOOLATLAS_MEMPROBE_HOLDERS=TYPE,... names what
holds objects of those types (one or two levels up), and TOOLATLAS_MEMPROBE_EXEC=FILE runs a
script of yours in the daemon with a dict RESULT to fill (paths.py: what keeps old ToolRecords
alive).
"""

import os
import sys

if os.environ.get("TOOLATLAS_MEMPROBE_OUT") and "serve" in sys.argv:
    import collections
    import ctypes
    import gc
    import json
    import signal
    import tempfile

    if os.environ.get("TOOLATLAS_MEMPROBE_TRACE"):
        import tracemalloc

        tracemalloc.start(int(os.environ["TOOLATLAS_MEMPROBE_TRACE"]))

    def _rss_mb() -> float:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) / 1024 for line in fh if line.startswith("VmRSS"))

    def _maps() -> dict[str, float]:
        groups: collections.Counter[str] = collections.Counter()
        cur = "?"
        with open("/proc/self/smaps") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 5 and "-" in parts[0] and not parts[0].endswith(":"):
                    path = parts[5] if len(parts) > 5 else "[anon]"
                    cur = path.split("site-packages/")[1].split("/")[0] if "site-packages/" in path else path
                elif parts and parts[0] == "Rss:":
                    groups[cur] += int(parts[1])
        return {k: round(v / 1024, 1) for k, v in groups.most_common(20)}

    def _pymalloc() -> str:
        with tempfile.TemporaryFile() as tf:
            sys.stderr.flush()
            saved = os.dup(2)
            os.dup2(tf.fileno(), 2)
            try:
                sys._debugmallocstats()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            tf.seek(0)
            text = tf.read().decode()
        i = text.find("# arenas allocated current")
        return text[i : i + 400] if i >= 0 else ""

    def _name(o: object) -> str:
        return f"{type(o).__module__}.{type(o).__qualname__}"

    def _attr(owner: object, value: object) -> str:
        try:
            return next((f".{k}" for k, v in vars(owner).items() if v is value), "")
        except TypeError:
            return ""

    def _holders(objs: list[object], wanted: str) -> dict[str, dict[str, int]]:
        """For each type named in `wanted` (comma-separated), what holds its objects: the
        referrer's type, and for a dict, the type owning it as __dict__ (or the dict's own
        referrer), two levels up."""
        out: dict[str, dict[str, int]] = {}
        skip = {id(objs)}
        for tname in filter(None, wanted.split(",")):
            chains: collections.Counter[str] = collections.Counter()
            some = [x for x in objs if _name(x) == tname][:400]
            skip.add(id(some))
            for o in some:
                for r in gc.get_referrers(o):
                    if id(r) in skip:
                        continue
                    label = _name(r)
                    if type(r).__name__ == "frame":
                        label = f"frame {r.f_code.co_qualname} ({r.f_code.co_filename.rsplit('/', 2)[-1]})"
                    if isinstance(r, (dict, list, set, tuple)) or type(r).__name__ in ("deque", "OrderedDict"):
                        ups = [u for u in gc.get_referrers(r) if id(u) not in skip and type(u).__name__ != "frame"][:3]
                        label += " <- " + ",".join(sorted(_name(u) + _attr(u, r) for u in ups))
                    chains[label] += 1
            out[tname] = dict(chains.most_common(12))
        return out

    def _awaiting(coro: object) -> str:
        """The chain of coroutines `coro` is awaiting (outermost three ... innermost two)."""
        chain = []
        for _ in range(50):
            if coro is None:
                break
            chain.append(getattr(coro, "__qualname__", type(coro).__name__))
            coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        return " > ".join(chain[:3] + ["..."] + chain[-2:] if len(chain) > 5 else chain)

    def _census() -> dict[str, object]:
        # The daemon freezes what it builds (memory.settle_heap): unfreeze to see those too
        # (cyclic garbage among them included), then freeze again, collecting nothing.
        frozen = gc.get_freeze_count()
        gc.unfreeze()
        try:
            return _count(frozen)
        finally:
            gc.freeze()

    def _count(frozen: int) -> dict[str, object]:
        import asyncio
        import threading

        objs = gc.get_objects()
        types = collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in objs)
        collected: dict[str, object] = {}
        if os.environ.get("TOOLATLAS_MEMPROBE_COLLECT"):  # and what a full collection leaves
            del objs
            collected["garbage_collected"] = gc.collect()
            objs = gc.get_objects()
            after = collections.Counter(_name(o) for o in objs)
            collected["objects_after_collect"] = sum(after.values())
            collected["types_after_collect"] = {k: v for k, v in after.items() if v >= 20}
        try:
            tasks = asyncio.all_tasks(asyncio.get_running_loop())
        except RuntimeError:
            tasks = set()
        holders = _holders(objs, os.environ.get("TOOLATLAS_MEMPROBE_HOLDERS", ""))  # before: the frozen are unsearched
        if os.environ.get("TOOLATLAS_MEMPROBE_EXEC"):  # a diagnostic script of the caller's, sees RESULT
            extra: dict[str, object] = {}
            with open(os.environ["TOOLATLAS_MEMPROBE_EXEC"]) as fh:
                exec(compile(fh.read(), fh.name, "exec"), {"RESULT": extra})
            collected["exec"] = extra
        del objs
        coros = collections.Counter(_awaiting(t.get_coro()) for t in tasks)
        return {"objects": sum(types.values()), "frozen_before": frozen, "types": {k: v for k, v in types.items() if v >= 20},
                "task_count": len(tasks), "tasks": dict(coros), "holders": holders, **collected,
                "threads_by_name": dict(collections.Counter(t.name.rstrip("0123456789") for t in threading.enumerate()))}

    def _dump(*_: object) -> None:
        out: dict[str, object] = {"smaps_rollup": open("/proc/self/smaps_rollup").read(), "maps_mb": _maps(),
                                  "pymalloc": _pymalloc(), "torch_imported": "torch" in sys.modules,
                                  "modules": len(sys.modules), "rss_mb": _rss_mb()}
        try:
            import tracemalloc

            if tracemalloc.is_tracing():
                snap = tracemalloc.take_snapshot()
                out["traced_mb"] = round(sum(s.size for s in snap.statistics("filename")) / 2**20, 1)
                by_site: collections.Counter[str] = collections.Counter()
                for s in snap.statistics("traceback"):
                    site = next((f"{fr.filename.split('/toolatlas/')[1]}:{fr.lineno}" for fr in reversed(list(s.traceback))
                                 if "/toolatlas/" in fr.filename), "(no toolatlas frame)")
                    by_site[site] += s.size
                out["traced_by_toolatlas_site_mb"] = [(k, round(v / 2**20, 2)) for k, v in by_site.most_common(30)]
        except Exception as exc:  # noqa: BLE001 - a probe never takes the daemon down
            out["trace_error"] = repr(exc)
        if os.environ.get("TOOLATLAS_MEMPROBE_TYPES"):
            try:
                out.update(_census())
            except Exception as exc:  # noqa: BLE001 - a probe never takes the daemon down
                out["census_error"] = repr(exc)
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)  # alone first: what a trim in the daemon would give back
        out["rss_after_trim_only_mb"] = _rss_mb()
        gc.collect()
        out["rss_after_gc_mb"] = _rss_mb()
        libc.malloc_trim(0)
        out["rss_after_trim_mb"] = _rss_mb()
        target = os.environ["TOOLATLAS_MEMPROBE_OUT"]
        with open(target + ".tmp", "w") as fh:
            json.dump(out, fh, indent=1)
        os.replace(target + ".tmp", target)

    signal.signal(signal.SIGUSR2, _dump)
