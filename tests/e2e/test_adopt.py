"""`toolatlas adopt` on real client config files of each format, run as the user would run it:
the config it writes passes check-config, a daemon serves it, the rewritten client file's shim
entry (launched as the client launches it, by the SDK client over stdio) lists the meta-tools,
`--undo` restores the bytes, `--dry-run` writes nothing, and no secret reaches the TOML."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import Daemon
from tests.support.servers import testserver_args

SECRET = "ghp_adoptTestSecret0123456789"
META = ["tool_search", "execute_tool", "catalog_status"]


def _tests_entry(**extra: Any) -> dict[str, Any]:
    """The project's test server over stdio, with a literal secret in its env."""
    return {**extra, "command": sys.executable, "args": testserver_args(), "env": {"API_TOKEN": SECRET}}


@pytest.fixture(autouse=True)
def _own_config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's own $XDG_CONFIG_HOME: adopt keeps the secrets it moves out of a client's
    file in its toolatlas/environment, which must be neither the runner's nor another test's."""
    xdg = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    monkeypatch.delenv("API_TOKEN", raising=False)
    return xdg


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "toolatlas", *args], capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})), timeout=60, check=False)


# (id, path under HOME, file content, adopted upstreams, {skipped name: reason}, variables the config reads)
FORMATS: list[tuple[str, str, Any, list[str], dict[str, str], set[str]]] = [
    ("claude-desktop", ".config/Claude/claude_desktop_config.json",
     {"globalShortcut": "Ctrl+Space", "mcpServers": {"tests": _tests_entry(), "off": {"command": "x", "disabled": True}}},
     ["tests"], {"off": "it is disabled in the client"}, {"API_TOKEN"}),
    ("claude-code-project", "proj/.mcp.json",
     {"mcpServers": {"tests": _tests_entry(type="stdio"),
                     "remote": {"type": "http", "url": "http://127.0.0.1:9/mcp",
                                "headers": {"Authorization": "Bearer ${REMOTE_TOKEN}"}},
                     "ws": {"type": "websocket", "url": "ws://127.0.0.1:9"}}},
     ["tests", "remote"], {"ws": "transport 'websocket' is not supported"}, {"API_TOKEN", "REMOTE_TOKEN"}),
    ("claude-code-user", ".claude.json",
     {"numStartups": 7, "mcpServers": {"tests": _tests_entry(type="stdio")},
      "projects": {"/home/me/app": {"allowedTools": [], "mcpServers": {
          "Tests": _tests_entry(type="stdio", cwd="/tmp"), "empty": {"type": "stdio"}}}}},
     ["tests", "tests-app"], {"empty": "a stdio entry without a command"}, {"API_TOKEN"}),
    ("cursor", ".cursor/mcp.json",
     {"mcpServers": {"tests": _tests_entry(), "events": {"url": "http://127.0.0.1:9/sse"}, "broken": {"args": ["x"]}}},
     ["tests", "events"], {"broken": "it has neither a command nor a url"}, {"API_TOKEN"}),
    ("vscode", "proj/.vscode/mcp.json",
     "{\n  // VS Code keeps prompted values in inputs\n"
     '  "inputs": [{"type": "promptString", "id": "api-token", "description": "Token", "password": true}],\n'
     '  "servers": {\n'
     f'    "tests": {{"type": "stdio", "command": {json.dumps(sys.executable)}, "args": {json.dumps(testserver_args())},\n'
     '              "env": {"API_TOKEN": "${input:api-token}", "HOME_COPY": "${env:HOME}"}},\n'
     '    "pick": {"type": "stdio", "command": "x", "args": ["${command:pickFile}"]},\n'
     "  },\n}\n",
     ["tests"], {"pick": "uses ${command:pickFile}, which toolatlas cannot expand"}, {"API_TOKEN"}),
    ("windsurf", ".codeium/windsurf/mcp_config.json",
     {"mcpServers": {"tests": _tests_entry(), "remote": {"serverUrl": "http://127.0.0.1:9/mcp"},
                     "off": {"command": "x", "disabled": True}}},
     ["tests", "remote"], {"off": "it is disabled in the client"}, {"API_TOKEN"}),
]


def _write(home: Path, rel: str, content: Any) -> Path:
    path = home / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content, indent=2) + "\n")
    return path


@pytest.mark.parametrize(("rel", "content", "adopted", "skipped", "needs"),
                         [f[1:] for f in FORMATS], ids=[f[0] for f in FORMATS])
def test_each_client_format_is_adopted_into_a_valid_config(
    tmp_path: Path, rel: str, content: Any, adopted: list[str], skipped: dict[str, str], needs: set[str],
) -> None:
    home = tmp_path / "home"
    client = _write(home, rel, content)
    out = tmp_path / "toolatlas.toml"
    env = {"HOME": str(home), "TOOLATLAS_SOCKET": str(tmp_path / "t.sock")}
    r = _run("adopt", str(client), "--out", str(out), env=env)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert SECRET not in text + r.stdout + r.stderr
    import tomllib

    ups = tomllib.loads(text)["upstream"]
    assert [u["name"] for u in ups] == adopted
    for name, reason in skipped.items():
        assert f"not adopted: {name!r}" in r.stderr and reason in r.stderr, r.stderr
    exported = {v: "http://127.0.0.1:9/x" for v in needs}
    assert set(re.findall(r"^    ([A-Z_][A-Z0-9_]*): ", r.stderr, re.M)) == needs, r.stderr  # told what to export
    ok = _run("check-config", str(out), env={**env, **exported})
    assert ok.returncode == 0 and "OK" in ok.stdout, ok.stderr
    assert "warning" not in ok.stderr
    if "API_TOKEN" in exported:  # the secret is read from the environment (or the environment file), not the config
        bare = {k: v for k, v in os.environ.items() if k != "API_TOKEN"} | {"XDG_CONFIG_HOME": str(tmp_path / "none")}
        missing = subprocess.run([sys.executable, "-m", "toolatlas", "check-config", str(out)], env=bare,
                                 capture_output=True, text=True, timeout=60, check=False)
        assert missing.returncode == 78 and "is not set" in missing.stderr, missing.stderr
    assert client.read_text() == (content if isinstance(content, str) else json.dumps(content, indent=2) + "\n")


def _on_the_adopted_config(d: Daemon, config: Path) -> None:
    """Point test daemon `d` at an adopted config: state in d's folder, BM25 only; everything
    else as adopted."""
    text = re.sub(r"(?m)^state_dir = .*$", f'state_dir = "{d.tmp / "state"}"', config.read_text())
    config.write_text(text + '\n[search]\nembedder = "none"\n')
    d.config = config


async def _through_the_shim(entry: dict[str, Any]) -> tuple[list[str], str]:
    """Launch the client file's entry as the client would and use it with the SDK client."""
    import anyio
    import mcp_types as types
    from mcp import Client, StdioServerParameters

    with anyio.fail_after(60):
        params = StdioServerParameters(command=entry["command"], args=entry["args"], env=dict(os.environ))
        async with Client(params) as c:
            tools = [t.name for t in (await c.list_tools()).tools]
            done = await c.call_tool("execute_tool", {"name": "tests__echo", "arguments": {"message": "via shim"}})
            text = "".join(b.text for b in done.content if isinstance(b, types.TextContent))
    return tools, text


