"""`toolatlas stubs` source generation (issue 18 item 6): awkward names and schemas become
valid, typed Python that mypy --strict accepts; the output is deterministic."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path
from typing import Any

from toolatlas.stubs.generate import MARKER, identifier, render, write

TEMPLATE = (Path(__file__).resolve().parents[2] / "daemon" / "toolatlas" / "stubs" / "client_template.py").read_text()

DEFINITIONS: list[dict[str, Any]] = [
    {"name": "units__convert", "server": "units", "tool": "convert", "attested": True,
     "description": 'Convert a value. Quotes """ and a backslash \\ stay text.', "examples": ["10 mi in km"],
     "inputSchema": {"type": "object", "required": ["value", "from"], "properties": {
         "value": {"type": "number", "description": "The value."},
         "from": {"type": "string", "enum": ["mi", "km"]},
         "to-unit": {"type": ["string", "null"]},
         "options": {"type": "object", "required": ["precision"], "properties": {
             "precision": {"type": "integer"}, "style": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
             "nested": {"type": "object", "properties": {"deep": {"type": "boolean"}}}}},
         "points": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "number"}}}},
         "free": {"type": "object"}, "anything": {}, "ref": {"$ref": "#/$defs/x"}}}},
    {"name": "units__2fa-check", "server": "units", "tool": "2fa-check", "attested": False,
     "description": "Check a code.", "inputSchema": {"type": "object", "properties": {}}},
    {"name": "my-server__class", "server": "my-server", "tool": "class", "attested": False,
     "description": "A tool named like a keyword.", "inputSchema": {"type": "object"}},
]


def test_identifiers() -> None:
    taken: set[str] = set()
    assert [identifier(n, taken) for n in ("getUserById", "from", "2fa-check", "get-user-by-id", "a b")] == [
        "get_user_by_id", "from_", "t_2fa_check", "get_user_by_id_2", "a_b"]


def test_generated_package_type_checks_and_imports(tmp_path: Path) -> None:
    files = render(DEFINITIONS, "/run/x.sock", TEMPLATE)
    assert render(list(reversed(DEFINITIONS)), "/run/x.sock", TEMPLATE) == files  # deterministic
    assert sorted(files) == ["__init__.py", "_client.py", "my_server.py", "units.py"]
    pkg = tmp_path / "stubpkg"
    assert write(pkg, files) == sorted(files)
    assert write(pkg, files) == []  # nothing changed: no file written
    mypy = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / ".mypy"), "stubpkg"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert mypy.returncode == 0, mypy.stdout + mypy.stderr
    sys.path.insert(0, str(tmp_path))
    try:
        mod = importlib.import_module("stubpkg.units")
        index = importlib.import_module("stubpkg")
    finally:
        sys.path.remove(str(tmp_path))
    sig = inspect.signature(mod.convert)
    assert list(sig.parameters)[:2] == ["value", "from_"] and all(
        p.kind is inspect.Parameter.KEYWORD_ONLY for p in sig.parameters.values())
    assert sig.parameters["to_unit"].default is None
    doc = mod.convert.__doc__ or ""
    assert '"""' in doc and "\\" in doc and "10 mi in km" in doc and "attested by the operator's card" in doc
    assert index.TOOLS == {"my-server": {"class_": "my-server__class"},
                           "units": {"convert": "units__convert", "t_2fa_check": "units__2fa-check"}}
    assert "'to-unit'" in files["units.py"] and "NotRequired" in files["units.py"] and "Literal['mi', 'km']" in files["units.py"]


def test_stale_generated_modules_are_removed_and_others_kept(tmp_path: Path) -> None:
    write(tmp_path, render(DEFINITIONS, "/run/x.sock", TEMPLATE))
    (tmp_path / "mine.py").write_text("# the user's own file\n")
    changed = write(tmp_path, render(DEFINITIONS[:2], "/run/x.sock", TEMPLATE))
    assert "-my_server.py" in changed and not (tmp_path / "my_server.py").exists()
    assert (tmp_path / "mine.py").exists() and MARKER in (tmp_path / "units.py").read_text()
