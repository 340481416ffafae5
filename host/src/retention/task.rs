//! The daemon's side of retention: the [`Sweeper`] that sweeps every `retention.interval` (read
//! again before each sweep, so `conduit config set` needs no restart) and on demand
//! (`POST /v1/gc`), one sweep at a time, and the counters the metrics read ([`SweepStats`]).
//!
//! Invariants: one sweep runs at a time (the periodic one and `gc` queue on one lock); the
//! periodic task is owned by the daemon and ends with it, and a sweep in progress stops
//! between two transactions once the daemon stops; a settings file that cannot be read is
//! logged (once per change of the error) and the last settings that could be read stay in
//! force.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use conduit_store::{Store, StoreError};
use conduit_supervisor::now_ms;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::settings::Retention;
use super::sweep::{Orphans, SweepReport, sweep};
use crate::packages::settings::{self, SettingsError};
use crate::state_dir::StateDir;

/// The first periodic sweep comes this long after the daemon starts (or sooner, with a
/// shorter interval), so it does not compete with the extensions' start.
pub const FIRST_SWEEP_DELAY: Duration = Duration::from_secs(60);

/// A test knob: the first periodic sweep's delay in milliseconds instead of
/// [`FIRST_SWEEP_DELAY`], so a test can keep the periodic sweep out of what it checks. Never
/// set it in production.
pub const TEST_FIRST_SWEEP_ENV: &str = "CONDUIT_TEST_FIRST_SWEEP_DELAY_MS";

/// Every this many periodic sweeps (the first included), the sweep also looks for content
/// files no row records (under three hours apart at the default interval): such files come only
/// from a crash or a failed record, and listing the folder at every sweep would cost what the
/// folder ever held.
const ORPHAN_SCAN_EVERY: u64 = 16;

/// What the metrics read of the sweeps since the daemon started.
#[derive(Debug, Default)]
pub struct SweepStats {
    pub sweeps: AtomicU64,
    pub failures: AtomicU64,
    pub last_at_ms: AtomicI64,
    pub last_us: AtomicU64,
    pub total_us: AtomicU64,
    /// The longest transaction of the last sweep.
    pub last_longest_tx_us: AtomicU64,
    pub artifacts_removed: AtomicU64,
    pub artifacts_removed_bytes: AtomicU64,
    pub logs_removed: AtomicU64,
    pub logs_removed_bytes: AtomicU64,
    /// What `logs/` held after the last sweep that looked at it.
    pub logs_retained: AtomicU64,
    pub logs_retained_bytes: AtomicU64,
    pub logs_known: AtomicBool,
}

impl SweepStats {
    fn record(&self, r: &SweepReport) {
        let add = |a: &AtomicU64, n: u64| a.fetch_add(n, Ordering::Relaxed);
        add(&self.sweeps, 1);
        self.last_at_ms.store(r.at_ms, Ordering::Relaxed);
        self.last_us.store(r.took_us, Ordering::Relaxed);
        add(&self.total_us, r.took_us);
        self.last_longest_tx_us
            .store(r.longest_transaction_us, Ordering::Relaxed);
        let a = &r.artifacts;
        add(
            &self.artifacts_removed,
            a.removed_count + a.unrecorded_count,
        );
        add(
            &self.artifacts_removed_bytes,
            a.removed_bytes + a.unrecorded_bytes,
        );
        add(&self.logs_removed, r.logs.removed_count);
        add(&self.logs_removed_bytes, r.logs.removed_bytes);
        if r.logs.swept {
            self.logs_retained.store(r.logs.retained, Ordering::Relaxed);
            self.logs_retained_bytes
                .store(r.logs.retained_bytes, Ordering::Relaxed);
            self.logs_known.store(true, Ordering::Relaxed);
        }
    }
}

/// Why a sweep could not run.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// The settings file cannot be read, or holds a value that is refused.
    #[error("{0}")]
    Settings(#[from] SettingsError),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("the retention sweep panicked (a bug in the host): {0}")]
    Panicked(String),
}

/// The daemon's sweeper.
#[derive(Debug)]
pub struct Sweeper {
    state: StateDir,
    store: Arc<Store>,
    pub stats: SweepStats,
    /// One sweep at a time.
    running: tokio::sync::Mutex<()>,
    /// The settings may have changed: read them again and plan the next sweep anew.
    wake: Notify,
    /// The daemon is stopping: a sweep in progress ends after its current transaction.
    stopping: Arc<AtomicBool>,
}

