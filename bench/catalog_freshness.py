"""Time from an upstream's tools/list_changed to the new tool being returned by tool_search.

    .venv/bin/python bench/catalog_freshness.py [--rounds 20] [--tools 200] [--embedder onnx|none]

The test server adds a tool and announces it (the notification goes out before the call
returns); the clock starts when the add_tool call returns and stops when a tool_search for
the new tool's own description ranks it first. Uses the default hybrid ranker with the ONNX
embedder unless told otherwise (the model export is cached in bench/out/state).
Goal: median <= 1000 ms.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _common import OUT, Daemon, emit, stdio_testserver, summary

WORDS = ["amber", "basalt", "cobalt", "dune", "ember", "fjord", "garnet", "harbor", "indigo", "jasper",
         "kelp", "lagoon", "marble", "nebula", "onyx", "prairie", "quartz", "reef", "sierra", "tundra"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--tools", type=int, default=200, help="generated tools on the upstream (index size)")
    p.add_argument("--embedder", default="onnx", choices=["onnx", "torch", "none"])
    a = p.parse_args()
    state = OUT / "state"
    with tempfile.TemporaryDirectory() as tmp:
        d = Daemon(Path(tmp), stdio_testserver("fresh", "--tools", str(a.tools)),
                   search_extra=f'embedder = "{a.embedder}"\n')
        d.config.write_text(d.config.read_text().replace(f'state_dir = "{Path(tmp) / "state"}"', f'state_dir = "{state}"'))
        with d:
            samples = []
            for i in range(a.rounds):
                word = WORDS[i % len(WORDS)]
                name = f"survey_{word}_{i}"
                desc = f"Survey the {word} deposits in sector {i} and chart them."
                d.tool("fresh__add_tool", {"name": name, "description": desc})
                t0 = time.perf_counter()
                deadline = t0 + 30
                while time.perf_counter() < deadline:
                    if d.search(desc, 1) == [f"fresh__{name}"]:
                        break
                else:
                    raise SystemExit(f"round {i}: {name} never became searchable")
                samples.append(time.perf_counter() - t0)
            status = d.status()
    emit({
        "bench": "catalog_freshness",
        "rounds": a.rounds,
        "catalog_tools": status["tools"],
        "ranker": status["index"].get("mode"),
        "embedder": status["index"].get("embedder"),
        "list_changed_to_searchable": summary(samples),
        "goal": "median <= 1000 ms",
    }, "catalog_freshness")


if __name__ == "__main__":
    main()
