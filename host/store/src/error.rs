//! The store's one error type.
//!
//! Every variant says what failed: which file, which record and id, which limit, and the SQLite
//! error underneath when there is one. Callers match on the variant to decide what to tell a
//! peer; the `Display` text is for logs and operators.
//!
//! Invariant: no SQL error leaves the store without the operation it interrupted (`Sql::what`).
//!
//! Each message is whole: it carries the SQLite error underneath in one line (`cause`, which is
//! deliberately not reported as `source()`), so a log line or an API answer that prints only
//! `Display` still says why ("database or disk is full"), and a chain printer (`{:#}`) does not
//! print the cause twice.

use std::borrow::Cow;
use std::path::PathBuf;
use std::time::Duration;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database file could not be opened or configured.
    #[error("cannot open the store at {}: {what}: {}", path.display(), sqlite(cause))]
    Open {
        path: PathBuf,
        what: &'static str,
        cause: rusqlite::Error,
    },

    /// SQLite would not put the file in WAL mode.
    #[error("the store at {} cannot use WAL mode (journal_mode is {mode})", path.display())]
    NotWal { path: PathBuf, mode: String },

    /// `PRAGMA quick_check` found damage; the store refuses to run on it.
    #[error("the store at {} failed its quick check: {problems}", path.display())]
    Corrupt { path: PathBuf, problems: String },

    /// The file was migrated by a newer build; this one does not know its schema.
    #[error(
        "the store at {} has schema version {found}, newer than the {known} this build knows",
        path.display()
    )]
    TooNew {
        path: PathBuf,
        found: i64,
        known: usize,
    },

    /// Read without a daemon, the file is at an older schema than this build's: only the
    /// daemon's open migrates it.
    #[error(
        "the store at {} has schema version {found}, older than the {known} this build reads; start the daemon once (`conduit daemon run`) to migrate it",
        path.display()
    )]
    NotMigrated {
        path: PathBuf,
        found: i64,
        known: usize,
    },

    /// A schema migration failed; the transaction that ran it was rolled back.
    #[error("migration to schema version {version} failed: {}", sqlite(cause))]
    Migration {
        version: usize,
        cause: rusqlite::Error,
    },

    /// `BEGIN IMMEDIATE` did not get the write lock (another process held it past the busy
    /// timeout) or failed otherwise.
    #[error("cannot begin a write transaction: {}", sqlite(.0))]
    Begin(rusqlite::Error),

    /// `COMMIT` failed; nothing the transaction wrote is visible.
    #[error("cannot commit the write transaction: {}", sqlite(.0))]
    Commit(rusqlite::Error),

    /// Every reader connection stayed busy for the whole checkout timeout.
    #[error("no reader connection came free within {waited:?}")]
    ReaderTimeout { waited: Duration },

    /// A statement failed; `what` names the operation and the record it touched.
    #[error("{what}: {}", sqlite(cause))]
    Sql {
        what: Cow<'static, str>,
        cause: rusqlite::Error,
    },

    /// The record does not exist.
    #[error("{record} {id} does not exist")]
    NotFound { record: &'static str, id: i64 },

    /// The record exists but its state does not allow the change.
    #[error("{record} {id} is {state}, not {expected}")]
    WrongState {
        record: &'static str,
        id: i64,
        state: String,
        expected: &'static str,
    },

    /// A page size outside `1..=max`.
    #[error("limit {limit} is outside 1..={max}")]
    InvalidLimit { limit: u32, max: u32 },

    /// A value the store cannot hold (a malformed digest, a size past `i64::MAX`).
    #[error("invalid {field}: {reason}")]
    Invalid { field: &'static str, reason: String },

    /// A row holds something this build cannot read back (an unknown state, unparsable JSON).
    #[error("{record} {id} has an unreadable {field}: {reason}")]
    Decode {
        record: &'static str,
        id: i64,
        field: &'static str,
        reason: String,
    },

    /// The same content digest was recorded before with a different size.
    #[error("artifact {sha256} was recorded with size {recorded}, not {size}")]
    ArtifactMismatch {
        sha256: String,
        recorded: u64,
        size: u64,
    },

    /// Content recorded as stored was no longer on disk inside the recording transaction: the
    /// retention sweep deleted the file of the same digest between its storing and its record.
    /// Nothing was recorded; storing it again succeeds.
    #[error(
        "the content of artifact sha256:{sha256} was removed by the retention sweep while it was being stored; nothing was recorded, send it again"
    )]
    ContentMissing { sha256: String },

    /// The code run inside a store operation panicked: a bug in the host, not a fault of the
    /// caller's request or of the file. A write's transaction was rolled back. `what` names the
    /// operation (`write`, `read`), `reason` is the panic's message.
    #[error("the {what} panicked (a bug in the host): {reason}")]
    Panicked { what: &'static str, reason: String },
}

