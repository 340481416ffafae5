//! conduit's coordination store: Events, Work, Timers, Waits, Emissions and artifact metadata in
//! one SQLite file.
//!
//! ```text
//!   host loop ──write(|tx| …)──▶ writer: 1 connection, BEGIN IMMEDIATE … COMMIT
//!   API, reentrant reads ─read(|r| …)──▶ readers: ≤ 4 query_only connections, each read
//!                                        a deferred transaction on a committed snapshot
//! ```
//!
//! Only this crate knows SQL. It does not call extensions, read the clock, or touch artifact
//! content: times are Unix milliseconds passed in by the caller (so tests control time), and
//! content lives on disk under its sha256, written by the caller.
//!
//! Invariants:
//! - Every write happens inside [`Store::write`], on the one writer connection, in a transaction
//!   that starts with `BEGIN IMMEDIATE` (so it holds the write lock from its first statement and
//!   never fails half-way with `SQLITE_BUSY` on an upgrade) and either commits or rolls back as a
//!   whole, on an error or a panic alike.
//! - WAL mode and `synchronous=FULL`: a committed transaction survives a power cut, and readers
//!   never wait for the writer.
//! - The live reads (`unrouted_events`, `open_work`, `due_timers`, `active_waits`,
//!   `planned_emissions`) go through partial indexes over the live set, so their cost follows
//!   what is live, not the history retained (see `schema.rs`).
//! - Every page is 1 to [`MAX_PAGE`] rows; anything else is [`StoreError::InvalidLimit`].

mod artifacts;
mod counts;
mod emissions;
mod error;
mod events;
mod ingress;
mod pool;
mod schema;
mod timers;
mod waits;
mod work;

#[cfg(test)]
mod tests;

use std::ops::Deref;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rusqlite::config::DbConfig;
use rusqlite::types::FromSql;
use rusqlite::{Connection, Params, Row, Statement, TransactionBehavior};

pub use artifacts::Artifact;
pub use counts::Counts;
pub use emissions::{Emission, EmissionState, Planned};
pub use error::{Fault, StoreError};
pub use events::{Accepted, EventRecord};
pub use schema::MIGRATIONS;
pub use timers::Timer;
pub use waits::{Wait, WaitState};
pub use work::{WorkRecord, WorkState};

use error::SqlContext;

/// The largest page any read returns, and the largest `limit` it accepts: the protocol's page
/// bound (`docs/protocol.md` §7.2), which the API and the callbacks check first.
pub const MAX_PAGE: u32 = conduit_protocol::rules::MAX_PAGE;

/// How long SQLite retries a lock held by another process before failing with `SQLITE_BUSY`.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How many read-only connections the store opens at most.
pub const MAX_READERS: usize = 4;

/// How long [`Store::read`] waits for a reader connection when all are busy.
pub const READER_CHECKOUT_TIMEOUT: Duration = Duration::from_secs(5);

/// A test-only knob: when set to a number, the writer's `max_page_count` is set to it, so the
/// file cannot grow past that many pages (SQLite clamps it to the current size) and writes
/// that need room fail with `SQLITE_FULL`, exactly as on a full disk. Never set it in
/// production.
pub const TEST_MAX_PAGE_COUNT_ENV: &str = "CONDUIT_TEST_MAX_PAGE_COUNT";

/// Prepared statements kept per connection; more than the store has, so none is re-prepared.
const STATEMENT_CACHE: usize = 64;

/// The store: one writer connection and a pool of readers over one SQLite file.
///
/// `Store` is `Send + Sync`; share it in an `Arc`. Writes serialise on the writer; reads run
/// alongside them on the readers.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    writer: Mutex<Connection>,
    readers: pool::Readers,
}

/// A read inside a transaction: a committed snapshot on a reader, or the writer's own view
/// (including its uncommitted writes) when reached through [`WriteTx`].
#[derive(Debug)]
pub struct ReadTx<'c> {
    conn: &'c Connection,
}

/// A write transaction on the writer connection. Every read of [`ReadTx`] is available on it
/// through `Deref` and sees the transaction's own writes.
#[derive(Debug)]
pub struct WriteTx<'c> {
    read: ReadTx<'c>,
}

