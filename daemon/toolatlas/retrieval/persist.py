"""On-disk state of the retrieval engine under `state_dir/retrieval/`.

* `embeddings-<model>.bin`: the embedding cache (sha256 of document text -> vector), so a
  restart or a re-list embeds only what changed.
* `snapshot-<model>.bin` + `hnsw-<model>.idx`: the last published catalog (documents, hnsw
  labels, version) and the dense index, so a restart serves searches before upstreams answer.

Every file is written atomically (temp file, fsync, rename, fsync of the folder) and carries a
SHA-256 of its body that is checked on load; a mismatch raises CorruptFile and the caller
rebuilds, and so does a file that cannot be read (a directory or a FIFO in its place: files
are opened without blocking and must be regular, see paths.open_regular; the write of the
rebuilt file moves such a thing aside first, see `_replace`). This module is the file format only; store.py decides what is written and read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import re
import struct
import sys
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from toolatlas.catalog.schemas import intern_schema
from toolatlas.paths import open_regular, read_regular, set_aside_unless_regular
from toolatlas.retrieval.documents import ToolDoc

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from toolatlas.retrieval.hnsw import HnswStore

_EMB_MAGIC = b"TAEMB01\n"
_SNAP_MAGIC = b"TASNP01\n"
_HDR = struct.Struct("<I")


class CorruptFile(Exception):
    """A persisted file failed its integrity check."""


def _slug(model: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "_", model)


def folder(state_dir: Path) -> Path:
    return Path(state_dir) / "retrieval"


_TEMP_RE = re.compile(r"^\..+\.(\d+)\.tmp$")


def remove_stale_temps(state_dir: Path) -> list[str]:
    """Delete the temp files of writers that died mid-write (a SIGKILL inside atomic_write
    leaves `.NAME.PID.tmp` behind). A file whose PID is still alive is left alone: another
    process may be writing it. Returns the names removed."""
    removed: list[str] = []
    try:
        entries = list(folder(state_dir).iterdir())
    except OSError:
        return removed
    for entry in entries:
        m = _TEMP_RE.match(entry.name)
        if m is None or _pid_alive(int(m.group(1))):
            continue
        try:
            entry.unlink()
            removed.append(entry.name)
        except OSError:
            pass
    return removed


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace(tmp: Path, path: Path) -> None:
    """Rename the written `tmp` to `path`, first moving aside what is at `path` if it is not
    a regular file (a directory or a FIFO: the rename onto it would fail at every write, and
    the file would never be rebuilt). OSError if either cannot be done."""
    aside = set_aside_unless_regular(path, time.time())
    if aside is not None:
        log.warning("retrieval.state_file_unusable %s is not a regular file; moved to %s so the rebuilt file "
                    "takes its place", path, aside)
    os.replace(tmp, path)


def atomic_write(path: Path, chunks: list[bytes]) -> None:
    """Write `chunks` to `path` via a temp file + fsync + rename + fsync of the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            for c in chunks:
                fh.write(c)
            fh.flush()
            os.fsync(fh.fileno())
        _replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(path.parent)


def _pack(magic: bytes, header: dict[str, Any], body: list[bytes]) -> list[bytes]:
    h = hashlib.sha256()
    for b in body:
        h.update(b)
    header = {**header, "sha256": h.hexdigest()}
    hb = json.dumps(header, sort_keys=True).encode()
    return [magic, _HDR.pack(len(hb)), hb, *body]


