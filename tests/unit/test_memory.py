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


def test_a_full_pass_is_due_first_and_after_the_heap_grew_by_the_factor() -> None:
    assert memory.needs_full_pass(10, 0)
    assert not memory.needs_full_pass(150, 100)
    assert memory.needs_full_pass(int(100 * memory.FULL_PASS_GROWTH), 100)
