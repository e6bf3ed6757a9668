"""State files that cannot be read, for the tests of issue #15 item 11. The tests run as root,
whom chmod 000 does not stop, so "unreadable" is what root cannot read either."""

from __future__ import annotations

import os
from pathlib import Path

UNREADABLE = ["directory", "fifo"]


def plant_unreadable(path: Path, kind: str) -> None:
    """Put a directory (with a file in it) or a FIFO (a plain open() of it would block for
    good) where the file `path` belongs, replacing the file if there is one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    if kind == "directory":
        path.mkdir()
        (path / "inside").write_text("x")
    else:
        os.mkfifo(path)
