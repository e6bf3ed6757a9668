"""`toolatlas learning show TOOL|forget TOOL|reset [--config PATH]`: the usage store
(state_dir/learning.sqlite3) as an operator sees it.

`show` lists the queries that led to TOOL (the 20 most frequent, with counts and when last
seen); `forget` deletes TOOL's events; `reset` deletes every event, query text included.
They open the store directly (a running daemon notices within a second and re-ranks). With
`[store] url` (replicas sharing state), `forget` and `reset` also delete the shared copies
and tell every replica to delete its own (store/wiring.py); `show` reads this host's store."""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from toolatlas.config import Config
    from toolatlas.retrieval.usage import SqliteUsageStore

EX_CONFIG = 78
EX_IOERR = 74  # the usage store cannot be opened or written
EX_UNAVAILABLE = 69  # the shared store ([store] url) cannot be reached
SHOWN = 20


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="toolatlas learning", description="Inspect or wipe what search learned from use.")
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in (("show", "the queries that lead to TOOL (top 20)"), ("forget", "drop TOOL's usage events")):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("tool", metavar="TOOL", type=_tool_name, help="namespaced tool name, e.g. notes__add_note")
    sub.add_parser("reset", help="delete every usage event (the ranking is zero-shot again)")
    for sp in sub.choices.values():
        sp.add_argument("--config", help="config file (default: $TOOLATLAS_CONFIG, else ~/.config/toolatlas/config.toml)")
        sp.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args(argv)

    from toolatlas.config import load
    from toolatlas.errors import ConfigError
    from toolatlas.paths import default_config_path
    from toolatlas.retrieval.usage import FILENAME, open_store

    path = args.config or os.environ.get("TOOLATLAS_CONFIG") or default_config_path()
    try:
        cfg = load(path)
    except (ConfigError, OSError) as exc:
        print(f"toolatlas learning: {exc}", file=sys.stderr)
        return EX_CONFIG
    state_dir = Path(cfg.daemon.state_dir)
    until = time.time()  # the events recorded up to now are forgotten, on every replica
    out: dict[str, object]
    try:
        # No store: nothing to show or delete, and none is made (made by root, the file would be
        # root's and the daemon's user could not open it). A state_dir the operator may not
        # enter fails here (PermissionError), said as below.
        if not (state_dir / FILENAME).exists():
            out = {"tool": args.tool, "events": 0, "queries": []} if args.action == "show" else \
                {"tool": args.tool, "forgotten": 0} if args.action == "forget" else \
                {"reset": 0, "store": str(state_dir / FILENAME)}
        else:
            store = open_store(state_dir)
            try:
                out = _act(args, store, time.time() - cfg.learning.retention_days * 86400.0)
            finally:
                store.close()
        if args.action == "reset":
            out["moved_aside_deleted"] = _delete_moved_aside(state_dir / FILENAME)
    except (sqlite3.Error, OSError) as exc:  # not a database, a directory, a read-only or full disk, locked
        print(f"toolatlas learning: cannot use the usage store {state_dir / FILENAME}: {exc}", file=sys.stderr)
        return EX_IOERR
    if cfg.store.url and args.action != "show":
        from toolatlas.errors import ToolatlasError

        try:
            out["shared"] = _forget_shared(cfg, args.tool if args.action == "forget" else None, until)
        except ToolatlasError as exc:
            _print(out, args.json)
            print(f"toolatlas learning: done in this host's store only: {exc}. The shared store and the "
                  "other replicas keep the events; run this again when the store answers.", file=sys.stderr)
            return EX_UNAVAILABLE
    _print(out, args.json)
    return 0


def _tool_name(text: str) -> str:
    """TOOL as given; an empty or blank one is refused (it printed ": 0 usage event(s)")."""
    if not text.strip():
        raise argparse.ArgumentTypeError("TOOL is empty; give a namespaced tool name, e.g. notes__add_note")
    return text


