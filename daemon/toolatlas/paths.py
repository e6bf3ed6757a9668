"""Default locations, stdlib only (the shim and the CLI import this without msgspec)."""

from __future__ import annotations

import os


def default_socket_path() -> str:
    """The socket when neither flag, env nor config names one (see the interface)."""
    if env := os.environ.get("TOOLATLAS_SOCKET"):
        return env
    if os.geteuid() == 0:
        return "/run/toolatlas/toolatlas.sock"
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/toolatlas-{os.geteuid()}"
    return os.path.join(runtime, "toolatlas", "toolatlas.sock")
