"""The daemon's Rift runner: one analysis per index version, however often it is asked.
A fake engine (the runner is the unit under test); the analysis itself is the real one."""

from __future__ import annotations

import time

import anyio
import numpy as np
import pytest

from toolatlas.retrieval.documents import ToolDoc
from toolatlas.rift import runner as runner_mod
from toolatlas.rift.runner import RiftRunner


class _Embedder:
    name = "fake"

    def embed_queries(self, texts: list[str]) -> np.ndarray:  # the margins of clustered tools
        v = np.random.default_rng(len(texts)).normal(size=(len(texts), 16)).astype(np.float32)
        out: np.ndarray = v / np.linalg.norm(v, axis=1, keepdims=True)
        return out


class _Engine:
    def __init__(self, n: int) -> None:
        rng = np.random.default_rng(0)
        vecs = rng.normal(size=(n, 16)).astype(np.float32)
        self.vecs = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
        self.docs = tuple(ToolDoc(name=f"s__t{i}", server="s", tool=f"t{i}", description=f"tool {i}",
                                  input_schema={"type": "object"}) for i in range(n))
        self.version = 3
        self.embedder = _Embedder()

    def catalog_vectors(self) -> tuple[int, tuple[ToolDoc, ...], np.ndarray]:
        return self.version, self.docs, self.vecs


async def _until(check: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await anyio.sleep(0.01)


async def test_an_index_is_analysed_once_however_often_rift_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = runner_mod.analyse

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(runner_mod, "analyse", counted)
    eng = _Engine(30)
    r = RiftRunner(eng, debounce=0.01)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        tg.start_soon(r.run)
        r.wanted()
        await _until(lambda: r.version == 3 and r.report is not None, "the first analysis")
        r.wanted()  # the same index asked again (an update and then its vectors)
        await _until(lambda: r.skipped == 1, "the second request")
        assert len(calls) == 1
        eng.version = 4  # a new index is analysed
        r.wanted()
        await _until(lambda: r.version == 4, "the analysis of the new index")
        assert len(calls) == 2 and r.skipped == 1
        tg.cancel_scope.cancel()
