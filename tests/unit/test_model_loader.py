"""The model loader's phases around the one-time export (retrieval/warmup.py). The export and
the model are fakes here: the unit under test is the loader's bookkeeping. The real export,
end to end, is tests/e2e/test_fresh_start.py."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from toolatlas.retrieval import embed
from toolatlas.retrieval.warmup import ModelLoader, ModelPhase


class FakeExport:
    """Stands in for ensure_onnx_export: blocks until `release`, then the export is on disk."""

    def __init__(self, error: Exception | None = None) -> None:
        self.done = False
        self.calls = 0
        self.started = threading.Event()
        self.release = threading.Event()
        self.error = error

    def needed(self, state_dir: Path | None) -> bool:
        return not self.done

    def run(self, state_dir: Path | None, cancel: threading.Event | None = None) -> Path:
        self.calls += 1
        self.started.set()
        assert self.release.wait(10), "the test never released the export"
        if self.error is not None:
            raise self.error
        self.done = True
        return Path("unused")


@pytest.fixture
def export(monkeypatch: pytest.MonkeyPatch) -> FakeExport:
    fake = FakeExport()
    monkeypatch.setattr(embed, "ensure_onnx_export", fake.run)
    monkeypatch.setattr(embed, "export_needed", fake.needed)
    return fake


def test_an_export_made_ahead_leaves_the_loader_waiting_then_load_uses_it(
    export: FakeExport, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    class FakeModel:
        name = "fake"

    model = FakeModel()
    loaded: list[Path | None] = []

    def fake_get_embedder(kind: str, state_dir: Path | None, query_threads: int, cancel: threading.Event) -> object:
        loaded.append(state_dir)
        return model

    monkeypatch.setattr(embed, "get_embedder", fake_get_embedder)
    loader = ModelLoader("onnx", tmp_path, 1, {"embedder_failures": 0})
    assert loader.progress.phase is ModelPhase.WAITING

    ahead = threading.Thread(target=loader.export_ahead)
    ahead.start()
    assert export.started.wait(10)
    assert loader.progress.phase is ModelPhase.EXPORTING and loader.model is None
    export.release.set()
    ahead.join(10)
    assert not ahead.is_alive()
    # Exported, not loaded: the model waits for the first index (the daemon loads it then).
    assert loader.progress.phase is ModelPhase.WAITING and loader.model is None and loaded == []

    assert loader.load() is model
    assert loader.progress.phase is ModelPhase.EMBEDDING and loaded == [tmp_path]
    assert export.calls == 1  # load found the export on disk


def test_a_failed_export_ahead_is_reported_by_load_and_not_tried_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    fake = FakeExport(error=embed.EmbedderUnavailable("exporting all-MiniLM-L6-v2 to ONNX failed (exit 1): boom"))
    fake.release.set()
    monkeypatch.setattr(embed, "ensure_onnx_export", fake.run)
    monkeypatch.setattr(embed, "export_needed", fake.needed)
    counts = {"embedder_failures": 0}
    loader = ModelLoader("onnx", tmp_path, 1, counts)

    loader.export_ahead()
    assert loader.progress.phase is ModelPhase.WAITING  # the failure waits for load to report it
    assert loader.load() is None
    assert loader.progress.phase is ModelPhase.FAILED and "boom" in str(loader.progress.error)
    assert counts["embedder_failures"] == 1 and fake.calls == 1
    assert loader.load() is None and fake.calls == 1  # BM25 from now on, no second export
