"""The composition root: the gateway, its MCP surface and their listeners, wired and run.

`Daemon` builds the pieces and connects them (the catalog's change listeners to the
surface, the surface's live-client counts to the gateway's status), starts them in stages
(socket and HTTP listening, then the gateway: index load, upstream pool, readiness), drains
and reloads them. `serve` runs it as the process: signals, sd_notify, metrics.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from toolatlas import events as ev
from toolatlas import logfile, memory
from toolatlas.catalog.attest import Attestor
from toolatlas.config import Config, DaemonSection, load, metrics_address, secrets
from toolatlas.metrics import MetricsBindError
from toolatlas.errors import ConfigError, ToolatlasError
from toolatlas.gateway import Gateway, keep_running, restart_keys
from toolatlas.gateway.approval import Decision
from toolatlas.gateway.ports import Connection
from toolatlas.guidance import Guidance
from toolatlas.notify import Notifier, listen_fds, run_watchdog, scrub_environment
from toolatlas.paths import config_environment, read_environment_file
from toolatlas.redact import RedactingFormatter, Redactor
from toolatlas.surface.admin import AdminLane
from toolatlas.surface.server import Surface
from toolatlas.surface.unix import UnixServer

if TYPE_CHECKING:  # imported where [http] listen is set: it brings OAuth's JWT and x509 (~0.1 s of a start)
    from toolatlas.surface.http import HttpEndpoint

# Seconds a thread may hold the GIL while another waits for it (Python's default: 0.005).
SWITCH_INTERVAL_S = 0.001
# How often readiness looks whether the embedding model has joined (for systemd's STATUS=).
HYBRID_POLL_S = 1.0
# At a stop, how long the shared store may take to receive what is buffered (the rest is sent
# at the next start).
STORE_FLUSH_ON_STOP_S = 2.0
log = logging.getLogger(__name__)


class Daemon:
    """The gateway with its surface on the Unix socket (and the HTTP endpoint if set).

    It is the operator's `AdminPort` too: the upstream commands come from the gateway, the
    reload is the one SIGHUP runs (`reload_config`)."""

    def __init__(
        self, cfg: Config, *, listen_socket: socket.socket | None = None, redactor: Redactor | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.gateway = Gateway(cfg, redactor=redactor)
        self.notifier = notifier or Notifier(socket_path="")
        self._reload_lock = anyio.Lock()
        # The environment file as at the start: a ${VAR} systemd took from it follows its edits.
        self._environment_file = read_environment_file()
        self.surface = Surface(self.gateway)
        self.gateway.status_service.surface = self.surface
        self.gateway.catalog.on_change.append(self.surface.tools_changed)
        self.gateway.federation.on_change.append(self.surface.relays.lists_changed)
        self.gateway.federation.on_access.append(self.surface.relays.tell)
        self.surface.bus.joined = self.gateway.federation.resee  # a listen stream saw the lists as they are
        self.gateway.log_listeners.append(self.surface.relays.log)
        self.unix = UnixServer(
            self.surface.server,
            cfg.daemon.socket,
            mode=int(cfg.daemon.socket_mode, 8),
            owner=cfg.daemon.socket_owner,
            group=cfg.daemon.socket_group,
            max_message_bytes=cfg.daemon.max_message_bytes,
            max_clients=cfg.daemon.max_clients,
            max_clients_per_uid=cfg.daemon.max_clients_per_uid,
            message_timeout=cfg.daemon.message_timeout,
            idle_timeout=cfg.daemon.idle_timeout,
            listen_socket=listen_socket,
            on_bad_message=lambda _msg: self.gateway.bad_message(),
            fast_lane=self.surface.lane,
            connections=self.surface.connections,
            admin=AdminLane(self),
        )
        # One more socket per [[endpoint]] with a socket: the same server and connections,
        # its clients tagged with the endpoint's name (visibility narrows them to its upstreams).
        self.endpoint_sockets = [
            UnixServer(self.surface.server, ep.socket, mode=int(cfg.daemon.socket_mode, 8), owner=cfg.daemon.socket_owner,
                       group=cfg.daemon.socket_group, max_message_bytes=cfg.daemon.max_message_bytes,
                       max_clients=cfg.daemon.max_clients, max_clients_per_uid=cfg.daemon.max_clients_per_uid,
                       message_timeout=cfg.daemon.message_timeout, idle_timeout=cfg.daemon.idle_timeout,
                       on_bad_message=lambda _msg: self.gateway.bad_message(), fast_lane=self.surface.lane,
                       connections=self.surface.connections, admin=AdminLane(self), endpoint=ep.name)
            for ep in cfg.endpoint if ep.socket
        ]
        self.http: HttpEndpoint | None = None
        self.sharing: Any = None  # store.wiring.Sharing when [store] url is set
        if cfg.store.url:
            self.sharing = _sharing(self.gateway)

    def __repr__(self) -> str:
        return f"<Daemon {self.gateway!r} {self.unix!r}>"

    @property
    def cfg(self) -> Config:
        return self.gateway.cfg

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen, then run the gateway; started() once the socket (and HTTP) listen."""
        cfg = self.cfg
        async with anyio.create_task_group() as tg:
            await tg.start(self.unix.run)
            for extra in self.endpoint_sockets:
                await tg.start(extra.run)
            if cfg.http.listen:
                from toolatlas.surface.http import HttpEndpoint

                self.http = HttpEndpoint(self.surface.server, cfg.http, max_message_bytes=cfg.daemon.max_message_bytes,
                                         connections=self.surface.connections, max_clients=cfg.daemon.max_clients,
                                         message_timeout=cfg.daemon.message_timeout, on_denied=self.gateway.denied,
                                         max_clients_per_principal=cfg.daemon.max_clients_per_uid,
                                         paths={ep.http_path.rstrip("/"): ep.name for ep in cfg.endpoint if ep.http_path})
                await tg.start(self.http.run)
            task_status.started()
            if self.sharing is not None:  # before the gateway: its first catalog is shared
                await tg.start(self.sharing.run)
            await tg.start(self.gateway.run)

    async def drain(self, timeout: float) -> None:
        """Stop accepting connections and let in-flight calls finish (bounded)."""
        await self.unix.stop_accepting()
        for extra in self.endpoint_sockets:
            await extra.stop_accepting()
        if self.http is not None:
            await self.http.stop_accepting()
        await self.gateway.drain(timeout)
        if self.sharing is not None:  # the last shared writes (audit records) go now if they can
            await self.sharing.replica.flush(STORE_FLUSH_ON_STOP_S)

    def check_reload(self, new: Config) -> None:
        """Refuse (ConfigError naming the key) a reload whose security-relevant settings
        cannot be applied to the running daemon: the running config is then kept whole, so
        no setting is half applied and no removed credential or endpoint stays alive."""
        old = self.cfg
        if new.http.listen != old.http.listen:
            raise ConfigError(f"[http] listen changed from {old.http.listen!r} to {new.http.listen!r}: "
                              "the endpoint can only be moved, opened or closed by a restart")
        where = {(ep.name, ep.socket, ep.http_path) for ep in old.endpoint}
        if where != {(ep.name, ep.socket, ep.http_path) for ep in new.endpoint}:
            raise ConfigError("[[endpoint]] names, sockets or http_paths changed: endpoints can only be added, removed "
                              "or moved by a restart (their upstreams, environment and templates reload)")

    async def reload(self, new: Config, attestor: Attestor, guidance: Guidance | None = None) -> dict[str, list[str]]:
        """Apply a checked reload: socket mode, ownership and limits (Unix sockets) first,
        then tokens and admission rules (HTTP), access rules and upstreams (gateway).
        ConfigError only before anything changed: a socket owner or group that cannot be
        applied leaves every socket as it was."""
        self.check_reload(new)
        d = new.daemon
        done: list[UnixServer] = []
        try:
            for unix in (self.unix, *self.endpoint_sockets):
                _reconfigure(unix, d)
                done.append(unix)
        except ConfigError:
            for unix in done:
                with contextlib.suppress(ConfigError):
                    _reconfigure(unix, self.cfg.daemon)
            raise
        if self.http is not None:
            self.http.reconfigure(new.http, max_message_bytes=d.max_message_bytes, max_clients=d.max_clients,
                                  message_timeout=d.message_timeout, max_clients_per_principal=d.max_clients_per_uid)
        summary = await self.gateway.reload(new, attestor, guidance)
        return summary

    async def reload_config(self) -> dict[str, Any]:
        """Re-read the config file and apply it: SIGHUP and `toolatlas reload` alike (one at a
        time). `{"applied": true, "config", "added", "removed", "changed", "restart_needed"}`,
        or `{"applied": false, "config", "error"}` when the file is invalid or a key cannot be
        applied to a running daemon (the error names it): the running config then stays whole.
        The reload is shielded: a client that hangs up does not leave it half applied."""
        with anyio.CancelScope(shield=True):
            async with self._reload_lock:
                # Before the first READY=1 (the index still loading) systemd must not hear READY.
                started = self.gateway.index_ready.is_set()
                if started:
                    await self.notifier.reloading()
                try:
                    summary: dict[str, Any] = self.gateway.redactor.tree(await self._reload_config())
                finally:
                    if started:
                        await self.notifier.ready()
        return summary

    async def _reload_config(self) -> dict[str, Any]:
        gw = self.gateway
        path, log_level = gw.cfg.source, gw.cfg.daemon.log_level
        try:
            loaded = await anyio.to_thread.run_sync(lambda: load(path, env=config_environment(self._environment_file)))
            # Keys that need a restart keep their running values (the new state_dir's cards are
            # not read early); they are reported against what runs, at every reload until then.
            later = restart_keys(gw.cfg, loaded)
            new = keep_running(gw.cfg, loaded)
            attestor = Attestor(new)  # a bad [cards] section is rejected before anything changes
            guidance = Guidance.load(new.surface.templates, new.daemon.environment, new.surface.publisher_text)  # so are bad templates
            summary = await self.reload(new, attestor, guidance)  # ConfigError: nothing changed
        except ConfigError as exc:
            log.error("reload rejected, keeping the running config: %s", exc)
            gw.events.emit(ev.CONFIG_RELOAD_REJECTED, reason=str(exc))
            return {"applied": False, "config": path, "error": str(exc)}
        if new.daemon.log_level != log_level:
            set_log_level(new.daemon.log_level)
        if later:
            log.warning("reload: %s changed; this takes effect only after a restart", ", ".join(later))
        gw.events.emit(ev.CONFIG_RELOADED, **summary)
        return {"applied": True, "config": path, **summary, "restart_needed": later}

    # -- the operator's AdminPort (surface.admin serves it to the daemon's owner) ------------

    def list_upstreams(self) -> list[dict[str, Any]]:
        return self.gateway.admin.list()

    async def restart_upstream(self, name: str) -> dict[str, Any]:
        try:
            return await self.gateway.admin.restart(name)
        except ToolatlasError as exc:
            raise self.gateway.redactor.exception(exc)

    async def relist_upstream(self, name: str) -> dict[str, Any]:
        try:
            return await self.gateway.admin.relist(name)
        except ToolatlasError as exc:
            raise self.gateway.redactor.exception(exc)

    async def decide_upstream(self, name: str, decision: str, principal: str) -> dict[str, Any]:
        return await self.gateway.decide_approval(name, Decision(decision), principal)

    def audit_admin(self, conn: Connection, method: str, *, upstream: str | None, outcome: str,
                    message: str | None = None) -> None:
        self.gateway.admin.audit(conn, method, upstream=upstream, outcome=outcome, message=message)

    def tool_definitions(self, conn: Connection, servers: list[str] | None) -> list[dict[str, Any]]:
        return self.gateway.tool_definitions(conn, servers)


