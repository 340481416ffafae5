//! [`Core`], what the management API, the callbacks and the host loop share: the store, the
//! supervisor, the artifacts, the in-transaction marks, the host loop's nudge, its counters and
//! each extension's health.
//!
//! What `Core` holds is defined in leaves it imports (`artifacts.rs`, `health.rs`, `stats.rs`,
//! `fault.rs`, `host_loop/poll.rs`, `group_commit.rs`, `timings.rs`); the operations on it live
//! in `ops.rs` and `callbacks.rs`, which import `Core` from here.
//!
//! Invariant: no lock here is held across an await; store work runs off the async runtime, on
//! at most as many blocking threads at once as the store has connections to give them (one
//! writer, `MAX_READERS` readers): the others wait here, on the async side.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use conduit_protocol::Capabilities;
use conduit_store::{Store, StoreError};
use conduit_supervisor::{Extension, Supervisor};
use tokio::sync::{Notify, Semaphore};

use super::fault::{DiskFullLog, panic_text};
use super::group_commit::GroupCommit;
use super::host_loop::poll::PollState;
use super::stats::LoopStats;
use super::timings::Timings;
use super::{artifacts, health};

/// Installed extensions that are not supervised (disabled), with what they declare: the host
/// loop holds their work instead of routing it to no Work.
pub type Dormant = std::collections::BTreeMap<String, Arc<Capabilities>>;

/// What the API, the callbacks and the host loop share.
pub struct Core {
    pub store: Arc<Store>,
    pub supervisor: Arc<Supervisor>,
    pub artifacts: Arc<artifacts::Artifacts>,
    /// Extensions with an in-transaction call pending.
    in_transaction: Mutex<HashSet<String>>,
    nudge: Notify,
    pub stats: LoopStats,
    /// Ingress polls by (extension, source): whether one is outstanding, when the last began.
    pub(crate) polls: Mutex<HashMap<(String, String), PollState>>,
    /// Tasks the core starts (ingress polls, probes); closed and awaited when the daemon stops.
    pub tasks: tokio_util::task::TaskTracker,
    /// Says in the log when writes start and stop failing for want of space.
    pub disk_full: DiskFullLog,
    /// Whether the in-transaction calls of each extension are made (`health.rs`).
    pub(crate) health: Mutex<HashMap<String, health::Health>>,
    /// Consecutive failures that make an extension unresponsive.
    unresponsive_after: AtomicU32,
    /// Set once the package registry has been applied at start: until then the owner of no
    /// kind is known, so the host loop routes nothing.
    registry_applied: AtomicBool,
    /// Store operations whose code panicked (`Core::write`, `Core::read`).
    store_panics: AtomicU64,
    /// See [`Dormant`]; replaced whole by each reload.
    dormant: Mutex<Arc<Dormant>>,
    /// Pending work dropped by an operator (`ext disable --drop-pending`), by record.
    pub dropped: super::pending::DroppedCounts,
    /// Accepted events waiting for their group commit (`ops.rs` runs the committer).
    pub(crate) group: GroupCommit,
    /// The writer's wait and hold, acknowledgement-to-routing, the group commit's counters.
    pub timings: Arc<Timings>,
    /// Permits for store work on a blocking thread (`store_slots`).
    write_slots: Arc<Semaphore>,
    read_slots: Arc<Semaphore>,
}

/// How many store operations of a kind may hold a blocking thread at once: as many as there are
/// connections for them. Past that a thread would only park on the store's own lock or pool,
/// and the runtime keeps every thread a burst made for as long as work keeps coming (its idle
/// threads are woken in turn, so none stays idle long enough to end): a burst of 64 pushes
/// left 64 threads for good.
fn store_slots(connections: usize) -> Arc<Semaphore> {
    Arc::new(Semaphore::new(connections))
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("store", &self.store.path())
            .finish_non_exhaustive()
    }
}

impl Core {
    pub fn new(
        store: Arc<Store>,
        supervisor: Arc<Supervisor>,
        artifacts_dir: PathBuf,
        tmp_dir: PathBuf,
    ) -> Self {
        let timings = Arc::new(Timings::default());
        let observer = timings.clone();
        // Every write transaction is timed, whoever makes it (the daemon makes one store and one
        // core; a second core over the same store keeps the first one's observer).
        store.observe_writes(move |t| observer.write(t));
        Core {
            store,
            supervisor,
            artifacts: Arc::new(artifacts::Artifacts::new(artifacts_dir, tmp_dir)),
            in_transaction: Mutex::new(HashSet::new()),
            nudge: Notify::new(),
            stats: LoopStats::default(),
            polls: Mutex::new(HashMap::new()),
            tasks: tokio_util::task::TaskTracker::new(),
            disk_full: DiskFullLog::default(),
            health: Mutex::new(HashMap::new()),
            unresponsive_after: AtomicU32::new(health::DEFAULT_UNRESPONSIVE_AFTER),
            registry_applied: AtomicBool::new(false),
            store_panics: AtomicU64::new(0),
            dormant: Mutex::new(Arc::default()),
            dropped: super::pending::DroppedCounts::default(),
            group: GroupCommit::default(),
            timings,
            write_slots: store_slots(1),
            read_slots: store_slots(conduit_store::MAX_READERS),
        }
    }

    /// Submissions waiting for a group commit now (the metrics).
    pub fn group_queued(&self) -> usize {
        self.group.queued()
    }

