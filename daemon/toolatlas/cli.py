"""The `toolatlas` command line (see the interface). Imports are lazy per command: `shim`
must start fast, so nothing heavy is imported before the command is known."""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse

from toolatlas.meta_tools import MAX_TOP_K as TOP_K_MAX
from toolatlas.paths import client_socket

EX_CONFIG = 78
EX_TEMPFAIL = 75  # `search` while the daemon is still starting and found nothing: try again
# Seconds search, call and status wait for each reply of the daemon.
ANSWER_TIMEOUT_S = 120.0

# Subcommands implemented in their own modules: `toolatlas WORD ...` -> module.main(argv).
_DELEGATED = {
    "eval": ("toolatlas.evaluation.cli", "main"),
    "cards": ("toolatlas.catalog.cards_cli", "main"),
    "keygen": ("toolatlas.catalog.cards_cli", "keygen_main"),
    "rift": ("toolatlas.rift.cli", "main"),
    "adopt": ("toolatlas.adopt.cli", "main"),
    "doctor": ("toolatlas.doctor_cli", "main"),
    "upstream": ("toolatlas.admin_cli", "upstream_main"),
    "reload": ("toolatlas.admin_cli", "reload_main"),
    "install": ("toolatlas.install", "main"),
    "stubs": ("toolatlas.stubs.cli", "main"),
    "learning": ("toolatlas.learning_cli", "main"),
}


def _top_k(text: str) -> int:
    """--k as an int in 1..20; argparse turns the ValueError/ArgumentTypeError into a usage error."""
    import argparse

    try:
        k = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {TOP_K_MAX}, got {text!r}") from None
    if not 1 <= k <= TOP_K_MAX:
        raise argparse.ArgumentTypeError(f"must be from 1 to {TOP_K_MAX}, got {k}")
    return k


