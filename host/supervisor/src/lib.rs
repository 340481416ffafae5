//! The supervisor: runs each enabled extension as a child process and keeps it running.
//!
//! One actor task per extension owns its child, its session and its stderr capture, and walks
//! a small state machine:
//!
//! ```text
//!            preflight fails                     handshake refused (version)
//!   ┌──────── refused          starting ───────────────────────► incompatible
//!   │                         │   ▲  │ ready within the start timeout
//!   │                         │   │  ▼
//!   │           spawn/handshake fails  ready ── exit, EOF ──► backing-off / crash-looping
//!   │                         └──────────────────────────────────────┘ (after the delay)
//!   └─ restart ─► starting     stop, shutdown ─► stopping ─► stopped
//!
//!   on demand:   idle ── a need (Extension::demand) ──► starting ─► ready
//!                  ▲                                                 │
//!                  └──── stopping ◄── idle_stop_after without calls ─┘
//! ```
//!
//! Everything an operator sees ([`Status`]) is kept in one place and copied out on request;
//! no lock is held across an await. Calls to an extension go through [`Extension::call_raw`],
//! which fails at once when the extension is not ready and records per-method latency.
//!
//! Where things are: `supervisor.rs` holds the registry ([`Supervisor`]), `extension.rs` the
//! handle on one extension and its calls ([`Extension`]), `status.rs` what an operator sees
//! ([`Status`], [`ExitRecord`]), `actor.rs` the run loop (`held.rs` a run held until an operator acts), `run.rs` how one run ends,
//! `lifecycle.rs` when an extension runs (on demand, idle stop) and the idle decision, `rest.rs`
//! the one task that watches every resting (idle) extension by its CPU clock, `journal.rs` the
//! last calls of a development install (method, latency, outcome), and `spec.rs`
//! what the daemon hands in ([`ExtensionSpec`], [`CallbackHandlers`]). This file only declares
//! and re-exports, so no module imports it.
//!
//! Not here: where packages live on disk, HTTP, the database. The daemon gives the supervisor
//! an [`ExtensionSpec`] per package and a [`CallbackHandlers`] factory for the callbacks.

mod actor;
pub mod backoff;
mod call;
pub mod cgroup;
pub mod child;
mod enforce;
mod extension;
mod forker;
mod held;
pub mod journal;
mod life;
pub mod lifecycle;
pub mod limits;
pub mod log;
pub mod process;
pub mod rest;
mod run;
pub mod sandbox;
#[cfg(target_os = "linux")]
pub mod spawner;
mod spec;
pub mod start;
mod stats;
mod status;
mod supervisor;
pub mod tree;
pub mod usage;

pub use crate::call::ExtCallError;
pub use crate::extension::{Awake, Extension};
pub use crate::lifecycle::{Lifecycle, StartMode};
pub use crate::spec::{
    BulkSink, CallbackHandlers, DEFAULT_START_TIMEOUT, ExtensionSpec, ReadyHook, no_callbacks,
};
pub use crate::stats::{
    CallSummary, Latency, LatencyHistogram, MethodStats, RATE_BUCKET, RATE_BUCKETS, Traffic,
};
pub use crate::status::{
    ExitCause, ExitGlance, ExitRecord, Glance, InFlightCall, RECENT_EXITS, Requester, Resources,
    RunBrief, State, Status, StopRequest, now_ms,
};
pub use crate::supervisor::{Overlap, Supervisor};
