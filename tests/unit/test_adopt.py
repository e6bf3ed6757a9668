"""`toolatlas adopt`'s pure parts: reading client files, converting entries, keeping secrets
out, naming, the TOML, and the rewritten client file (no subprocess; files in tmp_path)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from toolatlas.adopt.clients import AdoptError, ClientKind, read_client_file, strip_jsonc
from toolatlas.adopt.convert import Adoption, adopt, upstream_name
from toolatlas.adopt.render import merge, render, stand_in_env, toml_string
from toolatlas.adopt.rewrite import original_of, rewritten, shim_command
from toolatlas.config import parse


def _file(folder: Path, rel: str, data: Any) -> Path:
    p = folder / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(data if isinstance(data, str) else json.dumps(data, indent=2) + "\n")
    return p


def _adopt(folder: Path, rel: str, data: Any) -> Adoption:
    return adopt(read_client_file(_file(folder, rel, data)))


def _parsed(a: Adoption) -> Any:
    """The rendered config parsed with its variables set as `render.check` sets them: a URL
    where a value is the variable whole, else a plain word (inside a URL, "://" would break it)."""
    text = render(a)
    return parse(text, env=stand_in_env(text, a.exports.needed))


def test_jsonc_comments_and_trailing_commas_are_removed_but_strings_kept() -> None:
    text = '{\n // a comment\n "a": "http://x//y /* not a comment */", /* block */\n "b": [1, 2,],\n}'
    clean, changed = strip_jsonc(text)
    assert changed and json.loads(clean) == {"a": "http://x//y /* not a comment */", "b": [1, 2]}
    assert strip_jsonc('{"a": "\\"//"}') == ('{"a": "\\"//"}', False)


@pytest.mark.parametrize(("rel", "data", "kind"), [
    ("Claude/claude_desktop_config.json", {"mcpServers": {}}, ClientKind.CLAUDE_DESKTOP),
    ("app/.mcp.json", {"mcpServers": {}}, ClientKind.CLAUDE_CODE_PROJECT),
    ("home/.claude.json", {"projects": {}}, ClientKind.CLAUDE_CODE_USER),
    ("home/.cursor/mcp.json", {"mcpServers": {}}, ClientKind.CURSOR),
    ("app/.vscode/mcp.json", {"servers": {}, "inputs": []}, ClientKind.VSCODE),
    ("Code/User/settings.json", {"mcp": {"servers": {}}}, ClientKind.VSCODE),
    (".codeium/windsurf/mcp_config.json", {"mcpServers": {}}, ClientKind.WINDSURF),
    ("x/servers.json", {"mcpServers": {"r": {"serverUrl": "https://x/mcp"}}}, ClientKind.WINDSURF),
    ("x/other.json", {"mcpServers": {}}, ClientKind.GENERIC),
])
def test_the_client_is_recognised_from_path_and_content(tmp_path: Path, rel: str, data: Any, kind: ClientKind) -> None:
    assert read_client_file(_file(tmp_path, rel, data)).kind is kind


@pytest.mark.parametrize(("data", "says"), [
    ("[1, 2]", "not an object"),
    ('{"mcpServers": ', "not valid JSON"),
    ('{"theme": "dark"}', "no MCP servers found"),
])
def test_files_that_are_no_client_config_say_why(tmp_path: Path, data: str, says: str) -> None:
    with pytest.raises(AdoptError, match=says):
        read_client_file(_file(tmp_path, "c.json", data))


def test_names_become_valid_unique_upstream_names() -> None:
    assert upstream_name("GitHub Server", set()) == "github-server"
    assert upstream_name("@scope/pkg.v2", set()) == "scope-pkg-v2"
    assert upstream_name("---", set()) == "server"
    assert upstream_name("git", {"git", "git-2"}) == "git-3"
    # metrics' and events' label for calls that reach no upstream is not an upstream's name
    assert (upstream_name("Unknown", set()), upstream_name("none", set())) == ("unknown-2", "none-2")
    long = upstream_name("x" * 60, {"x" * 48})
    assert len(long) <= 48 and long.endswith("-2")


def test_every_entry_is_adopted_or_skipped_with_a_reason(tmp_path: Path) -> None:
    a = _adopt(tmp_path, "claude_desktop_config.json", {"mcpServers": {
        "ok": {"command": "npx", "args": ["-y", "pkg", 3]},
        "off": {"command": "x", "disabled": True},
        "ws": {"type": "ws", "url": "ws://127.0.0.1:1"},
        "wsurl": {"url": "ws://127.0.0.1:9/x"},
        "empty": {"args": ["a"]},
        "list": ["not", "an", "object"],
        "badargs": {"command": "x", "args": "one string"},
        "both": {"command": "x", "url": "http://127.0.0.1:1/mcp"},
        "shim": {"command": "/opt/venv/bin/toolatlas", "args": ["shim", "--config", "/c.toml"]},
    }})
    assert [u.name for u in a.upstreams] == ["ok"] and a.upstreams[0].args == ("-y", "pkg", "3")
    reasons = {s.name: s.reason for s in a.skipped}
    assert reasons == {
        "off": "it is disabled in the client",
        "ws": "transport 'ws' is not supported (toolatlas speaks stdio, sse and http)",
        "wsurl": "its url ws://127.0.0.1:9/x is not http(s) (toolatlas speaks stdio, sse and http)",
        "empty": "it has neither a command nor a url",
        "list": "the entry is a JSON list, not an object",
        "badargs": "args is a JSON str, not a list",
        "both": "it has both a command and a url, and no type to choose between them",
        "shim": "it is already the toolatlas shim",
    }
    assert ("mcpServers", "shim") in a.replaced and ("mcpServers", "off") not in a.replaced
    assert not [n for n in a.notes if "wsurl" in n], a.notes  # not "taken as streamable HTTP", then skipped


def test_literal_secrets_become_variables_and_never_reach_the_toml(tmp_path: Path) -> None:
    secrets = ["ghp_0123456789abcdefSECRET", "brave-secret-value", "tok-live-9876543210", "querysecret123",
               "pw-in-the-url", "sk-argsecret0000000"]
    a = _adopt(tmp_path, "claude_desktop_config.json", {"mcpServers": {
        "github": {"command": "docker", "args": ["run", "-e", "GITHUB_TOKEN", "img"],
                   "env": {"GITHUB_TOKEN": secrets[0], "DEBUG": "true", "LOG_DIR": "/var/log/x"}},
        "brave": {"command": "npx", "args": ["--api-key", secrets[1], "--token=" + secrets[1]],
                  "env": {"BRAVE_API_KEY": secrets[1]}},
        "remote": {"url": f"https://user:{secrets[4]}@api.example/mcp?api_key={secrets[3]}&page=2",
                   "headers": {"Authorization": f"Bearer {secrets[2]}", "Accept": "application/json"}},
        "proxy": {"command": "npx", "args": ["mcp-remote", "https://x.example/sse",
                                             "--header", f"Authorization: Bearer {secrets[2]}", secrets[5]]},
    }})
    text = render(a)
    for s in secrets:
        assert s not in text
        assert all(s not in why for why in a.exports.needed.values()) and all(s not in n for n in a.notes)
    cfg = _parsed(a)
    gh = cfg.upstream_by_name("github")
    assert gh.env == {"GITHUB_TOKEN": "http://stand-in.invalid/", "DEBUG": "true", "LOG_DIR": "/var/log/x"}
    raw = tomllib.loads(text)["upstream"]
    by = {u["name"]: u for u in raw}
    assert by["github"]["env"]["GITHUB_TOKEN"] == "${GITHUB_TOKEN}"
    # one value under one name, wherever it appeared
    assert by["brave"]["args"] == ["--api-key", "${BRAVE_API_KEY}", "--token=${BRAVE_API_KEY}"]
    assert by["remote"]["headers"] == {"Authorization": "Bearer ${REMOTE_TOKEN}", "Accept": "application/json"}
    assert by["remote"]["url"] == "https://user:${REMOTE_PASSWORD}@api.example/mcp?api_key=${REMOTE_API_KEY}&page=2"
    assert by["proxy"]["args"][3] == "Authorization: Bearer ${REMOTE_TOKEN}"
    assert by["proxy"]["args"][4] == "${PROXY_SECRET}"
    assert set(a.exports.needed) == {"GITHUB_TOKEN", "BRAVE_API_KEY", "REMOTE_TOKEN", "REMOTE_PASSWORD",
                                     "REMOTE_API_KEY", "PROXY_SECRET"}


def test_an_entry_left_out_asks_for_no_variable_and_keeps_no_secret(tmp_path: Path) -> None:
    """A user-level VS Code entry whose env holds a token but whose cwd needs
    ${workspaceFolder} is skipped; its token was moved out before the cwd failed, and was
    then listed as a variable the daemon must set and kept in the environment file, for a
    server the config does not run (still in the client file, with its secret)."""
    a = _adopt(tmp_path, "Code/User/mcp.json", {"servers": {
        "local": {"command": "node", "args": ["${env:DATA_DIR}"], "cwd": "${workspaceFolder}/x",
                  "env": {"GITHUB_TOKEN": "ghp_0123456789abcdefSECRET", "MODE": "${input:mode}"},
                  "autoApprove": ["x"]},
        "kept": {"command": "node", "env": {"API_KEY": "kept-secret-value"}},
    }})
    assert [u.name for u in a.upstreams] == ["kept"] and [s.name for s in a.skipped] == ["local"]
    assert set(a.exports.needed) == {"API_KEY"}
    assert a.exports.to_keep() == {"API_KEY": "kept-secret-value"}
    assert "GITHUB_TOKEN" not in render(a) and not [n for n in a.notes if "local" in n], a.notes


def test_a_project_server_that_names_files_in_the_project_runs_in_the_project_folder(tmp_path: Path) -> None:
    """Claude Code starts a .mcp.json server in the project folder, so `node dist/server.js`
    and `./run.sh` name files there. Adopted without a cwd, the daemon started them in its own
    folder and they failed (Cannot find module .../dist/server.js). A server that names no
    project file (an npx package) stays as it was, so one server in many projects is one."""
    project = tmp_path / "app"
    (project / "dist").mkdir(parents=True)
    (project / "dist" / "server.js").write_text("")
    a = _adopt(tmp_path, "app/.mcp.json", {"mcpServers": {
        "local": {"command": "node", "args": ["dist/server.js"]},
        "script": {"command": "./run.sh"},
        "package": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-github"]},
        "own": {"command": "node", "args": ["dist/server.js"], "cwd": "/srv"},
    }})
    cwd = {u.name: u.cwd for u in a.upstreams}
    assert cwd == {"local": str(project), "script": str(project), "package": None, "own": "/srv"}, cwd
    script = _parsed(a).upstream_by_name("script")
    assert (script.command, script.cwd) == ("./run.sh", str(project))  # exec finds it from the cwd


def test_connection_strings_and_short_passwords_are_secrets_too(tmp_path: Path) -> None:
    a = _adopt(tmp_path, ".mcp.json", {"mcpServers": {"db": {
        "command": "pg-mcp", "args": ["--password=hunt", "--port", "5432"],
        "env": {"DATABASE_URL": "postgresql://app:s3cr3t-pw@127.0.0.1:5432/app", "AUTH_URL": "https://auth.example/x",
                "MODE": "ro"}}}})
    up = a.upstreams[0]
    assert up.env == {"DATABASE_URL": "postgresql://app:${DB_PASSWORD}@127.0.0.1:5432/app",
                      "AUTH_URL": "https://auth.example/x", "MODE": "ro"}
    assert up.args == ("--password=${DB_PASSWORD_2}", "--port", "5432")
    assert "s3cr3t-pw" not in render(a) and "hunt" not in render(a)


def test_two_different_secrets_under_one_key_get_two_names(tmp_path: Path) -> None:
    a = _adopt(tmp_path, "claude_desktop_config.json", {"mcpServers": {
        "one": {"command": "a", "env": {"API_KEY": "first-secret-value"}},
        "two": {"command": "b", "env": {"API_KEY": "second-secret-value"}},
        "three": {"command": "c", "env": {"API_KEY": "first-secret-value"}},
    }})
    envs = [u.env["API_KEY"] for u in a.upstreams]
    assert envs == ["${API_KEY}", "${TWO_API_KEY}", "${API_KEY}"]


def test_vscode_inputs_env_and_workspace_references(tmp_path: Path) -> None:
    a = _adopt(tmp_path, "proj/.vscode/mcp.json", """{
      // prompted values
      "inputs": [{"type": "promptString", "id": "perplexity-key", "description": "Perplexity API Key", "password": true}],
      "servers": {
        "Perplexity": {"type": "stdio", "command": "npx", "args": ["-y", "perplexity-ask"],
                       "env": {"PERPLEXITY_API_KEY": "${input:perplexity-key}", "GH": "${env:GITHUB_TOKEN}",
                               "DATA": "${userHome}/data"},
                       "cwd": "${workspaceFolder}/tools"},
        "fetch": {"type": "sse", "url": "http://127.0.0.1:9000/sse", "headers": {"X-Api-Key": "${input:perplexity-key}"}},
        "picker": {"type": "stdio", "command": "x", "args": ["${command:pickFile}"]},
      }
    }""")
    p, f = a.upstreams
    assert p.env == {"PERPLEXITY_API_KEY": "${PERPLEXITY_KEY}", "GH": "${GITHUB_TOKEN}", "DATA": "${HOME}/data"}
    assert p.cwd == str(tmp_path / "proj" / "tools")
    assert (f.transport, f.headers) == ("sse", {"X-Api-Key": "${PERPLEXITY_KEY}"})
    assert a.exports.needed["PERPLEXITY_KEY"] == "VS Code input 'perplexity-key' (Perplexity API Key)"
    assert "GITHUB_TOKEN" in a.exports.needed
    assert [(s.name, s.reason) for s in a.skipped] == [("picker", "uses ${command:pickFile}, which toolatlas cannot expand")]
    assert a.source.had_comments
    _parsed(a)


def test_claude_code_user_file_reads_projects_too(tmp_path: Path) -> None:
    a = _adopt(tmp_path, "home/.claude.json", {
        "numStartups": 3,
        "mcpServers": {"memory": {"type": "stdio", "command": "npx", "args": ["-y", "server-memory"]}},
        "projects": {
            "/home/me/app": {"mcpServers": {
                "git": {"type": "stdio", "command": "uvx", "args": ["mcp-server-git"]},
                "memory": {"type": "stdio", "command": "npx", "args": ["-y", "server-memory"]}}},
            "/home/me/web": {"mcpServers": {
                "git": {"type": "stdio", "command": "uvx", "args": ["mcp-server-git", "-r", "/home/me/web"]},
                "api": {"type": "http", "url": "https://api.example/mcp",
                        "headers": {"Authorization": "Bearer ${API_TOKEN:-dev-default}"}}}},
        },
    })
    assert [u.name for u in a.upstreams] == ["memory", "git", "git-web", "api"]
    assert a.upstreams[3].headers == {"Authorization": "Bearer ${API_TOKEN}"}
    assert len(a.replaced) == 5  # the project's copy of memory is adopted once, replaced too
    assert any("the same server as mcpServers.memory" in n for n in a.notes)
    assert all("dev-default" not in n for n in [*a.notes, *a.exports.needed.values()])


def test_remote_entries_of_cursor_and_windsurf(tmp_path: Path) -> None:
    cur = _adopt(tmp_path, "home/.cursor/mcp.json", {"mcpServers": {
        "sse": {"url": "http://127.0.0.1:8000/sse"}, "web": {"url": "https://mcp.example/mcp", "headers": {"A": "b"}}}})
    assert [(u.transport, u.url, u.headers) for u in cur.upstreams] == [
        ("sse", "http://127.0.0.1:8000/sse", {}), ("http", "https://mcp.example/mcp", {"A": "b"})]
    assert sum("no type given" in n for n in cur.notes) == 2
    ws = _adopt(tmp_path, "home/.codeium/windsurf/mcp_config.json", {"mcpServers": {
        "remote": {"serverUrl": "https://mcp.example/mcp", "disabledTools": ["x"]},
        "off": {"command": "x", "disabled": True}}})
    assert [(u.name, u.transport) for u in ws.upstreams] == [("remote", "http")]
    assert any("disabledTools" in n for n in ws.notes) and ws.skipped[0].reason == "it is disabled in the client"


def test_toml_strings_escape_what_toml_requires() -> None:
    tricky = 'quote " back \\ tab\t nl\n del\x7f nul\x00 é 🚀 ${X}'
    assert tomllib.loads(f"v = {toml_string(tricky)}")["v"] == tricky


def test_rendered_config_has_laptop_daemon_defaults_and_parses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLATLAS_SOCKET", str(tmp_path / "s.sock"))
    a = _adopt(tmp_path, ".mcp.json", {"mcpServers": {"Weird Name!": {"command": "echo", "env": {"K": 'v"\n'}}}})
    cfg = _parsed(a)
    assert cfg.daemon.socket == str(tmp_path / "s.sock") and cfg.daemon.socket_mode == "0600"
    assert cfg.daemon.metrics_addr == "" and cfg.upstream[0].name == "weird-name"
    assert cfg.upstream[0].env == {"K": 'v"\n'}


def test_rewritten_client_keeps_other_keys_and_swaps_in_the_shim(tmp_path: Path) -> None:
    src = {"globalShortcut": "Ctrl+Space", "mcpServers": {
        "a": {"command": "npx", "args": ["a"]}, "off": {"command": "b", "disabled": True}}, "z": [1, 2]}
    a = _adopt(tmp_path, "claude_desktop_config.json", src)
    new, name = rewritten(a, tmp_path / "c.toml")
    data = json.loads(new)
    assert name == "toolatlas" and list(data) == ["globalShortcut", "mcpServers", "z"]
    assert data["globalShortcut"] == "Ctrl+Space" and data["z"] == [1, 2]
    assert data["mcpServers"]["off"] == src["mcpServers"]["off"]  # not adopted: left in place
    command, *pre = shim_command()
    assert data["mcpServers"]["toolatlas"] == {"command": command, "args": [*pre, "shim", "--config", str(tmp_path / "c.toml")]}
    assert "a" not in data["mcpServers"] and new.endswith(b"}\n") and b'\n  "mcpServers"' in new


def test_rewriting_a_file_with_comments_keeps_the_comments_outside_the_server_tables(tmp_path: Path) -> None:
    text = """{
  // my settings, keep them
  "editor.fontSize": 14, /* inline */
  "mcp": {
    "inputs": [],  // nothing to ask
    "servers": {
      // this old server goes
      "git": {"type": "stdio", "command": "uvx", "args": ["mcp-server-git"],},
      "off": {"type": "stdio", "command": "b", "disabled": true}
    }
  },
  "z": [1, 2,], // trailing commas stay too
}
"""
    a = _adopt(tmp_path, ".vscode/settings.json", text)
    assert a.source.had_comments and a.source.servers_table == ("mcp", "servers")
    new, name = rewritten(a, tmp_path / "c.toml")
    out = new.decode()
    for kept in ("// my settings, keep them", "/* inline */", "// nothing to ask", "[1, 2,], // trailing commas stay too",
                 "// this old server goes"):
        assert kept in out
    assert "mcp-server-git" not in out
    data = json.loads(strip_jsonc(out)[0])
    command, *pre = shim_command()
    assert data["mcp"]["servers"] == {
        "off": {"type": "stdio", "command": "b", "disabled": True},
        name: {"type": "stdio", "command": command, "args": [*pre, "shim", "--config", str(tmp_path / "c.toml")]}}
    assert out.startswith(text.split('"git"')[0])  # every byte before the adopted entry is the user's
    assert '      "off": {"type": "stdio", "command": "b", "disabled": true},\n      "toolatlas": {\n' in out


def test_a_rewrite_edits_only_the_entries_it_replaces(tmp_path: Path) -> None:
    """Only the adopted entries leave a commented server table, and the shim's entry is added
    after the last entry kept: a commented-out server, the comments beside entries and the
    entries left in place keep every byte. Before, the whole table was written anew, and
    everything commented in it was lost (but for the backup)."""
    text = """{
  "servers": {
    // GitHub, with my token
    "github": {"command": "npx", "args": ["-y", "gh"]},
    // "old": {"command": "retired-server"},
    "fs": {"command": "npx", "args": ["fs"]}, // the files
    "sock": {"type": "ws", "url": "ws://127.0.0.1:9"}, /* not adoptable: stays */
  },
}
"""
    a = _adopt(tmp_path, ".vscode/mcp.json", text)
    assert sorted(u.name for u in a.upstreams) == ["fs", "github"]
    new, name = rewritten(a, tmp_path / "c.toml")
    out = new.decode()
    command, *pre = shim_command()
    shim = json.dumps({"type": "stdio", "command": command, "args": [*pre, "shim", "--config", str(tmp_path / "c.toml")]},
                      indent=2).replace("\n", "\n    ")
    assert out == ('{\n  "servers": {\n    // GitHub, with my token\n    // "old": {"command": "retired-server"},\n'
                   '    // the files\n    "sock": {"type": "ws", "url": "ws://127.0.0.1:9"}, /* not adoptable: stays */\n'
                   f'    "{name}": {shim},\n  }},\n}}\n'), out
    assert set(json.loads(strip_jsonc(out)[0])["servers"]) == {"sock", name}


def test_a_file_with_a_byte_order_mark_keeps_it_and_its_comments(tmp_path: Path) -> None:
    """Notepad and some Windows tools write a UTF-8 BOM; the file is read past it, so the
    rewrite must edit past it too: the comments outside the server table stay (as the CLI
    says they do) and the BOM is written back."""
    text = '{\n  // keep me\n  "mcpServers": {\n    "a": {"command": "x"},\n  },\n  "other": 1,\n}\n'
    p = tmp_path / "claude_desktop_config.json"
    p.write_bytes(b"\xef\xbb\xbf" + text.encode())
    a = adopt(read_client_file(p))
    new, name = rewritten(a, tmp_path / "c.toml")
    assert new.startswith(b"\xef\xbb\xbf{\n  // keep me\n"), new[:40]
    out = new.decode("utf-8-sig")
    assert '"other": 1,\n}\n' in out
    assert set(json.loads(strip_jsonc(out)[0])["mcpServers"]) == {name}


@pytest.mark.parametrize("comments", [True, False])
def test_a_file_with_crlf_line_ends_keeps_them(tmp_path: Path, comments: bool) -> None:
    """A client file saved on Windows (CRLF): the rewrite keeps its line ends, in the lines it
    writes too (they came out LF: a mixed file, or an all-LF one without comments)."""
    text = ('{\r\n' + ('  // keep me\r\n' if comments else '') +
            '  "mcpServers": {\r\n    "a": {"command": "x"}\r\n  },\r\n  "other": 1\r\n}\r\n')
    p = tmp_path / "claude_desktop_config.json"
    p.write_bytes(text.encode())
    new, name = rewritten(adopt(read_client_file(p)), tmp_path / "c.toml")
    assert new.count(b"\n") == new.count(b"\r\n") > 5, new
    assert (b"// keep me\r\n" in new) is comments
    out = new.decode()
    assert set(json.loads(strip_jsonc(out)[0])["mcpServers"]) == {name}


def test_backup_names_lead_back_to_the_original(tmp_path: Path) -> None:
    assert original_of(tmp_path / "x.json.toolatlas-backup-20261202T101500Z") == tmp_path / "x.json"
    assert original_of(tmp_path / "x.json.toolatlas-backup-20261202T101500Z-2") == tmp_path / "x.json"
    with pytest.raises(AdoptError, match="not a backup made by"):
        original_of(tmp_path / "x.json.bak")


def test_merge_appends_only_new_servers_to_an_existing_config(tmp_path: Path) -> None:
    existing = ('[daemon]\nmetrics_addr = ""\n\n[[upstream]]\nname = "gh"\ntransport = "stdio"\ncommand = "docker"\n'
                'args = ["run"]\nenv = { TOKEN = "${MY_OWN_TOKEN}" }\n')
    a = _adopt(tmp_path, "claude_desktop_config.json", {"mcpServers": {
        "github": {"command": "docker", "args": ["run"], "env": {"TOKEN": "${MY_OWN_TOKEN}"}},
        "gh": {"command": "other"}}})
    text, added, notes = merge(existing, a, "c.toml")
    assert text.startswith(existing) and added == ["gh-2"]
    assert notes == ["mcpServers.github: c.toml already has this server as 'gh'",
                     "mcpServers.gh: upstream name 'gh-2' (c.toml has 'gh' already)"]
    assert [u["name"] for u in tomllib.loads(text)["upstream"]] == ["gh", "gh-2"]
    with pytest.raises(AdoptError, match="is not a toolatlas config"):
        merge("= nonsense", a, "c.toml")
