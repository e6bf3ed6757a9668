"""A stack sampler for a daemon under bench (bench/replicas.py --profile): loaded at start when
this folder is on PYTHONPATH and TA_SAMPLE_OUT=FILE is set. While FILE.on exists, a thread takes
every other thread's Python stack once a millisecond (sys._current_frames); when FILE.on goes
away it writes to FILE what the threads were doing:

  {"samples": thread stacks seen, "active": those not idle-waiting (select, a lock, a queue),
   "store": active stacks with a frame of toolatlas/store/, "search_path": active stacks of a
   search (toolatlas/gateway/search.py or retrieval engine.search), "store_on_search_path":
   stacks that are both, "top_active"/"top_store": the commonest leaf frames (file:function)}

Idle waits are left out so the figures say where CPU (or the GIL) went. Off (sleeping 50 ms
between checks for FILE.on) it costs the daemon nothing measurable."""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
import time

_IDLE = {"select", "poll", "epoll", "wait", "_wait_for_tstate_lock", "acquire", "get", "_worker", "accept",
         "recv", "recv_into", "readinto", "sleep", "_flush_loop", "run_forever", "_run_once"}


def _leaf(frame: object) -> str:
    code = frame.f_code  # type: ignore[attr-defined]
    return f"{os.path.basename(code.co_filename)}:{code.co_name}"


def _sample_loop(out: str) -> None:
    flag = out + ".on"
    me = threading.get_ident()
    while True:
        while not os.path.exists(flag):
            time.sleep(0.05)
        counts = collections.Counter()
        top_active: collections.Counter[str] = collections.Counter()
        top_store: collections.Counter[str] = collections.Counter()
        n = 0
        while True:
            n += 1
            if n % 100 == 0 and not os.path.exists(flag):
                break
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                counts["samples"] += 1
                if frame.f_code.co_name in _IDLE or _leaf(frame) == "runners.py:run":  # uvloop waits in C
                    continue
                counts["active"] += 1
                files = []
                f = frame
                while f is not None:
                    files.append((f.f_code.co_filename, f.f_code.co_name))
                    f = f.f_back
                store = any("/toolatlas/store/" in fn for fn, _ in files)
                search = any(fn.endswith("/gateway/search.py") or (fn.endswith("/retrieval/engine.py") and name == "search")
                             for fn, name in files)
                top_active[_leaf(frame)] += 1
                if store:
                    counts["store"] += 1
                    top_store[_leaf(frame)] += 1
                if search:
                    counts["search_path"] += 1
                if store and search:
                    counts["store_on_search_path"] += 1
            time.sleep(0.001)
        result = {k: counts.get(k, 0) for k in ("samples", "active", "store", "search_path", "store_on_search_path")}
        result["top_active"] = top_active.most_common(12)
        result["top_store"] = top_store.most_common(12)
        with open(out + ".tmp", "w") as fh:
            json.dump(result, fh)
        os.replace(out + ".tmp", out)


_OUT = os.environ.get("TA_SAMPLE_OUT")
if _OUT:
    threading.Thread(target=_sample_loop, args=(_OUT,), name="bench-sampler", daemon=True).start()
