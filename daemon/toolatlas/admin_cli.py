"""`toolatlas upstream list|restart NAME|relist NAME|approve NAME|reject NAME` and `toolatlas reload`: the operator
commands, sent over the daemon's socket as `toolatlas/*` JSON-RPC requests (surface.admin).
The daemon serves them to the user it runs as and to root only.

Exit status: 0 done; 1 it ran and failed (a restart that did not come back, an upstream
with no session to re-list); 64 an unknown upstream (or approve/reject with require_approval
off); 69 no daemon on the socket (or none that answers the handshake within
HANDSHAKE_TIMEOUT_S); 77 not the daemon's owner; 78 a reload refused (the config is invalid
or needs a restart for a key).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from toolatlas.paths import client_socket

EX_FAILED = 1
EX_USAGE = 64
EX_UNAVAILABLE = 69
EX_NOPERM = 77
EX_CONFIG = 78
# JSON-RPC error codes of surface.admin (not imported: it would pull in the SDK).
_FORBIDDEN = -32003
_INVALID_PARAMS = -32602
# Seconds the CLI waits for an answer; the daemon bounds every command well inside it.
ANSWER_TIMEOUT_S = 900.0
# Seconds it waits for the handshake's answer, which a working daemon gives at once (as long
# as search/status wait for theirs): a wedged daemon is exit 69 after this, not 15 minutes.
HANDSHAKE_TIMEOUT_S = 120.0


def _client_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--socket", help="daemon socket (default: $TOOLATLAS_SOCKET, config, runtime dir)")
    p.add_argument("--config", help="read the socket path from this config")
    p.add_argument("--json", action="store_true", help="print the raw JSON result")


# action -> (JSON-RPC method, takes NAME, help).
UPSTREAM_ACTIONS: dict[str, tuple[str, bool, str]] = {
    "list": ("toolatlas/upstream/list", False, "each upstream: transport, state, tools, pid, last error"),
    "restart": ("toolatlas/upstream/restart", True, "restart an upstream's session (a stdio server's process) and "
                "wait until it is back or failed"),
    "relist": ("toolatlas/upstream/relist", True, "fetch an upstream's tools/list now and show what changed"),
    "approve": ("toolatlas/upstream/approve", True, "let an upstream serve ([daemon] require_approval): its tools "
                "become searchable and callable"),
    "reject": ("toolatlas/upstream/reject", True, "keep an upstream off ([daemon] require_approval): it serves "
               "nothing until approved"),
}


def upstream_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="toolatlas upstream",
        description="Operator commands on the running daemon's upstreams (for the user the daemon runs as, or root).")
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, (_method, named, text) in UPSTREAM_ACTIONS.items():
        s = sub.add_parser(action, help=text, description=text)
        if named:
            s.add_argument("name", help="the upstream's name (`toolatlas upstream list` shows them)")
        _client_opts(s)
    return p


def reload_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="toolatlas reload",
        description="Make the running daemon re-read its config file, as SIGHUP does, and say what it applied "
                    "(for the user the daemon runs as, or root).")
    _client_opts(p)
    return p


def upstream_main(argv: list[str]) -> int:
    args = upstream_parser().parse_args(argv)
    method, named, _ = UPSTREAM_ACTIONS[args.action]
    params = {"name": args.name} if named else {}
    printers: dict[str, Callable[[dict[str, Any]], int]] = {
        "list": _print_list, "restart": _print_restart, "relist": _print_relist,
        "approve": _print_decision, "reject": _print_decision,
    }
    return _run(args, method, params, printers[args.action])


def reload_main(argv: list[str]) -> int:
    args = reload_parser().parse_args(argv)
    return _run(args, "toolatlas/reload", {}, _print_reload)


def _run(args: argparse.Namespace, method: str, params: dict[str, Any],
         show: Callable[[dict[str, Any]], int]) -> int:
    from toolatlas.errors import ConfigError
    from toolatlas.surface.rawclient import RawClient, RpcError

    try:
        path = client_socket(args.socket, args.config)
    except ConfigError as exc:
        print(f"toolatlas: config error: {exc}", file=sys.stderr)
        return EX_CONFIG
    try:
        client = RawClient(path, timeout=ANSWER_TIMEOUT_S, handshake_timeout=HANDSHAKE_TIMEOUT_S)
    except (ConnectionError, OSError, RpcError) as exc:
        print(f"toolatlas: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE
    with client:
        try:
            result = client.request(method, params)
        except RpcError as exc:
            print(f"toolatlas: {exc}", file=sys.stderr)
            return {_FORBIDDEN: EX_NOPERM, _INVALID_PARAMS: EX_USAGE}.get(exc.code, EX_FAILED)
        except (ConnectionError, OSError) as exc:
            print(f"toolatlas: {exc}", file=sys.stderr)
            return EX_FAILED
    code = show(result) if not args.json else _status_of(method, result)
    if args.json:
        print(json.dumps(result, indent=2))
    return code


def _status_of(method: str, result: dict[str, Any]) -> int:
    if method.endswith("/restart") and not result.get("ok"):
        return EX_FAILED
    if method == "toolatlas/reload" and not result.get("applied"):
        return EX_CONFIG
    return 0


def _ago(at: float | None) -> str:
    if at is None:
        return ""
    seconds = max(0.0, time.time() - at)
    if seconds < 120:
        return f" ({seconds:.0f} s ago)"
    if seconds < 7200:
        return f" ({seconds / 60:.0f} min ago)"
    return f" ({seconds / 3600:.1f} h ago)"


def _print_list(result: dict[str, Any]) -> int:
    ups = result.get("upstreams", [])
    if not ups:
        print("no upstreams configured")
        return 0
    rows = [("NAME", "TRANSPORT", "STATE", "TOOLS", "PID", "APPROVAL", "LAST ERROR")]
    for u in ups:
        state = u["state"]
        if u.get("next_retry_in") is not None:
            state += f" (retry in {u['next_retry_in']:.0f} s)"
        error = u.get("last_error") or u.get("reason")
        when = _ago(u.get("last_error_at")) if u.get("last_error") else ""
        pid = str(u["pid"]) if u.get("pid") is not None else "-"
        rows.append((u["name"], u["transport"], state, str(u["tools"]), pid, str(u.get("approval", "-")),
                     (error or "-") + when))
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    for r in rows:
        print(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]:>{widths[3]}}  "
              f"{r[4]:>{widths[4]}}  {r[5]:<{widths[5]}}  {r[6]}")
    return 0


def _print_restart(result: dict[str, Any]) -> int:
    up = result["upstream"]
    was = f" (was {result['previous_pid']})" if result.get("previous_pid") is not None else ""
    pid = f", pid {up['pid']}{was}" if up.get("pid") is not None else ""
    if result.get("ok"):
        print(f"{up['name']}: restarted; {up['state']} with {up['tools']} tools{pid}")
        return 0
    print(f"toolatlas: {up['name']}: restart failed: {up['state']}: {result.get('error')}", file=sys.stderr)
    return EX_FAILED


def _print_relist(result: dict[str, Any]) -> int:
    added, removed, changed = result["added"], result["removed"], result["changed"]
    if not (added or removed or changed):
        print(f"{result['upstream']}: {result['tools']} tools; no change")
        return 0
    print(f"{result['upstream']}: {result['tools']} tools; {len(added)} added, {len(removed)} removed, "
          f"{len(changed)} changed")
    for mark, names in (("+", added), ("-", removed), ("~", changed)):
        for name in names:
            print(f"  {mark} {name}")
    return 0


def _print_decision(result: dict[str, Any]) -> int:
    was = result.get("previous")
    print(f"{result['upstream']}: {result['approval']}" + (f" (was {was})" if was != result["approval"] else
                                                          " (unchanged)"))
    return 0


def _print_reload(result: dict[str, Any]) -> int:
    if not result.get("applied"):
        print(f"toolatlas: reload refused; the daemon keeps its running config: {result.get('error')}",
              file=sys.stderr)
        return EX_CONFIG

    def names(key: str) -> str:
        return ", ".join(result.get(key) or []) or "none"

    print(f"reloaded {result.get('config')}: upstreams added: {names('added')}; removed: {names('removed')}; "
          f"changed: {names('changed')}")
    if result.get("restart_needed"):
        print(f"these keys take effect only after a restart: {names('restart_needed')}")
    return 0


__all__ = ["reload_main", "upstream_main"]