/// What a store error means to whoever asked for the operation: the one classification the
/// management API's statuses and the callbacks' wire codes are both derived from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The file system is full: nothing was written, and the same write succeeds once there is
    /// room again. Checked before every other class, whatever the variant.
    DiskFull,
    /// The caller's value: a page size out of range, a value the store cannot hold.
    Invalid,
    /// The record the caller named does not exist.
    NotFound,
    /// The store itself failed (SQL, I/O, a lock held too long, damage, an unreadable row, a
    /// record in another state): nothing the caller can correct by asking differently.
    Store,
    /// A bug in the host: the code run inside a store operation panicked.
    Host,
}

impl StoreError {
    /// What the error means to the caller. A full disk comes first, whichever operation hit
    /// it; a record in the wrong state is the store's fault, not the caller's, as it always was.
    pub fn fault(&self) -> Fault {
        if self.is_disk_full() {
            return Fault::DiskFull;
        }
        match self {
            StoreError::InvalidLimit { .. } | StoreError::Invalid { .. } => Fault::Invalid,
            StoreError::NotFound { .. } => Fault::NotFound,
            StoreError::Panicked { .. } => Fault::Host,
            StoreError::Open { .. }
            | StoreError::NotWal { .. }
            | StoreError::Corrupt { .. }
            | StoreError::TooNew { .. }
            | StoreError::NotMigrated { .. }
            | StoreError::Migration { .. }
            | StoreError::Begin(_)
            | StoreError::Commit(_)
            | StoreError::ReaderTimeout { .. }
            | StoreError::Sql { .. }
            | StoreError::WrongState { .. }
            | StoreError::Decode { .. }
            | StoreError::ArtifactMismatch { .. }
            | StoreError::ContentMissing { .. } => Fault::Store,
        }
    }

    /// A copy for another caller of the same failed operation (every caller of a group commit
    /// whose transaction failed is told why): the same variant, so the same fault and text.
    /// A SQLite error is copied by its codes and message; the rare one that has neither (a
    /// conversion error) becomes a generic SQLite error with its text.
    pub fn shared(&self) -> StoreError {
        let sql = copy_sqlite;
        match self {
            StoreError::Open { path, what, cause } => StoreError::Open {
                path: path.clone(),
                what,
                cause: sql(cause),
            },
            StoreError::NotWal { path, mode } => StoreError::NotWal {
                path: path.clone(),
                mode: mode.clone(),
            },
            StoreError::Corrupt { path, problems } => StoreError::Corrupt {
                path: path.clone(),
                problems: problems.clone(),
            },
            StoreError::TooNew { path, found, known } => StoreError::TooNew {
                path: path.clone(),
                found: *found,
                known: *known,
            },
            StoreError::NotMigrated { path, found, known } => StoreError::NotMigrated {
                path: path.clone(),
                found: *found,
                known: *known,
            },
            StoreError::Migration { version, cause } => StoreError::Migration {
                version: *version,
                cause: sql(cause),
            },
            StoreError::Begin(cause) => StoreError::Begin(sql(cause)),
            StoreError::Commit(cause) => StoreError::Commit(sql(cause)),
            StoreError::ReaderTimeout { waited } => StoreError::ReaderTimeout { waited: *waited },
            StoreError::Sql { what, cause } => StoreError::Sql {
                what: what.clone(),
                cause: sql(cause),
            },
            StoreError::NotFound { record, id } => StoreError::NotFound { record, id: *id },
            StoreError::WrongState {
                record,
                id,
                state,
                expected,
            } => StoreError::WrongState {
                record,
                id: *id,
                state: state.clone(),
                expected,
            },
            StoreError::InvalidLimit { limit, max } => StoreError::InvalidLimit {
                limit: *limit,
                max: *max,
            },
            StoreError::Invalid { field, reason } => StoreError::Invalid {
                field,
                reason: reason.clone(),
            },
            StoreError::Decode {
                record,
                id,
                field,
                reason,
            } => StoreError::Decode {
                record,
                id: *id,
                field,
                reason: reason.clone(),
            },
            StoreError::ArtifactMismatch {
                sha256,
                recorded,
                size,
            } => StoreError::ArtifactMismatch {
                sha256: sha256.clone(),
                recorded: *recorded,
                size: *size,
            },
            StoreError::ContentMissing { sha256 } => StoreError::ContentMissing {
                sha256: sha256.clone(),
            },
            StoreError::Panicked { what, reason } => StoreError::Panicked {
                what,
                reason: reason.clone(),
            },
        }
    }

