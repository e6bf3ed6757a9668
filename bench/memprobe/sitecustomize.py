"""Memory probe for a `toolatlas serve` started by bench/memory.py (issue 19 item 3).

Imported at interpreter start when this folder is on PYTHONPATH. Only in a daemon
(`serve` in argv) and only with TOOLATLAS_MEMPROBE_OUT set: SIGUSR2 writes a JSON report
there (smaps_rollup, resident MB per mapping, pymalloc statistics, RSS before and after a
malloc_trim alone, then after a gc.collect + malloc_trim, and with TOOLATLAS_MEMPROBE_TRACE=N
the tracemalloc top allocation sites, innermost toolatlas frame, N frames deep). Diagnostics
only.
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
