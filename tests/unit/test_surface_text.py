"""The meta-tools and instructions rendered per caller (gateway.guide.SurfaceText): what its
cache keeps alive as the catalog changes."""

from __future__ import annotations

import gc

from toolatlas.catalog.attest import AttestResult
from toolatlas.catalog.model import ToolRecord
from toolatlas.config import parse
from toolatlas.gateway.guide import Guidances, SurfaceText
from toolatlas.gateway.ports import Connection
from toolatlas.gateway.view import CatalogView, plan_listing
from toolatlas.gateway.visibility import Visibility

CONFIG = '[[upstream]]\nname = "a"\ntransport = "stdio"\ncommand = "true"\n'


def _live_views() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is CatalogView)


def test_a_superseded_catalog_view_is_not_kept_by_the_rendered_text() -> None:
    """Each catalog change (an upstream's list_changed, a relist, a reconnect) publishes a new
    view holding the whole catalog; a rendering cached for a view that has been replaced can
    never be served again (a view never comes back), so it must not keep that view alive: a
    daemon whose upstreams change their tools held up to CACHE_ENTRIES (64) stale copies of
    its catalog (bench/soak.py)."""
    cfg = parse(CONFIG)
    current = [CatalogView()]
    visibility = Visibility(cfg, lambda: current[0], lambda: True)
    text = SurfaceText(Guidances(cfg, visibility), visibility, lambda: current[0], lambda: ["a"])
    conn = Connection(id=1, token="")
    before = _live_views()
    for i in range(10):
        tools = [ToolRecord.make("a", f"tool_{i}_{k}", f"does thing {k} of round {i}", {"type": "object"}) for k in range(20)]
        verdict = AttestResult({t.tool: (t.description, "", ()) for t in tools}, {}, "unattested")
        current[0] = plan_listing(current[0], "a", tools, verdict).final
        assert "a" in text.instructions(conn)
        assert text.meta_tools(conn)
    assert _live_views() <= before + 1  # the current view, nothing older
