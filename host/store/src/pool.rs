//! A small pool of read-only connections with a blocking, bounded checkout.
//!
//! Connections are opened lazily, up to `max`, and kept for reuse. Each is `query_only`, so a
//! read can never take the write lock; in WAL mode it reads the last committed snapshot while
//! the writer connection holds a transaction.
//!
//! Invariant: the pool's mutex is held only to take or return a connection, never while a
//! connection is opened or used, so a slow read or open never blocks a returning reader; and no
//! checkout waits longer than its timeout.

use std::ops::{Deref, DerefMut};
use std::path::PathBuf;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};

use crate::conn::{configure_statements, persist_wal};
use crate::error::StoreError;
use crate::limits::BUSY_TIMEOUT;

#[derive(Debug)]
pub(crate) struct Readers {
    path: PathBuf,
    max: usize,
    state: Mutex<Slots>,
    freed: Condvar,
}

#[derive(Debug)]
struct Slots {
    idle: Vec<Connection>,
    /// Connections that exist, idle or checked out, or being opened.
    opened: usize,
}

/// A checked-out reader; it goes back to the pool when dropped.
#[derive(Debug)]
pub(crate) struct Lease<'p> {
    pool: &'p Readers,
    conn: Option<Connection>,
}

impl Readers {
    pub(crate) fn new(path: PathBuf, max: usize) -> Readers {
        Readers {
            path,
            max,
            state: Mutex::new(Slots {
                idle: Vec::with_capacity(max),
                opened: 0,
            }),
            freed: Condvar::new(),
        }
    }

    /// Takes an idle reader, opens a new one while fewer than `max` exist, or waits up to
    /// `timeout` for one to be returned.
    pub(crate) fn checkout(&self, timeout: Duration) -> Result<Lease<'_>, StoreError> {
        let deadline = Instant::now() + timeout;
        // The pool's own state stays consistent across a panic elsewhere (it is only a Vec
        // and a count), so a poisoned lock is taken as is.
        let mut slots = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(conn) = slots.idle.pop() {
                return Ok(self.lease(conn));
            }
            if slots.opened < self.max {
                slots.opened += 1;
                drop(slots);
                return match self.open() {
                    Ok(conn) => Ok(self.lease(conn)),
                    Err(err) => {
                        let mut slots = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                        slots.opened -= 1;
                        self.freed.notify_one();
                        Err(err)
                    }
                };
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::ReaderTimeout { waited: timeout });
            }
            slots = self
                .freed
                .wait_timeout(slots, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn lease(&self, conn: Connection) -> Lease<'_> {
        Lease {
            pool: self,
            conn: Some(conn),
        }
    }

    fn open(&self) -> Result<Connection, StoreError> {
        let open_err = |what| {
            let path = self.path.clone();
            move |cause| StoreError::Open { path, what, cause }
        };
        // Read-write flags with `query_only` rather than a read-only open: a read-only
        // connection cannot create the WAL index if it is missing, and `query_only` still
        // refuses every write.
        let conn = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_URI,
        )
        .map_err(open_err("opening a reader"))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(open_err("setting a reader's busy timeout"))?;
        conn.pragma_update(None, "query_only", true)
            .map_err(open_err("making a reader query_only"))?;
        configure_statements(&conn).map_err(open_err(
            "enabling a reader's query planner stability guarantee",
        ))?;
        persist_wal(&conn).map_err(open_err("keeping the WAL files across restarts"))?;
        Ok(conn)
    }
}

impl Deref for Lease<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn
            .as_ref()
            .expect("a lease holds its connection until dropped")
    }
}

impl DerefMut for Lease<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        self.conn
            .as_mut()
            .expect("a lease holds its connection until dropped")
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            let mut slots = self
                .pool
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            slots.idle.push(conn);
            drop(slots);
            self.pool.freed.notify_one();
        }
    }
}
