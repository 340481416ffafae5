//! The coordination core: the store, the host loop that makes the four in-transaction calls,
//! the callbacks extensions make into the host, and the domain operations (`ops.rs`) the
//! management API and the callbacks share, so that both are thin adapters over one rule each.
//!
//! ```text
//!   ingress (API, ingress.push) ──► events ──► route ──► work_kind.trigger ──► Work
//!   timers (due) ──► recurrence.next ──► next firing
//!   waits (active) × new events ──► dependency.filter ──► satisfied
//!   emissions (planned by operation.emit) ──► emit.commit ──► records
//! ```
//!
//! Invariants:
//! - Every write goes through the store's one writer. Each in-transaction call is made inside
//!   a write transaction with a 250 ms deadline; past it the call is cancelled, its documented
//!   fallback applied and the transaction committed, so a hung extension holds the writer for
//!   at most 250 ms per call.
//! - While an in-transaction call to an extension is pending, that extension's write
//!   callbacks are refused at once with `reentrant_write` (waiting for the writer would
//!   deadlock); its reads are served from reader connections.
//! - Nothing here blocks a runtime worker on SQLite: async code goes through `spawn_blocking`,
//!   the host loop runs on its own thread.
//!
//! Layout: this file only declares the modules and re-exports. [`Core`] is in `shared.rs`;
//! what it holds is in leaves it imports (`artifacts.rs`, `health.rs`, `stats.rs` for
//! [`LoopStats`], `fault.rs` for the store-fault mapping and [`DiskFullLog`],
//! `host_loop/poll.rs` for the ingress poll bookkeeping), and the modules that work on a `Core`
//! (`ops.rs`, `callbacks.rs`, `manual.rs` — what an operator ends by hand —, `host_loop/`)
//! import it from `shared.rs`, never from here. `dispatch.rs` is the one callback dispatcher and
//! the trait a host implements behind it (the daemon in `callbacks.rs`, the checker in
//! `check/callbacks.rs`); it knows no `Core`.

pub mod artifacts;
pub mod callbacks;
pub mod dispatch;
mod fault;
pub mod health;
pub mod host_loop;
mod manual;
pub mod ops;
mod shared;
mod stats;

pub use fault::{DiskFullLog, disk_full_message};
pub use host_loop::HostLoop;
pub use shared::Core;
pub use stats::LoopStats;

/// The current time in Unix milliseconds (the store never reads the clock itself).
pub use conduit_supervisor::now_ms;

#[cfg(test)]
mod tests;
