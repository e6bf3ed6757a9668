"""`toolatlas install --user`: write the systemd user units and enable socket activation.

Writes `toolatlas.service` and `toolatlas.socket` under `$XDG_CONFIG_HOME/systemd/user`
(default ~/.config/systemd/user), the same units as systemd/user/ in the repository with
ExecStart naming this installation's `toolatlas` and ListenStream the config's socket. Where
systemd's user manager answers, it runs `systemctl --user daemon-reload` and
`systemctl --user enable --now toolatlas.socket`: systemd then owns the socket, so clients
connect before and while the daemon (re)starts, and the daemon starts on the first one (it
takes the socket from LISTEN_FDS). Where it does not (a container, no login session), it
says so and prints the commands to run; that is not an error (exit 0). `--dry-run` prints
the units and the commands and changes nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from toolatlas.errors import ConfigError
from toolatlas.paths import daemon_path, default_socket_path, read_environment_file

EX_CONFIG = 78
SOCKET_UNIT = "toolatlas.socket"

SERVICE = """\
# Written by `toolatlas install --user`; run it again to update. See systemd/user/ in the
# toolatlas repository for what each line is for.

[Unit]
Description=toolatlas MCP tool gateway (user)

[Service]
Type=notify
NotifyAccess=main
ExecStart={exec_start}
ExecReload=/bin/kill -HUP $MAINPID
WatchdogSec=30s
Restart=on-failure
RestartSec=2s
TimeoutStartSec=900s
TimeoutStopSec=30s
KillMode=mixed
# Variables the config's ${{VAR}} placeholders need (secrets stay out of the config); optional.
EnvironmentFile=-%E/toolatlas/environment

RuntimeDirectory=toolatlas
RuntimeDirectoryMode=0700
RuntimeDirectoryPreserve=yes
CacheDirectory=toolatlas
ConfigurationDirectory=toolatlas
UMask=0077
Environment=PYTHONUNBUFFERED=1

NoNewPrivileges=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallFilter=pkey_alloc pkey_free pkey_mprotect
SystemCallErrorNumber=EPERM

[Install]
WantedBy=default.target
"""

SOCKET = """\
# Written by `toolatlas install --user`: systemd holds the daemon's socket, and starts
# toolatlas.service on the first client connection.

[Unit]
Description=toolatlas MCP tool gateway socket (user)

[Socket]
ListenStream={listen}
SocketMode=0600
DirectoryMode=0700
Accept=no
Service=toolatlas.service

[Install]
WantedBy=sockets.target
"""


def _unit_word(word: str) -> str:
    """`word` as one argument of a unit's command line (specifiers and variables escaped)."""
    word = word.replace("%", "%%").replace("$", "$$")
    if word and not any(c in word for c in ' \t"\'\\;'):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def toolatlas_command() -> list[str]:
    """How this installation's toolatlas is run: the console script beside the interpreter,
    else the one on PATH, else `python -m toolatlas`."""
    script = Path(sys.executable).parent / "toolatlas"
    if script.exists():
        return [str(script)]
    found = shutil.which("toolatlas")
    return [found] if found else [sys.executable, "-m", "toolatlas"]


def render(config: str, socket: str) -> dict[str, str]:
    """The two units' text for `config`, whose daemon listens on `socket`."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    listen = socket
    if runtime and socket == os.path.join(runtime, "toolatlas", "toolatlas.sock"):
        listen = "%t/toolatlas/toolatlas.sock"  # the same path, and what systemd/user/ ships
    else:
        listen = listen.replace("%", "%%")
    exec_start = " ".join(_unit_word(w) for w in [*toolatlas_command(), "serve", "--config", config])
    return {"toolatlas.service": SERVICE.format(exec_start=exec_start), SOCKET_UNIT: SOCKET.format(listen=listen)}


def unit_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(base) / "systemd" / "user"


def service_environment() -> dict[str, str]:
    """The environment the service will have, as far as it can be known here: this one with
    the unit's `EnvironmentFile=-%E/toolatlas/environment` (paths.environment_file) over it."""
    return {**os.environ, **read_environment_file()}


def _user_manager() -> str | None:
    """None when `systemctl --user` reaches a user manager, else why not."""
    if shutil.which("systemctl") is None:
        return "systemctl is not installed"
    try:
        r = subprocess.run(["systemctl", "--user", "show-environment"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if r.returncode != 0:
        return (r.stderr.strip() or r.stdout.strip() or f"exit status {r.returncode}").splitlines()[0]
    return None


def _parser() -> argparse.ArgumentParser:
    default = os.path.join(os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"),
                           "toolatlas", "config.toml")
    p = argparse.ArgumentParser(prog="toolatlas install", description=__doc__.split("\n\n")[0])
    p.add_argument("--user", action="store_true", required=True,
                   help="install for this user (systemd user units); system units: see systemd/ in the repository")
    p.add_argument("--config", default=default, help=f"the daemon's config (default: {default})")
    p.add_argument("--dry-run", action="store_true", help="print the units and the commands; change nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    config = os.path.abspath(args.config)
    have_config = os.path.exists(config)
    env = service_environment()
    try:
        if have_config:
            from toolatlas.config import load

            load(config, env=env)  # a config the daemon would refuse is reported now, not at its first start
        socket = (daemon_path(config, "socket", env) if have_config else "") or default_socket_path()
    except ConfigError as exc:
        print(f"toolatlas install: config error: {exc}", file=sys.stderr)
        return EX_CONFIG
    units = render(config, socket)
    folder = unit_dir()
    enable = ["systemctl", "--user", "enable", "--now", SOCKET_UNIT]
    commands = [["systemctl", "--user", "daemon-reload"], enable]
    if args.dry_run:
        for name, text in units.items():
            print(f"# {folder / name}\n{text}")
        print("# then:\n" + "\n".join(" ".join(c) for c in commands))
        return 0
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in units.items():
        path = folder / name
        verb = "replaced" if path.exists() and path.read_text() != text else "wrote"
        path.write_text(text)
        print(f"{verb} {path}")
    print(f"config: {config}" + ("" if have_config else " (not there yet)") + f"; socket: {socket}")
    return _enable(commands, config, socket, have_config)


def _enable(commands: list[list[str]], config: str, socket: str, have_config: bool) -> int:
    from toolatlas.paths import socket_answers

    later = "\n".join("  " + " ".join(c) for c in commands)
    why_not = _user_manager()
    if why_not is not None:
        print(f"systemd's user manager is not reachable here ({why_not}); where it is, run:\n{later}\n"
              f"Without systemd, MCP clients can have the shim start the daemon: toolatlas shim --config {config}")
        return 0
    if not have_config:
        commands = commands[:1]
        print(f"write {config} first (e.g. `toolatlas adopt CLIENT_CONFIG --out {config}`), then run:\n"
              f"  {' '.join(commands[0][:3])} enable --now {SOCKET_UNIT}")
    elif socket_answers(socket):
        commands = [commands[0], ["systemctl", "--user", "enable", SOCKET_UNIT]]
        print(f"a daemon already listens on {socket} (one a shim started?): stop it, then run "
              f"`systemctl --user start {SOCKET_UNIT}`")
    for cmd in commands:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            print(f"{' '.join(cmd)}: failed (exit status {r.returncode}): {r.stderr.strip()}", file=sys.stderr)
            return 1
        print(f"ran: {' '.join(cmd)}")
    print(f"MCP clients connect with: {' '.join(toolatlas_command())} shim --socket {socket}")
    return 0
