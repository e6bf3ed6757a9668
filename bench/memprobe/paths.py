"""What keeps old tool records alive: run inside a daemon by the probe,
TOOLATLAS_MEMPROBE_TYPES=1 TOOLATLAS_MEMPROBE_COLLECT=1 TOOLATLAS_MEMPROBE_EXEC=bench/memprobe/paths.py
(bench/soak.py --probe passes the environment on). RESULT gets the ToolRecord count per
server/tool (a tool whose count grows with each catalog change has copies kept), and for a
few records of tool TOOLATLAS_MEMPROBE_PATH_TOOL (default "echo") a referrer path up to a
long-lived object (a module, a gateway/surface/upstream/engine object, a task).
"""
import os
import gc, collections, sys, types as _t
def _label(o):
    return f"{type(o).__module__}.{type(o).__qualname__}"
def _edge(parent, child):
    try:
        if isinstance(parent, dict):
            for k, v in parent.items():
                if v is child: return f"[{k!r:.40}]"
                if k is child: return "(key)"
        d = getattr(parent, "__dict__", None)
        if isinstance(d, dict):
            for k, v in d.items():
                if v is child: return f".{k}"
        for k in getattr(type(parent), "__slots__", ()) or getattr(type(parent), "__struct_fields__", ()):
            if getattr(parent, k, None) is child: return f".{k}"
        if d is child: return ".__dict__"
    except Exception:
        pass
    return ""
objs = gc.get_objects()
recs = [o for o in objs if _label(o) == "toolatlas.catalog.model.ToolRecord"]
RESULT["record_names"] = dict(collections.Counter(f"{r.server}/{r.tool}" for r in recs).most_common(12))
targets = [r for r in recs if r.tool == os.environ.get("TOOLATLAS_MEMPROBE_PATH_TOOL", "echo")]
skip = {id(objs), id(recs), id(targets), id(sys._getframe())}
for o in objs:
    if type(o).__name__ == "SurfaceText":
        RESULT["surface_text_cache"] = len(o._cache)
paths = []
for t in targets[::max(1, len(targets) // 6)]:
    # BFS upward
    prev = {id(t): None}
    keep = {id(t): t}
    frontier = [t]
    found = None
    for depth in range(30):
        nxt = []
        for o in frontier:
            for r in gc.get_referrers(o):
                if id(r) in skip or id(r) in prev or isinstance(r, _t.FrameType) or r is frontier or r is nxt:
                    continue
                prev[id(r)] = o; keep[id(r)] = r
                if isinstance(r, _t.ModuleType) or (type(r).__module__ or "").startswith(("toolatlas.gateway", "toolatlas.surface", "toolatlas.upstream", "toolatlas.retrieval.engine", "anyio", "asyncio")) and not isinstance(r, (dict, list, tuple)) and not type(r).__module__.startswith(("toolatlas.gateway.view", "toolatlas.catalog", "toolatlas.gateway.ports")) and type(r).__name__ not in ("CatalogView", "ServerCatalog"):
                    found = r; break
                nxt.append(r)
            if found is not None: break
        if found is not None: break
        frontier = nxt[:3000]
    chain = []
    o = found
    while o is not None:
        p = prev.get(id(o))
        chain.append(_label(o) + (_edge(o, p) if p is not None else ""))
        o = p
    paths.append(f"{t.server}/{t.tool}: " + " -> ".join(chain))
RESULT["paths"] = paths