def test_adopted_config_is_served_and_the_rewritten_client_reaches_it(tmp_path: Path) -> None:
    import anyio

    home = tmp_path / "home"
    original = {"globalShortcut": "Ctrl+Space",
                "mcpServers": {"tests": _tests_entry(), "off": {"command": "x", "disabled": True}}}
    client = _write(home, ".config/Claude/claude_desktop_config.json", original)
    client.chmod(0o600)
    before = client.read_bytes()
    d = Daemon(tmp_path, "")
    adopted = tmp_path / "adopted.toml"
    r = _run("adopt", str(client), "--rewrite-client", "--out", str(adopted),
             env={"HOME": str(home), "TOOLATLAS_SOCKET": d.socket})
    assert r.returncode == 0, r.stderr
    backup = Path(re.search(r"^backup: (.+)$", r.stderr, re.M).group(1))  # type: ignore[union-attr]
    assert f"undo:   toolatlas adopt --undo {backup}" in r.stderr
    assert backup.parent == client.parent and backup.read_bytes() == before
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600 and stat.S_IMODE(client.stat().st_mode) == 0o600

    rewritten = json.loads(client.read_text())
    assert rewritten["globalShortcut"] == "Ctrl+Space"
    assert list(rewritten["mcpServers"]) == ["off", "toolatlas"]  # the disabled entry stays, untouched
    entry = rewritten["mcpServers"]["toolatlas"]
    assert entry["args"][-3:] == ["shim", "--config", str(adopted)] and os.path.isabs(entry["command"])
    assert SECRET not in client.read_text() + adopted.read_text()

    _on_the_adopted_config(d, adopted)
    with d.start(env={"API_TOKEN": SECRET}):
        d.wait_for(lambda: [s["state"] for s in d.status()["servers"]] == ["ready"], 60, "adopted upstream ready")
        tools, echoed = anyio.run(_through_the_shim, entry)
        assert tools == META and echoed == "Echo: via shim"
        doctor = _run("doctor", "--config", str(adopted), env={"API_TOKEN": SECRET})
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert f"ok    daemon: answers at {d.socket}" in doctor.stdout
        assert "ok    upstream tests: ready" in doctor.stdout and "FAIL" not in doctor.stdout

    undone = _run("adopt", "--undo", str(backup))
    assert undone.returncode == 0, undone.stderr
    assert client.read_bytes() == before and stat.S_IMODE(client.stat().st_mode) == 0o600


