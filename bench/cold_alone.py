"""One cold start of a daemon alone (no store) on an empty state_dir: seconds from spawn to
hybrid search over a 2,000-tool stdio upstream (bench/replicas.py's `alone`), as JSON.

It runs the tree it is started in (the current directory's `bench/` and `daemon/`), so two
commits are compared by alternating trees, e.g. (the ONNX export is cached per user):

    for r in 1 2 3; do for t in /tmp/before .; do
      (cd $t && PYTHONPATH=daemon /path/to/.venv/bin/python /path/to/bench/cold_alone.py); done; done

The tree needs `../shared` beside it (the benchdata catalogs).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, "bench")
sys.path.insert(0, ".")

import replicas  # noqa: E402 - the current tree's, by the paths above


def main() -> int:
    tools = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    tmp = Path(tempfile.mkdtemp(prefix="toolatlas-cold-alone-"))
    before = os.getloadavg()[0]
    d, r = replicas.cold_start(tmp, "alone", tools, "")
    d.stop()
    print(json.dumps({"tree": os.getcwd(), "hybrid_s": r["hybrid_s"], "embeddings_computed": r["embeddings_computed"],
                      "log": r["log"], "loadavg": [round(before, 2), round(os.getloadavg()[0], 2)]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
