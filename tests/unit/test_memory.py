"""memory.settle_heap: collect once, then keep the survivors out of later collections; a full
pass (which reclaims garbage among frozen objects) only once the frozen heap has grown."""

from __future__ import annotations

import gc
import sys
import weakref

from toolatlas import memory


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_settle_heap_collects_cycles_and_freezes_the_rest() -> None:
    try:
        gc.unfreeze()
        memory._blocks_after_full = 0  # as at the daemon's start: the first settle is a full pass
        kept = [_Node() for _ in range(100)]
        a, b = _Node(), _Node()
        a.other, b.other = b, a  # a cycle: only the cyclic collector frees it
        gone = weakref.ref(a)
        del a, b
        memory.settle_heap()
        assert gone() is None
        frozen = gc.get_freeze_count()
        assert frozen >= len(kept)
        # Garbage made from frozen objects waits for the next settle, which unfreezes first.
        c, d = kept[0], kept[1]
        c.other, d.other = d, c
        later = weakref.ref(c)
        del kept, c, d
        gc.collect()
        assert later() is not None  # frozen: the ordinary collector does not look at it
        memory.settle_heap()
        assert later() is not None  # the frozen heap has not grown: no full pass yet
        e, f = _Node(), _Node()
        e.other, f.other = f, e
        young = weakref.ref(e)
        del e, f
        memory.settle_heap()
        assert young() is not None  # made since the last call: frozen too, until the next full pass
        memory._blocks_after_full = sys.getallocatedblocks() // 2  # as if the heap had doubled since
        memory.settle_heap()  # so this one is a full pass
        assert later() is None and young() is None
        assert gc.get_freeze_count() >= 100
    finally:
        gc.unfreeze()
        memory._blocks_after_full = 0


def test_the_first_settle_leaves_frozen_what_was_frozen_before_it() -> None:
    """A pre-fork parent's gc.freeze() (the suite's fork server, a preloading launcher): the
    first settle collects the child's own garbage and leaves the parent's objects frozen."""
    try:
        gc.unfreeze()
        memory._blocks_after_full = 0
        inherited = [_Node() for _ in range(100)]
        a, b = inherited[0], inherited[1]
        a.other, b.other = b, a
        theirs = weakref.ref(a)
        gc.freeze()  # as the parent did before forking
        del inherited, a, b  # garbage among the frozen: only a full pass with unfreeze frees it
        c, d = _Node(), _Node()
        c.other, d.other = d, c
        ours = weakref.ref(c)
        del c, d
        memory.settle_heap()
        assert ours() is None
        assert theirs() is not None  # still frozen: the first settle did not unfreeze it
        assert memory._blocks_after_full > 0  # the baseline for the next full pass is set
        memory._blocks_after_full = sys.getallocatedblocks() // 2  # as if the heap had doubled since
        memory.settle_heap()  # a later full pass reclaims among everything frozen
        assert theirs() is None
    finally:
        gc.unfreeze()
        memory._blocks_after_full = 0


def test_a_full_pass_is_due_first_and_after_the_heap_grew_by_the_factor() -> None:
    assert memory.needs_full_pass(10, 0)
    assert not memory.needs_full_pass(150, 100)
    assert memory.needs_full_pass(int(100 * memory.FULL_PASS_GROWTH), 100)


# Run in a fresh interpreter: glibc's thresholds are process-wide and one-way (once set, the
# dynamic rule is off for good). The script first frees a 16 MB mapped block, which under
# glibc's default rule raises the trim threshold to 32 MB, then fills and frees 24 MB of
# 512 KB heap blocks and reports the resident MB before, with them, after freeing them, and
# after lean_heap.
_HEAP_SCRIPT = r"""
import ctypes, json, sys
from toolatlas import memory

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]

def rss():
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) for l in fh if l.startswith("VmRSS:")) / 1024

def fill(n, size):
    blocks = [libc.malloc(size) for _ in range(n)]
    for b in blocks:
        ctypes.memset(b, 1, size)
    return blocks

if sys.argv[1] == "tune":
    memory.tune_heap()
big = fill(1, 16 * 2**20)
libc.free(big[0])
if sys.argv[2] == "hold":
    memory.hold_heap()
base = rss()
blocks = fill(48, 512 * 1024)
full = rss()
for b in reversed(blocks):
    libc.free(b)
freed = rss()
memory.lean_heap()
print(json.dumps({"base": base, "full": full, "freed": freed, "lean": rss(), "tuned": memory._tuned}))
"""


def _heap(tune: str, hold: str, env: dict[str, str] | None = None) -> dict[str, float]:
    import json
    import os
    import subprocess

    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", _HEAP_SCRIPT, tune, hold], env={**clean, **(env or {})},
                         capture_output=True, text=True, timeout=60, check=True)
    result: dict[str, float] = json.loads(out.stdout)
    assert result["full"] - result["base"] > 20, result  # the 24 MB were resident
    return result


def test_lean_thresholds_give_freed_heap_back_where_glibcs_default_keeps_it() -> None:
    default = _heap("no", "no")
    assert default["freed"] - default["base"] > 18, default  # kept: the dynamic threshold rose
    tuned = _heap("tune", "no")
    assert tuned["tuned"] and tuned["freed"] - tuned["base"] < 6, tuned


def test_held_thresholds_keep_freed_heap_until_lean_heap() -> None:
    held = _heap("tune", "hold")
    assert held["freed"] - held["base"] > 18, held  # kept for the next batch
    assert held["lean"] - held["base"] < 6, held  # lean_heap trimmed it


def test_an_operators_malloc_settings_are_left_alone() -> None:
    own = _heap("tune", "no", {"MALLOC_TRIM_THRESHOLD_": str(128 * 2**20), "MALLOC_MMAP_THRESHOLD_": str(4 * 2**20)})
    assert own["tuned"] is False
    assert own["freed"] - own["base"] > 18, own  # their 128 MB threshold, not ours