impl Store {
    /// Opens (creating if needed) the store at `path`, checks it with `PRAGMA quick_check`, and
    /// applies any migrations this build has that the file lacks.
    ///
    /// `quick_check` rather than `integrity_check`: it finds damaged pages and records but skips
    /// matching every index against its table, so opening stays fast as history grows.
    pub fn open(path: impl AsRef<Path>) -> Result<Store, StoreError> {
        let path = path.as_ref().to_owned();
        let open_err = |what| {
            let path = path.clone();
            move |cause| StoreError::Open { path, what, cause }
        };
        let mut conn = Connection::open(&path).map_err(open_err("opening"))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(open_err("setting the busy timeout"))?;
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
            .map_err(open_err("setting journal_mode=WAL"))?;
        if !mode.eq_ignore_ascii_case("wal") {
            // An in-memory file or one on a file system without shared memory cannot do WAL;
            // snapshot reads and durability both depend on it, so refuse rather than run
            // without.
            return Err(StoreError::NotWal { path, mode });
        }
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(open_err("setting synchronous=FULL"))?;
        conn.pragma_update(None, "foreign_keys", true)
            .map_err(open_err("setting foreign_keys=ON"))?;
        configure_statements(&conn)
            .map_err(open_err("enabling the query planner stability guarantee"))?;
        persist_wal(&conn).map_err(open_err("keeping the WAL files across restarts"))?;

        quick_check(&conn, &path)?;
        schema::migrate(&mut conn, &path)?;

        if let Some(n) = std::env::var(TEST_MAX_PAGE_COUNT_ENV)
            .ok()
            .and_then(|v| v.parse::<i64>().ok())
        {
            tracing::warn!(
                max_page_count = n,
                "{TEST_MAX_PAGE_COUNT_ENV} is set: the store will not grow (a test knob)"
            );
            conn.pragma_update(None, "max_page_count", n)
                .map_err(open_err("setting the test max_page_count"))?;
        }

        Ok(Store {
            readers: pool::Readers::new(path.clone(), MAX_READERS),
            path,
            writer: Mutex::new(conn),
        })
    }

    /// The file this store was opened on.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` in a write transaction on the writer connection and commits it if `f` returns
    /// `Ok`. On `Err`, or if `f` panics, the transaction is rolled back and nothing it wrote
    /// remains; the panic then continues.
    ///
    /// Blocks while another write runs: there is one writer. Synchronous on purpose; the host
    /// loop calls it from its own thread, and async callers should use `spawn_blocking`.
    /// Calling `write` again from inside `f` deadlocks; calling [`Store::read`] from inside
    /// `f` is fine and reads the last committed snapshot.
    pub fn write<T>(
        &self,
        f: impl FnOnce(&mut WriteTx<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        // A panic in an earlier `f` poisons the lock after its transaction was rolled back, so
        // the connection itself is sound; take it as is.
        let mut conn = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        if !conn.is_autocommit() {
            // A rollback that failed while unwinding would leave a transaction open; end it
            // here so that this one starts clean.
            tracing::warn!("writer connection was left inside a transaction; rolling it back");
            conn.execute_batch("ROLLBACK").map_err(StoreError::Begin)?;
        }
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(StoreError::Begin)?;
        let mut wtx = WriteTx {
            read: ReadTx { conn: &tx },
        };
        // `Transaction` rolls back when dropped, so unwinding out of `f` would roll back too;
        // catching the panic makes the rollback explicit and its failure visible before the
        // panic resumes.
        let res = catch_unwind(AssertUnwindSafe(|| f(&mut wtx)));
        match res {
            Ok(Ok(out)) => {
                tx.commit().map_err(StoreError::Commit)?;
                Ok(out)
            }
            Ok(Err(err)) => {
                if let Err(rb) = tx.rollback() {
                    tracing::warn!(error = %rb, "rollback after a failed write transaction failed");
                }
                Err(err)
            }
            Err(panic) => {
                if let Err(rb) = tx.rollback() {
                    tracing::warn!(error = %rb, "rollback after a panic in a write transaction failed");
                }
                resume_unwind(panic)
            }
        }
    }

    /// Runs `f` in a deferred read transaction on a reader connection: it sees one committed
    /// snapshot throughout, and never waits for the writer. Waits up to
    /// [`READER_CHECKOUT_TIMEOUT`] for a reader when all [`MAX_READERS`] are in use.
    pub fn read<T>(
        &self,
        f: impl FnOnce(&ReadTx<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut conn = self.readers.checkout(READER_CHECKOUT_TIMEOUT)?;
        let tx = conn.transaction().context("begin a read transaction")?;
        let out = f(&ReadTx { conn: &tx });
        // A read has nothing to commit; ending it with a rollback releases the snapshot.
        tx.rollback().context("end a read transaction")?;
        out
    }
}

impl<'c> Deref for WriteTx<'c> {
    type Target = ReadTx<'c>;

    fn deref(&self) -> &ReadTx<'c> {
        &self.read
    }
}

impl<'c> WriteTx<'c> {
    fn conn(&self) -> &'c Connection {
        self.read.conn
    }
}

