"""The official MCP conformance suite against the HTTP endpoint of a real daemon: every
scenario that applies to the gateway's own surface passes, the rest are the listed
expected failures (tests/e2e/conformance/expected-failures.json, a reason each)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _runner():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("toolatlas_conformance_run", HERE / "run.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_expected_failure_has_a_reason() -> None:
    data = json.loads((HERE / "expected-failures.json").read_text())
    for section in ("scenarios", "vacuous"):
        for name, entry in data[section].items():
            assert len(entry["reason"]) > 20, name


@pytest.mark.slow
def test_conformance_suite_against_the_http_endpoint(tmp_path: Path) -> None:
    run = _runner()
    if not run.NODE22.exists() or not run.CONFORMANCE.exists():
        pytest.fail("the conformance suite or Node 22 is not installed: run `make npm` (make test does)")
    res = run.run(tmp_path, timeout=240)
    print(res["summary"])
    assert not res["unexpected_failures"], json.dumps(res["unexpected_failures"], indent=1)[:4000]
    assert not res["stale_expected_failures"], res["stale_expected_failures"]
    # The scenarios that exercise the gateway's own surface.
    assert {"server-initialize", "ping", "tools-list", "dns-rebinding-protection",
            "server-sse-multiple-streams", "resources-list", "prompts-list", "logging-set-level"} <= set(res["passed"]), res
    assert run.ok(res)
