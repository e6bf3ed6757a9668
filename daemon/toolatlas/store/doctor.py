"""`toolatlas doctor`'s check of the shared store ([store] url): reachable, and its schema at
the version this toolatlas applies. Imported only when a store is configured (psycopg then)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolatlas.redact import Redactor

if TYPE_CHECKING:
    from toolatlas.config import Config


def check_store(cfg: Config) -> tuple[str, str]:
    """(level "ok" | "WARN" | "FAIL", what to say) for `cfg`'s [store]; the URL (it may
    hold a password) is never said, and an error text is redacted of the config's secrets."""
    from toolatlas.config import secrets
    from toolatlas.store.schema import LATEST, MIGRATIONS

    redact = Redactor()
    redact.add(secrets(cfg))
    try:
        import psycopg
    except ImportError:
        return "FAIL", "[store] url is set but the PostgreSQL driver is not installed: pip install 'toolatlas[store]'"
    timeout = max(1, int(cfg.store.connect_timeout))
    try:
        with psycopg.connect(cfg.store.url, autocommit=True, connect_timeout=timeout) as conn:
            exists = conn.execute("SELECT to_regclass('toolatlas_schema') IS NOT NULL").fetchone()
            applied = {int(r[0]) for r in conn.execute("SELECT version FROM toolatlas_schema")} \
                if exists and exists[0] else set()
    except (psycopg.Error, OSError) as exc:
        why = redact(" ".join(str(exc).split()))
        return "FAIL", (f"cannot reach the database ({why}); replicas then serve from local state and buffer their "
                        "writes on disk: check [store] url, the server and the network")
    newer = sorted(v for v in applied if v > LATEST)
    if newer:
        return "FAIL", (f"the database's schema has version {newer[-1]}, newer than this toolatlas knows ({LATEST}): "
                        "upgrade toolatlas on this host")
    missing = [f"{v} ({name})" for v, name, _ in MIGRATIONS if v not in applied]
    if missing:
        return "WARN", (f"reachable; migration(s) {', '.join(missing)} not applied yet: the next replica to start "
                        "applies them (under an advisory lock)")
    return "ok", f"reachable, schema at version {LATEST}"


__all__ = ["check_store"]