    /// The SQLite error underneath, if there is one.
    pub fn sqlite_error(&self) -> Option<&rusqlite::Error> {
        match self {
            StoreError::Open { cause, .. }
            | StoreError::Migration { cause, .. }
            | StoreError::Begin(cause)
            | StoreError::Commit(cause)
            | StoreError::Sql { cause, .. } => Some(cause),
            _ => None,
        }
    }

    /// Whether the error is SQLite reporting the database busy or locked, which another
    /// process holding the file causes; the caller may retry later.
    pub fn is_busy(&self) -> bool {
        matches!(
            self.sqlite_error().and_then(|e| e.sqlite_error_code()),
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
        )
    }

    /// Whether the file system holding the store is full (`SQLITE_FULL`, which SQLite reports
    /// for `ENOSPC`, or growing the shared-memory index failed). Nothing was written; the same
    /// write succeeds once there is room again.
    pub fn is_disk_full(&self) -> bool {
        match self.sqlite_error() {
            Some(rusqlite::Error::SqliteFailure(f, _)) => {
                f.code == rusqlite::ErrorCode::DiskFull
                    || f.extended_code == rusqlite::ffi::SQLITE_IOERR_SHMSIZE
            }
            _ => false,
        }
    }

    /// Whether retrying cannot help until someone changes the file or the build: damage, a
    /// schema from a newer build, a file system without WAL, a migration that failed for a
    /// reason other than space, locks or I/O. Everything else (a full disk, I/O errors, a
    /// lock held too long) may pass.
    pub fn is_permanent(&self) -> bool {
        match self {
            StoreError::NotWal { .. } | StoreError::Corrupt { .. } | StoreError::TooNew { .. } => {
                true
            }
            // A file that is not a database (or is damaged past reading) stays so.
            StoreError::Open { cause, .. } => matches!(
                cause.sqlite_error_code(),
                Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt)
            ),
            StoreError::Migration { cause, .. } => {
                !self.is_disk_full()
                    && !self.is_busy()
                    && !matches!(
                        cause.sqlite_error_code(),
                        Some(rusqlite::ErrorCode::SystemIoFailure)
                    )
            }
            _ => false,
        }
    }
}

/// A copy of a SQLite error that keeps what `sqlite` prints and what the classification reads
/// (the codes).
fn copy_sqlite(e: &rusqlite::Error) -> rusqlite::Error {
    match e {
        rusqlite::Error::SqliteFailure(f, msg) => rusqlite::Error::SqliteFailure(*f, msg.clone()),
        other => rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
            Some(other.to_string()),
        ),
    }
}

/// A SQLite error in one line: its message and extended code, without the repetition its
/// `source()` chain would add.
pub(crate) fn sqlite(e: &rusqlite::Error) -> String {
    match e {
        rusqlite::Error::SqliteFailure(f, Some(msg)) => {
            format!("{msg} (SQLite error {})", f.extended_code)
        }
        rusqlite::Error::SqliteFailure(f, None) => f.to_string(),
        other => other.to_string(),
    }
}

/// Attaches the operation to a SQLite error; the closure runs only on the error path, so the
/// message may be formatted without costing the success path anything.
pub(crate) trait SqlContext<T> {
    fn context(self, what: &'static str) -> Result<T, StoreError>;
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T, StoreError>;
}

impl<T> SqlContext<T> for Result<T, rusqlite::Error> {
    fn context(self, what: &'static str) -> Result<T, StoreError> {
        self.map_err(|cause| StoreError::Sql {
            what: Cow::Borrowed(what),
            cause,
        })
    }

