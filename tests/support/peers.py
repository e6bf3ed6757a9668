"""Socket peers of other Unix users: run a function in a forked child that dropped to a
user's uid and gid (the tests run as root), and get its JSON result back."""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Callable, Sequence
from typing import Any


def run_as(user: pwd.struct_passwd, fn: Callable[[], Any], groups: Sequence[int] = ()) -> Any:
    """`fn()` in a forked child running as `user`, with only the supplementary `groups`
    (default none, whatever /etc/group says); its JSON-able return value.

    A fork, not a new interpreter: the project's venv may live where other users cannot read
    (import what `fn` needs before calling this). An exception in the child fails the caller's
    assertion with its repr."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(r)
            os.setgroups(list(groups))
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            out = {"result": fn()}
        except BaseException as exc:  # report, never return into pytest
            out = {"error": repr(exc)}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    out = json.loads(data)
    assert "result" in out, out
    return out["result"]