def _unpack(path: Path, magic: bytes) -> tuple[dict[str, Any], memoryview] | None:
    try:
        raw = read_regular(path)
    except FileNotFoundError:
        return None
    except OSError as exc:  # a directory or FIFO in its place, no permission: rebuilt like corruption
        raise CorruptFile(f"{path} cannot be read: {exc.strerror or exc}") from exc
    if not raw.startswith(magic) or len(raw) < len(magic) + _HDR.size:
        raise CorruptFile(f"{path} does not start with the expected header")
    (hlen,) = _HDR.unpack_from(raw, len(magic))
    start = len(magic) + _HDR.size
    try:
        header = json.loads(raw[start : start + hlen])
    except ValueError as exc:
        raise CorruptFile(f"{path} has an unreadable header") from exc
    body = memoryview(raw)[start + hlen :]
    if not isinstance(header, dict) or hashlib.sha256(body).hexdigest() != header.get("sha256"):
        raise CorruptFile(f"{path} failed its checksum")
    return header, body


def embeddings_path(state_dir: Path, model: str) -> Path:
    return folder(state_dir) / f"embeddings-{_slug(model)}.bin"


# The embedding files mapped into memory (load_embeddings, save_embeddings): their vectors
# are views of the mapping, read from the page cache on use. `release_pages` drops this
# process's resident pages of them (the kernel keeps its cache), so a vector read once (a
# snapshot copying the live ones, a write reading the kept ones) does not stay in its RSS.
_MAPPED: weakref.WeakSet[mmap.mmap] = weakref.WeakSet()


def release_pages() -> None:
    """Unmap the resident pages of every mapped embedding file (they are read again from the
    page cache or the disk when used). Cheap; never raises."""
    for mm in list(_MAPPED):
        try:
            mm.madvise(mmap.MADV_DONTNEED)
        except (OSError, ValueError, AttributeError):  # closed, or no madvise on this platform
            pass


def is_mapped(vec: np.ndarray) -> bool:
    """Whether `vec` is a view of a mapped embedding file (file-backed, not heap memory)."""
    base = vec.base
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)


def save_embeddings(state_dir: Path, model: str, vec_of: dict[bytes, np.ndarray]) -> dict[bytes, np.ndarray]:
    """Write the cache; returns its vectors as views of the file just written (mapped, not
    copied: the caller can drop its own copies of them)."""
    keys = list(vec_of)
    mat = np.stack([vec_of[k] for k in keys]).astype(np.float32) if keys else np.empty((0, 0), np.float32)
    body = [b"".join(keys), mat.tobytes()]
    dim = int(mat.shape[1]) if keys else 0
    del mat
    header = {"model": model, "count": len(keys), "dim": dim}
    chunks = _pack(_EMB_MAGIC, header, body)
    path = embeddings_path(state_dir, model)
    atomic_write(path, chunks)
    if not keys:
        return {}
    start = sum(len(c) for c in chunks[:3]) + len(keys) * 32
    del chunks, body
    try:
        with open_regular(path) as fh:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as exc:  # a filesystem without mmap: the caller keeps its copies
        log.warning("retrieval.embeddings_not_mapped path=%s error=%s", path, exc)
        return dict(vec_of)
    return _views(mm, keys, start, dim)


def _views(mm: mmap.mmap, keys: list[bytes], start: int, dim: int) -> dict[bytes, np.ndarray]:
    _MAPPED.add(mm)
    mat = np.frombuffer(mm, dtype=np.float32, count=len(keys) * dim, offset=start).reshape(len(keys), dim)
    return {k: mat[i] for i, k in enumerate(keys)}


