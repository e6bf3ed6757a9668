"""A throwaway PostgreSQL server for the shared-store tests: `initdb` in a temp folder, one
server on 127.0.0.1 at a free port, stopped and removed at the end.

initdb and postgres refuse to run as root: as root (CI), the cluster belongs to an
unprivileged system user (`postgres` when the packages made one, else `nobody`) and every
server command runs as that user through `runuser`. The binaries come from PATH or
/usr/lib/postgresql/*/bin (`make setup` installs the distribution's packages when absent).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path

from tests.support.ports import free_port

SUPERUSER = "toolatlas"


def bindir() -> Path | None:
    """The folder holding initdb/pg_ctl/postgres, or None when PostgreSQL is not installed."""
    found = shutil.which("initdb")
    if found:
        real = Path(os.path.realpath(found)).parent
        if (real / "pg_ctl").exists():
            return real
    for cand in sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True):
        return Path(cand).parent
    return None


class PgServer:
    """One PostgreSQL cluster; `url(db)` is a libpq URL for database `db` (trust auth)."""

    def __init__(self) -> None:
        found = bindir()
        if found is None:
            raise RuntimeError("PostgreSQL server binaries not found (initdb); `make setup` installs them")
        self.bin = found
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="toolatlas-pg-"))
        self.data = self.root / "data"
        self.sockdir = self.root / "sock"
        self.log = self.root / "server.log"
        self.user: str | None = None
        if os.geteuid() == 0:
            self.user = "postgres" if _user_exists("postgres") else "nobody"
            pw = pwd.getpwnam(self.user)
            os.chmod(self.root, 0o700)
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self._as_user("mkdir", "-p", str(self.sockdir))
        self._as_user(str(self.bin / "initdb"), "-D", str(self.data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8",
                      "--no-sync")
        self.start()

    def _as_user(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        cmd = list(argv) if self.user is None else ["runuser", "-u", self.user, "--", *argv]
        done = subprocess.run(cmd, capture_output=True, timeout=120, cwd=self.root)
        if check and done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {done.stderr.decode()[-2000:]}\n"
                               f"{self.log.read_text() if self.log.exists() else ''}")
        return done

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        opts = (f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.sockdir} "
                "-c fsync=off -c max_connections=200 -c shared_buffers=32MB")
        self._as_user(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w",
                      "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (`fast`: sessions are cut, as when a database host goes away)."""
        self._as_user(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def _processes(self) -> list[int]:
        """The postmaster's pid and its children's (this server's only)."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = []
        for stat in glob.glob("/proc/[0-9]*/stat"):
            try:
                fields = Path(stat).read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == postmaster:
                children.append(int(stat.split("/")[2]))
        return [postmaster, *children]

    def pause(self) -> None:
        """SIGSTOP the server's processes: it still accepts TCP connections (the kernel does)
        but answers nothing, as a hung host or a black-holed network."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: int) -> None:
        for pid in self._processes():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:  # a backend that ended meanwhile
                pass

    def psql(self, sql: str, db: str = "postgres") -> list[tuple[object, ...]]:
        import psycopg

        with psycopg.connect(self.url(db), autocommit=True, connect_timeout=10) as conn:
            cur = conn.execute(sql)
            return list(cur.fetchall()) if cur.description else []

    def new_database(self) -> str:
        """A fresh database (per test); its URL."""
        name = "t_" + uuid.uuid4().hex[:12]
        self.psql(f"CREATE DATABASE {name}")
        return self.url(name)

    def close(self) -> None:
        try:
            self.resume()  # a paused server does not stop
        except (OSError, ValueError, IndexError):
            pass
        self._as_user(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


__all__ = ["PgServer", "bindir"]
