"""Prometheus figures of the shared store, computed from the replica at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from toolatlas.metrics import NAMESPACE

_GAUGES = (
    ("store_connected", "connected", "1 while the shared store (PostgreSQL) is reachable, else 0."),
    ("store_buffered_writes", "buffered", "Shared writes waiting in the on-disk buffer for the store."),
    ("store_buffered_bytes", "buffered_bytes", "Bytes of shared writes waiting in the on-disk buffer."),
    ("store_audit_buffered", "audit_buffered", "Audit records waiting in the on-disk spool for the store (of buffered_writes)."),
    ("store_vectors_pending", "vectors_pending", "Embeddings waiting (in memory) to be shared."),
)
_COUNTERS = (
    ("store_writes_sent", "sent", "Buffered shared writes the store committed."),
    ("store_writes_refused", "refused", "Shared writes refused because the on-disk buffer was full."),
    ("store_writes_rejected", "rejected", "Buffered writes the database refused (their content) and were dropped."),
    ("store_changes_received", "received", "Changes other replicas made, applied here."),
    ("store_reconnects", "reconnects", "Reconnections to the shared store after it was lost."),
    ("store_vectors_fetched", "vectors_fetched", "Embeddings taken from the shared cache instead of computed."),
)


class StoreCollector:
    """Reads `source()` (the store section of catalog_status) once per scrape."""

    def __init__(self, source: Callable[[], dict[str, Any]]) -> None:
        self._source = source

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        state = self._source()
        out: list[Metric] = []
        for name, key, doc in _GAUGES:
            g = GaugeMetricFamily(f"{NAMESPACE}_{name}", doc)
            g.add_metric([], float(state.get(key) or 0))
            out.append(g)
        for name, key, doc in _COUNTERS:
            c = CounterMetricFamily(f"{NAMESPACE}_{name}", doc)
            c.add_metric([], float(state.get(key) or 0))
            out.append(c)
        return out


def register(registry: CollectorRegistry, source: Callable[[], dict[str, Any]]) -> None:
    registry.register(StoreCollector(source))


__all__ = ["StoreCollector", "register"]