def _reconfigure(unix: UnixServer, d: DaemonSection) -> None:
    unix.reconfigure(mode=int(d.socket_mode, 8), owner=d.socket_owner, group=d.socket_group,
                     max_message_bytes=d.max_message_bytes, max_clients=d.max_clients,
                     max_clients_per_uid=d.max_clients_per_uid, message_timeout=d.message_timeout,
                     idle_timeout=d.idle_timeout)


def _sharing(gw: Gateway) -> Any:
    """The shared store for `gw` (imported only when `[store] url` is set: a daemon without
    one never loads the database driver)."""
    from toolatlas.store import metrics as store_metrics
    from toolatlas.store.replica import Replica
    from toolatlas.store.wiring import Sharing

    sharing = Sharing(gw, Replica(gw.cfg.store, gw.cfg.daemon.state_dir, redactor=gw.redactor))
    store_metrics.register(gw.metrics.registry, sharing.status)
    return sharing


def _configure_logging(level: str, redactor: Redactor) -> None:
    """Log lines on stderr, every one (tracebacks too) redacted by the daemon's `redactor`."""
    handler = logging.StreamHandler()
    handler.setFormatter(RedactingFormatter(redactor, "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, level), handlers=[handler])
    set_log_level(level)


def set_log_level(level: str) -> None:
    """`[daemon] log_level` for the daemon's log lines (at the start and at a reload)."""
    logging.getLogger().setLevel(getattr(logging, level))
    # The HTTP clients log every request at INFO (each upstream ping): keep them quiet. The SDK's
    # streamable-HTTP client logs each new session's Mcp-Session-Id (which lets whoever holds it
    # act in that session on some servers) and each event stream reconnect at INFO, naming no upstream.
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2", "mcp.client.streamable_http"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, getattr(logging, level)))


async def serve(
    cfg: Config, *, ready: Callable[[Daemon], None] | None = None, redactor: Redactor | None = None,
) -> None:
    """Run the daemon until SIGTERM/SIGINT; SIGHUP reloads the config (and adds its secrets
    to `redactor`, the one the log formatter uses).

    systemd: READY=1 once the socket listens and the upstreams that connected have their
    first listing indexed, i.e. once tool_search serves (BM25 at least: on a fresh state_dir
    the embedding model is still exporting then, and STATUS= says so until hybrid search is
    ready); WATCHDOG=1 pings from the event loop, RELOADING=1 around a reload, STOPPING=1 on
    shutdown.
    """
    notifier = Notifier()
    activated = listen_fds()
    daemon = Daemon(cfg, listen_socket=activated[0] if activated else None, redactor=redactor, notifier=notifier)
    gw = daemon.gateway
    early = signal.getsignal(signal.SIGHUP)  # cli.EarlyHangup: SIGHUPs while the daemon started
    stop = signal.getsignal(signal.SIGINT)  # EarlyStop (main_serve): a SIGINT or SIGTERM meanwhile
    # The signal receiver encloses the whole task tree: a second Ctrl-C or SIGTERM while the
    # tree drains and tears down is queued and logged, never the default action (a
    # KeyboardInterrupt traceback or death by SIGTERM); once the tree is gone, both are ignored.
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async with anyio.create_task_group() as tg:
            await tg.start(run_watchdog, notifier)  # reads WATCHDOG_USEC before the scrub
            if log_max := logfile.max_bytes_from_env():  # started by the shim: its log file kept bounded
                await tg.start(logfile.keep_bounded, log_max)
            scrub_environment()  # children must not inherit NOTIFY_SOCKET, LISTEN_FDS or WATCHDOG_*
            if addr := metrics_address(cfg):
                try:
                    await tg.start(gw.metrics.serve, *addr)
                except MetricsBindError as exc:  # a busy port: one clear line, not a traceback
                    raise ConfigError(str(exc)) from None
            await tg.start(daemon.run)
            if getattr(early, "count", 0):
                log.info("SIGHUP arrived while the daemon started: reloading the config now")
                await daemon.reload_config()

            async def announce_ready() -> None:
                await gw.index_ready.wait()
                view = gw.catalog.view
                serving = f"serving {len(view.by_name)} tools from {len(view.available)} upstreams"
                loading = gw.engine.progress.pending
                await notifier.ready(serving + ("; BM25 search while the embedding model loads" if loading else ""))
                if ready is not None:
                    ready(daemon)
                if loading:
                    while gw.engine.progress.pending:
                        await anyio.sleep(HYBRID_POLL_S)
                    view = gw.catalog.view
                    notifier.status(f"serving {len(view.by_name)} tools from {len(view.available)} upstreams; "
                                    f"search: {gw.engine.degraded or 'hybrid'}")

            tg.start_soon(announce_ready)
            signum: int | None = getattr(stop, "signum", None)
            if signum is None:
                async for signum in signals:
                    if signum != signal.SIGHUP:
                        break
                    await daemon.reload_config()
            assert signum is not None
            log.info("received %s: draining for up to %.0f s", signal.Signals(signum).name, gw.cfg.daemon.drain_timeout)

            async def late_signals() -> None:
                async for late in signals:
                    log.warning("received %s while draining; already stopping", signal.Signals(late).name)

            tg.start_soon(late_signals)
            await notifier.stopping()
            await daemon.drain(gw.cfg.daemon.drain_timeout)
            await gw.close_upstreams()
            gw.close_audit()
            tg.cancel_scope.cancel()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # the receiver restored the defaults on its exit
    log.info("stopped")


class EarlyStop:
    """SIGINT and SIGTERM from `main_serve`'s start until `serve` takes them over: `serve`
    then drains at once. asyncio's runner would cancel the starting task on a SIGINT (a
    daemon that went on serving, Ctrl-C lost) and SIGTERM's default action skips the drain."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self, signum: int, _frame: object) -> None:
        self.signum = self.signum or signum


def main_serve(cfg: Config) -> int:
    early_stop = EarlyStop()
    imports = signal.signal(signal.SIGINT, early_stop)  # cli.EarlyInterrupt, under `toolatlas serve`
    signal.signal(signal.SIGTERM, early_stop)
    if getattr(imports, "count", 0):  # a Ctrl-C during the imports whose KeyboardInterrupt was dropped
        raise KeyboardInterrupt
    redactor = Redactor(secrets(cfg))
    _configure_logging(cfg.daemon.log_level, redactor)
    memory.tune_heap()
    # The event loop hands the GIL back and forth with worker threads doing Python work (a big
    # listing's records and plan, name suggestions, token counts). Each time the loop wakes it
    # waits up to the switch interval for the GIL; at the default 5 ms a request needing a few
    # wake-ups waited ~100 ms behind one such thread. 1 ms bounds that wait 5x tighter.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    backend_options: dict[str, Any] = {}
    if cfg.daemon.event_loop == "uvloop":
        try:
            import uvloop  # noqa: F401

            backend_options = {"use_uvloop": True}
        except ImportError:
            log.warning("uvloop is not installed; using asyncio's event loop")
    try:
        anyio.run(functools.partial(serve, cfg, redactor=redactor), backend="asyncio", backend_options=backend_options)
    except BaseExceptionGroup as group:
        raise _sole_leaf(group) from None
    return 0


def _sole_leaf(exc: BaseException) -> BaseException:
    """The one real error inside nested task-group exception groups, if there is just one."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


__all__ = ["Daemon", "main_serve", "serve"]
