//! The schema, as an ordered list of migrations tracked by `PRAGMA user_version`.
//!
//! `user_version` is the number of migrations applied: a new file is at 0, and after
//! `MIGRATIONS[i]` runs it is `i + 1`. Each migration runs in its own `BEGIN IMMEDIATE`
//! transaction together with the bump of `user_version`, so a crash leaves the file at a whole
//! version, and two processes opening a new file at once apply each migration once.
//!
//! Invariant: a migration, once released, is never edited or removed; a change is a new entry
//! appended at the end. A file whose version is past the end of the list belongs to a newer
//! build and is refused rather than guessed at.
//!
//! The live reads of the host loop go through partial indexes (`events_unrouted`, `work_live`,
//! `timers_due`, `waits_active`, `emissions_planned`) whose `WHERE` clause names the live set, so
//! an idle pass reads nothing of the retained history. The queries repeat each index's `WHERE`
//! term literally, because SQLite uses a partial index only when the query's `WHERE` implies it.
//! The retention sweep reads the same way (`artifacts_retained`, `artifacts_purging`), so a sweep
//! with nothing to remove reads nothing of the history either.
//! All times are Unix milliseconds chosen by the caller. State columns are plain text without
//! `CHECK` constraints, so that adding a state is an append-only change and not a table rebuild;
//! the Rust enums are the check.

use std::path::Path;

use rusqlite::{Connection, TransactionBehavior};

use crate::error::StoreError;