def _parser() -> argparse.ArgumentParser:
    import argparse

    p = argparse.ArgumentParser(prog="toolatlas", description="MCP tool gateway daemon and tools.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    s = sub.add_parser("serve", help="run the daemon in the foreground")
    s.add_argument("--config", required=True, help="config file (TOML)")

    def client_opts(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--socket", help="daemon socket (default: $TOOLATLAS_SOCKET, config, runtime dir)")
        sp.add_argument("--config", help="read the socket path from this config")
        sp.add_argument("--json", action="store_true", help="print the raw JSON result")

    s = sub.add_parser("shim", help="relay stdio to the daemon socket (what an MCP client launches)")
    s.add_argument("--socket", help="daemon socket (default: $TOOLATLAS_SOCKET, config, runtime dir)")
    s.add_argument("--config", help="the daemon's config: its socket, and the daemon is started when that "
                   "socket does not answer")

    s = sub.add_parser("search", help="one tool_search through the running daemon")
    s.add_argument("query")
    s.add_argument("--k", type=_top_k, default=5, help=f"results (1-{TOP_K_MAX})")
    s.add_argument("--servers", help="comma-separated servers to search")
    client_opts(s)

    s = sub.add_parser("call", help="one execute_tool through the running daemon")
    s.add_argument("name")
    s.add_argument("--args", default="{}", help="arguments as a JSON object")
    client_opts(s)

    s = sub.add_parser("status", help="catalog_status through the running daemon")
    client_opts(s)

    s = sub.add_parser("check-config", help="validate a config file")
    s.add_argument("path")

    for word in _DELEGATED:
        sub.add_parser(word, help=f"see `toolatlas {word} --help`", add_help=False)
    return p


def _shim_args(argv: list[str]) -> SimpleNamespace | None:
    """`shim [--socket P] [--config P]` read without building the parser (~10 ms of the shim's
    start); anything else (--help, a typo) is left to argparse."""
    if not argv or argv[0] != "shim":
        return None
    opts: dict[str, str | None] = {"socket": None, "config": None}
    rest = argv[1:]
    while rest:
        flag, eq, value = rest.pop(0).partition("=")
        name = flag[2:] if flag.startswith("--") else ""
        if name not in opts or opts[name] is not None:
            return None
        if not eq:
            if not rest:
                return None
            value = rest.pop(0)
        opts[name] = value
    return SimpleNamespace(cmd="shim", **opts)


def _shim(args: Any, socket: str) -> int:
    """`toolatlas shim`; with `--config`, one that starts the daemon when nothing answers."""
    from toolatlas.surface.shim import run

    if not args.config:
        return run(socket)
    from toolatlas.errors import ConfigError
    from toolatlas.paths import daemon_path, default_socket_path, default_state_dir
    from toolatlas.surface.autostart import Starter

    try:
        served = daemon_path(args.config, "socket") or default_socket_path()
        state_dir = daemon_path(args.config, "state_dir") or default_state_dir()
    except ConfigError as exc:
        print(f"toolatlas: config error: {exc}", file=sys.stderr)
        return EX_CONFIG
    if args.socket and os.path.abspath(args.socket) != served:
        print(f"toolatlas: --socket {args.socket} is not the socket the daemon of {args.config} listens on "
              f"({served}); drop --socket to use that one", file=sys.stderr)
        return EX_CONFIG
    return run(served, Starter(args.config, served, state_dir))


def _content_json(result: dict[str, Any]) -> Any:
    if result.get("structuredContent") is not None:
        return result["structuredContent"]
    texts = [c.get("text", "") for c in result.get("content", []) if c.get("type") == "text"]
    try:
        return json.loads("".join(texts))
    except ValueError:
        return "".join(texts)


def _call_arguments(given: str) -> dict[str, Any] | str:
    """`call --args` as an object, or why it is not one."""
    try:
        value = json.loads(given)
    except ValueError as exc:
        return f"--args is not valid JSON: {exc}"
    except RecursionError:  # the decoder's nesting limit (hundreds of levels), not a traceback
        return "--args is not valid JSON: nested too deeply to read"
    if not isinstance(value, dict):
        return f"--args must be a JSON object of the tool's arguments, e.g. '{{\"text\": \"hi\"}}'; got {given[:80]}"
    return value


def _client_command(args: Any, path: str) -> int:
    from toolatlas.surface.rawclient import RawClient, RpcError

    call_args = _call_arguments(args.args) if args.cmd == "call" else {}
    if isinstance(call_args, str):  # a usage error: said before any daemon is asked
        print(f"toolatlas: {call_args}", file=sys.stderr)
        return 64
    try:
        client = RawClient(path, timeout=ANSWER_TIMEOUT_S)
    except OSError as exc:  # ConnectionError: unreachable, or refused (a connection cap); or no answer
        print(f"toolatlas: {exc}", file=sys.stderr)
        return 69
    with client:
        try:
            if args.cmd == "search":
                params: dict[str, Any] = {"query": args.query, "top_k": args.k}
                if args.servers:
                    params["servers"] = [s.strip() for s in args.servers.split(",") if s.strip()]
                result = client.call_tool("tool_search", params)
            elif args.cmd == "status":
                result = client.call_tool("catalog_status", {})
            else:
                result = client.call_tool("execute_tool", {"name": args.name, "arguments": call_args})
        except (RpcError, ConnectionError, OSError) as exc:
            print(f"toolatlas: {exc}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(result if args.cmd == "call" else _content_json(result), indent=2))
    else:
        _print_human(args.cmd, result)
    if result.get("isError"):
        return 1
    return EX_TEMPFAIL if args.cmd == "search" and _still_starting(_content_json(result)) else 0


def _still_starting(answer: Any) -> bool:
    """A tool_search answer with no match from a daemon whose index is not ready yet."""
    return isinstance(answer, dict) and not answer.get("matches") and (
        bool(answer.get("waiting_for")) or answer.get("degraded") == "index-not-ready")


def _print_human(cmd: str, result: dict[str, Any]) -> None:
    if result.get("isError") or cmd == "call":
        for c in result.get("content", []):
            print(c.get("text", json.dumps(c)) if c.get("type") == "text" else json.dumps(c))
        return
    data = _content_json(result)
    if cmd == "search":
        waiting = "; ".join(data.get("waiting_for") or ())
        if _still_starting(data):
            print(f"toolatlas is still starting, waiting for: {waiting or 'its index'}. Try again in a few seconds "
                  "(`toolatlas status` shows progress).", file=sys.stderr)
            return
        if data.get("degraded"):
            print(f"(degraded: {data['degraded']})")
        if waiting:
            print(f"(still starting, results may be incomplete; waiting for: {waiting})")
        for i, m in enumerate(data["matches"], 1):
            desc = " ".join((m.get("description") or "").split())
            print(f"{i:2d}. {m['name']}  [{m['score']:.3f}]\n    {desc[:160]}")
        if not data["matches"]:
            print("no matching tools")
    else:
        if data.get("environment"):
            print(f"environment: {data['environment']}")
        for s in data["servers"]:
            reason = f"  ({s['reason']})" if s.get("reason") else ""
            if s.get("approval") in ("pending", "rejected"):  # listed, but serves nothing: say why
                reason += f"  (not searchable: {s.get('not_searchable_because')})"
            print(f"{s['name']:<24} {s['transport']:<6} {s['state']:<10} {s['tools']:>5} tools{reason}")
        idx = data["index"]
        print(f"index: {data['tools']} searchable tools, version {data.get('index_version')}, "
              f"ready={idx.get('ready')}, mode={idx.get('mode')}, degraded={idx.get('degraded')}")
        pending = data.get("waiting_for") or []
        print("waiting for: nothing" if not pending else "waiting for:")
        for line in pending:
            print(f"  {line}")
        tok = data.get("tokens") or {}
        if tok.get("full_catalog_tokens") is not None:
            est = f" (estimated from {tok['estimated_from_sample']} tools)" if tok.get("estimated_from_sample") else ""
            print(f"tokens ({tok.get('tokenizer')}): full catalog {tok['full_catalog_tokens']}{est} "
                  f"vs meta-tools {tok.get('meta_tools_tokens')} "
                  f"({100 * tok.get('reduction', 0):.1f}% smaller); mean top-5 search result "
                  f"{tok.get('mean_top5_search_result_tokens') or 0:.0f}")
        elif tok.get("pending"):
            print("tokens: being counted (ask again in a moment)")
        rift = data.get("rift") or {}
        if rift.get("available"):
            c = rift["clusters"]
            print(f"rift: confusable clusters high={c['high']} medium={c['medium']} low={c['low']}")
        store = data.get("store")
        if store:
            link = "connected" if store.get("connected") else f"UNREACHABLE ({store.get('error')})"
            print(f"store: {link}; {store.get('buffered', 0)} writes buffered on disk, "
                  f"{store.get('received', 0)} changes from other replicas, replica {store.get('replica')}")


# Exit status when stdout's reader goes away (`toolatlas ... | head -1`): 128 + SIGPIPE,
# what a shell reports for a tool killed by the signal, but without a traceback.
EX_BROKEN_PIPE = 141
EX_INTERRUPTED = 130  # Ctrl-C before a command took SIGINT over (serve's first seconds: its imports)


def main(argv: list[str] | None = None) -> int:
    """Run one command; output piped into a reader that stops early ends quietly (141), and
    so does a Ctrl-C (130) no command handles itself."""
    try:
        code = _main(argv)
        sys.stdout.flush()
        return code
    except KeyboardInterrupt:
        return EX_INTERRUPTED
    except BrokenPipeError:
        # Point stdout at /dev/null so the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EX_BROKEN_PIPE


class EarlyHangup:
    """The SIGHUP handler of `serve` until the daemon takes SIGHUP itself (app.serve): its
    default action would end the daemon while it starts; `count` tells app.serve to reload
    once it can (the config may have changed after it was read)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, _signum: int, _frame: object) -> None:
        self.count += 1


class EarlyInterrupt:
    """serve's SIGINT during its imports (app.main_serve then takes it): KeyboardInterrupt, as
    Python's own handler raises. Installed by us because with Python's default handler in place
    a Ctrl-C during the imports was lost under load (6 of 6 daemons started side by side and
    interrupted then went on serving), while a handler of our own is always called. A handler
    that runs inside a finalizer or a weakref callback (the import system's module-lock
    cleanup is one) has its exception printed as "ignored" and dropped, so `count` also
    records it: main_serve stops at once when it is not 0."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, _signum: int, _frame: object) -> None:
        self.count += 1
        raise KeyboardInterrupt


def _main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        import signal

        signal.signal(signal.SIGHUP, EarlyHangup())
        signal.signal(signal.SIGINT, EarlyInterrupt())
    if argv and argv[0] in _DELEGATED:
        import importlib

        module, func = _DELEGATED[argv[0]]
        return int(getattr(importlib.import_module(module), func)(argv[1:]) or 0)

    args = _shim_args(argv) or _parser().parse_args(argv)
    if args.cmd == "shim":  # an MCP client starts it with no shell to expand a ~ in its args
        args.config, args.socket = (os.path.expanduser(p) if p else p for p in (args.config, args.socket))
    from toolatlas.errors import ConfigError

    if args.cmd in ("shim", "search", "call", "status"):
        try:
            socket = client_socket(args.socket, args.config)
        except ConfigError as exc:
            print(f"toolatlas: config error: {exc}", file=sys.stderr)
            return EX_CONFIG
        if args.cmd == "shim":
            return _shim(args, socket)
        return _client_command(args, socket)

    from toolatlas.config import load

    path = args.config if args.cmd == "serve" else args.path
    try:
        cfg = load(path)
    except ConfigError as exc:
        print(f"toolatlas: config error: {exc}", file=sys.stderr)
        return EX_CONFIG
    if args.cmd == "check-config":
        from toolatlas.doctor import cards_problem, missing_commands

        problem = cards_problem(cfg)
        if problem:
            print(f"toolatlas: config error: {path}: {problem}", file=sys.stderr)
            return EX_CONFIG
        for problem, _advice in missing_commands(cfg):
            print(f"toolatlas: warning: {problem} (the daemon will not be able to start it)", file=sys.stderr)
        from toolatlas.access import rule_warnings

        for problem in rule_warnings(cfg):
            print(f"toolatlas: warning: {problem}", file=sys.stderr)
        print(f"{path}: OK ({len(cfg.upstream)} upstreams; socket {cfg.daemon.socket})")
        return 0
    from toolatlas.paths import writable_folder

    try:  # a state_dir the daemon cannot write is one line now, not a traceback from its first file
        writable_folder(cfg.daemon.state_dir, "[daemon] state_dir")
    except ConfigError as exc:
        print(f"toolatlas: config error: {path}: {exc}", file=sys.stderr)
        return EX_CONFIG
    # The stdio upstreams start now, beside the daemon's own imports (upstream/children.py).
    from toolatlas.upstream.children import prespawn

    prespawn(cfg.upstream, cfg.daemon.socket)
    from toolatlas.app import main_serve

    try:
        return main_serve(cfg)
    except ConfigError as exc:
        print(f"toolatlas: {exc}", file=sys.stderr)
        return EX_CONFIG
    except KeyboardInterrupt:
        return EX_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
