"""What a reload applies to a running daemon, and what it says it leaves for a restart:
`toolatlas reload` through the real CLI against a real daemon, one config area at a time."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.daemon import Daemon, stdio_faultserver, stdio_testserver

from toolatlas.catalog.cards_cli import keygen_main, main as cards_main
from toolatlas.surface.rawclient import RpcError


def reload(d: Daemon) -> dict[str, Any]:
    """`toolatlas reload --json` against `d`, as an operator runs it; its answer."""
    out = subprocess.run([sys.executable, "-m", "toolatlas", "reload", "--socket", d.socket, "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode in (0, 78), out.stderr
    answer: dict[str, Any] = json.loads(out.stdout)
    return answer


def test_a_restart_only_key_waits_for_the_restart_and_says_so_at_every_reload(tmp_path: Path) -> None:
    """A moved state_dir (or socket) is reported at this reload and the next ones until a
    restart, and not once the file is back at the running value; meanwhile the daemon goes on
    with the running state_dir: an upstream restarted by the reload keeps its card there."""
    key = tmp_path / "op.key"
    assert keygen_main(["--out", str(key)]) == 0
    d = Daemon(tmp_path, stdio_testserver("one"), daemon_extra=f'\n[cards]\npublic_key = "{key}.pub"\n')
    assert cards_main(["generate", "--config", str(d.config), "--key", str(key), "--quiet"]) == 0
    base = d.config.read_text()
    with d:
        d.wait_for(lambda: d.status()["cards"]["servers"]["one"]["card"] == "verified", 30, "one attested")
        moved = base.replace(str(tmp_path / "state"), str(tmp_path / "elsewhere"))
        assert moved != base
        # one changes too (its environment): it restarts and lists again, and is attested again
        d.config.write_text(moved.replace('name = "one"\n', 'name = "one"\nenv = { RELOADED = "1" }\n'))
        first = reload(d)
        assert first["applied"] and first["changed"] == ["one"], first
        assert first["restart_needed"] == ["daemon.state_dir"], first
        d.wait_for(lambda: d.status()["servers"][0]["state"] == "ready", 60, "one back after its restart")
        d.wait_for(lambda: d.status()["cards"]["servers"]["one"]["card"] == "verified", 30,
                   "one's card still read from the running state_dir")
        # its new listing joins search once indexed, which may come after READY and the card
        d.wait_for(lambda: d.search("echo a message back") == ["one__echo"], 30, "one's tools back in search")

        again = reload(d)
        assert again["applied"] and again["restart_needed"] == ["daemon.state_dir"], again

        d.config.write_text(base)
        back = reload(d)
        assert back["applied"] and back["restart_needed"] == [], back


def test_learning_switched_on_by_a_reload_records(tmp_path: Path) -> None:
    """`[learning] enabled = false` at the start, then true at a reload: a search followed by
    a call of its result is a usage event, kept in the store."""
    d = Daemon(tmp_path, stdio_testserver("one") + "[learning]\nenabled = false\n")
    base = d.config.read_text()

    with d:
        d.config.write_text(base.replace("enabled = false", "enabled = true"))
        assert reload(d)["applied"]
        with d.client() as c:
            found = c.call_tool("tool_search", {"query": "echo a message back", "top_k": 3})["structuredContent"]
            assert found["matches"][0]["name"] == "one__echo", found
            assert not c.call_tool("execute_tool", {"name": "one__echo", "arguments": {"message": "x"}}).get("isError")
        d.wait_for(lambda: d.status()["learning"]["events"] == 1, 30, "the usage event learned")
        assert (tmp_path / "state" / "learning.sqlite3").exists()

        d.config.write_text(base)
        assert reload(d)["applied"]
        assert d.status()["learning"]["enabled"] is False


def test_keys_read_only_at_the_start_are_named_as_waiting_for_a_restart(tmp_path: Path) -> None:
    """The result cache's size and lifetime, the event loop and the shared store's timings are
    read once at the start: a reload that changes them says so rather than ignoring them."""
    d = Daemon(tmp_path, stdio_testserver("one"))
    base = d.config.read_text()
    with d:
        d.config.write_text(base.replace("[search]\n", "[search]\ncache_size = 0\ncache_ttl = 5\n")
                            .replace("[daemon]\n", '[daemon]\nevent_loop = "asyncio"\n')
                            + "\n[store]\nretry_interval = 7\n")
        answer = reload(d)
        assert answer["applied"], answer
        assert answer["restart_needed"] == ["search.cache_size", "search.cache_ttl", "daemon.event_loop",
                                            "store.retry_interval"], answer


def test_log_level_changed_by_a_reload_applies_at_once(tmp_path: Path) -> None:
    """`[daemon] log_level` raised to WARNING at a reload: the INFO lines stop; back to INFO,
    they come again."""
    d = Daemon(tmp_path, stdio_testserver("one"))
    base = d.config.read_text()
    line = "upstream one: restarting by operator request"

    def restart() -> None:
        out = subprocess.run([sys.executable, "-m", "toolatlas", "upstream", "restart", "one", "--socket", d.socket],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr

    with d:
        d.config.write_text(base.replace("[daemon]\n", '[daemon]\nlog_level = "WARNING"\n'))
        assert reload(d)["applied"]
        restart()
        assert line not in d.log.read_text()
        d.config.write_text(base)
        assert reload(d)["applied"]
        restart()
        assert line in d.log.read_text()


def test_a_variable_from_the_environment_file_follows_its_edit_at_a_reload(tmp_path: Path) -> None:
    """As under systemd's `EnvironmentFile=`: the daemon starts with the file's variables in
    its environment. The operator rotates a token in the file and reloads: the upstream using
    it restarts with the new value."""
    xdg = tmp_path / "xdg"
    (xdg / "toolatlas").mkdir(parents=True)
    envfile = xdg / "toolatlas" / "environment"
    envfile.write_text("TA_RELOAD_TOKEN=first-token-value\n")
    d = Daemon(tmp_path, stdio_testserver("one") + 'env = { TOKEN = "${TA_RELOAD_TOKEN}" }\n')

    def child_token() -> str:
        out = subprocess.run([sys.executable, "-m", "toolatlas", "upstream", "list", "--json", "--socket", d.socket],
                             capture_output=True, text=True, timeout=300)
        pid = json.loads(out.stdout)["upstreams"][0]["pid"]
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        return next(v.decode().partition("=")[2] for v in environ if v.startswith(b"TOKEN="))

    with d.start(env={"XDG_CONFIG_HOME": str(xdg), "TA_RELOAD_TOKEN": "first-token-value"}):
        assert child_token() == "first-token-value"
        envfile.write_text("TA_RELOAD_TOKEN=second-token-value\n")
        answer = reload(d)
        assert answer["applied"] and answer["changed"] == ["one"], answer
        d.wait_for(lambda: child_token() == "second-token-value", 60, "one restarted with the new token")


def _cut_call_text(tmp_path: Path, cut: Callable[[Daemon], None], drain_timeout: int = 5) -> str:
    """The error text of a long call on a stdio upstream that `cut(d)` ends while it runs."""
    d = Daemon(tmp_path, stdio_faultserver("slow", "--name", "slow"))
    d.config.write_text(d.config.read_text().replace("drain_timeout = 5\n", f"drain_timeout = {drain_timeout}\n"))
    result: list[dict[str, Any]] = []
    with d:
        caller = threading.Thread(target=lambda: result.append(d.tool("slow__work", {"seconds": 600})), daemon=True)
        caller.start()
        d.wait_for(lambda: json.loads(d.tool("slow__stats", {})["content"][0]["text"])["inflight"] == 1, 30,
                   "the call in flight")
        cut(d)
        caller.join(60)
    assert result and result[0]["isError"], result
    return str(result[0]["content"][0]["text"])


def test_a_call_in_flight_on_an_upstream_the_reload_restarts_fails_saying_why(tmp_path: Path) -> None:
    """A call running on an upstream whose config changes ends at the reload (never hangs),
    with an error that names the reload rather than blaming the upstream's connection."""
    def change(d: Daemon) -> None:
        d.config.write_text(d.config.read_text().replace('name = "slow"\n', 'name = "slow"\nmax_concurrency = 4\n'))
        assert reload(d)["changed"] == ["slow"]

    text = _cut_call_text(tmp_path, change)
    assert "closed by a config reload or a restart during tools/call work" in text, text


