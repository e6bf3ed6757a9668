"""The shared store's schema: versioned migrations, applied in order, each once.

Pure data (no driver import). `client.Store.migrate` applies the missing ones under a
PostgreSQL advisory lock, so replicas that start together migrate once; a migration that
is applied is never edited, only followed by a new one.

Three kinds of shared data, one table each:

- `toolatlas_embeddings`: the embedding cache, keyed by the document vector space (model and
  runtime, retrieval.embed.document_space) and the SHA-256 of the embedded text.
- `toolatlas_events`: an append-only log (catalog change notices today; usage feedback and
  audit events plug in as new kinds). `idem` makes a write idempotent: a buffered write
  sent twice (a replica killed between the commit and its bookkeeping) lands once.
- `toolatlas_state`: the latest value per (kind, key) (card verification results today;
  upstream approval states and learned state plug in as new kinds). A write applies only if
  it is newer (`written_at`, the writer's clock) than what is there; each applied write
  takes a new `seq`, which replicas catch up on.

And one view for operators: `toolatlas_audit`, the shared audit trail (the events of kind
`audit`, one row per audit record of any replica, with the record's main fields as columns).
"""

from __future__ import annotations

# The advisory-lock key migrations run under (any constant shared by every replica).
MIGRATION_LOCK = 0x7A71A5  # "toolatlas"
# The transaction-level advisory lock every write holds: ids and sequence numbers are then
# handed out in commit order, so a reader that has seen id N never later meets a smaller id
# committed after it (a sequence alone allots ids at insert, not at commit).
WRITE_LOCK = 0x7A71A6
# The NOTIFY channel: the payload is a small JSON `{"origin", "table", "kind", "key"}`.
CHANNEL = "toolatlas"

SCHEMA_TABLE = """
CREATE TABLE IF NOT EXISTS toolatlas_schema (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    applied_by text NOT NULL
)
"""

# (version, name, statements); versions increase by one.
MIGRATIONS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (1, "embeddings, events, state", (
        """CREATE TABLE toolatlas_embeddings (
            space text NOT NULL,
            key bytea NOT NULL,
            vec bytea NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (space, key)
        )""",
        """CREATE TABLE toolatlas_events (
            id bigserial PRIMARY KEY,
            kind text NOT NULL,
            key text NOT NULL,
            body jsonb NOT NULL,
            origin text NOT NULL,
            idem text NOT NULL UNIQUE,
            written_at timestamptz NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now()
        )""",
        "CREATE INDEX toolatlas_events_kind ON toolatlas_events (kind, id)",
        "CREATE SEQUENCE toolatlas_state_seq",
        """CREATE TABLE toolatlas_state (
            kind text NOT NULL,
            key text NOT NULL,
            body jsonb NOT NULL,
            origin text NOT NULL,
            idem text NOT NULL,
            written_at timestamptz NOT NULL,
            seq bigint NOT NULL DEFAULT nextval('toolatlas_state_seq'),
            PRIMARY KEY (kind, key)
        )""",
        "CREATE INDEX toolatlas_state_seq_idx ON toolatlas_state (seq)",
    )),
    (2, "audit view", (
        # at: the replica's clock when it wrote the record; replica: its name in the store
        # (catalog_status store.replica); record: the audit line as in its audit file.
        """CREATE VIEW toolatlas_audit AS
            SELECT id, written_at AS at, origin AS replica, body->>'event' AS event,
                   body->>'principal' AS principal, body AS record, created_at AS stored_at
            FROM toolatlas_events WHERE kind = 'audit'""",
    )),
)

LATEST = MIGRATIONS[-1][0]


def pending(applied: set[int]) -> list[tuple[int, str, tuple[str, ...]]]:
    """The migrations not in `applied`, in order. A version in `applied` that this build does
    not know (a newer replica migrated the database) is left alone: the tables this build
    uses are still there, since migrations only add."""
    return [m for m in MIGRATIONS if m[0] not in applied]


__all__ = ["CHANNEL", "LATEST", "MIGRATIONS", "MIGRATION_LOCK", "WRITE_LOCK", "SCHEMA_TABLE", "pending"]