def test_dry_run_prints_both_files_and_writes_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    client = _write(home, ".cursor/mcp.json", {"mcpServers": {"tests": _tests_entry()}})
    before = client.read_bytes()
    listing = sorted(p.name for p in tmp_path.rglob("*"))
    out = tmp_path / "never.toml"
    r = _run("adopt", str(client), "--rewrite-client", "--dry-run", "--out", str(out), env={"HOME": str(home)})
    assert r.returncode == 0, r.stderr
    assert f"==> {out} (toolatlas config) <==" in r.stdout and '[[upstream]]\nname = "tests"' in r.stdout
    shown = r.stdout.split(f"==> {client} (rewritten client config) <==\n", 1)[1]
    assert json.loads(shown)["mcpServers"]["toolatlas"]["args"][-3:] == ["shim", "--config", str(out)]
    assert SECRET not in r.stdout + r.stderr
    assert client.read_bytes() == before and sorted(p.name for p in tmp_path.rglob("*")) == listing


def test_rewrite_goes_through_a_symlink(tmp_path: Path) -> None:
    dotfiles = _write(tmp_path, "dotfiles/mcp.json", {"mcpServers": {"tests": _tests_entry()}})
    link = tmp_path / "home" / ".cursor" / "mcp.json"
    link.parent.mkdir(parents=True)
    link.symlink_to(dotfiles)
    before = dotfiles.read_bytes()
    r = _run("adopt", str(link), "--rewrite-client", "--out", str(tmp_path / "c.toml"))
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and "toolatlas" in json.loads(dotfiles.read_text())["mcpServers"]
    backup = next(dotfiles.parent.glob("mcp.json.toolatlas-backup-*"))
    assert _run("adopt", "--undo", str(backup)).returncode == 0
    assert dotfiles.read_bytes() == before and link.is_symlink()


def test_a_read_only_client_file_is_not_rewritten(tmp_path: Path) -> None:
    """`--rewrite-client` replaced a client file its user had made read-only (chmod 444): the
    rename beside it needs only the folder, so the mode stopped nothing. It is refused now,
    before anything is written (neither the client file nor the toolatlas config)."""
    client = _write(tmp_path, ".cursor/mcp.json", {"mcpServers": {"tests": _tests_entry()}})
    client.chmod(0o444)
    before, config = client.read_bytes(), tmp_path / "c.toml"
    r = _run("adopt", str(client), "--rewrite-client", "--out", str(config))
    assert r.returncode == 1 and f"{client} is read-only (mode 0444)" in r.stderr, r.stderr
    assert "adopt without --rewrite-client" in r.stderr
    assert client.read_bytes() == before and stat.S_IMODE(client.stat().st_mode) == 0o444
    assert not config.exists() and not list(client.parent.glob("mcp.json.toolatlas-backup-*"))


def test_servers_adopted_into_the_config_of_a_running_daemon_are_served_at_once(tmp_path: Path) -> None:
    """The README's laptop flow: the first client's shim started the daemon on the adopted
    config; adopting a second client adds its servers to that config, and its shim reaches
    the same daemon. Before, that daemon never read them (no reload): the second client saw
    none of its own servers."""
    d = Daemon(tmp_path, "")
    config = tmp_path / "adopted.toml"
    first = _write(tmp_path, ".cursor/mcp.json", {"mcpServers": {"first": _tests_entry()}})
    assert _run("adopt", str(first), "--out", str(config), env={"TOOLATLAS_SOCKET": d.socket}).returncode == 0
    _on_the_adopted_config(d, config)
    with d.start(env={"API_TOKEN": SECRET}):
        d.wait_for(lambda: [s["state"] for s in d.status()["servers"]] == ["ready"], 60, "first ready")
        second = _write(tmp_path, "claude_desktop_config.json", {"mcpServers": {
            "second": {"command": sys.executable, "args": testserver_args()}}})
        r = _run("adopt", str(second), "--out", str(config))
        assert r.returncode == 0, r.stderr
        assert f"the daemon on {d.socket} reloaded {config}: upstreams added: second" in r.stderr, r.stderr
        d.wait_for(lambda: {s["name"]: s["state"] for s in d.status()["servers"]} == {"first": "ready", "second": "ready"},
                   60, "second served")