def test_a_call_still_in_flight_when_the_daemon_stops_says_the_daemon_stopped(tmp_path: Path) -> None:
    """A call that outlasts the drain is cut by the daemon's stop, and says so: not a config
    reload or a restart, which would send a model to retry at once against a daemon that is gone."""
    def stop(d: Daemon) -> None:
        assert d.stop(signal.SIGTERM) == 0

    text = _cut_call_text(tmp_path, stop, drain_timeout=1)
    assert "was closed by the daemon stopping during tools/call work" in text, text


def test_the_stop_after_a_reload_logs_what_it_does(tmp_path: Path) -> None:
    """A drain_timeout changed by a reload is the one the stop announces (and waits), and the
    upstreams closed by the stop are not said to be removed by a config reload."""
    d = Daemon(tmp_path, stdio_testserver("one"))
    with d:
        d.config.write_text(d.config.read_text().replace("drain_timeout = 5\n", "drain_timeout = 7\n"))
        assert reload(d)["applied"]
    log = d.log.read_text()
    assert "received SIGTERM: draining for up to 7 s" in log, log[-2000:]
    assert "upstream one: removing by daemon stop" in log and "removing by config reload" not in log, log[-2000:]


def _events(d: Daemon, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in d.log.read_text(errors="replace").splitlines()
            if line.startswith("{") and f'"event":"{name}"' in line]


