"""Config parsing: errors name the key and its table; ${VAR} expands; paths resolve."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from toolatlas.config import HttpUpstream, StdioUpstream, load, parse
from toolatlas.errors import ConfigError

GOOD = """
[daemon]
socket = "run/t.sock"
state_dir = "state"
metrics_addr = ""

[[upstream]]
name = "files"
transport = "stdio"
command = "python3"
args = ["-m", "x"]
env = { TOKEN = "${SECRET_TOKEN}" }

[[upstream]]
name = "web"
transport = "http"
url = "http://127.0.0.1:3001/mcp"
headers = { Authorization = "Bearer ${SECRET_TOKEN}" }
"""


def test_good_config_parses_with_expansion_and_relative_paths(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text(GOOD)
    cfg = parse(f.read_text(), source=str(f), env={"SECRET_TOKEN": "s3cret"})
    assert [type(u) for u in cfg.upstream] == [StdioUpstream, HttpUpstream]
    assert cfg.upstream[0].env == {"TOKEN": "s3cret"}
    assert cfg.upstream[1].headers["Authorization"] == "Bearer s3cret"
    assert cfg.daemon.socket == str(tmp_path / "run" / "t.sock")
    assert cfg.daemon.state_dir == str(tmp_path / "state")
    assert cfg.upstream[0].timeouts.call == 60.0


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[daemon]\nsockett = 'x'\n", "unknown key 'sockett' in [daemon]"),
        ("[[upstream]]\nname='a'\ntransport='stdio'\ncommand='x'\nbogus=1\n", "unknown key 'bogus' in [upstream 'a'"),
        ("[[upstream]]\nname='a'\ntransport='ftp'\nurl='x'\n", "transport must be one of stdio, sse, http"),
        ("[[upstream]]\nname='Bad Name'\ntransport='stdio'\ncommand='x'\n", "upstream[0].name"),
        ("[daemon]\ndrain_timeout = 'soon'\n", "Expected `float`"),
        ("[[upstream]]\nname='a'\ntransport='http'\nurl='${NOPE_UNSET}'\n", "${NOPE_UNSET} is not set"),
        ("[[upstream]]\nname='a'\ntransport='stdio'\ncommand='x'\n[[upstream]]\nname='a'\ntransport='stdio'\ncommand='y'\n", "used more than once"),
        # refused calls are counted and audited under upstream="unknown": an upstream of that name hid among them
        ("[[upstream]]\nname='unknown'\ntransport='stdio'\ncommand='x'\n", "upstream name 'unknown' is reserved"),
        ("[[upstream]]\nname='none'\ntransport='stdio'\ncommand='x'\n", "upstream name 'none' is reserved"),
        ("[daemon]\nmetrics_addr = 'nope'\n", "metrics_addr must be HOST:PORT"),
        ("[[upstream]]\nname='a'\ntransport='http'\nurl='ftp://x'\n", "must start with http://"),
        # an unparsable URL was accepted, then a traceback in check-config and the daemon's start
        ("[[upstream]]\nname='a'\ntransport='sse'\nurl='http://[::1'\n", "upstream 'a' url is not a valid URL: Invalid IPv6 URL"),
        ("[[upstream]]\nname='a'\ntransport='http'\nurl='http://h:99999/mcp'\n", "upstream 'a' url is not a valid URL: Port out of range"),
        ("[[upstream]]\nname='a'\ntransport='http'\nurl='http:///mcp'\n", "upstream 'a' url names no host, got 'http:///mcp'"),
        ("[[upstream]]\nname='a'\ntransport='stdio'\ncommand=' '\n", "upstream 'a' has an empty command"),
        ("[store]\nurl='postgresql://u:p@[::1/db'\n", "[store] url is not a valid URL: Invalid IPv6 URL"),
        ("[http]\nlisten='127.0.0.1:0'\n[http.oauth]\nissuers=[{issuer='i', jwks_url='https://[x/j', audience='a'}]\n",
         "issuer 'i': jwks_url is not a valid URL"),
        ("this is = = not toml", "not valid TOML"),
        # a token pasted with its newline failed every connect, its value quoted past the redaction
        ("[[upstream]]\nname='a'\ntransport='http'\nurl='http://h/mcp'\nheaders={Authorization=\"Bearer t0ken\\n\"}\n",
         "upstream 'a' header 'Authorization' has a line break or another control character in its value"),
        ("[[upstream]]\nname='a'\ntransport='sse'\nurl='http://h/sse'\nheaders={Authorization='Bearer t0ken '}\n",
         "upstream 'a' header 'Authorization' has spaces at the start or end of its value"),
        ("[[upstream]]\nname='a'\ntransport='http'\nurl='http://h/mcp'\nheaders={'X Token'='t'}\n",
         "upstream 'a' header 'X Token' is not a valid HTTP header name"),
        ("[[upstream]]\nname='a'\ntransport='stdio'\ncommand='x'\nmax_description_chars=10\n",
         "Expected `int` >= 256 at [upstream 'a' (upstream[0].max_description_chars)]"),
        ("[[upstream]]\nname='a'\ntransport='stdio'\ncommand='x'\nmax_schema_bytes=0\n", "upstream[0].max_schema_bytes"),
        ("[[upstream]]\nname='a'\ntransport='stdio'\ncommand='x'\nmax_result_blocks=0\n", "upstream[0].max_result_blocks"),
        ("[learning]\nmax_events = 0\n", "Expected `int` >= 1 at [learning.max_events]"),
        # one secret under two names (a copied block): every request would be the last name's
        ("[http]\nlisten = '127.0.0.1:0'\n[[http.tokens]]\nname = 'ci'\nsha256 = '" + "ab" * 32 + "'\n"
         "[[http.tokens]]\nname = 'deploy'\nsha256 = '" + "AB" * 32 + "'\n",
         "[[http.tokens]] 'ci' and 'deploy' have the same sha256"),
    ],
)
def test_bad_configs_name_the_key(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(text, env={})
    assert needle in str(info.value)


@pytest.mark.parametrize(("text", "needle"), [
    ("[[upstream]]\nname='a'\ntransport='stdio'\ncommand='x'\nenv={A='${NOPE_UNSET}'}\n",
     "upstream[0].env.A: environment variable ${NOPE_UNSET} is not set"),
    ("[daemon]\nsocket='${NOPE_UNSET}/s.sock'\n", "daemon.socket: environment variable ${NOPE_UNSET} is not set"),
    ("[surface]\ntemplates='no-such-folder'\n", "[surface] templates: folder "),
    # a NUL in a path was a ValueError traceback in check-config and serve, and killed a daemon at SIGHUP
    ("[surface]\ntemplates=\"a\\u0000b\"\n", "surface.templates: contains a NUL character"),
    ("[daemon]\nstate_dir=\"/tmp/a\\u0000b\"\n", "daemon.state_dir: contains a NUL character"),
    ("[[upstream]]\nname='a'\ntransport='stdio'\ncommand='x'\nenv={A=\"1\\u0000\"}\n",
     "upstream[0].env.A: contains a NUL character"),
    ("[[upstream]]\nname='a'\ntransport='stdio'\ncommand='x'\nenv={\"A\\u0000\"='1'}\n",
     "upstream[0].env.'A\\x00': contains a NUL character"),
])
def test_every_config_error_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, needle: str) -> None:
    """Like every other config error, these say which file (systemd's journal, a reload, two configs)."""
    monkeypatch.delenv("NOPE_UNSET", raising=False)
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as info:
        load(cfg)
    assert str(info.value).startswith(f"{cfg}: ") and needle in str(info.value), str(info.value)


def test_check_config_says_a_nul_character_in_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[daemon]\nmetrics_addr = ''\nsocket = \"run/a\\u0000.sock\"\n")
    out = subprocess.run([sys.executable, "-m", "toolatlas", "check-config", str(cfg)], capture_output=True, text=True)
    assert out.returncode == 78, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"toolatlas: config error: {cfg}: daemon.socket: contains a NUL character (\\u0000), which no path, command or "
        "value can hold; remove it"], out.stderr


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load(tmp_path / "absent.toml")


