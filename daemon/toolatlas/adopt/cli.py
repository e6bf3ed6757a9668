"""`toolatlas adopt PATH [--out FILE] [--rewrite-client] [--dry-run]` and
`toolatlas adopt --undo BACKUP`. The TOML goes to --out (else standard output); everything
said about it (what was adopted, renamed, left out and why, which variables to export) goes
to standard error."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from toolatlas.adopt.clients import AdoptError, ClientKind, read_client_file
from toolatlas.adopt.convert import Adoption, adopt
from toolatlas.adopt.render import merge, render
from toolatlas.adopt.rewrite import apply, check_same_config, check_writable, rewritten, undo
from toolatlas.paths import default_config_path, environment_file, read_environment_file, read_regular, write_atomic

_CLIENT = {ClientKind.CLAUDE_DESKTOP: "Claude Desktop", ClientKind.CLAUDE_CODE_PROJECT: "Claude Code",
           ClientKind.CLAUDE_CODE_USER: "Claude Code", ClientKind.CURSOR: "Cursor", ClientKind.VSCODE: "VS Code",
           ClientKind.WINDSURF: "Windsurf", ClientKind.GENERIC: "the client"}
EX_DATAERR = 65  # the client file cannot be read as a client config
RELOAD_WAIT_S = 120.0  # for a running daemon's answer to the reload that brings the adopted servers


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="toolatlas adopt",
        description="Write a toolatlas config from an MCP client's config (Claude Desktop, Claude Code "
                    ".mcp.json or ~/.claude.json, Cursor, VS Code .vscode/mcp.json, Windsurf).",
    )
    p.add_argument("path", nargs="?", help="the client's config file")
    p.add_argument("--out", help="write the toolatlas config here (default: standard output; with "
                                 f"--rewrite-client: {default_config_path()})")
    p.add_argument("--rewrite-client", action="store_true",
                   help="replace the adopted servers in the client file with one toolatlas shim entry "
                        "(a timestamped backup is kept beside it)")
    p.add_argument("--dry-run", action="store_true", help="print the config (and the rewritten client file); write nothing")
    p.add_argument("--force", action="store_true",
                   help="replace an existing --out file (without it, the new servers are added to that config)")
    p.add_argument("--undo", metavar="BACKUP", help="restore a client file from the backup --rewrite-client made")
    return p


def _say(text: str) -> None:
    print(text, file=sys.stderr)


def _report(a: Adoption) -> None:
    src = a.source
    names = ", ".join(u.name for u in a.upstreams) or "none"
    _say(f"{src.path} ({src.kind.value}): {len(a.upstreams)} server(s) adopted: {names}")
    for s in a.skipped:
        _say(f"  not adopted: {s.name!r} ({s.label}): {s.reason}")
    for note in a.notes:
        _say(f"  note: {note}")
    if a.exports.needed:
        _say("  the config reads these environment variables (their values are not in the config):")
        for var, why in sorted(a.exports.needed.items()):
            _say(f"    {var}: {why}")


def _keep_secrets(a: Adoption) -> None:
    """Put the secret values moved out of the client's file into the environment file (mode
    0600), which the daemon reads however it starts; say what the daemon still needs."""
    path = environment_file()
    written = {n: line for n, v in sorted(a.exports.to_keep().items()) if (line := _env_line(n, v)) is not None}
    if written:
        try:
            old = read_regular(path)
        except FileNotFoundError:
            old = b""
        except OSError as exc:
            raise AdoptError(f"cannot read {path}: {exc.strerror or exc}") from exc
        lines = "".join(f"{line}\n" for line in written.values()).encode()
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        write_atomic(path, [old, b"" if not old or old.endswith(b"\n") else b"\n", lines], mode=0o600)
        _say(f"kept {len(written)} secret(s) from the client's file in {path} (mode 0600), where the daemon "
             f"reads them: {', '.join(sorted(written))}")
    held = set(a.exports.held) | set(written)
    rest = sorted(v for v in a.exports.needed if v not in held and v not in os.environ)
    if rest:
        _say(f"  the daemon still needs: {', '.join(rest)}: set them in {path} (NAME=value lines) or in its "
             "environment")


def _env_line(name: str, value: str) -> str | None:
    """`NAME=value` as an environment file holds it (single quotes around a value with spaces
    or quoting), or None for a value no such line can hold (a newline, or both quotes)."""
    if "\n" in value or "\r" in value or ("'" in value and ('"' in value or "\\" in value)):
        return None
    if value and not any(c in value for c in " \t\"'\\#;$"):
        return f"{name}={value}"
    return f"{name}='{value}'" if "'" not in value else f'{name}="{value}"'


def _missing_commands(a: Adoption) -> None:
    from toolatlas.doctor import command_problem

    for up in a.upstreams:
        problem = up.transport == "stdio" and "${" not in up.command and command_problem(up.command, None, up.cwd)
        if problem:
            _say(f"  warning: upstream {up.name!r}: {problem} (here; the daemon needs it on its PATH)")


def _rewrite_notes(a: Adoption) -> None:
    if a.source.had_comments:
        _say(f"  note: comments inside the replaced server entries of {a.source.path} are gone (the others stay); "
             "the backup keeps them all")
    if a.source.kind is ClientKind.CLAUDE_CODE_USER and any(w[0] == "projects" for w in a.replaced):
        _say("  note: servers of single projects now reach every project through the user-level toolatlas entry")


def _merged(adoption: Adoption, out: Path) -> tuple[str, list[str]]:
    """The existing config at `out` with the new servers added (see render.merge)."""
    from toolatlas.paths import read_config

    try:
        existing = read_config(out)
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise AdoptError(f"cannot read the existing {out}: {why}; pass --force to replace it") from exc
    text, added, notes = merge(existing, adoption, str(out))
    for note in notes:
        _say(f"  note: {note}")
    return text, added


def _reload_running(out: Path) -> None:
    """A daemon already running on `out`'s socket (the shim of a client adopted before started
    it) would not run the servers just added until it reloads: ask it to, and say how it went."""
    from toolatlas.errors import ConfigError
    from toolatlas.paths import daemon_path, default_socket_path, socket_answers
    from toolatlas.surface.rawclient import RawClient, RpcError

    try:
        sock = daemon_path(str(out), "socket") or default_socket_path()
    except ConfigError:
        return
    if not socket_answers(sock):
        return
    try:
        with RawClient(sock, timeout=RELOAD_WAIT_S, handshake_timeout=15.0) as client:
            result = client.request("toolatlas/reload", {})
    except (ConnectionError, OSError, RpcError) as exc:
        _say(f"the daemon on {sock} was not reloaded ({exc}); run `toolatlas reload --config {out}` as its user")
        return
    if not result.get("applied"):
        _say(f"the daemon on {sock} refused the reload and keeps its running config: {result.get('error')}")
    else:
        _say(f"the daemon on {sock} reloaded {result.get('config')}: upstreams added: "
             f"{', '.join(result.get('added') or []) or 'none'}")


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.undo:
            if args.path or args.rewrite_client or args.out or args.dry_run:
                parser.error("--undo BACKUP takes no other arguments")
            target, kept = undo(args.undo)
            _say(f"restored {target} from {args.undo}"
                 + (f"; what it held before the undo is kept in {kept}" if kept is not None else ""))
            return 0
        if not args.path:
            parser.error("give the client's config file (or --undo BACKUP)")
        return _adopt(args)
    except AdoptError as exc:
        _say(f"toolatlas adopt: {exc}")
        return 1
    except OSError as exc:  # writing --out (a missing or read-only folder)
        _say(f"toolatlas adopt: cannot write {exc.filename or 'the config'}: {exc.strerror or exc}")
        return 1


def _adopt(args: argparse.Namespace) -> int:
    try:
        source = read_client_file(args.path)
    except AdoptError as exc:
        _say(f"toolatlas adopt: {exc}")
        return EX_DATAERR
    adoption = adopt(source, held=read_environment_file())
    _report(adoption)
    _missing_commands(adoption)
    if not adoption.upstreams:
        _say("toolatlas adopt: no server could be adopted; nothing written")
        return 1
    out = Path(args.out) if args.out else Path(default_config_path()) if args.rewrite_client else None
    if out is not None and out.resolve() == source.path.resolve():
        raise AdoptError(f"--out {out} is the client file itself; choose another path")
    if out is not None and out.is_dir():  # no --force can replace a folder with the config
        raise AdoptError(f"--out {out} is a folder; name the config file to write, e.g. {out / 'config.toml'}")
    if args.rewrite_client and out is not None:
        check_same_config(source, out)
    merging = out is not None and out.exists() and not args.force
    text, added = _merged(adoption, out) if merging and out else (render(adoption), [u.name for u in adoption.upstreams])
    client_bytes, entry = rewritten(adoption, out) if args.rewrite_client and out else (b"", "")
    if args.dry_run:
        print(f"==> {out or 'standard output'} (toolatlas config) <==\n{text}")
        if args.rewrite_client:
            print(f"==> {source.path} (rewritten client config) <==\n{client_bytes.decode()}")
        _say("dry run: nothing was written")
        return 0
    if out is None:
        sys.stdout.write(text)
        return 0
    if args.rewrite_client:  # before the config is written: a refused rewrite leaves both as they were
        check_writable(source.path)
    write_atomic(out, text.encode())
    _keep_secrets(adoption)
    _say(f"added {len(added)} upstream(s) to {out}: {', '.join(added) or 'none (it has them all)'}" if merging
         else f"wrote {out}")
    if added:
        _reload_running(out)
    if args.rewrite_client:
        backup = apply(adoption, client_bytes)
        _rewrite_notes(adoption)
        _say(f"rewrote {source.path}: {len(adoption.replaced)} entr{'y' if len(adoption.replaced) == 1 else 'ies'} "
             f"replaced by the {entry!r} entry (toolatlas shim)\n"
             f"backup: {backup}\nundo:   toolatlas adopt --undo {backup}\n"
             f"next:   restart {_CLIENT[source.kind]}, then `toolatlas status --config {out}`")
    else:
        _say(f"next: toolatlas check-config {out}, then point your client at `toolatlas shim --config {out}`")
    return 0
