"""The ONNX export of the embedding model: where it lives and how it is made, once.

The export runs `python -m toolatlas.retrieval.export_onnx` in a subprocess (torch never
enters the daemon) into a temporary folder renamed into place; a file lock serialises
concurrent exporters; a shutdown kills a running export. Split from embed.py, which loads
what this module makes. Stdlib only: `toolatlas doctor` checks the export without numpy or
onnxruntime.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from toolatlas.errors import ToolatlasError
from toolatlas.paths import read_regular

log = logging.getLogger(__name__)

MODEL_NAME = "all-MiniLM-L6-v2"
EXPORT_DIRNAME = "minilm-l6-v2-onnx-v2"
_EXPORT_TIMEOUT = 900.0


class EmbedderUnavailable(ToolatlasError):
    """The embedding model could not be loaded or run; retrieval falls back to BM25."""


def models_dir(state_dir: Path | None) -> Path:
    """Where exported models live: ``state_dir/models`` or the user cache dir."""
    if state_dir is not None:
        return Path(state_dir) / "models"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "toolatlas" / "models"


def export_complete(folder: Path) -> bool:
    """Whether `folder` holds every file its manifest lists, each at its recorded size."""
    try:
        manifest = json.loads(read_regular(folder / "manifest.json"))
        files: dict[str, int] = manifest["files"]
        return all((folder / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


# Test knob: while the path this names does not exist, a needed export waits before it starts
# (phase "exporting", said so in the log), so a test can observe a fresh daemon serving BM25
# before the export without timing luck. The export itself is the real one once the path appears.
HOLD_EXPORT_ENV = "TOOLATLAS_TEST_HOLD_EXPORT"
_POLL_S = 0.2


def export_needed(state_dir: Path | None) -> bool:
    """Whether `ensure_onnx_export` would have to export (no complete export on disk)."""
    return not export_complete(models_dir(state_dir) / EXPORT_DIRNAME)


def _hold(cancel: threading.Event | None) -> None:
    gate = os.environ.get(HOLD_EXPORT_ENV)
    if not gate:
        return
    log.warning("embed.export_held until %s exists (%s, a test knob)", gate, HOLD_EXPORT_ENV)
    while not os.path.exists(gate):
        if cancel is not None and cancel.is_set():
            raise EmbedderUnavailable("the ONNX export was cancelled (shutting down)")
        time.sleep(_POLL_S)


def _run_export(tmp: Path, cancel: threading.Event | None) -> None:
    """Run the exporter subprocess into `tmp`; on `cancel` (shutdown) it is killed, so no
    child outlives the daemon. Raises EmbedderUnavailable on failure or cancel."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            # Niced: on a fresh state_dir the export runs beside the upstreams starting and
            # BM25 serving; the first answers matter more than the minutes of a one-time step.
            [sys.executable, "-m", "toolatlas.retrieval.export_onnx", "--out", str(tmp), "--nice", "10",
             "--parent", str(os.getpid())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        )
        try:
            if cancel is None:
                proc.wait(timeout=_EXPORT_TIMEOUT)
            else:
                _wait_or_cancel(proc, cancel)
        except subprocess.TimeoutExpired as exc:
            raise EmbedderUnavailable(
                f"exporting {MODEL_NAME} to ONNX did not finish within {_EXPORT_TIMEOUT:g} s") from exc
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if cancel is not None and cancel.is_set():
            raise EmbedderUnavailable("the ONNX export was cancelled (shutting down)")
        if proc.returncode != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace").strip().splitlines()[-3:]
            raise EmbedderUnavailable(
                f"exporting {MODEL_NAME} to ONNX failed (exit {proc.returncode}): " + " | ".join(tail))


def _wait_or_cancel(proc: subprocess.Popen[bytes], cancel: threading.Event) -> None:
    deadline = time.monotonic() + _EXPORT_TIMEOUT
    while proc.poll() is None:
        if cancel.wait(_POLL_S):
            return  # the caller kills it
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(proc.args, _EXPORT_TIMEOUT)


def _remove_earlier_formats(root: Path) -> None:
    """Delete exports of earlier formats under `root` (~110 MB each, never read again). Run
    whenever the current export is complete, not only right after making it: a daemon killed
    between the rename and this clean-up would otherwise keep the old folder for good."""
    for old in root.glob(EXPORT_DIRNAME.rsplit("-v", 1)[0] + "-v*"):
        if old.name != EXPORT_DIRNAME and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
            log.info("embed.export_removed_old path=%s", old)


def _remove_dead_exports(root: Path) -> None:
    """Delete the temporary folders of exports whose process died (a daemon SIGKILLed while
    exporting leaves `.export-*`, up to the model's size, for good). Run with the export
    lock held: an export in progress holds it, so every such folder found then is dead."""
    for dead in root.glob(".export-*"):
        if dead.is_dir():
            shutil.rmtree(dead, ignore_errors=True)
            log.info("embed.export_removed_dead path=%s (left by an export that did not finish)", dead)


def ensure_onnx_export(state_dir: Path | None, cancel: threading.Event | None = None) -> Path:
    """Return a folder holding a complete ONNX export, exporting it first if needed.

    The export runs in a subprocess (torch never enters this process), into a temporary
    folder that is renamed into place; a file lock serialises concurrent exporters. Setting
    `cancel` (the daemon shutting down) kills a running export. Raises EmbedderUnavailable
    if the export fails or is cancelled.
    """
    root = models_dir(state_dir)
    final = root / EXPORT_DIRNAME
    if export_complete(final):
        _remove_earlier_formats(root)
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(root / ".export.lock", "w") as lockf:
            fcntl.flock(lockf, fcntl.LOCK_EX)
            if export_complete(final):
                return final
            if final.exists():
                log.warning("embed.export_incomplete path=%s: exporting again", final)
                shutil.rmtree(final, ignore_errors=True)
            _remove_dead_exports(root)
            _hold(cancel)
            tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=root))
            log.info("embed.export_start out=%s", final)
            t0 = time.monotonic()
            try:
                _run_export(tmp, cancel)
                os.replace(tmp, final)
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)
            log.info("embed.export_done out=%s seconds=%.1f", final, time.monotonic() - t0)
            _remove_earlier_formats(root)
    except OSError as exc:
        raise EmbedderUnavailable(f"cannot write the ONNX model under {str(root)!r}: {exc}") from exc
    if not export_complete(final):
        raise EmbedderUnavailable(f"the ONNX export in {str(final)!r} is incomplete")
    return final


__all__ = ["EXPORT_DIRNAME", "HOLD_EXPORT_ENV", "EmbedderUnavailable", "ensure_onnx_export", "export_complete",
           "export_needed", "models_dir"]