def test_undo_keeps_what_the_client_file_held_since_the_rewrite(tmp_path: Path) -> None:
    """A user who added a server in the client after adopting it, then undoes: the backup's
    bytes come back, and the file as it was is kept beside it (named in the message). Before,
    undo wrote over it: the server added since was lost."""
    client = _write(tmp_path, ".cursor/mcp.json", {"mcpServers": {"tests": _tests_entry()}})
    before = client.read_bytes()
    r = _run("adopt", str(client), "--rewrite-client", "--out", str(tmp_path / "c.toml"))
    assert r.returncode == 0, r.stderr
    backup = Path(re.search(r"^backup: (.+)$", r.stderr, re.M).group(1))  # type: ignore[union-attr]
    later = json.loads(client.read_text())
    later["mcpServers"]["added-since"] = {"command": "my-new-server"}
    client.write_text(json.dumps(later))
    undone = _run("adopt", "--undo", str(backup))
    assert undone.returncode == 0, undone.stderr
    assert client.read_bytes() == before
    kept = Path(re.search(r"what it held before the undo is kept in (.+)$", undone.stderr, re.M).group(1))  # type: ignore[union-attr]
    assert kept != backup and kept.parent == client.parent and json.loads(kept.read_text()) == later
    again = _run("adopt", "--undo", str(backup))  # nothing new to keep: no second copy
    assert again.returncode == 0 and "kept in" not in again.stderr, again.stderr


def test_a_second_client_is_added_to_the_same_config(tmp_path: Path) -> None:
    import tomllib

    out = tmp_path / "c.toml"
    desktop = _write(tmp_path, "claude_desktop_config.json", {"mcpServers": {
        "tests": _tests_entry(), "a": {"command": sys.executable, "args": ["-V"]}}})
    assert _run("adopt", str(desktop), "--out", str(out)).returncode == 0
    first = out.read_bytes()
    cursor = _write(tmp_path, ".cursor/mcp.json", {"mcpServers": {
        "tests": _tests_entry(), "b": {"command": sys.executable, "args": ["-VV"]},
        "a": {"command": sys.executable, "args": ["-c", "pass"]}}})
    r = _run("adopt", str(cursor), "--out", str(out))
    assert r.returncode == 0, r.stderr
    merged = out.read_bytes()
    assert merged.startswith(first)  # what was there is kept byte for byte
    assert [u["name"] for u in tomllib.loads(merged.decode())["upstream"]] == ["tests", "a", "b", "a-2"]
    assert f"{out} already has this server as 'tests'" in r.stderr and "added 2 upstream(s)" in r.stderr
    assert _run("check-config", str(out), env={"API_TOKEN": "x"}).returncode == 0

    out.write_text("this is not TOML = = =\n")
    refused = _run("adopt", str(cursor), "--out", str(out))
    assert refused.returncode == 1 and "is not a toolatlas config" in refused.stderr and "--force" in refused.stderr
    assert out.read_text() == "this is not TOML = = =\n"
    assert _run("adopt", str(cursor), "--out", str(out), "--force").returncode == 0
    assert [u["name"] for u in tomllib.loads(out.read_text())["upstream"]] == ["tests", "b", "a"]


