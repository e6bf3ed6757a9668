"""Where the exported embedding model lives, and whether an export is complete.

Stdlib only, apart from embed.py which does the exporting: `toolatlas doctor` checks the
model cache without importing numpy or onnxruntime.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from toolatlas.paths import read_regular

# The folder of the current export format under models_dir(); bump the suffix when it changes.
EXPORT_DIRNAME = "minilm-l6-v2-onnx-v2"


def models_dir(state_dir: Path | None) -> Path:
    """Where exported models live: ``state_dir/models`` or the user cache dir."""
    if state_dir is not None:
        return Path(state_dir) / "models"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "toolatlas" / "models"


def export_complete(folder: Path) -> bool:
    """Whether `folder` holds every file its manifest lists, each at its recorded size."""
    try:
        manifest = json.loads(read_regular(folder / "manifest.json"))
        files: dict[str, int] = manifest["files"]
        return all((folder / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False
