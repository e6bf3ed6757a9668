"""Sign and verify a capability card for a 50-tool server; median milliseconds, JSON out.

    .venv/bin/python bench/cards_sign.py [--tools 50] [--repeat 200]

sign   = schema hashes of every tool + canonical JSON + Ed25519 signature + file encoding
         (`build_card` from a ready bootstrap draft, then `encode_card`).
verify = what the daemon does for a changed card file: decode + canonical-form check +
         signature check + every tool's schema hash against the live definitions
         (`decode_card`, `verify_card`, `schema_hash` per tool).
Tools are the first N of ../shared/benchdata/toollens/catalog.jsonl, put on one server.
The goal (issue 4) is < 50 ms each.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from _common import emit, pct_ms

ROOT = Path(__file__).resolve().parents[1]
BENCHDATA = ROOT / ".." / "shared" / "benchdata"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tools", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()

    from toolatlas.catalog import signing
    from toolatlas.catalog.cards import ServerIdentity, decode_card, encode_card, verify_card
    from toolatlas.catalog.catalog_file import read_catalog
    from toolatlas.catalog.generators import BootstrapGenerator, build_card
    from toolatlas.catalog.model import ToolRecord, schema_hash

    seen: set[str] = set()
    tools = []
    for r in read_catalog(BENCHDATA / "toollens" / "catalog.jsonl"):
        if r.name in seen:
            continue
        seen.add(r.name)
        tools.append(ToolRecord.make("bench", r.name, r.description, r.input_schema))
        if len(tools) == args.tools:
            break
    key = signing.generate_private_key()
    pub = key.public_key()
    ident = ServerIdentity(name="bench", transport="stdio", endpoint="bench-server")
    draft = BootstrapGenerator().generate("bench", tools)

    sign_s: list[float] = []
    data = b""
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        card = build_card(ident, draft, tools, key)
        data = encode_card(card)
        sign_s.append(time.perf_counter() - t0)

    verify_s: list[float] = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        c = decode_card(data)
        verify_card(c, pub)
        by = {t.tool: t.schema_sha256 for t in c.tools}
        ok = all(by.get(t.tool) == schema_hash(t.tool, t.description, t.input_schema) for t in tools)
        verify_s.append(time.perf_counter() - t0)
        assert ok

    gen_s: list[float] = []
    for _ in range(max(10, args.repeat // 10)):
        t0 = time.perf_counter()
        BootstrapGenerator().generate("bench", tools)
        gen_s.append(time.perf_counter() - t0)

    ms = lambda xs: pct_ms(xs, 50)  # noqa: E731
    result = {
        "tools": len(tools),
        "card_bytes": len(data),
        "repeat": args.repeat,
        "sign_median_ms": ms(sign_s),
        "verify_median_ms": ms(verify_s),
        "bootstrap_generate_median_ms": ms(gen_s),
        "goal_ms": 50,
        "ok": ms(sign_s) < 50 and ms(verify_s) < 50,
    }
    emit(result, "cards_sign")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
