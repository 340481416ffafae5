//! The two kinds of transaction a caller is handed: [`ReadTx`] and [`WriteTx`].
//!
//! The record modules (`events`, `work`, `timers`, …) add their reads to `ReadTx` and their
//! writes to `WriteTx`; [`Store`](crate::store::Store) is the only place that creates either.
//!
//! Invariant: a `WriteTx` exists only inside [`Store::write`](crate::store::Store::write), so
//! every write runs in its `BEGIN IMMEDIATE` transaction.

use std::ops::Deref;

use rusqlite::Connection;

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
}
