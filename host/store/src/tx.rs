//! The two kinds of transaction a caller is handed: [`ReadTx`] and [`WriteTx`].
//!
//! The record modules (`events`, `work`, `timers`, …) add their reads to `ReadTx` and their
//! writes to `WriteTx`; [`Store`](crate::store::Store) is the only place that creates either.
//!
//! Invariant: a `WriteTx` exists only inside [`Store::write`](crate::store::Store::write), so
//! every write runs in its `BEGIN IMMEDIATE` transaction. [`WriteTx::isolated`] nests a savepoint
//! in it, so that one part of a transaction can fail alone (one caller's share of a group
//! commit) while the rest commits.

use std::ops::Deref;

use rusqlite::Connection;

use crate::error::{SqlContext, StoreError};

/// A read inside a transaction: a committed snapshot on a reader, or the writer's own view
/// (including its uncommitted writes) when reached through [`WriteTx`].
#[derive(Debug)]
pub struct ReadTx<'c> {
    pub(crate) conn: &'c Connection,
}

/// A write transaction on the writer connection. Every read of [`ReadTx`] is available on it
/// through `Deref` and sees the transaction's own writes.
#[derive(Debug)]
pub struct WriteTx<'c> {
    pub(crate) read: ReadTx<'c>,
}

impl<'c> Deref for WriteTx<'c> {
    type Target = ReadTx<'c>;

    fn deref(&self) -> &ReadTx<'c> {
        &self.read
    }
}

impl<'c> WriteTx<'c> {
    pub(crate) fn conn(&self) -> &'c Connection {
        self.read.conn
    }

    /// Runs `f` inside a savepoint of this transaction: on `Ok` what it wrote stays (and
    /// commits with the transaction), on `Err` exactly what it wrote is undone and the
    /// transaction goes on without it.
    ///
    /// The outer `Err` is the transaction itself lost: SQLite may roll a whole transaction back
    /// on some errors (a full disk, an I/O error), and then nothing written before `f` remains
    /// either; the caller must give up the whole transaction (return that error from
    /// [`Store::write`](crate::store::Store::write)). The inner `Err` is `f`'s own failure.
    pub fn isolated<T>(
        &mut self,
        f: impl FnOnce(&mut WriteTx<'c>) -> Result<T, StoreError>,
    ) -> Result<Result<T, StoreError>, StoreError> {
        let conn = self.conn();
        conn.prepare_cached("SAVEPOINT isolated")
            .and_then(|mut stmt| stmt.execute([]))
            .context("open a savepoint")?;
        match f(self) {
            Ok(out) => {
                conn.prepare_cached("RELEASE isolated")
                    .and_then(|mut stmt| stmt.execute([]))
                    .context("release a savepoint")?;
                Ok(Ok(out))
            }
            Err(err) => {
                if conn.is_autocommit() {
                    // SQLite rolled the whole transaction back: the savepoint is gone too.
                    return Err(err);
                }
                conn.prepare_cached("ROLLBACK TO isolated")
                    .and_then(|mut stmt| stmt.execute([]))
                    .and_then(|_| conn.prepare_cached("RELEASE isolated"))
                    .and_then(|mut stmt| stmt.execute([]))
                    .context("roll back to a savepoint")?;
                Ok(Err(err))
            }
        }
    }
}
