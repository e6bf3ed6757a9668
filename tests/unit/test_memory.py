"""memory.settle_heap: collect once, then keep the survivors out of later collections."""

from __future__ import annotations

import gc
import weakref

from toolatlas import memory


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_settle_heap_collects_cycles_and_freezes_the_rest() -> None:
    try:
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
        assert later() is None
    finally:
        gc.unfreeze()
