//! The [`Store`]: opening the file, and the one writer and the pool of readers behind
//! [`Store::write`] and [`Store::read`].
//!
//! Invariant: every write happens inside [`Store::write`], on the one writer connection, in a
//! transaction that starts with `BEGIN IMMEDIATE` and either commits or rolls back as a whole,
//! on an error or a panic alike. Every write is timed ([`WriteTimes`]: how long it waited for
//! the writer, how long it held it) and the times handed to the observer the daemon set, after
//! the writer is released.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use rusqlite::{Connection, TransactionBehavior};

use crate::conn::{configure_statements, persist_wal};
use crate::error::{SqlContext, StoreError};
use crate::limits::{
    BUSY_TIMEOUT, JOURNAL_SIZE_LIMIT, MAX_READERS, READER_CHECKOUT_TIMEOUT, TEST_MAX_PAGE_COUNT_ENV,
};
use crate::tx::{ReadTx, WriteTx};
use crate::{pool, schema};

// The crate's internal tests read the writer and the readers directly, so they are this
// module's child; the file keeps its place beside `lib.rs`.
#[cfg(test)]
#[path = "tests.rs"]
mod tests;

/// Whether a write transaction's `COMMIT` waits for its own fsync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// `synchronous=FULL`: the WAL is fsynced before `COMMIT` returns; the transaction
    /// survives a power cut once it is committed. Every write whose outcome a caller is told
    /// (an acknowledged event, a timer, a wait or an emission made through the API) is this.
    Synced,
    /// `synchronous=NORMAL`: `COMMIT` returns once the WAL is written, without an fsync of its
    /// own. A process crash loses nothing (the bytes are with the OS); a power cut may undo the
    /// last such commits, unless a `Full` commit or a checkpoint came after them (the WAL is
    /// appended to in order, so their fsync covers every commit before). Only for work that is
    /// redone when it is undone: the host loop's steps, whose in-transaction calls are made
    /// again after a crash before their commit anyway (docs/protocol.md, "MUST NOT count on
    /// being called only once").
    Deferred,
}

/// What one write transaction cost the writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteTimes {
    /// From asking for the writer (entering [`Store::write`]) to `BEGIN IMMEDIATE` succeeding:
    /// the time spent behind other writes.
    pub wait: Duration,
    /// From `BEGIN IMMEDIATE` succeeding to `COMMIT` (or the rollback) done: what this write
    /// made every other write wait. A commit's fsync is in it.
    pub hold: Duration,
}

/// What [`Store::write`] tells about each write transaction (see [`Store::observe_writes`]).
type WriteObserver = Box<dyn Fn(WriteTimes) + Send + Sync>;

