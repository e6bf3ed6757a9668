"""Where things live: default locations, and the one resolver of a configured path.

Stdlib only: the shim and the CLI import this without msgspec. The daemon's config
(config.py) and the CLI's `--socket` default both resolve a path here, so `~`, `${VAR}`
and a path relative to the config file mean the same thing to both.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import stat
from collections.abc import Mapping
from typing import BinaryIO

from toolatlas.errors import ConfigError

SYSTEM_SOCKET = "/run/toolatlas/toolatlas.sock"
_VAR_PATTERN = r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}"  # compiled on first use (re's cache keeps it)


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def file_kind(mode: int) -> str:
    """What a file of `st_mode` `mode` is, for a message: "a directory", "a regular file"..."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((k for test, k in _KINDS if test(mode)), "a special file")


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """`path` opened for reading, if it is a regular file; never blocks.

    A plain open() of a FIFO waits for a writer forever, and one of a device reads without
    end. This opens with O_NONBLOCK (a FIFO opens at once) and checks the type on the open
    descriptor (no race with a rename): anything but a regular file raises OSError whose
    strerror says "not a regular file (a FIFO)". FileNotFoundError when nothing is there.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"not a regular file ({file_kind(mode)})", os.fspath(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str]) -> bytes:
    """The bytes of the regular file `path` (see `open_regular` for what else raises)."""
    with open_regular(path) as fh:
        return fh.read()


def read_config(path: str | os.PathLike[str]) -> str:
    """A config file's text: UTF-8, with the byte order mark some Windows editors put first
    dropped (tomllib refuses it). UnicodeDecodeError when it is not UTF-8."""
    return read_regular(path).decode("utf-8-sig")


def set_aside_unless_regular(path: str | os.PathLike[str], now: float) -> str | None:
    """Move what is at `path`, if it is there and is not a regular file (a directory, a FIFO:
    an open of it fails, or blocks for good), to `<path>.unusable-<now>`, so a fresh file can
    take its place. Returns where it went, None when nothing was moved; OSError if it cannot
    be moved."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode):
        return None
    aside = f"{os.fspath(path)}.unusable-{int(now)}"
    os.replace(path, aside)
    return aside


def expand_vars(text: str, env: Mapping[str, str], where: str, found: list[str] | None = None) -> str:
    """`${VAR}` in `text` from `env` (a bare `$VAR` is left alone, as the config documents).

    Each value put in is appended to `found` (when given). Raises ConfigError naming `where`
    (the config key) when a variable is not set.
    """

    def sub(m: re.Match[str]) -> str:
        var = m.group(1)
        if var not in env:
            raise ConfigError(f"{where}: environment variable ${{{var}}} is not set")
        if found is not None:
            found.append(env[var])
        return env[var]

    return re.sub(_VAR_PATTERN, sub, text)


def no_nul(text: str, where: str) -> str:
    """`text`, or ConfigError naming `where` (the config key) when it holds a NUL character:
    no path, command, argument, environment value or header can carry one (the OS refuses
    it), and it would otherwise surface as a traceback wherever the value is first used."""
    if "\x00" in text:
        raise ConfigError(f"{where}: contains a NUL character (\\u0000), which no path, command or value can "
                          "hold; remove it")
    return text


def resolve_path(path: str, base: str | os.PathLike[str]) -> str:
    """A configured path made absolute: `~` expanded, a relative one taken from `base` (the
    config file's folder). "" stays "" (the key is unset)."""
    # os.path, not pathlib: pathlib costs the shim ~5 ms of imports at every start.
    return os.path.realpath(os.path.join(os.fspath(base), os.path.expanduser(path))) if path else path


def default_socket_path() -> str:
    """The socket when neither flag, env nor config names one (see the interface)."""
    if env := os.environ.get("TOOLATLAS_SOCKET"):
        return env
    if os.geteuid() == 0:
        return SYSTEM_SOCKET
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/toolatlas-{os.geteuid()}"
    return os.path.join(runtime, "toolatlas", "toolatlas.sock")


def default_state_dir() -> str:
    """The state folder when the config names none."""
    if os.geteuid() == 0:
        return "/var/lib/toolatlas"
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(base, "toolatlas")