def test_a_config_saved_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    """Some Windows editors save UTF-8 with a byte order mark, which tomllib refuses ("Invalid
    statement (at line 1, column 1)"): the loader, the CLI's socket lookup and check-config
    read the file past it."""
    from toolatlas.paths import daemon_path

    cfg = tmp_path / "bom.toml"
    cfg.write_bytes(b"\xef\xbb\xbf" + f'[daemon]\nsocket = "{tmp_path / "s.sock"}"\nmetrics_addr = ""\n'.encode())
    assert load(cfg).daemon.socket == str(tmp_path / "s.sock")
    assert daemon_path(str(cfg), "socket") == str(tmp_path / "s.sock")
    ok = subprocess.run([sys.executable, "-m", "toolatlas", "check-config", str(cfg)], capture_output=True, text=True)
    assert ok.returncode == 0 and "OK" in ok.stdout, ok.stderr


def test_the_environment_file_backs_unset_variables_and_a_fifo_there_is_not_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """${VAR} expands from the environment, then $XDG_CONFIG_HOME/toolatlas/environment; a
    FIFO in the file's place is not opened (an open would block the daemon's start for good)."""
    import os

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setenv("TA_T_SHELL", "from-shell")
    monkeypatch.delenv("TA_T_FILE", raising=False)
    (tmp_path / "toolatlas").mkdir()
    envfile = tmp_path / "toolatlas" / "environment"
    envfile.write_text("# kept by adopt\nTA_T_FILE='from file'\nTA_T_SHELL=from-file\n")
    text = "[daemon]\nmetrics_addr = ''\n[[upstream]]\nname = 'w'\ntransport = 'http'\nurl = 'http://h/${TA_T_FILE}/${TA_T_SHELL}'\n"
    assert parse(text).upstream[0].url == "http://h/from file/from-shell"  # the environment wins
    envfile.unlink()
    os.mkfifo(envfile)
    with pytest.raises(ConfigError, match=r"\$\{TA_T_FILE\} is not set"):
        parse(text)