def test_a_file_with_nothing_to_adopt_writes_nothing(tmp_path: Path) -> None:
    client = _write(tmp_path, "claude_desktop_config.json", {"mcpServers": {"off": {"command": "x", "disabled": True}}})
    r = _run("adopt", str(client), "--out", str(tmp_path / "c.toml"))
    assert r.returncode == 1 and "no server could be adopted" in r.stderr and "'off'" in r.stderr
    assert not (tmp_path / "c.toml").exists()
    bad = _run("adopt", str(tmp_path / "missing.json"))
    assert bad.returncode == 65 and "cannot read" in bad.stderr


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_an_out_that_is_a_folder_is_said_so(tmp_path: Path, force: list[str]) -> None:
    """--out FOLDER said "[Errno 22] not a regular file (a directory): ...; pass --force to
    replace it", and with --force "cannot write FOLDER/../.FOLDER.xxxx.tmp: Is a directory"."""
    client = _write(tmp_path, "claude_desktop_config.json", {"mcpServers": {"tests": _tests_entry()}})
    folder = tmp_path / "conf"
    folder.mkdir()
    r = _run("adopt", str(client), "--out", str(folder), *force)
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines()[-1] == (f"toolatlas adopt: --out {folder} is a folder; name the config file to "
                                         f"write, e.g. {folder / 'config.toml'}"), r.stderr
    assert list(folder.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == [
        "claude_desktop_config.json", "conf"]  # no temporary file left beside it


def test_secrets_moved_out_of_a_client_are_kept_in_the_environment_file_the_daemon_reads(tmp_path: Path) -> None:
    """The client's literal secrets become ${VAR}s in the config and NAME=value lines in
    ~/.config/toolatlas/environment (0600): the daemon, however started (here without the
    variable in its environment, as a shim started from a GUI client would start it), reads
    them from there and hands them to the upstream. Adopting again adds nothing; another
    client's different value under the same name gets a name of its own."""
    from tests.support.processes import children_of

    xdg = tmp_path / "xdg"
    envfile = xdg / "toolatlas" / "environment"
    out = tmp_path / "adopted.toml"
    d = Daemon(tmp_path, "")
    sock = {"TOOLATLAS_SOCKET": d.socket}
    desktop = _write(tmp_path, "claude_desktop_config.json", {"mcpServers": {"tests": _tests_entry()}})
    r = _run("adopt", str(desktop), "--out", str(out), env=sock)
    assert r.returncode == 0, r.stderr
    assert f"kept 1 secret(s) from the client's file in {envfile} (mode 0600), where the daemon reads them: " \
           "API_TOKEN" in r.stderr, r.stderr
    assert "still needs" not in r.stderr and SECRET not in r.stderr + out.read_text()
    assert envfile.read_text() == f"API_TOKEN={SECRET}\n" and stat.S_IMODE(envfile.stat().st_mode) == 0o600
    assert _run("adopt", str(desktop), "--out", str(out)).returncode == 0
    assert envfile.read_text() == f"API_TOKEN={SECRET}\n"  # the same value: nothing new
    other = _write(tmp_path, ".cursor/mcp.json", {"mcpServers": {"other": {
        "command": sys.executable, "args": [*testserver_args(), "--name", "other"], "env": {"API_TOKEN": "ghp_another one"}}}})
    r = _run("adopt", str(other), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert envfile.read_text() == f"API_TOKEN={SECRET}\nOTHER_API_TOKEN='ghp_another one'\n", envfile.read_text()

    _on_the_adopted_config(d, out)
    assert "API_TOKEN" not in os.environ
    with d.start():
        d.wait_for(lambda: {s["state"] for s in d.status()["servers"]} == {"ready"}, 60, "adopted upstreams ready")
        environ = [Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") for pid in children_of(d.proc.pid)]
        assert sorted(v for e in environ for v in e if v.startswith(b"API_TOKEN")) == \
            sorted([f"API_TOKEN={SECRET}".encode(), b"API_TOKEN=ghp_another one"]), environ


def test_a_client_whose_shim_runs_another_config_is_not_pointed_elsewhere(tmp_path: Path) -> None:
    """`--rewrite-client --out B` on a client file whose toolatlas entry runs `--config A`
    replaced that entry with one for B: the client lost every server adopted into A. It is
    refused now, naming A, and nothing is written; adopting into A itself goes on."""
    first = tmp_path / "a.toml"
    client = _write(tmp_path, ".cursor/mcp.json", {"mcpServers": {"tests": _tests_entry()}})
    assert _run("adopt", str(client), "--rewrite-client", "--out", str(first)).returncode == 0
    data = json.loads(client.read_text())
    data["mcpServers"]["more"] = _tests_entry()
    client.write_text(json.dumps(data))
    before, other = client.read_bytes(), tmp_path / "b.toml"
    for extra in ([], ["--dry-run"]):
        r = _run("adopt", str(client), "--rewrite-client", "--out", str(other), *extra)
        assert r.returncode == 1 and f"already runs the toolatlas shim with --config {first.resolve()}" in r.stderr, r.stderr
        assert client.read_bytes() == before and not other.exists()
    r = _run("adopt", str(client), "--rewrite-client", "--out", str(first))
    assert r.returncode == 0, r.stderr
    assert list(json.loads(client.read_text())["mcpServers"]) == ["toolatlas"]
    assert json.loads(client.read_text())["mcpServers"]["toolatlas"]["args"][-1] == str(first.resolve())