def test_a_socket_owner_or_group_that_does_not_exist_is_refused_by_name(tmp_path: Path) -> None:
    """A reload naming a socket_owner or socket_group unknown on the host is refused whole,
    naming the key (the socket keeps its mode), through the CLI and by SIGHUP alike; the
    daemon goes on serving and takes the next good reload."""
    d = Daemon(tmp_path, stdio_testserver("one"))
    base = d.config.read_text()
    with d:
        d.config.write_text(base.replace("[daemon]\n", '[daemon]\nsocket_mode = "0600"\nsocket_owner = "no-such-user-h2"\n'))
        refused = reload(d)
        assert refused["applied"] is False, refused
        assert "[daemon] socket_owner 'no-such-user-h2': no such user" in refused["error"], refused
        assert stat.S_IMODE(os.stat(d.socket).st_mode) == 0o660

        d.config.write_text(base.replace("[daemon]\n", '[daemon]\nsocket_group = "no-such-group-h2"\n'))
        d.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        rejected = d.wait_for(lambda: [e for e in _events(d, "config_reload_rejected") if "socket_group" in e["reason"]],
                              30, "the SIGHUP reload refused")
        assert "no such group" in rejected[0]["reason"], rejected
        assert d.proc.poll() is None  # type: ignore[union-attr]
        assert d.search("echo a message back") == ["one__echo"]

        d.config.write_text(base.replace("[daemon]\n", '[daemon]\nsocket_mode = "0600"\n'))
        assert reload(d)["applied"]
        assert stat.S_IMODE(os.stat(d.socket).st_mode) == 0o600


def test_a_sighup_reload_of_a_path_holding_a_nul_is_refused_and_the_daemon_stays(tmp_path: Path) -> None:
    """A NUL character in a path (here [surface] templates) was a ValueError out of the SIGHUP
    reload, which ended the daemon; now it is a refused reload naming the key."""
    d = Daemon(tmp_path, stdio_testserver("one"))
    base = d.config.read_text()
    with d:
        d.config.write_text(base.replace("[search]\n", '[surface]\ntemplates = "tpl\\u0000"\n[search]\n'))
        d.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        rejected = d.wait_for(lambda: _events(d, "config_reload_rejected"), 30, "the SIGHUP reload refused")
        assert "surface.templates: contains a NUL character" in rejected[0]["reason"], rejected
        assert d.proc.poll() is None, d.log.read_text()[-3000:]  # type: ignore[union-attr]
        assert d.search("echo a message back") == ["one__echo"]