def load_embeddings(state_dir: Path, model: str, dim: int) -> dict[bytes, np.ndarray]:
    """The persisted cache, {} if there is none; CorruptFile if it fails its checks.

    The file is checked by reading it in blocks, then mapped: the vectors are read-only
    views of the mapping (page cache, not heap), so a cache of older vectors several times
    the catalog costs no memory until one is used (see release_pages)."""
    path = embeddings_path(state_dir, model)
    try:
        fh = open_regular(path)
    except FileNotFoundError:
        return {}
    except OSError as exc:  # a directory or FIFO in its place, no permission: rebuilt like corruption
        raise CorruptFile(f"{path} cannot be read: {exc.strerror or exc}") from exc
    with fh:
        header, start = _check_streamed(fh, path, _EMB_MAGIC)
        n = header.get("count")
        if header.get("model") != model or not isinstance(n, int) or (n and header.get("dim") != dim):
            raise CorruptFile(f"{path} is for another model or has a bad header")
        if os.fstat(fh.fileno()).st_size - start != n * 32 + n * dim * 4:
            raise CorruptFile(f"{path} has the wrong size")
        if not n:
            return {}
        fh.seek(start)
        raw = fh.read(n * 32)
        keys = [raw[i * 32 : (i + 1) * 32] for i in range(n)]
        try:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:  # a filesystem without mmap: read it into memory
            log.warning("retrieval.embeddings_not_mapped path=%s error=%s", path, exc)
            mat = np.frombuffer(fh.read(), dtype=np.float32).reshape(n, dim)
            return {k: mat[i] for i, k in enumerate(keys)}
    return _views(mm, keys, start + n * 32, dim)


def _check_streamed(fh: Any, path: Path, magic: bytes) -> tuple[dict[str, Any], int]:
    """(header, offset of the body) of an open file whose body's SHA-256 is checked by
    reading it in blocks (the file is never held in memory whole); CorruptFile otherwise."""
    head = fh.read(len(magic) + _HDR.size)
    if not head.startswith(magic) or len(head) < len(magic) + _HDR.size:
        raise CorruptFile(f"{path} does not start with the expected header")
    (hlen,) = _HDR.unpack_from(head, len(magic))
    try:
        header = json.loads(fh.read(hlen))
    except ValueError as exc:
        raise CorruptFile(f"{path} has an unreadable header") from exc
    h = hashlib.sha256()
    for block in iter(lambda: fh.read(1 << 20), b""):
        h.update(block)
    if not isinstance(header, dict) or h.hexdigest() != header.get("sha256"):
        raise CorruptFile(f"{path} failed its checksum")
    return header, len(magic) + _HDR.size + hlen


@dataclass(frozen=True)
class Restored:
    version: int
    docs: list[ToolDoc]
    labels: list[int]
    next_label: int
    hnsw_path: Path | None  # None when there is no usable dense index on disk
    basis: np.ndarray | None = None  # the hnswlib file's basis (HnswStore), None: it holds the vectors
    basis_energy: float = 1.0  # HnswStore.fit_energy of that basis


def _snap_paths(state_dir: Path, model: str) -> tuple[Path, Path]:
    d = folder(state_dir)
    return d / f"snapshot-{_slug(model)}.bin", d / f"hnsw-{_slug(model)}.idx"


def _file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with open_regular(path) as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save_snapshot(
    state_dir: Path, model: str, *, version: int, docs: list[ToolDoc], labels: list[int], hnsw: "HnswStore | None"
) -> None:
    snap_path, hnsw_path = _snap_paths(state_dir, model)
    hnsw_sha = None
    next_label = 0
    if hnsw is not None:
        hnsw_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = hnsw_path.with_name(f".{hnsw_path.name}.{os.getpid()}.tmp")
        try:
            hnsw.save(tmp)
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            hnsw_sha = _file_sha(tmp)
            _replace(tmp, hnsw_path)
        finally:
            if tmp.exists():
                tmp.unlink()
        next_label = hnsw.next_label
    basis = hnsw.basis if hnsw is not None else None
    body = _encode({"docs": docs, "labels": labels, "basis": basis.tobytes() if basis is not None else None})
    header = {"model": model, "version": version, "next_label": next_label, "hnsw_sha256": hnsw_sha,
              "basis_shape": list(basis.shape) if basis is not None else None,
              "basis_energy": hnsw.fit_energy if hnsw is not None else None}
    atomic_write(snap_path, _pack(_SNAP_MAGIC, header, [body]))


