"""`adopt --rewrite-client`: the client file with its adopted servers replaced by one
toolatlas shim entry, a byte-identical timestamped backup beside it, and `adopt --undo`.

Every other key of the file is kept (same order; the indentation is taken from the file). In
a JSON-with-comments file only the entries that change are edited (adopt/jsonc.py): comments
beside them and commented-out entries stay, comments inside a replaced entry go with it (the
backup keeps them, and the CLI says so).
"""

from __future__ import annotations

import codecs
import copy
import datetime as _dt
import json
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

from toolatlas.adopt.clients import AdoptError, ClientFile, ClientKind
from toolatlas.adopt.convert import Adoption, is_toolatlas_shim
from toolatlas.adopt.jsonc import Edit, edit_tables
from toolatlas.paths import read_regular, write_atomic

BACKUP_INFIX = ".toolatlas-backup-"
_BACKUP_RE = re.compile(r"^(?P<orig>.+)\.toolatlas-backup-\d{8}T\d{6}Z(?:-\d+)?$")
_TYPED = (ClientKind.VSCODE, ClientKind.CLAUDE_CODE_PROJECT, ClientKind.CLAUDE_CODE_USER)


def shim_command() -> list[str]:
    """How a client launches this toolatlas: the `toolatlas` script beside this Python (a
    venv or pipx install), else `python -m toolatlas`; absolute either way (clients do not
    search the user's shell PATH)."""
    script = Path(sys.executable).parent / "toolatlas"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [os.path.abspath(sys.executable), "-m", "toolatlas"]


def shim_entry(kind: ClientKind, config: Path) -> dict[str, Any]:
    command, *pre = shim_command()
    entry: dict[str, Any] = {"type": "stdio"} if kind in _TYPED else {}
    entry.update(command=command, args=[*pre, "shim", "--config", str(config.resolve())])
    return entry


def _indent(raw: bytes) -> int | str:
    m = re.search(rb"\n([ \t]+)\S", raw)
    if m is None:
        return 2
    lead = m.group(1).decode()
    return "\t" if lead.startswith("\t") else len(lead)


def rewritten(adoption: Adoption, config: Path) -> tuple[bytes, str]:
    """The new client file (bytes) and the name its toolatlas entry got."""
    src: ClientFile = adoption.source
    data = copy.deepcopy(src.data)
    for where in adoption.replaced:
        holder: Any = data
        for key in where[:-1]:
            holder = holder[key]
        holder.pop(where[-1], None)
    table: Any = data
    for key in src.servers_table:
        table = table.setdefault(key, {})
    name = next(n for n in ("toolatlas", "toolatlas-gateway", *(f"toolatlas-{i}" for i in range(2, 100)))
                if n not in table)
    table[name] = shim_entry(src.kind, config)
    indent = _indent(src.raw)
    # A UTF-8 byte order mark (Windows editors write one) was read past: edit past it, keep it.
    bom = codecs.BOM_UTF8 if src.raw.startswith(codecs.BOM_UTF8) else b""
    # Line ends as the file has them: a file saved with CRLF (Windows) keeps CRLF in what is new.
    crlf = b"\r\n" in src.raw

    def out(text: str) -> bytes:
        return bom + (re.sub(r"(?<!\r)\n", "\r\n", text) if crlf else text).encode()

    if src.had_comments:
        tables = {tuple(w[:-1]) for w in adoption.replaced} | {tuple(src.servers_table)}
        edits: dict[tuple[str, ...], Edit] = {t: (frozenset(w[-1] for w in adoption.replaced if tuple(w[:-1]) == t),
                                                  (name, table[name]) if t == tuple(src.servers_table) else None)
                                              for t in tables}
        edited = edit_tables(src.raw[len(bom):].decode(), edits, indent)
        if edited is not None:
            return out(edited), name
    text = json.dumps(data, indent=indent, ensure_ascii=False)
    return out(text + ("\n" if src.raw.endswith(b"\n") else "")), name


