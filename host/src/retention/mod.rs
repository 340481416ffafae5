//! Retention: what conduit removes so that an unattended daemon does not fill its disk, and
//! what it keeps.
//!
//! ```text
//!   settings.rs  the [retention] table: keys, defaults, bounds, the one parser of values
//!   logs.rs      which files of logs/ are earlier runs, and which go (a pure plan)
//!   sweep.rs     one sweep: artifact content (the store decides), unrecorded files, logs, WAL
//!   task.rs      the daemon's Sweeper: every `interval`, and on demand (POST /v1/gc)
//!   view.rs      an artifact as the API and the CLI show it (size, creator, references)
//! ```
//!
//! Coordination rows (Events, Work, timers, Waits, Emissions and their records) are never
//! removed: they are the history extensions read (`state.events` pages through every Event)
//! and the audit trail of what was decided. Artifact content and the logs of earlier runs are
//! what grows without a bound the operator chose; docs/operations.md ("Retention") says what
//! is kept, what goes, and how to size it.
//!
//! Layout: this file only declares the modules and re-exports; `task.rs` builds on `sweep.rs`,
//! which builds on `logs.rs` and `settings.rs`; `view.rs` stands alone.

pub mod logs;
pub mod settings;
pub mod sweep;
pub mod task;
pub mod view;

pub use settings::{Retention, RetentionSettings};
pub use sweep::{SweepReport, sweep};
pub use task::{SweepError, SweepStats, Sweeper};
