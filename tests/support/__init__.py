"""What the test layers and the bench scripts share, one copy of each job:

- ``ports``: a free TCP port on 127.0.0.1.
- ``processes``: /proc helpers (pid_alive, children_of, descendants), die_with_parent, kill_all.
- ``servers``: the project's test MCP servers (testserver, faultserver), the user examples and
  npm's server-everything as subprocesses on 127.0.0.1.
- ``configs``: upstream config structs with short test timeouts (TEST_TIMEOUTS).
- ``daemon``: a real ``toolatlas serve`` subprocess on a generated TOML config.
- ``results``: the text of a tool result (SDK object or raw JSON).

The repository root must be on sys.path (pytest puts it there: ``tests`` is a package).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The suite's XDG_CACHE_HOME (tests/conftest.py sets it for the tests and what they start):
# the ONNX export of the embedding model is made here once per machine, and nothing a test
# runs writes into the home directory of whoever runs it.
TEST_CACHE_HOME = Path(tempfile.gettempdir()) / f"toolatlas-test-cache-{os.getuid()}"
# The suite's XDG_CONFIG_HOME, empty: a config's ${VAR}s fall back to its toolatlas/environment,
# and the runner's own (~/.config/toolatlas/environment) must not reach the tests' daemons.
TEST_CONFIG_HOME = Path(tempfile.gettempdir()) / f"toolatlas-test-config-{os.getuid()}"
