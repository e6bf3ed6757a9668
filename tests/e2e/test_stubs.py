"""`toolatlas stubs` against a running daemon (issue 18 item 6): the modules generated from
npm's server-everything import, pass mypy --strict, and call `echo` through the daemon; a
server the caller's access rules deny gets no module (and cannot be called through the stub
client either); a re-run on an unchanged catalog writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.daemon import Daemon, everything_upstream, stdio_testserver


def _stubs(d: Daemon, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "toolatlas", "stubs", "--out", str(out), "--socket", d.socket, *extra],
                          capture_output=True, text=True, timeout=120)


def _python(cwd: Path, code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TOOLATLAS_SOCKET"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120, env=env)


def test_stubs_from_server_everything_type_check_and_call_echo(tmp_path: Path) -> None:
    rules = f'[[access]]\nusers = [{os.getuid()}]\nservers = ["everything"]\n'
    d = Daemon(tmp_path, everything_upstream() + stdio_testserver("vault") + rules, daemon_extra='access_default = "deny"\n')
    with d:
        d.wait_for(lambda: any(s["name"] == "everything" and s["tools"] > 0 for s in d.status()["servers"]), 60,
                   "everything listed")
        out = tmp_path / "atlas_tools"
        run = _stubs(d, out)
        assert run.returncode == 0, run.stderr
        assert "of 1 servers (everything)" in run.stdout, run.stdout
        # the denied server: no module, not in the index
        assert sorted(p.name for p in out.glob("*.py")) == ["__init__.py", "_client.py", "everything.py"]
        denied = _stubs(d, tmp_path / "denied_tools", "--servers", "vault")
        assert denied.returncode == 1 and "unknown server(s) vault" in denied.stderr, denied
        assert not (tmp_path / "denied_tools").exists()
        # a folder that cannot be written: one line saying so, exit 73, no traceback
        (tmp_path / "a_file").write_text("not a folder\n")
        blocked = _stubs(d, tmp_path / "a_file" / "atlas_tools")
        assert blocked.returncode == 73 and "Traceback" not in blocked.stderr, blocked
        assert blocked.stderr.startswith(f"toolatlas: cannot write the stubs into {tmp_path / 'a_file' / 'atlas_tools'}: "
                                         "Not a directory"), blocked.stderr

        mypy = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / ".mypy"),
                               "atlas_tools"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert mypy.returncode == 0, mypy.stdout + mypy.stderr

        called = _python(tmp_path, "from atlas_tools import TOOLS, everything, text\n"
                                   "print(sorted(TOOLS))\nprint(text(everything.echo(message='from a stub')))")
        assert called.returncode == 0, called.stderr
        assert called.stdout.splitlines() == ["['everything']", "Echo: from a stub"]
        # the stub client calls as this process: the daemon's access rules still refuse the denied server
        refused = _python(tmp_path, "from atlas_tools import ToolError, call\n"
                                    "try:\n    call('vault__echo', {'message': 'x'})\nexcept ToolError as e:\n    print('refused', e)")
        assert refused.returncode == 0 and refused.stdout.startswith("refused vault__echo"), refused

        before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.glob("*.py")}
        again = _stubs(d, out)
        assert again.returncode == 0 and again.stdout.rstrip().endswith("unchanged"), again.stdout
        assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.glob("*.py")} == before