/// Sets up a connection's statement handling: a statement cache larger than the store's set of
/// statements, and the query planner stability guarantee (QPSG).
///
/// QPSG is there for speed as much as for stability. The bundled SQLite is built with STAT4,
/// under which a statement whose plan could depend on a bound value (a `LIMIT ?`, a range on an
/// indexed column) is marked to be re-prepared when that binding changes, and the statement
/// cache clears every binding when a statement is returned to it. Without QPSG every cached
/// live read was re-prepared on every use, about 5 µs each; with it, a plan is fixed when the
/// statement is prepared, which is also what the query-plan tests assume.
fn configure_statements(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(())
}

/// Keep `conduit.db-wal` and `conduit.db-shm` when the last connection closes
/// (`SQLITE_FCNTL_PERSIST_WAL`), instead of deleting them and creating them again at the next
/// open. Creating the shared-memory index needs 32 KiB of free space, so without this a store
/// closed cleanly could not be opened again on a full disk; with it, the next open reuses the
/// space the files already hold. The WAL is still checkpointed into the main file at close, so
/// `conduit.db` alone is complete after a clean stop. Set on every connection: whichever closes
/// last decides.
fn persist_wal(conn: &Connection) -> rusqlite::Result<()> {
    let mut on: std::ffi::c_int = 1;
    // SAFETY: `handle` is the connection's live handle, used only during this call;
    // SQLITE_FCNTL_PERSIST_WAL reads and writes one `int` through the pointer, which points to
    // a local that outlives the call.
    let rc = unsafe {
        rusqlite::ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            rusqlite::ffi::SQLITE_FCNTL_PERSIST_WAL,
            (&raw mut on).cast(),
        )
    };
    if rc == rusqlite::ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rc),
            None,
        ))
    }
}

fn quick_check(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let mut stmt = conn
        .prepare("PRAGMA quick_check")
        .map_err(|cause| StoreError::Open {
            path: path.to_owned(),
            what: "running quick_check",
            cause,
        })?;
    let problems = stmt
        .query_map([], |row| row.get::<_, String>(0))
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(|cause| StoreError::Open {
            path: path.to_owned(),
            what: "running quick_check",
            cause,
        })?;
    if problems.len() == 1 && problems[0] == "ok" {
        return Ok(());
    }
    Err(StoreError::Corrupt {
        path: path.to_owned(),
        problems: problems.join("; "),
    })
}

/// Checks a page size: 1 to [`MAX_PAGE`].
fn page(limit: u32) -> Result<i64, StoreError> {
    if (1..=MAX_PAGE).contains(&limit) {
        Ok(i64::from(limit))
    } else {
        Err(StoreError::InvalidLimit {
            limit,
            max: MAX_PAGE,
        })
    }
}

/// Reads a JSON column back, naming the record when it cannot be parsed.
fn parse_json(
    text: &str,
    record: &'static str,
    id: i64,
    field: &'static str,
) -> Result<serde_json::Value, StoreError> {
    serde_json::from_str(text).map_err(|err| StoreError::Decode {
        record,
        id,
        field,
        reason: err.to_string(),
    })
}

/// Runs a prepared query and decodes every row with `decode`.
fn collect<T>(
    stmt: &mut Statement<'_>,
    params: impl Params,
    what: &'static str,
    mut decode: impl FnMut(&Row<'_>) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let mut rows = stmt.query(params).context(what)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().context(what)? {
        out.push(decode(row)?);
    }
    Ok(out)
}

/// Runs a prepared query and decodes its first row, if any.
fn first<T>(
    stmt: &mut Statement<'_>,
    params: impl Params,
    what: &'static str,
    decode: impl FnOnce(&Row<'_>) -> Result<T, StoreError>,
) -> Result<Option<T>, StoreError> {
    let mut rows = stmt.query(params).context(what)?;
    match rows.next().context(what)? {
        Some(row) => decode(row).map(Some),
        None => Ok(None),
    }
}

/// Reads one column. The tables are `STRICT`, so a type mismatch here means a damaged file.
fn col<T: FromSql>(row: &Row<'_>, idx: usize) -> Result<T, StoreError> {
    row.get(idx).context("read a column")
}