/// The store: one writer connection and a pool of readers over one SQLite file.
///
/// `Store` is `Send + Sync`; share it in an `Arc`. Writes serialise on the writer; reads run
/// alongside them on the readers.
pub struct Store {
    path: PathBuf,
    writer: Mutex<Connection>,
    /// Whether the writer is at `synchronous=NORMAL` now ([`Durability::Deferred`]); changed only
    /// under the writer's lock, outside a transaction.
    deferred: AtomicBool,
    readers: pool::Readers,
    observer: OnceLock<WriteObserver>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
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
        // After a checkpoint resets the WAL, SQLite truncates the file to this size, so a
        // burst of writes does not leave a large WAL behind for good (the retention sweep
        // truncates it to nothing when the store is idle).
        conn.pragma_update(None, "journal_size_limit", JOURNAL_SIZE_LIMIT)
            .map_err(open_err("setting journal_size_limit"))?;
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
            deferred: AtomicBool::new(false),
            observer: OnceLock::new(),
        })
    }

    /// Hand every write transaction's [`WriteTimes`] to `f` from now on (the daemon's metrics).
    /// Set once; a second observer is refused (`false`). `f` runs on the writing thread after
    /// the writer is released, so it delays that caller but no other write: keep it short.
    pub fn observe_writes(&self, f: impl Fn(WriteTimes) + Send + Sync + 'static) -> bool {
        self.observer.set(Box::new(f)).is_ok()
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
        self.write_with(Durability::Synced, f)
    }

    /// [`Store::write`], its `COMMIT` as durable as `durability` says (see
    /// [`Durability::Deferred`] for when a commit may skip its own fsync).
    pub fn write_with<T>(
        &self,
        durability: Durability,
        f: impl FnOnce(&mut WriteTx<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let asked = Instant::now();
        let mut begun = None;
        let res = self.write_timed(durability, f, &mut begun);
        if let (Some(begun), Some(observe)) = (begun, self.observer.get()) {
            observe(WriteTimes {
                wait: begun - asked,
                hold: begun.elapsed(),
            });
        }
        match res {
            Ok(out) => out,
            Err(panic) => resume_unwind(panic),
        }
    }

    /// [`Store::write`] without its timing: sets `begun` once `BEGIN IMMEDIATE` succeeded, and
    /// returns a panic of `f` (after the rollback, the writer released) for the caller to
    /// resume once the write is timed.
    fn write_timed<T>(
        &self,
        durability: Durability,
        f: impl FnOnce(&mut WriteTx<'_>) -> Result<T, StoreError>,
        begun: &mut Option<Instant>,
    ) -> std::thread::Result<Result<T, StoreError>> {
        // A panic in an earlier `f` poisons the lock after its transaction was rolled back, so
        // the connection itself is sound; take it as is.
        let mut conn = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        if !conn.is_autocommit() {
            // A rollback that failed while unwinding would leave a transaction open; end it
            // here so that this one starts clean.
            tracing::warn!("writer connection was left inside a transaction; rolling it back");
            if let Err(e) = conn.execute_batch("ROLLBACK") {
                return Ok(Err(StoreError::Begin(e)));
            }
        }
        // Set only when it changes (between transactions, where SQLite allows it). Should the
        // change fail, the write fails before it begins.
        let deferred = durability == Durability::Deferred;
        if self.deferred.load(Ordering::Relaxed) != deferred {
            let level = if deferred { "NORMAL" } else { "FULL" };
            if let Err(e) = conn.pragma_update(None, "synchronous", level) {
                return Ok(Err(StoreError::Begin(e)));
            }
            self.deferred.store(deferred, Ordering::Relaxed);
        }
        let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
            Ok(tx) => tx,
            Err(e) => return Ok(Err(StoreError::Begin(e))),
        };
        *begun = Some(Instant::now());
        let mut wtx = WriteTx {
            read: ReadTx { conn: &tx },
        };
        // `Transaction` rolls back when dropped, so unwinding out of `f` would roll back too;
        // catching the panic makes the rollback explicit and its failure visible before the
        // panic resumes.
        let res = catch_unwind(AssertUnwindSafe(|| f(&mut wtx)));
        match res {
            Ok(Ok(out)) => Ok(tx.commit().map_err(StoreError::Commit).map(|()| out)),
            Ok(Err(err)) => {
                if let Err(rb) = tx.rollback() {
                    tracing::warn!(error = %rb, "rollback after a failed write transaction failed");
                }
                Ok(Err(err))
            }
            Err(panic) => {
                if let Err(rb) = tx.rollback() {
                    tracing::warn!(error = %rb, "rollback after a panic in a write transaction failed");
                }
                Err(panic)
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

    /// Runs `f` on a reader connection outside any transaction (a passive WAL checkpoint,
    /// which readers may run: it changes no data). Waits for a reader as [`Store::read`] does.
    pub(crate) fn with_reader<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let conn = self.readers.checkout(READER_CHECKOUT_TIMEOUT)?;
        f(&conn)
    }

    /// Runs `f` on the writer connection outside any transaction (a WAL checkpoint), holding
    /// the writer so that no write runs meanwhile.
    pub(crate) fn with_writer<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let conn = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        if !conn.is_autocommit() {
            tracing::warn!("writer connection was left inside a transaction; rolling it back");
            conn.execute_batch("ROLLBACK").map_err(StoreError::Begin)?;
        }
        f(&conn)
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
