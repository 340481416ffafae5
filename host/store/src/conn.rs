//! How every connection is set up, the writer's and each reader's alike.
//!
//! Invariant: the writer and every reader get the same statement handling and the same WAL
//! persistence, from these functions, so no connection behaves differently from another.

use rusqlite::Connection;
use rusqlite::config::DbConfig;

/// Prepared statements kept per connection; more than the store has, so none is re-prepared.
const STATEMENT_CACHE: usize = 64;

/// Sets up a connection's statement handling: a statement cache larger than the store's set of
/// statements, and the query planner stability guarantee (QPSG).
///
/// QPSG is there for speed as much as for stability. The bundled SQLite is built with STAT4,
/// under which a statement whose plan could depend on a bound value (a `LIMIT ?`, a range on an
/// indexed column) is marked to be re-prepared when that binding changes, and the statement
/// cache clears every binding when a statement is returned to it. Without QPSG every cached
/// live read was re-prepared on every use, about 5 µs each; with it, a plan is fixed when the
/// statement is prepared, which is also what the query-plan tests assume.
pub(crate) fn configure_statements(conn: &Connection) -> rusqlite::Result<()> {
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
pub(crate) fn persist_wal(conn: &Connection) -> rusqlite::Result<()> {
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