/// Every migration, oldest first. Append only.
pub const MIGRATIONS: &[&str] = &[
    // 1: the coordination records.
    r#"
CREATE TABLE work (
    id         INTEGER PRIMARY KEY,
    kind       TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    state      TEXT    NOT NULL,  -- open | ready | done
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
) STRICT;
-- At most one unfinished Work per (kind, key); done Work keeps its key without blocking a new one.
CREATE UNIQUE INDEX work_live_key ON work (kind, key) WHERE state != 'done';
CREATE INDEX work_live ON work (id) WHERE state != 'done';

CREATE TABLE events (
    id          INTEGER PRIMARY KEY,
    source      TEXT    NOT NULL,
    delivery_id TEXT    NOT NULL,
    kind        TEXT    NOT NULL,
    payload     TEXT    NOT NULL,  -- JSON
    accepted_at INTEGER NOT NULL,
    routed_at   INTEGER,           -- NULL until the routing pass has decided
    work_id     INTEGER REFERENCES work (id),
    UNIQUE (source, delivery_id)
) STRICT;
CREATE INDEX events_unrouted ON events (id) WHERE routed_at IS NULL;
CREATE INDEX events_by_source ON events (source, id);

CREATE TABLE work_inputs (
    work_id  INTEGER NOT NULL REFERENCES work (id),
    event_id INTEGER NOT NULL REFERENCES events (id),
    added_at INTEGER NOT NULL,
    PRIMARY KEY (work_id, event_id)
) STRICT, WITHOUT ROWID;

CREATE TABLE timers (
    id            INTEGER PRIMARY KEY,
    extension     TEXT    NOT NULL,
    recurrence    TEXT    NOT NULL,
    spec          TEXT    NOT NULL,
    next_at       INTEGER,          -- NULL: stopped
    last_fired_at INTEGER,
    created_at    INTEGER NOT NULL
) STRICT;
CREATE INDEX timers_due ON timers (next_at) WHERE next_at IS NOT NULL;

CREATE TABLE waits (
    id              INTEGER PRIMARY KEY,
    extension       TEXT    NOT NULL,
    filter          TEXT    NOT NULL,
    subject         TEXT    NOT NULL,
    work_id         INTEGER REFERENCES work (id),
    cursor_event_id INTEGER NOT NULL,  -- the last event considered; 0 before any
    state           TEXT    NOT NULL,  -- active | satisfied
    satisfied_by    INTEGER REFERENCES events (id),
    created_at      INTEGER NOT NULL,
    satisfied_at    INTEGER
) STRICT;
CREATE INDEX waits_active ON waits (id) WHERE state = 'active';

CREATE TABLE emissions (
    id           INTEGER PRIMARY KEY,
    extension    TEXT    NOT NULL,
    emission     TEXT    NOT NULL,
    work_id      INTEGER REFERENCES work (id),
    payload      TEXT    NOT NULL,  -- JSON
    commit_nonce TEXT    NOT NULL,  -- random; the commit id is em-<id>-<nonce>
    state        TEXT    NOT NULL,  -- planned | committed | failed
    error        TEXT,
    planned_at   INTEGER NOT NULL,
    finished_at  INTEGER
) STRICT;
CREATE INDEX emissions_planned ON emissions (id) WHERE state = 'planned';

CREATE TABLE emission_records (
    emission_id INTEGER NOT NULL REFERENCES emissions (id),
    seq         INTEGER NOT NULL,
    kind        TEXT    NOT NULL,
    body        TEXT    NOT NULL,  -- JSON
    PRIMARY KEY (emission_id, seq)
) STRICT, WITHOUT ROWID;

CREATE TABLE artifacts (
    id         INTEGER PRIMARY KEY,
    sha256     TEXT    NOT NULL UNIQUE,  -- lower-case hex; the content's address on disk
    size       INTEGER NOT NULL,
    name       TEXT    NOT NULL,
    media_type TEXT,
    extension  TEXT    NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;
"#,
    // 2: where each extension's ingress source was last polled to.
    r#"
CREATE TABLE ingress_cursors (
    extension  TEXT    NOT NULL,
    source     TEXT    NOT NULL,
    cursor     TEXT    NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (extension, source)
) STRICT, WITHOUT ROWID;
"#,
    // 3: retention. An artifact's content may be removed by the sweep (`retention.rs`); its row
    // stays, marked, so its id keeps its meaning and the sweep can finish after a crash.
    r#"
-- When the content was last stored or mentioned by a new record, or found needed by a live one.
ALTER TABLE artifacts ADD COLUMN touched_at INTEGER NOT NULL DEFAULT 0;
-- Set when the sweep decides to remove the content (committed before any file is deleted).
ALTER TABLE artifacts ADD COLUMN removed_at INTEGER;
-- Set once the content file is gone.
ALTER TABLE artifacts ADD COLUMN purged_at INTEGER;
UPDATE artifacts SET touched_at = created_at;
-- The sweep's candidates, oldest first: only content still kept.
CREATE INDEX artifacts_retained ON artifacts (touched_at, id) WHERE removed_at IS NULL;
-- Content whose removal was decided but not finished (a crash between the two).
CREATE INDEX artifacts_purging ON artifacts (id) WHERE removed_at IS NOT NULL AND purged_at IS NULL;

-- Which records mention which artifact id (by digest; the artifact may not exist yet).
CREATE TABLE artifact_refs (
    sha256    TEXT    NOT NULL,
    record    TEXT    NOT NULL,  -- event | emission | emission_record | wait
    record_id INTEGER NOT NULL,
    PRIMARY KEY (sha256, record, record_id)
) STRICT, WITHOUT ROWID;

-- How much content is kept, maintained by triggers so nothing reads every row to know.
CREATE TABLE artifact_totals (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    count INTEGER NOT NULL,
    bytes INTEGER NOT NULL
) STRICT;
INSERT INTO artifact_totals (id, count, bytes)
    SELECT 1, count(*), coalesce(sum(size), 0) FROM artifacts;
CREATE TRIGGER artifact_totals_insert AFTER INSERT ON artifacts WHEN NEW.removed_at IS NULL
BEGIN
    UPDATE artifact_totals SET count = count + 1, bytes = bytes + NEW.size WHERE id = 1;
END;
CREATE TRIGGER artifact_totals_removed AFTER UPDATE OF removed_at ON artifacts
    WHEN OLD.removed_at IS NULL AND NEW.removed_at IS NOT NULL
BEGIN
    UPDATE artifact_totals SET count = count - 1, bytes = bytes - OLD.size WHERE id = 1;
END;
CREATE TRIGGER artifact_totals_revived AFTER UPDATE OF removed_at ON artifacts
    WHEN OLD.removed_at IS NOT NULL AND NEW.removed_at IS NULL
BEGIN
    UPDATE artifact_totals SET count = count + 1, bytes = bytes + NEW.size WHERE id = 1;
END;
"#,
    // 4 (it follows retention's 3; on a branch without that one, it is the third entry): what
    // an operator ended by hand, kept rather than erased. A deleted timer has no `next_at` and
    // a `deleted_at`; a cancelled wait is in state `cancelled` with a `cancelled_at`; a closed
    // Work is `done` with a `closed_at` and the operator's reason. Each leaves its live partial
    // index (`timers_due`, `waits_active`, `work_live`) as a finished record does.
    r#"
ALTER TABLE timers ADD COLUMN deleted_at INTEGER;
ALTER TABLE waits ADD COLUMN cancelled_at INTEGER;
ALTER TABLE work ADD COLUMN closed_at INTEGER;
ALTER TABLE work ADD COLUMN close_reason TEXT;
"#,
    // 5 (after retention's 3 and the hand-ended records' 4; on a branch without those, the
    // last entry): what the operator views read (`conduit top`, `conduit web`; views.rs): Work by state and
    // by kind, newest first, from indexes; and Work counted by kind and state in a table the
    // triggers keep, so a count is a read of a few rows whatever the history retained.
    r#"
CREATE INDEX work_by_state ON work (state, id);
CREATE INDEX work_by_kind ON work (kind, state, id);
CREATE TABLE work_counts (
    kind  TEXT    NOT NULL,
    state TEXT    NOT NULL,
    n     INTEGER NOT NULL,
    PRIMARY KEY (kind, state)
) STRICT, WITHOUT ROWID;
INSERT INTO work_counts (kind, state, n) SELECT kind, state, count(*) FROM work GROUP BY kind, state;
CREATE TRIGGER work_counts_insert AFTER INSERT ON work BEGIN
    INSERT INTO work_counts (kind, state, n) VALUES (new.kind, new.state, 1)
        ON CONFLICT (kind, state) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER work_counts_update AFTER UPDATE OF kind, state ON work
    WHEN old.kind != new.kind OR old.state != new.state BEGIN
    UPDATE work_counts SET n = n - 1 WHERE kind = old.kind AND state = old.state;
    INSERT INTO work_counts (kind, state, n) VALUES (new.kind, new.state, 1)
        ON CONFLICT (kind, state) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER work_counts_delete AFTER DELETE ON work BEGIN
    UPDATE work_counts SET n = n - 1 WHERE kind = old.kind AND state = old.state;
END;
"#,
];

/// Brings the file at `path` (already open as `conn`) up to `MIGRATIONS.len()`.
pub(crate) fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    loop {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(StoreError::Begin)?;
        // Read the version under the write lock, so a concurrent opener's migration is seen.
        let found: i64 = tx
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .map_err(|cause| StoreError::Open {
                path: path.to_owned(),
                what: "reading user_version",
                cause,
            })?;
        let applied = usize::try_from(found).unwrap_or(usize::MAX);
        if applied == MIGRATIONS.len() {
            return Ok(());
        }
        if applied > MIGRATIONS.len() {
            return Err(StoreError::TooNew {
                path: path.to_owned(),
                found,
                known: MIGRATIONS.len(),
            });
        }
        let version = applied + 1;
        tx.execute_batch(MIGRATIONS[applied])
            .and_then(|()| tx.pragma_update(None, "user_version", version as i64))
            .and_then(|()| tx.commit())
            .map_err(|cause| StoreError::Migration { version, cause })?;
        tracing::info!(version, path = %path.display(), "applied store migration");
    }
}