def default_config_path() -> str:
    """Where `toolatlas adopt --rewrite-client` writes a config when no --out is given, and
    where `toolatlas doctor` looks when neither --config nor $TOOLATLAS_CONFIG names one."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return os.path.join(base, "toolatlas", "config.toml")


def environment_file() -> str:
    """`~/.config/toolatlas/environment` (under $XDG_CONFIG_HOME): `NAME=value` lines for the
    config's `${VAR}`s. The user service reads it (`EnvironmentFile=`), the config loader falls
    back to it for a name the environment does not set (a daemon a shim starts has its GUI
    client's environment), and `adopt` keeps there the secrets it moves out of a client's
    file (mode 0600)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return os.path.join(base, "toolatlas", "environment")


def read_environment_file(path: str | None = None) -> dict[str, str]:
    """The variables of an environment file (default `environment_file()`), as systemd reads
    one: `NAME=value` lines, `#` and `;` comments, a value may be quoted; {} when absent."""
    try:  # a FIFO or folder there is not read (an open of a FIFO would block for good)
        text = read_regular(path or environment_file()).decode("utf-8", errors="replace")
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        name, eq, value = line.strip().partition("=")
        if not eq or not name or name[0] in "#;":
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[name.strip()] = value
    return out


def config_environment(file_at_start: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a config's `${VAR}` expands from: this process's environment, and for a name it
    does not set, `environment_file()`.

    `file_at_start` (a reload's): that file as the daemon read it at its start. A name this
    process's environment holds at the file's value then (systemd's `EnvironmentFile=` put it
    there) takes the file's value now, so an edited file applies at a reload."""
    file = read_environment_file()
    env = {**file, **os.environ}
    for name, was in (file_at_start or {}).items():
        if name in file and os.environ.get(name) == was:
            env[name] = file[name]
    return env


def writable_folder(path: str, key: str) -> None:
    """Make the folder `path` (mode 0700) if it is missing, and check that a file can be made in
    it; ConfigError naming the config `key` and the path that failed (a parent that is a file,
    a folder of another user) when not: the daemon writes its state there from its start."""
    import tempfile  # not at module level (see write_atomic)

    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename and exc.filename != path else ""
        raise ConfigError(f"{key} {path!r} cannot be used: {where}{exc.strerror or exc}") from exc


def write_atomic(path: str | os.PathLike[str], chunks: bytes | list[bytes], mode: int | None = None) -> None:
    """Replace `path` with `chunks` at once: a temp file in the same folder, fsync, rename,
    fsync of the folder. Readers see the old bytes or the new ones, never a mix. The file
    gets `mode`, else the mode the file had, else 0666 less the umask."""
    import tempfile  # not at module level: the shim imports this module and must start fast

    p = os.fspath(path)
    folder = os.path.dirname(p) or "."
    os.makedirs(folder, exist_ok=True)
    if mode is None:
        try:
            mode = stat.S_IMODE(os.stat(p).st_mode)
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(p)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            for chunk in [chunks] if isinstance(chunks, bytes) else chunks:
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dfd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


SOCKET_PATH_MAX = 107  # bytes: sun_path holds 108 on Linux, the last one a NUL (104 on macOS)


def unix_socket_path(path: str, source: str) -> str:
    """`path`, when a Unix socket can be bound there; ConfigError (naming `source`, the config)
    when it is longer than a socket address holds: bind(2) would fail on it at the start."""
    size = len(os.fsencode(path))
    if size > SOCKET_PATH_MAX:
        raise ConfigError(f"{source}: socket {path!r} is {size} bytes long; a Unix socket path holds at most "
                          f"{SOCKET_PATH_MAX}: choose a shorter one (e.g. under $XDG_RUNTIME_DIR or /tmp)")
    return path


def socket_path(configured: str, config_dir: str | os.PathLike[str]) -> str:
    """The daemon socket for a `[daemon] socket` value whose `${VAR}`s are expanded."""
    return resolve_path(configured, config_dir) or default_socket_path()


def client_socket(flag: str | None, config: str | None = None) -> str:
    """The socket a client command (shim, search, call, status) talks to.

    `--socket`, else `$TOOLATLAS_SOCKET`, else the `[daemon] socket` of `config` (or of
    `$TOOLATLAS_CONFIG`) resolved exactly as the daemon resolves it, else the default. Only
    that key is read, so a config whose other values need the daemon's environment (an
    unset `${TOKEN}` in an upstream header) still names its socket. Raises ConfigError when
    the config is not valid TOML or its socket names an unset variable, and when `config`
    (the --config flag; not `$TOOLATLAS_CONFIG`) names no file.
    """
    if flag:
        return flag
    if env := os.environ.get("TOOLATLAS_SOCKET"):
        return env
    if config and not os.path.exists(config):
        raise ConfigError(f"--config {config!r}: no such file")
    config = config or os.environ.get("TOOLATLAS_CONFIG")
    if not config or not os.path.exists(config):
        return default_socket_path()
    return daemon_path(config, "socket") or default_socket_path()


def daemon_path(config: str, key: str, env: Mapping[str, str] | None = None) -> str:
    """The `[daemon] KEY` path (socket, state_dir) of `config`, resolved as the daemon
    resolves it, or "" when unset.

    Reads only that key (see `client_socket`); raises ConfigError when the file cannot be
    read, is not valid TOML, or the value is not a string or names an unset variable.
    """
    import tomllib

    try:
        table = tomllib.loads(read_config(config)).get("daemon", {})
    except OSError as exc:
        raise ConfigError(f"cannot read the {key} from {config!r}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"cannot read the {key} from {config!r}: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read the {key} from {config!r}: it is not UTF-8 text") from exc
    raw = table.get(key, "") if isinstance(table, dict) else ""
    if not isinstance(raw, str):
        raise ConfigError(f"{config}: [daemon] {key} must be a string, got {raw!r}")
    value = expand_vars(raw, config_environment() if env is None else env, f"daemon.{key}")
    try:
        no_nul(value, f"daemon.{key}")
    except ConfigError as exc:
        raise ConfigError(f"{config}: {exc}") from None
    return resolve_path(value, os.path.dirname(os.path.abspath(config)))


def socket_answers(path: str, timeout: float = 1.0) -> bool:
    """Whether something accepts connections on the Unix socket `path` now."""
    if not path:
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(timeout)
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()