def _forget_shared(cfg: Config, tool: str | None, until: float) -> int:
    """Delete the shared usage events of `tool` (None: every tool) up to `until` and tell every
    replica to delete its copies; how many shared events were deleted. StoreDown (a
    ToolatlasError naming the operation) when the database does not answer."""
    import socket

    import anyio

    from toolatlas.config import secrets
    from toolatlas.redact import Redactor
    from toolatlas.store.client import Store

    async def go() -> int:
        store = Store(cfg.store.url, origin=f"cli:{socket.gethostname()}:{os.getpid()}",
                      connect_timeout=cfg.store.connect_timeout, redactor=Redactor(secrets(cfg)))
        await store.connect()
        try:
            await store.migrate()  # a database no replica has used yet has no tables
            return await store.forget_feedback(tool, until)
        finally:
            await store.close()

    return anyio.run(go)


def _delete_moved_aside(path: Path) -> int:
    """Delete the copies of unreadable stores the daemon moved aside (`<name>.corrupt-<time>`,
    gateway/learning.py): they hold users' queries too, past any retention, and `reset`
    promises every query gone. How many stores (not counting their -wal and -shm)."""
    n = 0
    for aside in path.parent.glob(f"{path.name}.corrupt-*"):
        aside.unlink()
        n += not aside.name.endswith(("-wal", "-shm"))
    return n


def _act(args: argparse.Namespace, store: SqliteUsageStore, since: float) -> dict[str, object]:
    """`since`: the oldest time within retention_days (older events no longer count, though
    the daemon may not have pruned them yet)."""
    if args.action == "reset":
        return {"reset": store.reset(), "store": str(store.path)}
    if args.action == "forget":
        if not (forgotten := store.forget_tool(args.tool)):
            _hint(store, args.tool, since)
        return {"tool": args.tool, "forgotten": forgotten}
    events = [e for e in store.events(since) if e.tool == args.tool]
    if not events:
        _hint(store, args.tool, since)
    counts = Counter(e.query for e in events)
    last: dict[str, float] = {}
    for e in events:  # the latest time, not the latest stored: another replica's events come late
        last[e.query] = max(last.get(e.query, e.at), e.at)
    rows = [{"query": q, "count": n, "last": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(last[q]))}
            for q, n in counts.most_common(SHOWN)]
    return {"tool": args.tool, "events": len(events), "queries": rows}


def _hint(store: SqliteUsageStore, tool: str, since: float) -> None:
    """No events of `tool`: say which tools have some, on stderr, or a misspelt name (one
    underscore, no server prefix) reads as done ("0 forgotten") while the events stay."""
    known = Counter(e.tool for e in store.events(since))
    if known:
        names = ", ".join(f"{t} ({n})" for t, n in known.most_common(10))
        more = f" and {len(known) - 10} more" if len(known) > 10 else ""
        print(f"toolatlas learning: no usage events of {_shown(tool)}; tools with events: {names}{more}",
              file=sys.stderr)


def _print(obj: dict[str, object], as_json: bool) -> None:
    if as_json:
        print(json.dumps(obj))
        return
    if "queries" in obj:
        print(f"{obj['tool']}: {obj['events']} usage event(s)")
        for row in obj["queries"]:  # type: ignore[attr-defined]
            print(f"  {row['count']:>5}  {row['last']}  {_shown(row['query'])}")
    elif "forgotten" in obj:
        print(f"{obj['tool']}: {obj['forgotten']} usage event(s) forgotten")
    else:
        aside = f" (and {obj['moved_aside_deleted']} unreadable copy(ies) moved aside)" if obj["moved_aside_deleted"] else ""
        print(f"{obj['reset']} usage event(s) deleted from {obj['store']}{aside}")
    if "shared" in obj:
        print(f"{obj['shared']} deleted from the shared store; every replica deletes its copies")


def _shown(text: str) -> str:
    """`text` for a terminal: a query is any principal's words, and a control character in it
    (an escape sequence, a carriage return, a newline, a bidi override) would act on the
    operator's terminal or forge lines of this list; each one is written as its escape."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
