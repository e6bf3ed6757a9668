"""The operator's upstream commands (`toolatlas upstream list|restart|relist`) and the audit
trail of every operator command (events and metrics).

What each upstream is doing, a fresh session on request and a forced re-list that says what
changed. The composition root adds `reload` and offers all of it to the surface as
`gateway.ports.AdminPort`; the surface serves them on the Unix socket to the daemon's owner
only (surface.admin).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import anyio

from toolatlas import events as ev
from toolatlas.config import Upstream
from toolatlas.errors import BadInput, UpstreamUnavailable
from toolatlas.gateway.audit import who
from toolatlas.gateway.catalog import LiveCatalog
from toolatlas.gateway.ports import Connection
from toolatlas.metrics import ADMIN_COMMANDS, Metrics
from toolatlas.redact import Redactor
from toolatlas.upstream.pool import Pool, UpstreamStatus
from toolatlas.upstream.state import UpstreamState

log = logging.getLogger(__name__)

# Seconds a restart waits, beyond the upstream's connect and list_tools timeouts, for the
# fresh session to settle and its tools to reach the catalog.
RESTART_MARGIN_S = 5.0


def upstream_entry(st: UpstreamStatus) -> dict[str, Any]:
    """One upstream as `toolatlas upstream list` shows it (not yet redacted)."""
    return {
        "name": st.name,
        "transport": st.transport,
        "state": st.state.value,
        "tools": st.tools,
        "pid": st.pid,
        "reason": st.reason,
        "last_error": st.last_error,
        "last_error_at": st.last_error_at,
        "since": st.since,
        "reconnects": st.reconnects,
        "next_retry_in": None if st.next_retry_in is None else round(st.next_retry_in, 2),
        "protocol_version": st.protocol_version,
    }


class UpstreamAdmin:
    """See the module docstring. `upstreams()` is the running config's upstream list."""

    def __init__(
        self, pool: Pool, catalog: LiveCatalog, upstreams: Callable[[], Sequence[Upstream]], *,
        redactor: Redactor, events: ev.Events, metrics: Metrics,
        approval: Callable[[str, str], str] = lambda _name, _state: "active",
    ) -> None:
        """`approval(name, state)`: the upstream's approval lifecycle state (gateway.approval)."""
        self._approval = approval
        self._pool = pool
        self._catalog = catalog
        self._upstreams = upstreams
        self._redact = redactor
        self._events = events
        self._metrics = metrics

    def _configured(self, name: str) -> Upstream:
        """`name`'s config, or BadInput naming every configured upstream."""
        ups = {u.name: u for u in self._upstreams()}
        if name in ups and self._pool.get(name) is not None:
            return ups[name]
        known = ", ".join(ups) or "none (the config has no [[upstream]])"
        raise BadInput(f"no upstream named {name!r}; the configured upstreams are: {known}")

    def list(self) -> list[dict[str, Any]]:
        """Every upstream: state, tools, pid (stdio), last error; reasons redacted."""
        return [self._redact.tree({**upstream_entry(st), "approval": self._approval(st.name, st.state.value)})
                for st in self._pool.status()]

    async def restart(self, name: str) -> dict[str, Any]:
        """Close `name`'s session (a stdio child is stopped) and start a fresh one; wait until
        it is READY with its tools in the catalog, or failed, or the bounded wait ran out.

        Returns `{"upstream": entry, "ok", "previous_pid", "error"}`. Raises BadInput for an
        unknown or disabled upstream, UpstreamUnavailable while the daemon is starting."""
        up = self._configured(name)
        if not up.enabled:
            raise BadInput(f"upstream {name!r} is disabled in the config (enabled = false); set enabled = true "
                           "and run `toolatlas reload` to start it")
        before = self._pool.get(name)
        wait = up.timeouts.connect + up.timeouts.list_tools + RESTART_MARGIN_S
        st = await self._pool.restart(name, timeout=wait)
        indexing = up.timeouts.list_tools + RESTART_MARGIN_S
        if st.state is UpstreamState.READY:
            # READY comes just before the tools are handed over: a call right after the
            # answer must find them (bounded: a slow index update only delays the answer).
            with anyio.move_on_after(indexing):
                while not self._catalog.view.server(name).available and self._is_ready(name):
                    await anyio.sleep(0.02)
            st = self._pool.get(name) or st
        ok = st.state is UpstreamState.READY and self._catalog.view.server(name).available
        error = None
        if st.state is UpstreamState.READY and not ok:
            error = f"connected, but its tools did not reach the catalog within {indexing:g} s"
        elif not ok:
            error = st.reason or st.last_error or f"still {st.state.value} after {wait:g} s"
        log.info("upstream %s: restarted by operator: %s", name, st.state.value + (f" ({error})" if error else ""))
        result: dict[str, Any] = self._redact.tree({
            "upstream": upstream_entry(st), "ok": ok, "previous_pid": before.pid if before else None, "error": error,
        })
        return result

    def _is_ready(self, name: str) -> bool:
        st = self._pool.get(name)
        return st is not None and st.state is UpstreamState.READY

    async def relist(self, name: str) -> dict[str, Any]:
        """Fetch `name`'s tools/list now, hand it to the catalog (even when unchanged) and
        say what changed since the last listing: `{"upstream", "tools", "added", "removed",
        "changed"}` (namespaced names). Raises BadInput (unknown), UpstreamUnavailable (not
        READY, or lost meanwhile) or UpstreamTimeout (the re-list took too long)."""
        self._configured(name)
        st = self._pool.get(name)
        if st is None or st.state is not UpstreamState.READY:
            state = st.state.value if st else "gone"
            why = f": {st.reason}" if st and st.reason else ""
            raise UpstreamUnavailable(self._redact(
                f"upstream {name!r} is {state}{why}; it has no session to re-list: "
                f"`toolatlas upstream restart {name}` reconnects it now"))
        before = {r.name: r for r in self._pool.tools(name) or ()}
        await self._pool.refresh(name)
        after = {r.name: r for r in self._pool.tools(name) or ()}
        result = {
            "upstream": name,
            "tools": len(after),
            "added": sorted(after.keys() - before.keys()),
            "removed": sorted(before.keys() - after.keys()),
            "changed": sorted(n for n in after.keys() & before.keys() if after[n] != before[n]),
        }
        self._events.emit(ev.UPSTREAM_RELISTED, **result)
        return result

    def audit(self, conn: Connection, method: str, *, upstream: str | None, outcome: str,
              message: str | None = None) -> None:
        """Record one operator command: an event and the admin_commands counter. `outcome`
        "refused" is a peer the command is not for (admin_command_refused)."""
        command = method.removeprefix("toolatlas/").replace("/", "_")
        label = command if command in ADMIN_COMMANDS else "unknown"
        self._metrics.count_admin_command(label, outcome)
        if outcome == "refused":
            self._events.emit(ev.ADMIN_COMMAND_REFUSED, command=command[:64], pid=conn.pid, reason=message,
                              **who(conn))
            return
        self._events.emit(ev.ADMIN_COMMAND_COMPLETED, command=command[:64], upstream=upstream, outcome=outcome,
                          message=None if message is None else message[:ev.MESSAGE_CHARS], **who(conn))


__all__ = ["RESTART_MARGIN_S", "UpstreamAdmin", "upstream_entry"]
