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
//!   never wait for the writer. The one exception is asked for by name ([`Durability::Deferred`], the
//!   host loop's own steps, which are redone when undone): committed without an fsync of its
//!   own, made durable by the next synced commit or checkpoint.
//! - The live reads (`unrouted_events`, `open_work`, `due_timers`, `active_waits`,
//!   `planned_emissions`) go through partial indexes over the live set, so their cost follows
//!   what is live, not the history retained (see `schema.rs`).
//! - Every page is 1 to [`MAX_PAGE`] rows; anything else is [`StoreError::InvalidLimit`].
//! - Artifact content is removed only by the retention sweep (`retention.rs`), in
//!   transactions of at most [`SWEEP_BATCH`] rows that hold the writer about
//!   [`SWEEP_TX_BUDGET`]; coordination rows are never deleted.

mod artifacts;
mod conn;
mod counts;
mod emissions;
mod ended;
mod error;
mod events;
mod ingress;
mod inspect;
mod limits;
mod pending;
mod pool;
mod refs;
mod retention;
mod rows;
mod schema;
mod store;
mod timers;
mod tx;
mod views;
mod waits;
mod work;

pub use artifacts::Artifact;
pub use counts::Counts;
pub use emissions::{Emission, EmissionState, Planned};
pub use ended::Ended;
pub use error::{Fault, StoreError};
pub use events::{Accepted, EventRecord};
pub use inspect::{Inspection, QuickCheck, inspect, read_only};
pub use limits::{
    BUSY_TIMEOUT, JOURNAL_SIZE_LIMIT, MAX_PAGE, MAX_READERS, READER_CHECKOUT_TIMEOUT,
    TEST_MAX_PAGE_COUNT_ENV,
};
pub use pending::Owned;
pub use refs::{ArtifactRef, ArtifactTotals, References, Referrer};
pub use retention::{
    ArtifactPolicy, ArtifactSweep, Checkpoint, Removal, RemovalReason, SWEEP_BATCH,
    SWEEP_TX_BUDGET, TRUNCATE_WAIT, TxStats, Verdict, verdict,
};
pub use schema::MIGRATIONS;
pub use store::{Durability, Store, WriteTimes};
pub use timers::Timer;
pub use tx::{ReadTx, WriteTx};
pub use views::{ViewCounts, WorkCount, WorkFilter, WorkSummary};
pub use waits::{Wait, WaitState};
pub use work::{WorkRecord, WorkState};