def _encode(payload: dict[str, Any]) -> bytes:
    """The snapshot body. MessagePack holds integers of 64 bits at most; a schema with a wider
    one (`"maximum": 2**256 - 1`, a token amount) made the write raise OverflowError out of
    the catalog update, and the upstream's tools never became searchable. Such an integer is
    kept as the nearest float (a snapshot serves only until the upstream lists again)."""
    try:
        return msgspec.msgpack.encode(payload)
    except OverflowError:
        docs = [msgspec.structs.replace(d, input_schema=_narrowed(d.input_schema)) for d in payload["docs"]]
        return msgspec.msgpack.encode({**payload, "docs": docs})


def _narrowed(value: Any) -> Any:
    """`value` with every integer MessagePack cannot hold (beyond 64 bits) made a float."""
    if isinstance(value, dict):
        return {k: _narrowed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_narrowed(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        return float(value)
    return value


def _interned(doc: ToolDoc) -> ToolDoc:
    """`doc` with its strings and schema shared with the records the first listing after a
    restart makes of the same tools (catalog.model: interned the same way)."""
    return ToolDoc(
        name=sys.intern(doc.name), server=sys.intern(doc.server), tool=sys.intern(doc.tool),
        description=sys.intern(doc.description), input_schema=intern_schema(doc.input_schema),
        server_summary=sys.intern(doc.server_summary), tags=doc.tags,
    )


def load_snapshot(state_dir: Path, model: str) -> Restored | None:
    """The persisted snapshot or None; CorruptFile if the snapshot file fails its checks.

    A missing or mismatching hnsw file is not an error: `hnsw_path` is then None.
    """
    snap_path, hnsw_path = _snap_paths(state_dir, model)
    got = _unpack(snap_path, _SNAP_MAGIC)
    if got is None:
        return None
    header, body = got

    try:
        raw = msgspec.msgpack.decode(body)
        docs = [_interned(d) for d in msgspec.convert(raw["docs"], list[ToolDoc])]
        labels = msgspec.convert(raw["labels"], list[int])
        basis = _basis(raw.get("basis"), header.get("basis_shape"))
        basis_energy = float(header.get("basis_energy") or 1.0)
        # the header is outside the checksum: a field it mangled is a corrupt file, not a crash at start
        version, next_label = int(header.get("version", 0)), int(header.get("next_label", 0))
    except (msgspec.DecodeError, msgspec.ValidationError, KeyError, TypeError, ValueError) as exc:
        raise CorruptFile(f"{snap_path} has an undecodable body or header ({exc})") from exc
    if len(docs) != len(labels):
        raise CorruptFile(f"{snap_path} is inconsistent")
    usable = None
    sha = header.get("hnsw_sha256")
    try:
        if sha and _file_sha(hnsw_path) == sha:
            usable = hnsw_path
        elif sha:
            log.warning("index.hnsw_corrupt path=%s: the dense index file failed its checksum; "
                        "it is rebuilt from the embedding cache", hnsw_path)
    except FileNotFoundError:
        log.warning("index.hnsw_missing path=%s: the dense index is rebuilt from the embedding cache", hnsw_path)
    except OSError as exc:
        log.warning("index.hnsw_corrupt path=%s: cannot be read (%s); the dense index is rebuilt from the "
                    "embedding cache", hnsw_path, exc.strerror or exc)
    return Restored(
        version=version,
        docs=docs,
        labels=labels,
        next_label=next_label,
        hnsw_path=usable,
        basis=basis,
        basis_energy=basis_energy,
    )


def _basis(raw: object, shape: object) -> np.ndarray | None:
    """The snapshot's hnswlib basis (float32, `shape`); None for a file written without one."""
    if raw is None:
        return None
    if not isinstance(raw, bytes) or not (isinstance(shape, list) and len(shape) == 2):
        raise ValueError("a malformed basis")
    rows, cols = (int(x) for x in shape)
    return np.frombuffer(raw, dtype=np.float32).reshape(rows, cols).copy()
