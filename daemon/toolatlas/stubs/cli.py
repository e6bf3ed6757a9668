"""`toolatlas stubs --out DIR [--servers a,b] [--socket PATH]`: typed Python modules of the
tools the caller may use, fetched from the running daemon (`toolatlas/tools` on its socket,
answered within the caller's access rules) and written as a package into DIR."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

EX_CONFIG = 78
EX_UNAVAILABLE = 69
EX_CANTCREAT = 73  # the --out folder or a file in it cannot be written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="toolatlas stubs", description=(
        "Write one typed Python module per server (a function per tool) into DIR, a package; calling a "
        "function runs the tool through the daemon as the calling user."))
    ap.add_argument("--out", required=True, metavar="DIR", help="the package folder (its name is the package's)")
    ap.add_argument("--servers", help="only these servers (comma-separated)")
    ap.add_argument("--socket", help="daemon socket (default: $TOOLATLAS_SOCKET, config, runtime dir)")
    ap.add_argument("--config", help="read the socket path from this config")
    args = ap.parse_args(argv)

    from toolatlas.errors import ConfigError
    from toolatlas.paths import client_socket
    from toolatlas.stubs.generate import render, write
    from toolatlas.surface.rawclient import RawClient, RpcError

    out = Path(args.out)
    if not out.name.isidentifier():
        print(f"toolatlas: --out {args.out}: the folder's name is the package's name and must be a Python "
              f"identifier (e.g. {out.name.replace('-', '_') or 'tools'})", file=sys.stderr)
        return 2
    try:
        socket = client_socket(args.socket, args.config)
    except ConfigError as exc:
        print(f"toolatlas: config error: {exc}", file=sys.stderr)
        return EX_CONFIG
    params = {}
    if args.servers:
        params["servers"] = [s.strip() for s in args.servers.split(",") if s.strip()]
    try:
        with RawClient(socket) as client:
            tools = client.request("toolatlas/tools", params)["tools"]
    except RpcError as exc:
        print(f"toolatlas: {exc}", file=sys.stderr)
        return 1
    except (ConnectionError, OSError) as exc:
        print(f"toolatlas: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE
    template = (Path(__file__).parent / "client_template.py").read_text(encoding="utf-8")
    files = render(tools, os.path.abspath(socket), template)
    try:
        changed = write(out, files)
    except OSError as exc:  # a read-only or full disk, a file where a folder must be
        print(f"toolatlas: cannot write the stubs into {args.out}: {exc.strerror or exc}"
              + (f" ({exc.filename})" if exc.filename else ""), file=sys.stderr)
        return EX_CANTCREAT
    servers = sorted({t["server"] for t in tools})
    print(f"{out}: {len(tools)} tools of {len(servers)} servers ({', '.join(servers) or 'none'}); "
          + (f"{len(changed)} files written or removed" if changed else "unchanged"))
    return 0
