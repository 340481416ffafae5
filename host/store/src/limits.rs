//! The store's limits and timeouts, as constants.
//!
//! Invariant: constants only; nothing here depends on another module of this crate.

use std::time::Duration;

/// The largest page any read returns, and the largest `limit` it accepts: the protocol's page
/// bound (`docs/protocol.md` §7.2), which the API and the callbacks check first.
pub const MAX_PAGE: u32 = conduit_protocol::rules::MAX_PAGE;

/// How long SQLite retries a lock held by another process before failing with `SQLITE_BUSY`.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How many read-only connections the store opens at most.
pub const MAX_READERS: usize = 4;

/// How long [`Store::read`](crate::store::Store::read) waits for a reader connection when all
/// are busy.
pub const READER_CHECKOUT_TIMEOUT: Duration = Duration::from_secs(5);

/// A test-only knob: when set to a number, the writer's `max_page_count` is set to it, so the
/// file cannot grow past that many pages (SQLite clamps it to the current size) and writes
/// that need room fail with `SQLITE_FULL`, exactly as on a full disk. Never set it in
/// production.
pub const TEST_MAX_PAGE_COUNT_ENV: &str = "CONDUIT_TEST_MAX_PAGE_COUNT";

/// The size (bytes) SQLite truncates the WAL file to when a checkpoint resets it
/// (`PRAGMA journal_size_limit`): 64 MiB, so a burst of large transactions leaves at most this
/// much WAL behind while the store is busy.
pub const JOURNAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;