    fn with_context(self, what: impl FnOnce() -> String) -> Result<T, StoreError> {
        self.map_err(|cause| StoreError::Sql {
            what: Cow::Owned(what()),
            cause,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sqlite_failure(code: std::ffi::c_int) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None)
    }

    fn sql(code: std::ffi::c_int) -> StoreError {
        StoreError::Sql {
            what: Cow::Borrowed("insert"),
            cause: sqlite_failure(code),
        }
    }

    #[test]
    fn a_full_disk_is_classified_first_whichever_operation_hit_it() {
        for e in [
            sql(rusqlite::ffi::SQLITE_FULL),
            sql(rusqlite::ffi::SQLITE_IOERR_SHMSIZE),
            StoreError::Begin(sqlite_failure(rusqlite::ffi::SQLITE_FULL)),
            StoreError::Commit(sqlite_failure(rusqlite::ffi::SQLITE_FULL)),
            StoreError::Migration {
                version: 3,
                cause: sqlite_failure(rusqlite::ffi::SQLITE_FULL),
            },
        ] {
            assert!(e.is_disk_full(), "{e}");
            assert_eq!(e.fault(), Fault::DiskFull, "{e}");
        }
    }

    #[test]
    fn each_variant_has_its_fault() {
        let path = PathBuf::from("/s/conduit.db");
        let cases = [
            (
                StoreError::InvalidLimit { limit: 0, max: 200 },
                Fault::Invalid,
            ),
            (
                StoreError::Invalid {
                    field: "payload",
                    reason: "too deep".into(),
                },
                Fault::Invalid,
            ),
            (
                StoreError::NotFound {
                    record: "work",
                    id: 7,
                },
                Fault::NotFound,
            ),
            (
                StoreError::Panicked {
                    what: "write",
                    reason: "boom".into(),
                },
                Fault::Host,
            ),
            (sql(rusqlite::ffi::SQLITE_CONSTRAINT), Fault::Store),
            (sql(rusqlite::ffi::SQLITE_BUSY), Fault::Store),
            (
                StoreError::Begin(sqlite_failure(rusqlite::ffi::SQLITE_BUSY)),
                Fault::Store,
            ),
            (
                StoreError::Commit(sqlite_failure(rusqlite::ffi::SQLITE_IOERR)),
                Fault::Store,
            ),
            (
                StoreError::Open {
                    path: path.clone(),
                    what: "opening",
                    cause: sqlite_failure(rusqlite::ffi::SQLITE_NOTADB),
                },
                Fault::Store,
            ),
            (
                StoreError::NotWal {
                    path: path.clone(),
                    mode: "delete".into(),
                },
                Fault::Store,
            ),
            (
                StoreError::Corrupt {
                    path: path.clone(),
                    problems: "page 3".into(),
                },
                Fault::Store,
            ),
            (
                StoreError::TooNew {
                    path,
                    found: 9,
                    known: 8,
                },
                Fault::Store,
            ),
            (
                StoreError::Migration {
                    version: 2,
                    cause: sqlite_failure(rusqlite::ffi::SQLITE_ERROR),
                },
                Fault::Store,
            ),
            (
                StoreError::ReaderTimeout {
                    waited: Duration::from_secs(5),
                },
                Fault::Store,
            ),
            (
                StoreError::WrongState {
                    record: "work",
                    id: 1,
                    state: "done".into(),
                    expected: "open",
                },
                Fault::Store,
            ),
            (
                StoreError::Decode {
                    record: "event",
                    id: 1,
                    field: "payload",
                    reason: "not JSON".into(),
                },
                Fault::Store,
            ),
            (
                StoreError::ArtifactMismatch {
                    sha256: "ab".into(),
                    recorded: 1,
                    size: 2,
                },
                Fault::Store,
            ),
        ];
        for (e, fault) in cases {
            assert!(!e.is_disk_full(), "{e}");
            assert_eq!(e.fault(), fault, "{e}");
            // Every caller of a failed group commit gets the same answer.
            let copy = e.shared();
            assert_eq!((copy.fault(), copy.to_string()), (fault, e.to_string()));
        }
    }

    #[test]
    fn a_shared_copy_of_a_sqlite_error_keeps_its_codes_and_message() {
        let full = StoreError::Commit(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
            Some("database or disk is full".into()),
        ));
        let copy = full.shared();
        assert!(copy.is_disk_full());
        assert_eq!(copy.to_string(), full.to_string());
        // A SQLite error without codes keeps its text.
        let odd = StoreError::Sql {
            what: Cow::Borrowed("read a row"),
            cause: rusqlite::Error::InvalidColumnIndex(7),
        };
        assert!(
            odd.shared()
                .to_string()
                .contains(&rusqlite::Error::InvalidColumnIndex(7).to_string())
        );
        let panicked = StoreError::Panicked {
            what: "write",
            reason: "boom".into(),
        };
        assert_eq!(panicked.shared().fault(), Fault::Host);
    }

    #[test]
    fn a_panic_says_which_operation_and_that_it_is_a_bug() {
        let e = StoreError::Panicked {
            what: "write",
            reason: "index out of bounds".into(),
        };
        assert_eq!(
            e.to_string(),
            "the write panicked (a bug in the host): index out of bounds"
        );
        assert!(!e.is_permanent());
    }
}
