"""`toolatlas cards generate|verify|show` and `toolatlas keygen`.

generate  writes one signed card per server into state_dir/cards/, from a live config (one
          tools/list per upstream) or offline from a catalog JSONL file (interface format).
verify    checks every card's form and signature, and each tool's schema hash against the
          live upstreams (--config) or a catalog (--catalog); exit 1 naming every failure.
show      prints one card (readable, or --json).
export    rewrites a catalog JSONL with each tool's description replaced by the card text a
          generator gives (offline, unsigned): feed it to `toolatlas eval` to measure cards.

Exit codes: 0 ok, 1 verification failed, 2 usage or key problem, 3 an upstream could not be
listed or a generator failed, 78 config error.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

EX_FAIL = 1
EX_USAGE = 2
EX_UPSTREAM = 3
EX_CONFIG = 78


def _err(msg: str) -> None:
    print(f"toolatlas: {msg}", file=sys.stderr)


def listing_seconds(text: str) -> float:
    """--timeout: a finite number of seconds > 0 (nan failed with anyio's 'deadline must not be
    NaN', inf waited forever on a silent upstream, 0 or less timed out at once); argparse makes
    the error a usage error, exit 2."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return seconds


def list_live(upstream: Any, timeout: float | None = None) -> list[Any]:
    """One tools/list against a configured upstream (blocking), as ToolRecords."""
    import anyio

    from toolatlas.upstream.pool import list_tools_once

    async def go() -> list[Any]:
        return await list_tools_once(upstream, timeout=timeout)

    return anyio.run(go)


def _load_cfg(path: str | None) -> Any:
    from toolatlas import config

    return config.load(path) if path else None


def _state_dir(args: argparse.Namespace, cfg: Any) -> str | None:
    """--state-dir, else the config's [daemon] state_dir; None, said on stderr, if neither."""
    state_dir = args.state_dir or (cfg.daemon.state_dir if cfg else None)
    if not state_dir:
        _err("no state dir: pass --state-dir DIR or --config PATH")
        return None
    return str(state_dir)


def _key_file(given: str | None, cfg: Any, key: str, flag: str) -> Path | None:
    """The key file given by `flag`, else the config's [cards] `key` (private_key or
    public_key); None, said on stderr, if neither."""
    from toolatlas.catalog.attest import resolve_path

    path = Path(given) if given else (resolve_path(cfg, getattr(cfg.cards, key)) if cfg else None)
    if path is None:
        _err(f"no {key.replace('_', ' ')}: pass {flag} PATH or set [cards] {key}")
    return path


def _redactor(cfg: Any) -> Any:
    """The redactor of `cfg`'s secrets (none without a config): card endpoints and messages."""
    from toolatlas.config import secrets
    from toolatlas.redact import Redactor

    return Redactor(secrets(cfg) if cfg else ())


# --------------------------------------------------------------------------- generate


def _generate(args: argparse.Namespace) -> int:
    from toolatlas.catalog import signing
    from toolatlas.catalog.catalog_file import load_records
    from toolatlas.catalog.cards import ServerIdentity, card_path, identity_of, write_card
    from toolatlas.catalog.generators import build_card, make_generator

    cfg = _load_cfg(args.config)
    redact = _redactor(cfg)
    if cfg is None and not args.catalog:
        _err("cards generate needs --config PATH or --catalog FILE")
        return EX_USAGE
    key_path = _key_file(args.key, cfg, "private_key", "--key")
    state_dir = _state_dir(args, cfg) if key_path is not None else None
    if key_path is None or state_dir is None:
        return EX_USAGE
    key = signing.load_private_key(key_path)

    jobs: list[tuple[Any, str, list[Any]]] = []  # (identity, generator kind, records)
    failed = 0
    if args.catalog:
        catalog = load_records(args.catalog)
        wanted = args.server or list(catalog)
        for name in wanted:
            if name not in catalog:
                _err(f"server {name!r} is not in {args.catalog}")
                return EX_USAGE
            up = cfg.upstream_by_name(name) if cfg else None
            ident = identity_of(up, redact=redact) if up else ServerIdentity(name=name, transport="catalog", endpoint=os.path.basename(args.catalog))
            kind = args.generator or (up.card_generator if up else "bootstrap")
            jobs.append((ident, kind, catalog[name]))
    else:
        ups = [u for u in cfg.upstream if u.enabled and (not args.server or u.name in args.server)]
        unknown = sorted(set(args.server or []) - {u.name for u in cfg.upstream})
        if unknown:
            _err(f"no upstream named {unknown[0]!r} in {cfg.source}")
            return EX_USAGE
        disabled = sorted(set(args.server or []) - {u.name for u in ups})
        if disabled:  # named on purpose: writing nothing and exiting 0 would look like success
            _err(f"upstream {disabled[0]!r} is disabled (enabled = false) in {cfg.source}; no card written")
            return EX_USAGE
        if not ups:
            _err(f"no enabled upstream in {cfg.source}; no card written")
            return EX_USAGE
        for up in ups:
            try:
                records = list_live(up, args.timeout)
            except Exception as exc:  # noqa: BLE001 - report and go on with the others
                _err(redact(f"{up.name}: cannot list tools, no card written: {exc}"))
                failed += 1
                continue
            jobs.append((identity_of(up, redact=redact), args.generator or up.card_generator, records))

    for ident, kind, records in jobs:
        try:
            draft = make_generator(kind, cfg).generate(ident.name, records)
            card = build_card(ident, draft, records, key)
        except Exception as exc:  # noqa: BLE001
            from toolatlas.errors import ToolatlasError

            if not isinstance(exc, ToolatlasError):
                raise
            _err(redact(f"{ident.name}: {exc}"))
            failed += 1
            continue
        path = write_card(card_path(state_dir, ident.name), card)
        if not args.quiet:
            note = "" if draft.attested else " (unattested publisher text)"
            print(f"wrote {path} ({len(card.tools)} tools, {kind}){note}")
    return EX_UPSTREAM if failed else 0


# --------------------------------------------------------------------------- verify


def _verify(args: argparse.Namespace) -> int:
    from toolatlas.catalog import signing
    from toolatlas.catalog.catalog_file import load_records
    from toolatlas.catalog.cards import card_filename, cards_dir, identity_of, read_card, verify_card
    from toolatlas.catalog.model import schema_hash
    from toolatlas.catalog.sanitize import visible
    from toolatlas.errors import SignatureError

    cfg = _load_cfg(args.config)
    redact = _redactor(cfg)
    pub_path = _key_file(args.public_key, cfg, "public_key", "--public-key")
    state_dir = _state_dir(args, cfg) if pub_path is not None else None
    if pub_path is None or state_dir is None:
        return EX_USAGE
    pub = signing.load_public_key(pub_path)

    failures: list[str] = []
    cards: dict[str, Any] = {}
    folder = cards_dir(state_dir)
    files = sorted(p for p in folder.glob("*.json") if not p.name.startswith(".")) if folder.is_dir() else []
    for path in files:
        try:
            card = read_card(path)
            verify_card(card, pub)
        except SignatureError as exc:
            failures.append(f"{path.name}: {exc}")
            continue
        if card_filename(card.server.name) != path.name:
            failures.append(f"{path.name}: holds the card of server {card.server.name!r}")
            continue
        cards[card.server.name] = card

    live: dict[str, list[Any]] = {}
    unlisted = 0  # upstreams that could not be checked: exit 3 when that is all that failed
    if args.catalog:
        live = load_records(args.catalog)
    elif cfg is not None and not args.offline:
        for up in cfg.upstream:
            if not up.enabled:
                continue
            if up.name not in cards:
                failures.append(f"{up.name}: no valid card in {folder}")
                continue
            ident = identity_of(up, redact=redact)
            c = cards[up.name].server
            if (c.transport, c.endpoint) != (ident.transport, ident.endpoint):
                failures.append(f"{up.name}: card signed for {c.transport} {c.endpoint!r}, config has {ident.transport} {ident.endpoint!r}")
            try:
                live[up.name] = list_live(up, args.timeout)
            except Exception as exc:  # noqa: BLE001
                failures.append(redact(f"{up.name}: cannot list tools to check schema hashes: {exc}"))
                unlisted += 1
    for server, records in live.items():
        held = cards.get(server)
        if held is None:
            if args.catalog:
                failures.append(f"{server}: no valid card")
            continue
        for rec in records:
            tc = held.tool(rec.tool)
            if tc is None:
                failures.append(f"{server}: tool {rec.tool!r} is offered but not in the card")
            elif tc.schema_sha256 != schema_hash(rec.tool, rec.description, rec.input_schema):
                failures.append(f"{server}: tool {rec.tool!r} changed since the card was signed")

    for name, card in sorted(cards.items()):
        bad = any(f.startswith(f"{name}:") for f in failures)
        if not args.quiet and not bad:
            p = card.provenance
            tag = "" if p.attested else " UNATTESTED"
            print(visible(f"ok   {name}: {len(card.tools)} tools, {p.generator}, signed {p.created_at} by {p.key_id}{tag}"))
    for f in failures:
        print(visible(f"FAIL {f}"))
    if not files and not failures:
        print(f"no cards in {folder}")
    return EX_UPSTREAM if failures and len(failures) == unlisted else EX_FAIL if failures else 0


# --------------------------------------------------------------------------- show


def _show(args: argparse.Namespace) -> int:
    import msgspec

    from toolatlas.catalog.cards import card_path, format_card, read_card
    from toolatlas.errors import SignatureError

    cfg = _load_cfg(args.config)
    state_dir = _state_dir(args, cfg)
    if state_dir is None:
        return EX_USAGE
    path = card_path(state_dir, args.server)
    if not path.exists():
        _err(f"no card for {args.server!r} at {path}")
        return EX_FAIL
    try:
        card = read_card(path)
    except SignatureError as exc:
        _err(str(exc))
        return EX_FAIL
    if args.json:
        # ASCII: a bidi override or tag character in card text would act on the terminal raw
        print(json.dumps(msgspec.to_builtins(card), indent=2, ensure_ascii=True))
    else:
        print(format_card(card))
        print("(signature not checked: use `toolatlas cards verify`)")
    return 0


# --------------------------------------------------------------------------- export


def _export(args: argparse.Namespace) -> int:
    from toolatlas.catalog.catalog_file import read_catalog, records_by_server
    from toolatlas.catalog.generators import GeneratorError, make_generator

    cfg = _load_cfg(args.config)
    lines = read_catalog(args.catalog)
    catalog = records_by_server(lines)
    text: dict[tuple[str, str], str] = {}
    for server, recs in catalog.items():
        try:
            draft = make_generator(args.generator, cfg).generate(server, recs)
        except GeneratorError as exc:  # exit 3, as for generate: the generator failed, not the usage
            _err(f"{server}: {exc}; nothing written")
            return EX_UPSTREAM
        for d in draft.tools:
            summary = d.summary
            if args.with_server and draft.summary:
                summary = f"{summary} Server: {draft.summary}"
            text[(server, d.tool)] = summary
    out = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout
    try:
        for line in lines:
            row = dict(line.raw, description=text[(line.server, line.name)])
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="toolatlas cards", description="Operator-attested capability cards.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    g = sub.add_parser("generate", help="write signed cards into state_dir/cards/")
    g.add_argument("--config", help="config: upstreams to list, keys, state dir, [cards.llm]")
    g.add_argument("--catalog", help="catalog JSONL file instead of live upstreams (offline)")
    g.add_argument("--server", action="append", help="only this server (repeatable)")
    g.add_argument("--generator", choices=["bootstrap", "llm", "publisher"], help="override each upstream's card_generator")
    g.add_argument("--key", help="private key (default: [cards] private_key)")
    g.add_argument("--state-dir", help="default: [daemon] state_dir")
    g.add_argument("--timeout", type=listing_seconds, help="seconds per upstream listing")
    g.add_argument("--quiet", "-q", action="store_true")

    v = sub.add_parser("verify", help="check every card's signature and schema hashes; exit 1 on any failure")
    v.add_argument("--config")
    v.add_argument("--catalog", help="check schema hashes against this catalog instead of live upstreams")
    v.add_argument("--offline", action="store_true", help="signatures only, do not contact upstreams")
    v.add_argument("--public-key", help="default: [cards] public_key")
    v.add_argument("--state-dir")
    v.add_argument("--timeout", type=listing_seconds, help="seconds per upstream listing")
    v.add_argument("--quiet", "-q", action="store_true", help="print failures only")

    s = sub.add_parser("show", help="print one card")
    s.add_argument("server")
    s.add_argument("--config")
    s.add_argument("--state-dir")
    s.add_argument("--json", action="store_true")

    e = sub.add_parser("export", help="catalog JSONL with descriptions replaced by card text (for toolatlas eval)")
    e.add_argument("--catalog", required=True)
    e.add_argument("--generator", choices=["bootstrap", "llm", "publisher"], default="bootstrap")
    e.add_argument("--config", help="for the llm generator's [cards.llm]")
    e.add_argument("--with-server", action="store_true", help="append the card's server summary to each description")
    e.add_argument("--out", help="output file (default: stdout)")
    return p


def main(argv: list[str]) -> int:
    """`toolatlas cards ...` (argv after "cards")."""
    from toolatlas.errors import ConfigError, ToolatlasError

    args = _parser().parse_args(argv)
    try:
        return {"generate": _generate, "verify": _verify, "show": _show, "export": _export}[args.cmd](args)
    except ConfigError as exc:
        _err(str(exc))
        return EX_CONFIG
    except (ToolatlasError, ValueError, OSError) as exc:
        _err(str(exc))
        return EX_USAGE


def keygen_main(argv: list[str]) -> int:
    """`toolatlas keygen --out PATH`: new Ed25519 key (0600), public key to PATH.pub and stdout."""
    from toolatlas.catalog import signing
    from toolatlas.errors import SignatureError

    p = argparse.ArgumentParser(prog="toolatlas keygen", description="New Ed25519 operator key for capability cards.")
    p.add_argument("--out", required=True, help="private key file to create (mode 0600; never overwritten)")
    args = p.parse_args(argv)
    if not args.out or args.out.endswith("/"):  # "" was a ValueError traceback; "DIR/" wrote the file DIR
        _err(f"--out {args.out!r}: name the private key file to create, not a folder (e.g. --out ~/operator.key)")
        return EX_USAGE
    key = signing.generate_private_key()
    try:
        pub = signing.write_private_key(args.out, key)
    except SignatureError as exc:
        _err(str(exc))
        return EX_USAGE
    print(signing.public_key_text(key))
    print(f"private key: {args.out} (keep it off the daemon host if you can)", file=sys.stderr)
    print(f"public key:  {pub} (set [cards] public_key to this file)", file=sys.stderr)
    return 0