    /// Consecutive failures that make an extension unresponsive.
    pub fn unresponsive_after(&self) -> u32 {
        self.unresponsive_after.load(Ordering::Relaxed)
    }

    pub fn set_unresponsive_after(&self, n: u32) {
        self.unresponsive_after.store(n, Ordering::Relaxed);
    }

    /// The package registry has been applied (every enabled package is supervised, at least as
    /// `starting`): the host loop may route from now on.
    pub fn mark_registry_applied(&self) {
        if !self.registry_applied.swap(true, Ordering::SeqCst) {
            self.nudge();
        }
    }

    pub fn registry_applied(&self) -> bool {
        self.registry_applied.load(Ordering::SeqCst)
    }

    /// Hold the work of these installed but unsupervised extensions from now on (each reload
    /// says which they are).
    pub fn set_dormant(&self, dormant: Dormant) {
        *self.dormant.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(dormant);
    }

    /// The installed extensions that are not supervised, with what they declare.
    pub fn dormant(&self) -> Arc<Dormant> {
        self.dormant
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn lock_health(&self) -> std::sync::MutexGuard<'_, HashMap<String, health::Health>> {
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How an extension's in-transaction calls stand, for `ext status`.
    pub fn health_view(&self, ext: &str) -> health::HealthView {
        let threshold = self.unresponsive_after();
        self.lock_health()
            .get(ext)
            .map(|h| h.view(threshold))
            .unwrap_or_else(|| health::Health::default().view(threshold))
    }

    pub(crate) fn artifacts_arc(&self) -> &Arc<artifacts::Artifacts> {
        &self.artifacts
    }

    /// Ask the host loop for a pass now (a new event, a planned emission, a management
    /// request). A nudge during a pass queues one more pass.
    pub fn nudge(&self) {
        self.nudge.notify_one();
    }

    pub(crate) async fn nudged(&self) {
        self.nudge.notified().await
    }

    fn lock_in_tx(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.in_transaction
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Whether an in-transaction call to `ext` is pending.
    pub fn in_transaction(&self, ext: &str) -> bool {
        self.lock_in_tx().contains(ext)
    }

    /// Mark `ext` as inside an in-transaction call until the guard drops.
    pub(crate) fn enter_transaction(&self, ext: &str) -> InTransaction<'_> {
        self.lock_in_tx().insert(ext.to_owned());
        InTransaction {
            core: self,
            ext: ext.to_owned(),
        }
    }

    /// The capabilities an extension declared in its last handshake (kept while it restarts),
    /// shared rather than copied.
    pub fn capabilities(&self, ext: &str) -> Option<Arc<Capabilities>> {
        self.supervisor.get(ext).and_then(|e| e.capabilities())
    }

    /// Every supervised extension with the capabilities of its last handshake. The host loop
    /// asks every pass: nothing of a status is copied but a pointer.
    pub fn extensions(&self) -> Vec<(Extension, Arc<Capabilities>)> {
        self.supervisor
            .list()
            .into_iter()
            .filter_map(|e| e.capabilities().map(|c| (e, c)))
            .collect()
    }

    /// Run a write transaction off the async runtime. A panic inside `f` (its transaction
    /// rolled back) is [`StoreError::Panicked`]: a host fault, never the caller's.
    pub async fn write<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut conduit_store::WriteTx<'_>) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let store = self.store.clone();
        // The permit goes with the blocking task: a caller that stops waiting frees no slot
        // while its work still runs.
        let permit = self.write_slots.clone().acquire_owned().await.ok(); // never closed
        let res = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            store.write(f)
        })
        .await
        .unwrap_or_else(|e| Err(self.panicked("write", e)));
        self.disk_full.note(&res);
        res
    }

    /// Run a read on a reader connection, off the async runtime; a panic inside `f` is
    /// [`StoreError::Panicked`], as for [`Core::write`].
    pub async fn read<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&conduit_store::ReadTx<'_>) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let store = self.store.clone();
        let permit = self.read_slots.clone().acquire_owned().await.ok(); // never closed
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            store.read(f)
        })
        .await
        .unwrap_or_else(|e| Err(self.panicked("read", e)))
    }

    /// A store operation's task that did not finish: counted and logged as the bug it is.
    /// (A blocking task is cancelled only if the runtime shuts down before it starts; that is
    /// reported the same way, with the join error's text.)
    fn panicked(&self, what: &'static str, e: tokio::task::JoinError) -> StoreError {
        self.store_panics.fetch_add(1, Ordering::Relaxed);
        let reason = match e.try_into_panic() {
            Ok(payload) => panic_text(payload.as_ref()),
            Err(e) => e.to_string(),
        };
        tracing::error!(what, %reason, "a store operation panicked (a bug in the host)");
        StoreError::Panicked { what, reason }
    }

    /// How many store operations run through [`Core::write`] and [`Core::read`] panicked (the
    /// host loop's own passes are counted apart, in [`LoopStats::panics`]).
    pub fn store_panics(&self) -> u64 {
        self.store_panics.load(Ordering::Relaxed)
    }
}

/// Clears the in-transaction mark when dropped.
pub(crate) struct InTransaction<'a> {
    core: &'a Core,
    ext: String,
}

impl Drop for InTransaction<'_> {
    fn drop(&mut self) {
        self.core.lock_in_tx().remove(&self.ext);
    }
}
