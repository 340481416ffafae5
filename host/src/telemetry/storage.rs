//! The storage families of the metrics: the retention sweeps (how many, how long, the longest
//! transaction of the last one), what they removed and what is kept, by kind (`artifacts`,
//! `logs`), and the sizes of the database, its WAL, `artifacts/` and `logs/`.
//!
//! Cheap to gather at every scrape: the database and WAL sizes are two `stat`s; the kept
//! artifact content is the store's totals row (kept by triggers) on a reader; `logs/` is what
//! the last sweep counted (the folder is not walked per scrape), so its families appear once a
//! sweep has looked at it.

use std::sync::atomic::Ordering;

use super::snapshot::{Kind, Snapshot};
use crate::daemon::handle::Daemon;

/// Appends the storage families to `s`.
pub(super) fn families(s: &mut Snapshot, d: &Daemon) {
    let st = &d.sweeper().stats;
    let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed) as f64;
    s.family(
        "conduit_retention_sweeps_total",
        Kind::Counter,
        "Retention sweeps finished (periodic and `conduit gc`), dry runs not counted.",
    )
    .num(&[], l(&st.sweeps));
    s.family(
        "conduit_retention_sweep_failures_total",
        Kind::Counter,
        "Retention sweeps that failed (the log says why); the next one tries again.",
    )
    .num(&[], l(&st.failures));
    s.family(
        "conduit_retention_sweep_seconds_total",
        Kind::Counter,
        "Time spent in retention sweeps.",
    )
    .num(&[], l(&st.total_us) / 1e6);
    s.family(
        "conduit_retention_last_sweep_seconds",
        Kind::Gauge,
        "Duration of the last retention sweep.",
    )
    .num(&[], l(&st.last_us) / 1e6);
    s.family(
        "conduit_retention_last_sweep_timestamp_seconds",
        Kind::Gauge,
        "When the last retention sweep ran (Unix seconds; 0 before the first).",
    )
    .num(&[], st.last_at_ms.load(Ordering::Relaxed) as f64 / 1e3);
    s.family(
        "conduit_retention_longest_transaction_seconds",
        Kind::Gauge,
        "The longest store transaction of the last retention sweep (how long it held the writer, commit included).",
    )
    .num(&[], l(&st.last_longest_tx_us) / 1e6);
    s.family(
        "conduit_retention_removed_total",
        Kind::Counter,
        "Files retention removed since the daemon started: artifact contents, logs of earlier runs.",
    )
    .num(&[("kind", "artifacts")], l(&st.artifacts_removed))
    .num(&[("kind", "logs")], l(&st.logs_removed));
    s.family(
        "conduit_retention_removed_bytes_total",
        Kind::Counter,
        "Bytes retention removed since the daemon started, by kind.",
    )
    .num(&[("kind", "artifacts")], l(&st.artifacts_removed_bytes))
    .num(&[("kind", "logs")], l(&st.logs_removed_bytes));

    let totals = match d.core().store.read(|r| r.artifact_totals()) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(error = %e, "metrics: cannot read the artifact totals");
            None
        }
    };
    let logs_known = st.logs_known.load(Ordering::Relaxed);
    let f = s.family(
        "conduit_retention_retained",
        Kind::Gauge,
        "Files kept: artifact contents (from the store), files in logs/ (as the last sweep counted them).",
    );
    if let Some(t) = &totals {
        f.num(&[("kind", "artifacts")], t.retained as f64);
    }
    if logs_known {
        f.num(&[("kind", "logs")], l(&st.logs_retained));
    }
    let f = s.family(
        "conduit_retention_retained_bytes",
        Kind::Gauge,
        "Bytes kept, by kind (artifacts from the store, logs as the last sweep counted them).",
    );
    if let Some(t) = &totals {
        f.num(&[("kind", "artifacts")], t.retained_bytes as f64);
    }
    if logs_known {
        f.num(&[("kind", "logs")], l(&st.logs_retained_bytes));
    }
    let (db, wal) = crate::retention::sweep::db_sizes(d.state_dir());
    let f = s.family(
        "conduit_storage_bytes",
        Kind::Gauge,
        "Bytes on disk: the database file, its WAL, artifacts/ (content kept or still to delete) and logs/ (at the last sweep).",
    );
    f.num(&[("part", "database")], db as f64)
        .num(&[("part", "wal")], wal as f64);
    if let Some(t) = &totals {
        f.num(
            &[("part", "artifacts")],
            (t.retained_bytes + t.removing_bytes) as f64,
        );
    }
    if logs_known {
        f.num(&[("part", "logs")], l(&st.logs_retained_bytes));
    }
}
