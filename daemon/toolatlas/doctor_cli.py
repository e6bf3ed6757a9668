"""`toolatlas doctor [--config PATH]`: one line per check (ok, WARN, FAIL with what to do);
exit 1 when any check FAILs. The checks live in toolatlas.doctor."""

from __future__ import annotations

import argparse

from toolatlas.doctor import FAIL, run_checks


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="toolatlas doctor",
        description="Check a toolatlas setup: config, stdio commands, the daemon's socket, the state "
                    "folder, the embedding model, and each upstream's last error.",
    )
    p.add_argument("--config", help="config file (default: $TOOLATLAS_CONFIG, else ~/.config/toolatlas/config.toml)")
    args = p.parse_args(argv)
    checks = run_checks(args.config)
    for check in checks:
        print(check.line(), flush=True)
    failed = sum(1 for c in checks if c.level == FAIL)
    print(f"{failed} problem(s) found" if failed else "no problems found")
    return 1 if failed else 0