def test_check_config_cli_exit_codes(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text("[daemon]\nmetrics_addr = ''\n")
    bad = tmp_path / "bad.toml"
    bad.write_text("[daemon]\nwhat = 1\n")
    ok = subprocess.run([sys.executable, "-m", "toolatlas", "check-config", str(good)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "OK" in ok.stdout
    no = subprocess.run([sys.executable, "-m", "toolatlas", "check-config", str(bad)], capture_output=True, text=True)
    assert no.returncode == 78
    assert "unknown key 'what' in [daemon]" in no.stderr


@pytest.mark.parametrize(("cards", "needle"), [
    ("public_key = 'absent.pub'\n", "[cards] public_key: "),
    ("required = true\n", "[cards] required = true needs [cards] public_key"),
])
def test_check_config_refuses_a_cards_section_the_daemon_would_refuse(tmp_path: Path, cards: str, needle: str) -> None:
    """check-config must not say OK to a config `serve` (and a reload) refuses with exit 78."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[daemon]\nmetrics_addr = ''\nstate_dir = 'state'\n[cards]\n{cards}")
    run = subprocess.run([sys.executable, "-m", "toolatlas", "check-config", str(cfg)], capture_output=True, text=True)
    assert run.returncode == 78, run.stdout + run.stderr
    assert needle in run.stderr and str(cfg) in run.stderr and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    doctor = subprocess.run([sys.executable, "-m", "toolatlas", "doctor", "--config", str(cfg)], capture_output=True,
                            text=True, timeout=60)
    assert doctor.returncode == 1 and any(line.startswith("FAIL  config: ") and needle in line
                                          for line in doctor.stdout.splitlines()), doctor.stdout


def test_bundled_example_config_is_valid() -> None:
    cfg = load(Path(__file__).resolve().parents[2] / "conf" / "example.toml")
    assert {u.name for u in cfg.upstream} and {type(u).__name__ for u in cfg.upstream} == {
        "StdioUpstream", "SseUpstream", "HttpUpstream"
    }


@pytest.mark.parametrize("key", ["[daemon]\nsocket", '[[endpoint]]\nname = "e"\nupstreams = ["*"]\nsocket'])
def test_a_socket_path_too_long_to_bind_is_a_config_error(tmp_path: Path, key: str) -> None:
    """A Unix socket address holds 107 bytes of path: a longer socket (a deep checkout's
    .run/toolatlas.sock) passed check-config and doctor, then `serve` died in bind(2) with a
    traceback ('AF_UNIX path too long'). Now check-config (and so serve, reload and doctor)
    refuses it, naming the path and the limit; 107 bytes still parse."""
    deep = tmp_path / ("d" * 200)
    fits = "/tmp/" + "s" * (107 - len("/tmp/") - len(".sock")) + ".sock"
    for path, ok in ((str(deep / "t.sock"), False), (fits, True)):
        f = tmp_path / "c.toml"
        f.write_text(f'{key} = "{path}"\n' + ('[daemon]\nmetrics_addr = ""\n' if "endpoint" in key else "")
                     + '[[upstream]]\nname = "x"\ntransport = "http"\nurl = "http://127.0.0.1:1/mcp"\n')
        r = subprocess.run([sys.executable, "-m", "toolatlas", "check-config", str(f)], capture_output=True, text=True,
                           timeout=60)
        if ok:
            assert r.returncode == 0, r.stderr
        else:
            assert r.returncode == 78, r.stdout
            assert f"socket {path!r} is {len(path)} bytes long; a Unix socket path holds at most 107" in r.stderr, r.stderr


def _warnings_of_check_config(tmp_path: Path, text: str) -> list[str]:
    """check-config on a config of `text` under [daemon] (state in tmp_path, one stdio
    upstream `files`): it must say OK; its warning lines."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("[daemon]\nmetrics_addr = ''\nstate_dir = 'state'\n"
                   "[[upstream]]\nname = 'files'\ntransport = 'stdio'\ncommand = 'true'\n" + text)
    run = subprocess.run([sys.executable, "-m", "toolatlas", "check-config", str(cfg)], capture_output=True, text=True)
    assert run.returncode == 0 and "OK" in run.stdout, run.stdout + run.stderr
    return [line for line in run.stderr.splitlines() if line.startswith("toolatlas: warning: ")]


def test_check_config_warns_of_an_access_rule_naming_no_token(tmp_path: Path) -> None:
    """A typo in a rule's token name (`ci_agent` for `ci-agent`) is a rule that matches no one:
    the real token then gets access_default ("allow": every upstream). check-config still says
    OK (a rule left naming a token just removed must not block that removal at a reload), but
    warns, naming the rule and the token."""
    from toolatlas.surface.http import hash_token

    warnings = _warnings_of_check_config(tmp_path, "[http]\nlisten = '127.0.0.1:0'\n"
                                         f"[[http.tokens]]\nname = 'ci-agent'\nsha256 = '{hash_token('s3cret-token')}'\n"
                                         "[[access]]\nusers = ['root']\nservers = ['*']\n"
                                         "[[access]]\ntokens = ['ci_agent', 'ci-agent']\nservers = ['files']\n")
    assert len(warnings) == 1 and "[[access]] rule 2" in warnings[0] and "'ci_agent'" in warnings[0], warnings
    assert "access_default" in warnings[0], warnings


def test_check_config_warns_of_an_access_rule_naming_an_unknown_user_or_group(tmp_path: Path) -> None:
    """A user or group name this host does not know (a typo: `alcie`) makes a rule that
    matches no socket client; the client meant gets access_default. Warned of, not refused
    (the account may be made later); numeric ids are never warned of."""
    warnings = _warnings_of_check_config(tmp_path, "[[access]]\nusers = ['root', 'no-such-user-xq', 4242]\n"
                                         "groups = ['root', 'no-such-group-xq', '4243']\nservers = ['files']\n")
    assert len(warnings) == 2, warnings
    assert "rule 1 names user 'no-such-user-xq'" in warnings[0] and "rule 1 names group 'no-such-group-xq'" in warnings[1]


def test_check_config_warns_of_an_oauth_rule_that_any_of_several_issuers_matches(tmp_path: Path) -> None:
    """With two issuers, a rule's oauth_groups match the groups either issuer names: warned,
    unless oauth_issuers binds it; an issuer that is not configured is an error."""
    oauth = ("[http]\nlisten = '127.0.0.1:0'\n[http.oauth]\nissuers = [{issuer = 'https://a', jwks_url = 'https://a/k'},"
             " {issuer = 'https://b', jwks_url = 'https://b/k'}]\n")
    warnings = _warnings_of_check_config(tmp_path, oauth + "[[access]]\noauth_groups = ['ops']\nservers = ['files']\n"
                                         "[[access]]\noauth_issuers = ['https://a']\noauth_groups = ['ops']\n"
                                         "servers = ['files']\n")
    assert len(warnings) == 1 and "rule 1 matches the oauth_* claims of every issuer" in warnings[0], warnings
    with pytest.raises(ConfigError, match="oauth_issuers names 'https://c', which is not an"):
        parse(oauth + "[[access]]\noauth_issuers = ['https://c']\nservers = []\n", env={})
