"""Rift analysis: confusable clusters (layer 1), retrieval margins from synthetic task queries
(layer 2) and shared/distinguishing tokens with a diagnosis (layer 3).

Layer 2 asks: if a user phrases a task the way this tool's *arguments* suggest (its name words,
parameter names and allowed values; never its summary, which would be circular), does the
index rank this tool above every sibling in its cluster, and by how much? The cluster's worst
margin sets its risk: HIGH below `high` (0.10), MEDIUM below `medium` (0.20), else LOW. With
margin analysis off (the ablation), clusters are reported "unrated".

Layer 3 compares each tool's descriptive text (by default the document text) with its
siblings': a tool with no token of its own gets the diagnosis REGENERATE (its card cannot tell
it apart, whatever the embedder does); one with tokens but a margin below `high` gets SHARPEN.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from toolatlas.names import split
from toolatlas.rift.clusters import agglomerate, cohesion

RISKS = ("high", "medium", "low", "unrated")
_BLOCK = 512  # cluster members whose similarity rows one matrix product computes
_RANK = {"high": 3, "medium": 2, "low": 1, "unrated": 0}


def risk_at_least(risk: str, floor: str) -> bool:
    """True if `risk` is at or above `floor` ("high" | "medium"); "never" is never reached."""
    return floor in _RANK and _RANK[risk] >= _RANK[floor] and risk != "unrated"


def _words(text: str) -> list[str]:
    from toolatlas.retrieval.text import words

    return words(text)


# Words the retrieval tokenizer drops as noise but that tell tools apart ("get" vs "put").
_KEEP = frozenset(
    """get use using not no all any each more most same other own off on up down out over under
    before after again above below between only few some now once further""".split()
)


def _tokens(text: str) -> list[str]:
    from toolatlas.retrieval.text import STOPWORDS, stem, words

    return [stem(w) for w in words(text) if len(w) > 1 and not w.isdigit() and (w in _KEEP or w not in STOPWORDS)]


def synthetic_query(name: str, schema: Mapping[str, Any] | None) -> str:
    """A task phrasing built from the tool's name and arguments only.

    `server__read_file` with {path (required), encoding: enum [utf8, latin1]} ->
    "read file path encoding utf8".
    """
    parts = split(name)
    tool = parts[1] if parts else name
    out = _words(tool)
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    if isinstance(props, Mapping) and props:
        req = schema.get("required") if isinstance(schema, Mapping) else None
        req = set(req) if isinstance(req, list) else set()
        order = sorted(props, key=lambda k: (k not in req, list(props).index(k)))
        for pname in order[:4]:
            out.extend(_words(pname))
            spec = props[pname]
            enum = spec.get("enum") if isinstance(spec, Mapping) else None
            if isinstance(enum, list) and enum:
                out.extend(_words(str(enum[0])))
    # de-duplicate, keep order
    seen: set[str] = set()
    return " ".join(w for w in out if not (w in seen or seen.add(w)))  # type: ignore[func-returns-value]


@dataclass(frozen=True)
class ToolDiag:
    name: str
    cluster: int
    margin: float | None  # min over siblings of sim(q, own) - sim(q, sibling)
    confused_with: str  # the sibling that margin was taken against (nearest, without margins)
    distinguishing: tuple[str, ...]
    diagnosis: str  # "OK" | "SHARPEN" | "REGENERATE"
    query: str


@dataclass(frozen=True)
class Cluster:
    id: int
    members: tuple[str, ...]
    cohesion: float
    risk: str  # high | medium | low | unrated
    worst_margin: float | None
    shared: tuple[str, ...]


@dataclass(frozen=True)
class RiftReport:
    clusters: tuple[Cluster, ...]
    tools: dict[str, ToolDiag]  # only tools that are in a cluster
    n_tools: int
    theta: float
    high: float
    medium: float
    margin_analysis: bool
    embedder: str
    seconds: dict[str, float] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        """Clusters per risk, for catalog_status."""
        out = {r: 0 for r in RISKS}
        for c in self.clusters:
            out[c.risk] += 1
        return out

    def worst(self) -> str | None:
        rated = [c.risk for c in self.clusters if c.risk != "unrated"]
        return max(rated, key=_RANK.__getitem__) if rated else None

    def fails(self, fail_on: str) -> bool:
        return any(risk_at_least(c.risk, fail_on) for c in self.clusters)

    def note_for(self, name: str, *, max_tokens: int = 4, visible: Callable[[str], bool] | None = None) -> str | None:
        """Short disambiguation note for a tool_search match in a HIGH/MEDIUM cluster.
        `visible(name)` limits the siblings it names to tools the caller may use: a note
        never tells a caller about a tool it cannot see (None when no sibling is visible)."""
        diag = self.tools.get(name)
        if diag is None:
            return None
        cl = self.clusters[diag.cluster]
        if cl.risk not in ("high", "medium"):
            return None
        others = [m for m in cl.members if m != name and (visible is None or visible(m))]
        if not others:
            return None
        shown = ", ".join(others[:3]) + (f" (+{len(others) - 3})" if len(others) > 3 else "")
        if diag.distinguishing:
            return f"Easily confused with {shown}; this one: {', '.join(diag.distinguishing[:max_tokens])}."
        return f"Easily confused with {shown}; its description does not tell them apart."

    def to_json(self) -> dict[str, Any]:
        return {
            "tools": self.n_tools,
            "theta": self.theta,
            "thresholds": {"high": self.high, "medium": self.medium},
            "margin_analysis": self.margin_analysis,
            "embedder": self.embedder,
            "counts": self.counts(),
            "clustered_tools": len(self.tools),
            "regenerate": sorted(n for n, d in self.tools.items() if d.diagnosis == "REGENERATE"),
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            "clusters": [
                {
                    "id": c.id,
                    "risk": c.risk,
                    "cohesion": round(c.cohesion, 4),
                    "worst_margin": None if c.worst_margin is None else round(c.worst_margin, 4),
                    "shared_tokens": list(c.shared),
                    "members": [
                        {
                            "name": m,
                            "margin": None if self.tools[m].margin is None else round(self.tools[m].margin, 4),  # type: ignore[arg-type]
                            "confused_with": self.tools[m].confused_with,
                            "distinguishing_tokens": list(self.tools[m].distinguishing),
                            "diagnosis": self.tools[m].diagnosis,
                            "query": self.tools[m].query,
                        }
                        for m in c.members
                    ],
                }
                for c in self.clusters
            ],
        }

    def format_text(self, *, limit: int | None = None) -> str:
        c = self.counts()
        head = f"Rift: {self.n_tools} tools, {len(self.clusters)} confusable clusters (theta {self.theta:g}, embedder {self.embedder})"
        if self.margin_analysis:
            head += f": {c['high']} HIGH, {c['medium']} MEDIUM, {c['low']} LOW"
        else:
            head += ": margin analysis off, risks unrated"
        lines = [head]
        order = sorted(self.clusters, key=lambda cl: (-_RANK[cl.risk], cl.worst_margin if cl.worst_margin is not None else 0.0, -cl.cohesion))
        for cl in order[: limit if limit is not None else len(order)]:
            wm = "" if cl.worst_margin is None else f"  worst margin {cl.worst_margin:+.3f}"
            lines.append("")
            lines.append(f"{cl.risk.upper():8} cluster {cl.id}: {len(cl.members)} tools, cohesion {cl.cohesion:.3f}{wm}")
            if cl.shared:
                lines.append(f"  shared: {', '.join(cl.shared[:8])}")
            for m in cl.members:
                d = self.tools[m]
                mg = "" if d.margin is None else f"margin {d.margin:+.3f} vs {d.confused_with}  "
                dist = ", ".join(d.distinguishing[:6]) or "(none)"
                lines.append(f"  - {m}: {mg}distinct: {dist}  [{d.diagnosis}]")
        if limit is not None and len(order) > limit:
            lines.append(f"\n... {len(order) - limit} more clusters (use --json for all)")
        regen = sorted(n for n, d in self.tools.items() if d.diagnosis == "REGENERATE")
        if regen:
            lines.append("")
            lines.append(f"REGENERATE ({len(regen)}): {', '.join(regen[:20])}" + (" ..." if len(regen) > 20 else ""))
        return "\n".join(lines)


def analyse(
    tools: Sequence[tuple[str, str]],
    embedder: Any,
    *,
    theta: float = 0.65,
    high: float = 0.10,
    medium: float = 0.20,
    margin: bool = True,
    schemas: Mapping[str, Mapping[str, Any]] | None = None,
    token_texts: Mapping[str, str] | None = None,
    vectors: np.ndarray | None = None,
) -> RiftReport:
    """Rift report for `tools` = [(namespaced name, document text)].

    `embedder` has `.embed(texts)` and `.embed_queries(texts)` -> (n, d) float32 L2-normalised,
    and `.name`; `vectors`
    (the same rows, already embedded) skips embedding the documents. `schemas` maps a name to
    its inputSchema for the layer-2 queries (name words only without it). `token_texts`
    overrides the text compared in layer 3 (e.g. the card summary plus parameter names).
    Blocking and CPU-bound: run it in a worker thread.
    """
    if not 0 < theta <= 1:
        raise ValueError(f"theta must be in (0, 1], got {theta}")
    if not 0 <= high <= medium:
        raise ValueError(f"thresholds must satisfy 0 <= high <= medium, got high={high} medium={medium}")
    names = [n for n, _ in tools]
    if len(set(names)) != len(names):
        seen_names: set[str] = set()
        twice = next(n for n in names if n in seen_names or seen_names.add(n))  # type: ignore[func-returns-value]
        raise ValueError(f"tool names must be unique: two tools are named {twice!r} (server__tool)")
    secs: dict[str, float] = {}
    t0 = time.perf_counter()
    if vectors is None:
        vecs = np.asarray(embedder.embed([t for _, t in tools]), dtype=np.float32) if tools else np.zeros((0, 1), np.float32)
    else:
        vecs = np.asarray(vectors, dtype=np.float32)
        if vecs.shape[0] != len(tools):
            raise ValueError(f"vectors has {vecs.shape[0]} rows for {len(tools)} tools")
    secs["embed_docs"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    groups = agglomerate(vecs, theta)
    secs["cluster"] = time.perf_counter() - t0

    # Layer 2: one synthetic query per clustered tool.
    t0 = time.perf_counter()
    clustered = [i for g in groups for i in g]
    queries = {i: synthetic_query(names[i], (schemas or {}).get(names[i])) for i in clustered}
    qvec: dict[int, np.ndarray] = {}
    if margin and clustered:
        qv = np.asarray(embedder.embed_queries([queries[i] for i in clustered]), dtype=np.float32)
        qvec = {i: qv[k] for k, i in enumerate(clustered)}
    secs["margins"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    texts = dict(tools)
    tok = {i: _tokens(token_texts.get(names[i], texts[names[i]]) if token_texts else texts[names[i]]) for i in clustered}
    clusters: list[Cluster] = []
    diags: dict[str, ToolDiag] = {}
    for cid, g in enumerate(groups):
        # Counted once a cluster, not once a member: a tool's own tokens are those no sibling
        # has (count 1), the shared ones those every member has; and each member's row of
        # query-sibling similarities comes from one matrix product a block of members. A
        # cluster of thousands of look-alike tools costs O(m) Python steps, not O(m^2).
        counts = Counter(t for i in g for t in set(tok[i]))
        shared = {t for t, c in counts.items() if c == len(g)}
        gv = vecs[np.asarray(g)]
        qm = np.stack([qvec[i] for i in g]) if margin else gv
        worst: float | None = None
        for start in range(0, len(g), _BLOCK):
            block = qm[start:start + _BLOCK] @ gv.T  # (members in the block, members)
            for r, i in enumerate(g[start:start + _BLOCK]):
                row = block[r]
                own = float(row[start + r])
                row[start + r] = -np.inf
                k = int(np.argmax(row))
                seen: set[str] = set()
                dist = tuple(t for t in tok[i] if counts[t] == 1 and not (t in seen or seen.add(t)))  # type: ignore[func-returns-value]
                m: float | None = None
                if margin:
                    m = own - float(row[k])
                    worst = m if worst is None else min(worst, m)
                nearest = names[g[k]]
                if not dist:
                    diagnosis = "REGENERATE"
                elif m is not None and m < high:
                    diagnosis = "SHARPEN"
                else:
                    diagnosis = "OK"
                diags[names[i]] = ToolDiag(names[i], cid, m, nearest, dist, diagnosis, queries[i])
        if worst is None:
            risk = "unrated"
        elif worst < high:
            risk = "high"
        elif worst < medium:
            risk = "medium"
        else:
            risk = "low"
        shared_sorted = tuple(sorted(shared, key=lambda t: (tok[g[0]].index(t), t)))
        clusters.append(Cluster(cid, tuple(names[i] for i in g), cohesion(vecs, g), risk, worst, shared_sorted))
    secs["tokens"] = time.perf_counter() - t0
    return RiftReport(
        clusters=tuple(clusters),
        tools=diags,
        n_tools=len(tools),
        theta=theta,
        high=high,
        medium=medium,
        margin_analysis=margin,
        embedder=str(getattr(embedder, "name", type(embedder).__name__)),
        seconds=secs,
    )
