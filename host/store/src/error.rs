//! The store's one error type.
//!
//! Every variant says what failed: which file, which record and id, which limit, and the SQLite
//! error underneath when there is one. Callers match on the variant to decide what to tell a
//! peer; the `Display` text is for logs and operators.
//!
//! Invariant: no SQL error leaves the store without the operation it interrupted (`Sql::what`).

use std::borrow::Cow;
use std::path::PathBuf;
use std::time::Duration;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database file could not be opened or configured.
    #[error("cannot open the store at {}: {what}", path.display())]
    Open {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: rusqlite::Error,
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

    /// A schema migration failed; the transaction that ran it was rolled back.
    #[error("migration to schema version {version} failed")]
    Migration {
        version: usize,
        #[source]
        source: rusqlite::Error,
    },

    /// `BEGIN IMMEDIATE` did not get the write lock (another process held it past the busy
    /// timeout) or failed otherwise.
    #[error("cannot begin a write transaction")]
    Begin(#[source] rusqlite::Error),

    /// `COMMIT` failed; nothing the transaction wrote is visible.
    #[error("cannot commit the write transaction")]
    Commit(#[source] rusqlite::Error),

    /// Every reader connection stayed busy for the whole checkout timeout.
    #[error("no reader connection came free within {waited:?}")]
    ReaderTimeout { waited: Duration },

    /// A statement failed; `what` names the operation and the record it touched.
    #[error("{what}")]
    Sql {
        what: Cow<'static, str>,
        #[source]
        source: rusqlite::Error,
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
}

impl StoreError {
    /// Whether the error is SQLite reporting the database busy or locked, which another
    /// process holding the file causes; the caller may retry later.
    pub fn is_busy(&self) -> bool {
        let source = match self {
            StoreError::Open { source, .. }
            | StoreError::Migration { source, .. }
            | StoreError::Begin(source)
            | StoreError::Commit(source)
            | StoreError::Sql { source, .. } => source,
            _ => return false,
        };
        matches!(
            source.sqlite_error_code(),
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
        )
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
        self.map_err(|source| StoreError::Sql {
            what: Cow::Borrowed(what),
            source,
        })
    }

    fn with_context(self, what: impl FnOnce() -> String) -> Result<T, StoreError> {
        self.map_err(|source| StoreError::Sql {
            what: Cow::Owned(what()),
            source,
        })
    }
}