def test_a_reload_while_the_socket_file_is_gone_applies_and_the_rebound_socket_takes_it(tmp_path: Path) -> None:
    """A SIGHUP reload while the socket file was gone (a /tmp cleaner; here its folder's place
    is taken, so it cannot be bound again yet) died in chmod's FileNotFoundError/NotADirectoryError,
    ending the daemon. Now it applies, and the socket bound again has the reloaded mode."""
    d = Daemon(tmp_path, stdio_testserver("one"))
    base = d.config.read_text()
    run = Path(d.socket).parent
    with d:
        shutil.rmtree(run)
        run.write_text("")
        d.wait_for(lambda: "binding it again failed" in d.log.read_text(), 30, "the failed re-bind")
        d.config.write_text(base.replace("[daemon]\n", '[daemon]\nsocket_mode = "0600"\n'))
        d.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        d.wait_for(lambda: _events(d, "config_reloaded") or d.proc.poll() is not None, 30,  # type: ignore[union-attr]
                   "the SIGHUP reload's end")
        assert d.proc.poll() is None, d.log.read_text()[-3000:]  # type: ignore[union-attr]
        run.unlink()
        d.wait_for(lambda: stat.S_IMODE(os.stat(d.socket).st_mode) == 0o600, 30, "the socket bound again, 0600")
        assert d.search("echo a message back") == ["one__echo"]


def test_a_shorter_retention_set_by_a_reload_prunes_at_once(tmp_path: Path) -> None:
    """An operator shortens `[learning] retention_days` (a privacy rule) and reloads: the
    usage events now past it are deleted then, not at the next hourly prune."""
    d = Daemon(tmp_path, stdio_testserver("one"))
    with d:
        with d.client() as c:
            found = c.call_tool("tool_search", {"query": "echo a message back", "top_k": 3})["structuredContent"]
            assert found["matches"][0]["name"] == "one__echo", found
            assert not c.call_tool("execute_tool", {"name": "one__echo", "arguments": {"message": "x"}}).get("isError")
        d.wait_for(lambda: d.status()["learning"]["events"] == 1, 30, "the usage event learned")
        # a retention of under a millisecond: the event is past it by the time the reload applies
        d.config.write_text(d.config.read_text() + "\n[learning]\nretention_days = 0.00000001\n")
        assert reload(d)["applied"]
        d.wait_for(lambda: d.status()["learning"]["events"] == 0, 30, "the event pruned")


def test_the_model_is_told_the_configured_default_top_k_and_a_reload_changes_it(tmp_path: Path) -> None:
    """tool_search's top_k description names `[search] default_top_k` (not a fixed 5); a
    reload that changes it tells connected clients to re-list, and they read the new one."""
    d = Daemon(tmp_path, stdio_testserver("one"), search_extra='embedder = "none"\ndefault_top_k = 3\n')

    def top_k_text(c: Any) -> str:
        tools = {t["name"]: t for t in c.request("tools/list", {})["tools"]}
        text: str = tools["tool_search"]["inputSchema"]["properties"]["top_k"]["description"]
        return text

    with d, d.client() as c:
        assert top_k_text(c) == "Omit: up to 3 that fit."
        d.config.write_text(d.config.read_text().replace("default_top_k = 3", "default_top_k = 8"))
        assert reload(d)["applied"]
        assert top_k_text(c) == "Omit: up to 8 that fit."


def test_a_lower_max_message_bytes_applies_to_connections_already_open(tmp_path: Path) -> None:
    """A client that connected before the reload is held to the new, lower
    `max_message_bytes` on the socket: its oversized message is refused, saying the limit."""
    d = Daemon(tmp_path, stdio_testserver("one"))
    query = "echo a message back " + "x" * 3000
    with d, d.client() as c:
        assert c.call_tool("tool_search", {"query": query, "top_k": 1})["structuredContent"]["matches"]
        d.config.write_text(d.config.read_text().replace("[daemon]\n", "[daemon]\nmax_message_bytes = 2048\n"))
        assert reload(d)["applied"]
        try:
            answer = c.call_tool("tool_search", {"query": query, "top_k": 1})
        except RpcError as exc:
            assert "exceeds the 2048-byte limit" in str(exc), exc
        else:
            raise AssertionError(f"a 3 KB message passed the 2 KB limit (isError: {answer.get('isError')})")
        assert c.call_tool("tool_search", {"query": "echo a message back", "top_k": 1})["structuredContent"]["matches"]