def _backup(real: Path, data: bytes, now: _dt.datetime) -> Path:
    """A new file beside `real` holding `data`, with its mode; never overwrites one."""
    stamp = now.astimezone(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    mode = stat.S_IMODE(os.stat(real).st_mode)
    for i in range(1, 100):
        path = real.with_name(f"{real.name}{BACKUP_INFIX}{stamp}" + (f"-{i}" if i > 1 else ""))
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        except FileExistsError:
            continue
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(path, mode)  # the umask may have narrowed it
        return path
    raise AdoptError(f"cannot find a free backup name beside {real}")


def check_same_config(source: ClientFile, config: Path) -> None:
    """AdoptError when the client file already launches the toolatlas shim with another
    `--config`: rewriting would point that entry at `config`, and the client would lose the
    servers adopted into the other one."""
    for entry in source.entries:
        args = entry.spec.get("args") if isinstance(entry.spec, dict) and is_toolatlas_shim(entry.spec) else None
        if not isinstance(args, list) or "--config" not in args[:-1]:
            continue
        other = args[args.index("--config") + 1]
        if not isinstance(other, str):
            continue
        if Path(other).expanduser().resolve() != config.resolve():
            raise AdoptError(f"{entry.label} already runs the toolatlas shim with --config {other}; nothing was "
                             f"written: adopt into that config (--out {other}), or remove that entry first")


def check_writable(path: Path) -> None:
    """AdoptError when the client file (through a symlink) is read-only: no write bit for
    anyone (root may write it anyway), or not writable for this user. A rewrite replaces the
    file, which a read-only mode would not stop; the user made it read-only for a reason."""
    real = Path(os.path.realpath(path))
    try:
        mode = stat.S_IMODE(os.stat(real).st_mode)
    except OSError as exc:
        raise AdoptError(f"cannot read {str(real)!r} again: {exc.strerror or exc}") from exc
    if not mode & 0o222 or not os.access(real, os.W_OK):
        raise AdoptError(f"{path} is read-only (mode {mode:04o}); nothing was written: make it writable "
                         f"(chmod u+w) to have it rewritten, or adopt without --rewrite-client")


def apply(adoption: Adoption, new: bytes, *, now: _dt.datetime | None = None) -> Path:
    """Back the client file up, then replace it with `new`; returns the backup's path.

    A symlinked file (dotfiles) is written through the link. Raises AdoptError when the file
    changed since it was read (the client wrote it meanwhile): nothing is written then.
    """
    src = adoption.source
    real = Path(os.path.realpath(src.path))
    check_writable(src.path)
    try:
        current = read_regular(real)
    except OSError as exc:
        raise AdoptError(f"cannot read {str(real)!r} again: {exc.strerror or exc}") from exc
    if current != src.raw:
        raise AdoptError(f"{src.path} changed while it was being adopted (is the client writing it?); "
                         "nothing was rewritten: run adopt again")
    try:
        backup = _backup(real, current, now or _dt.datetime.now(_dt.timezone.utc))
        write_atomic(real, new)
    except OSError as exc:
        raise AdoptError(f"cannot rewrite {str(real)!r}: {exc.strerror or exc}") from exc
    return backup


def original_of(backup: Path) -> Path:
    m = _BACKUP_RE.match(backup.name)
    if m is None:
        raise AdoptError(f"{backup} is not a backup made by `toolatlas adopt` "
                         f"(its name would be FILE{BACKUP_INFIX}YYYYMMDDTHHMMSSZ)")
    return backup.with_name(m.group("orig"))


def undo(backup: str | os.PathLike[str], *, now: _dt.datetime | None = None) -> tuple[Path, Path | None]:
    """Put the bytes (and mode) of `backup` back in the file it was made from. Returns that
    path, and where the file's bytes before the undo were kept (None when they were the
    backup's already, or there was no file): what the client or the user wrote there since
    the rewrite is not lost."""
    b = Path(backup)
    target = original_of(b)
    try:
        data = read_regular(b)
        try:
            current: bytes | None = read_regular(target)
        except FileNotFoundError:
            current = None
        kept = _backup(target, current, now or _dt.datetime.now(_dt.timezone.utc)) \
            if current is not None and current != data else None
        write_atomic(target, data, stat.S_IMODE(os.stat(b).st_mode))
    except OSError as exc:
        raise AdoptError(f"cannot restore {target} from {b}: {exc.strerror or exc}") from exc
    return target, kept
