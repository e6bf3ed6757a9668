"""What the learned state costs as usage events pile up (issue 17's memory and publish cost
at a platform's scale, and why `[learning] max_events` exists).

    PYTHONPATH=daemon .venv/bin/python bench/learning_scale.py [--steps 4] [--step 25000] [--principals 100]

In process: a LearningIndex fed `--step` events at a time of distinct 9-word queries (8 words
of a 5,000-word vocabulary plus a number), each with its own random unit vector, from
`--principals` principals over 2,000 tools, times spread over 30 days. After each step: the
process's VmRSS, the time of `state()`, of the first principal's lexical index (which sums
every principal's words for the state: pastwords.PastWords) and the mean of the next eight
principals' (what a publish prebuilds beside it, and what the search of a principal outside
those pays once per state). Synthetic: real queries repeat words, so real indexes are smaller.
Prints JSON.
"""

from __future__ import annotations

import argparse
import os
import random
import time

import numpy as np

from _common import emit
from toolatlas.retrieval.learned import LearningIndex
from toolatlas.retrieval.usage import UsageEvent


def rss_mb() -> float:
    for line in open(f"/proc/{os.getpid()}/status"):
        if line.startswith("VmRSS"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--step", type=int, default=25_000)
    p.add_argument("--principals", type=int, default=100)
    a = p.parse_args()
    load0 = os.getloadavg()[0]
    rnd, rng = random.Random(0), np.random.default_rng(0)
    words = [f"w{i}" for i in range(5000)]
    tools = [f"srv{i % 40}__tool{i}" for i in range(2000)]
    index, now, total, rows = LearningIndex(), time.time(), 0, []
    start_rss = rss_mb()
    for _ in range(a.steps):
        vecs = rng.standard_normal((a.step, 384)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        index.add([UsageEvent(query=" ".join(rnd.sample(words, 8)) + f" {total + i}", tool=rnd.choice(tools),
                              principal=f"user{rnd.randrange(a.principals)}", at=now - rnd.random() * 86400 * 30,
                              vector=vecs[i], space="bench", id=total + i + 1) for i in range(a.step)])
        del vecs
        total += a.step
        t0 = time.perf_counter()
        state = index.state(time.time())
        t1 = time.perf_counter()
        owns = list(state.principals.values())[:9]
        state.lexical(owns[0])
        t2 = time.perf_counter()
        for own in owns[1:]:
            state.lexical(own)
        t3 = time.perf_counter()
        rows.append({"events": total, "vmrss_mb": rss_mb(), "state_ms": round((t1 - t0) * 1000, 1),
                     "first_lexical_ms": round((t2 - t1) * 1000, 1),
                     "next_lexical_mean_ms": round((t3 - t2) * 1000 / max(1, len(owns) - 1), 1)})
        del state
    emit({"bench": "learning_scale", "principals": a.principals, "start_vmrss_mb": start_rss,
          "load_1m": [round(load0, 2), round(os.getloadavg()[0], 2)], "rows": rows}, "learning_scale")


if __name__ == "__main__":
    main()