impl Sweeper {
    pub fn new(state: StateDir, store: Arc<Store>) -> Sweeper {
        Sweeper {
            state,
            store,
            stats: SweepStats::default(),
            running: tokio::sync::Mutex::new(()),
            wake: Notify::new(),
            stopping: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The settings in force now, read from `settings.toml`.
    pub fn settings(&self) -> Result<Retention, SettingsError> {
        Ok(settings::retention(&self.state)?.resolved())
    }

    /// The settings may have changed (a reload): the periodic task reads them again at once.
    pub fn settings_changed(&self) {
        self.wake.notify_one();
    }

    /// Sweep now with the settings in the file (`conduit gc`): every content file is looked
    /// at. Waits for a sweep in progress to finish first.
    pub async fn sweep_now(self: &Arc<Self>, dry_run: bool) -> Result<SweepReport, SweepError> {
        let retention = self.settings()?;
        self.run(retention, dry_run, Orphans::All).await
    }

    async fn run(
        self: &Arc<Self>,
        retention: Retention,
        dry_run: bool,
        orphans: Orphans,
    ) -> Result<SweepReport, SweepError> {
        let _one = self.running.lock().await;
        let me = self.clone();
        let report = tokio::task::spawn_blocking(move || {
            let stopping = me.stopping.clone();
            sweep(
                &me.state,
                &me.store,
                &retention,
                now_ms(),
                dry_run,
                orphans,
                &move || stopping.load(Ordering::Relaxed),
            )
        })
        .await
        .map_err(|e| SweepError::Panicked(e.to_string()))?;
        match report {
            Ok(r) => {
                if !dry_run {
                    self.stats.record(&r);
                }
                Ok(r)
            }
            Err(e) => {
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                Err(e.into())
            }
        }
    }

    /// The periodic sweeps until `shutdown`; the returned task is the daemon's to await.
    pub fn spawn(self: Arc<Self>, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let first_delay = std::env::var(TEST_FIRST_SWEEP_ENV)
                .ok()
                .and_then(|v| v.parse().ok())
                .map_or(FIRST_SWEEP_DELAY, Duration::from_millis);
            let mut last: Option<tokio::time::Instant> = None;
            let mut retention = Retention::default();
            let mut complaint: Option<String> = None;
            let mut periodic: u64 = 0;
            loop {
                match self.settings() {
                    Ok(r) => {
                        if complaint.take().is_some() {
                            tracing::info!("the retention settings can be read again");
                        }
                        retention = r;
                    }
                    Err(e) => {
                        let text = e.to_string();
                        if complaint.as_deref() != Some(text.as_str()) {
                            tracing::error!(error = %text, "cannot read the retention settings; the last ones read stay in force");
                            complaint = Some(text);
                        }
                    }
                }
                let due = match last {
                    None => started + first_delay.min(retention.interval),
                    Some(t) => t + retention.interval,
                };
                tokio::select! {
                    () = tokio::time::sleep_until(due) => {}
                    () = self.wake.notified() => continue,
                    () = shutdown.cancelled() => break,
                }
                let orphans = if periodic.is_multiple_of(ORPHAN_SCAN_EVERY) {
                    Orphans::All
                } else {
                    Orphans::Skip
                };
                periodic += 1;
                match self.run(retention, false, orphans).await {
                    Ok(r) => log_sweep(&r),
                    Err(e) => {
                        tracing::error!(error = %e, "the retention sweep failed; the next one tries again")
                    }
                }
                last = Some(tokio::time::Instant::now());
            }
        })
    }

    /// The daemon is stopping: a sweep in progress ends after its current transaction.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }
}

fn log_sweep(r: &SweepReport) {
    let a = &r.artifacts;
    let removed = a.removed_count + a.unrecorded_count + r.logs.removed_count;
    if removed > 0 || !r.errors.is_empty() {
        tracing::info!(
            artifacts = a.removed_count,
            artifact_bytes = a.removed_bytes,
            unrecorded = a.unrecorded_count,
            logs = r.logs.removed_count,
            log_bytes = r.logs.removed_bytes,
            wal_truncated = r.wal.truncated,
            took_ms = r.took_us / 1000,
            longest_transaction_us = r.longest_transaction_us,
            "retention sweep removed content"
        );
    } else {
        tracing::debug!(
            wal_truncated = r.wal.truncated,
            took_ms = r.took_us / 1000,
            "retention sweep: nothing to remove"
        );
    }
    for e in &r.errors {
        tracing::warn!(error = %e, "retention sweep");
    }
}
