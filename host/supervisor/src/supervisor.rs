//! The registry of supervised extensions ([`Supervisor`]): starts each one's actor, stops it,
//! lists them, keeps the last status of those that stopped, replaces a running version by a new
//! one without a gap ([`Supervisor::replace`]), and, while this process is a child subreaper,
//! reaps the orphans that come to it.
//!
//! A replacement runs in three slots of one map, under one lock, so a reader sees a package in
//! exactly one of these shapes: the old version serving with the new one starting beside it
//! (`incoming`); the new one serving with the old one finishing its calls in flight
//! (`draining`); or one version. The switch from the first to the second is one change under
//! that lock, and from then on every call made through the old version's handle goes to the
//! new one ([`Extension::successor`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::actor::actor;
use crate::extension::Extension;
use crate::process;
use crate::rest::Resting;
use crate::spec::{CallbackHandlers, ExtensionSpec};
use crate::status::{State, Status};

struct Running {
    ext: Extension,
    task: JoinHandle<()>,
    /// What the daemon started it from ([`ExtensionSpec::origin`]).
    origin: String,
    /// Which replacement started it (0: none), so that a replacement overtaken by another
    /// one (or by a plain start) never switches to its own.
    generation: u64,
}

/// Every supervised run, by package name, in the slots described at the top of the file.
#[derive(Default)]
struct Slots {
    /// The version that serves, in name order (what `list` gives every host-loop pass).
    running: BTreeMap<String, Running>,
    /// A new version starting beside the one that serves.
    incoming: HashMap<String, Running>,
    /// Replaced versions finishing their calls in flight (more than one only when upgrades
    /// follow each other faster than calls finish).
    draining: HashMap<String, Vec<Running>>,
    /// The last replacement of each package that did not become ready (its last status), until
    /// the next start or replacement of the package.
    failed: HashMap<String, (Status, String)>,
}

type SlotMap = Arc<Mutex<Slots>>;

/// A second version of a package beside the one that serves, for its status.
#[derive(Clone, Debug)]
pub enum Overlap {
    /// The new version starting beside the one that serves.
    Starting(Extension),
    /// The replaced version finishing its calls in flight.
    Draining(Extension),
    /// The last replacement did not become ready: its status then, and what it was started
    /// from. The version that served before serves on.
    Failed(Box<Status>, String),
}

/// All supervised extensions.
pub struct Supervisor {
    slots: SlotMap,
    /// The last status of each package that stopped, for its history (exits, last error).
    retired: Arc<Mutex<HashMap<String, Status>>>,
    handlers: CallbackHandlers,
    shutdown: CancellationToken,
    /// Reaps (and kills) adopted orphans while this process is a subreaper.
    reaper: Mutex<Option<JoinHandle<()>>>,
    /// The resting extensions, watched by one sweep (see `rest.rs`).
    resting: Arc<Resting>,
    /// The tasks that see each replacement through (and await the actors they take over).
    upgrades: TaskTracker,
    next_generation: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor").finish_non_exhaustive()
    }
}

fn lock_slots(map: &SlotMap) -> std::sync::MutexGuard<'_, Slots> {
    map.lock().unwrap_or_else(|p| p.into_inner())
}

/// Reap adopted orphans, and kill those no running extension claims; whether there were any.
fn reap_once(map: &SlotMap) -> bool {
    let exts: Vec<Extension> = {
        let slots = lock_slots(map);
        slots
            .running
            .values()
            .chain(slots.incoming.values())
            .chain(slots.draining.values().flatten())
            .map(|r| r.ext.clone())
            .collect()
    };
    let found = process::reap_orphans(|id| exts.iter().any(|e| e.owns(id)));
    if found.killed > 0 {
        tracing::warn!(
            killed = found.killed,
            "killed processes whose extension had stopped (they had left its process tree)"
        );
    }
    found.any()
}

/// The status a new entry starts with: idle when it waits for a need, else starting, with its
/// lifecycle shown and what an earlier run of the package left carried over.
fn first_status(spec: &ExtensionSpec, earlier: Option<&Status>) -> Status {
    let waits = spec.lifecycle.on_demand() && !spec.start_now;
    let state = if waits { State::Idle } else { State::Starting };
    let mut status = Status::new(&spec.name, &spec.version, state, spec.declared.clone());
    status.start = spec.lifecycle.start;
    status.idle_stop_after_ms = spec.lifecycle.idle_stop_after.map(|d| d.as_millis() as u64);
    if waits {
        status.idle_since_ms = Some(crate::status::now_ms());
    }
    if let Some(e) = earlier {
        status.carry_history(e);
    }
    status
}

impl Supervisor {
    /// A supervisor. Must be called inside a tokio runtime. If this process is a child
    /// subreaper ([`process::become_subreaper`]), it also reaps the orphans that come to it and
    /// kills those of extensions that no longer run.
    pub fn new(handlers: CallbackHandlers) -> Self {
        let slots: SlotMap = Arc::default();
        let shutdown = CancellationToken::new();
        let reaper = process::is_subreaper().then(|| {
            let (map, stop) = (slots.clone(), shutdown.clone());
            tokio::spawn(async move {
                use tokio::signal::unix::{SignalKind, signal};
                let mut sigchld = signal(SignalKind::child()).ok();
                // Quick while there are orphans, ever slower while there are none: each new one
                // comes with a SIGCHLD, which wakes the reaper at once.
                let mut every = process::REAP_INTERVAL;
                loop {
                    tokio::select! {
                        _ = async { match &mut sigchld { Some(s) => { s.recv().await; } None => std::future::pending().await } } => {}
                        () = tokio::time::sleep(every) => {}
                        () = stop.cancelled() => break,
                    }
                    every = process::reap_interval(every, reap_once(&map));
                }
            })
        });
        let resting = Arc::new(Resting::default());
        let (sweep, stop) = (resting.clone(), shutdown.clone());
        tokio::spawn(async move { sweep.run(stop).await });
        Supervisor {
            slots,
            retired: Arc::default(),
            handlers,
            shutdown,
            reaper: Mutex::new(reaper),
            resting,
            upgrades: TaskTracker::new(),
            next_generation: std::sync::atomic::AtomicU64::new(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        lock_slots(&self.slots)
    }

    fn retire(&self, ext: &Extension) {
        self.retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ext.name().to_owned(), ext.brief());
    }

    /// The last status of a package this supervisor ran and stopped (disabled, removed), for
    /// its history; `None` if it runs or never ran.
    pub fn last_status(&self, name: &str) -> Option<Status> {
        self.retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// A new actor for `spec`, not yet in any slot; `before` are runs of the same package it
    /// waits for to stop first (they own its processes and log).
    fn spawn_actor(&self, spec: ExtensionSpec, before: Vec<Running>, generation: u64) -> Running {
        let (cmds, cmd_rx) = mpsc::unbounded_channel();
        let earlier = self
            .retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&spec.name);
        let status = first_status(&spec, earlier.as_ref());
        let ext = Extension::new(spec.name.clone(), status, cmds);
        if spec.development {
            ext.journal().enable();
        }
        let handler = (self.handlers)(&spec.name);
        let (actor_ext, shutdown) = (ext.clone(), self.shutdown.child_token());
        let resting = self.resting.clone();
        let origin = spec.origin.clone();
        let task = tokio::spawn(async move {
            // The old one stops first (it owns the package's processes and log); its history
            // goes on in the new one.
            for old in before {
                old.ext.ask_to_stop();
                let _ = old.task.await;
                let old = old.ext.brief();
                actor_ext.update(|s| s.carry_history(&old));
            }
            actor(actor_ext, spec, handler, cmd_rx, shutdown, resting).await
        });
        Running {
            ext,
            task,
            origin,
            generation,
        }
    }

    /// Start supervising `spec`. An extension of the same name is stopped first (and a new
    /// version starting beside it is given up).
    ///
    /// The new extension is listed (as `starting`, or `idle` when it waits for a need) at once,
    /// even while the one it replaces is still stopping: whoever asks in between (the host
    /// loop) sees an extension about to start, not a gap.
    pub async fn start(&self, spec: ExtensionSpec) -> Extension {
        let mut slots = self.lock();
        let mut before: Vec<Running> = slots.incoming.remove(&spec.name).into_iter().collect();
        before.extend(slots.running.remove(&spec.name));
        slots.failed.remove(&spec.name);
        let run = self.spawn_actor(spec, before, 0);
        let ext = run.ext.clone();
        slots.running.insert(ext.name().to_owned(), run);
        drop(slots);
        ext
    }

    /// Replace the ready version of `spec`'s package by `spec` without a gap: the new version
    /// starts beside the one that serves (which is not restarted meanwhile, should it fail),
    /// and once its handshake is done every new call goes to it; the old one finishes the calls
    /// it has in flight (at most until the longest of their deadlines), then gets the usual
    /// stop. If the new one does not become ready (it is crash-looping, incompatible or
    /// refused, or takes longer than twice its start timeout and a minute), it is stopped and
    /// the old one serves on; see
    /// [`Supervisor::overlap`]. Returns the new version's handle, or `None` when no ready
    /// version serves (then [`Supervisor::start`] is the way).
    pub fn replace(&self, mut spec: ExtensionSpec) -> Option<Extension> {
        let generation = self
            .next_generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut slots = self.lock();
        let old = slots.running.get(&spec.name)?;
        if old.ext.state() != State::Ready {
            return None;
        }
        old.ext.set_retiring(true);
        let name = spec.name.clone();
        // A replacement already under way is given up; its actor is awaited off this lock.
        if let Some(earlier) = slots.incoming.remove(&name) {
            earlier.ext.ask_to_stop();
            self.upgrades.spawn(async move {
                let _ = earlier.task.await;
            });
        }
        slots.failed.remove(&name);
        spec.start_now = true;
        let limit = spec.start_timeout * 2 + Duration::from_secs(60);
        let run = self.spawn_actor(spec, Vec::new(), generation);
        let new = run.ext.clone();
        slots.incoming.insert(name.clone(), run);
        drop(slots);
        let see_through = SeeThrough {
            slots: self.slots.clone(),
            name,
            generation,
            shutdown: self.shutdown.clone(),
        };
        self.upgrades.spawn(see_through.run(new.clone(), limit));
        Some(new)
    }

    /// Forget the failed replacement of `name` unless it was started from `origin`: the
    /// registry no longer asks for it (it was rolled back), so it is history.
    pub fn forget_failed(&self, name: &str, origin: &str) {
        let mut slots = self.lock();
        if slots.failed.get(name).is_some_and(|(_, o)| o != origin) {
            slots.failed.remove(name);
        }
    }

    /// Give up the new version of `name` starting beside the one that serves (which serves
    /// on, and is restarted again should it fail). Does nothing if none is starting.
    pub async fn cancel(&self, name: &str) {
        let incoming = {
            let mut slots = self.lock();
            if let Some(old) = slots.running.get(name) {
                old.ext.set_retiring(false);
            }
            slots.incoming.remove(name)
        };
        if let Some(r) = incoming {
            tracing::info!(extension = %name, "giving up the new version starting beside the running one");
            r.ext.ask_to_stop();
            let _ = r.task.await;
        }
    }

    /// Stop an extension gracefully and forget it (its history is kept); a version starting
    /// beside it or finishing its calls is stopped too. Does nothing if it is not supervised.
    pub async fn stop(&self, name: &str) {
        let (running, others) = {
            let mut slots = self.lock();
            slots.failed.remove(name);
            let others: Vec<Running> = slots
                .incoming
                .remove(name)
                .into_iter()
                .chain(slots.draining.remove(name).into_iter().flatten())
                .collect();
            (slots.running.remove(name), others)
        };
        for r in running.iter().chain(&others) {
            r.ext.ask_to_stop();
        }
        for r in others {
            let _ = r.task.await;
        }
        if let Some(r) = running {
            let _ = r.task.await;
            self.retire(&r.ext);
        }
    }

    /// The version that serves `name`.
    pub fn get(&self, name: &str) -> Option<Extension> {
        self.lock().running.get(name).map(|r| r.ext.clone())
    }

    /// A second version of `name` beside the one that serves (starting or finishing its calls),
    /// or the last replacement that failed.
    pub fn overlap(&self, name: &str) -> Option<Overlap> {
        let slots = self.lock();
        if let Some(r) = slots.incoming.get(name) {
            return Some(Overlap::Starting(r.ext.clone()));
        }
        if let Some(r) = slots.draining.get(name).and_then(|v| v.first()) {
            return Some(Overlap::Draining(r.ext.clone()));
        }
        slots
            .failed
            .get(name)
            .map(|(s, origin)| Overlap::Failed(Box::new(s.clone()), origin.clone()))
    }

    /// What each serving version was started from, and each version starting beside one
    /// ([`ExtensionSpec::origin`]), by name.
    pub fn origins(&self) -> (HashMap<String, String>, HashMap<String, String>) {
        let slots = self.lock();
        let of = |(k, r): (&String, &Running)| (k.clone(), r.origin.clone());
        (
            slots.running.iter().map(of).collect(),
            slots.incoming.iter().map(of).collect(),
        )
    }

    /// How many extensions rest now: idle, watched by their CPU clock alone (see the
    /// `rest` module).
    pub fn resting(&self) -> usize {
        self.resting.count()
    }

    /// Every serving extension, by name.
    pub fn list(&self) -> Vec<Extension> {
        self.lock()
            .running
            .values()
            .map(|r| r.ext.clone())
            .collect()
    }

    /// Stop every extension gracefully, all at once, and wait for them; then kill whatever
    /// adopted orphan is left.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        let all: Vec<Running> = {
            let mut slots = self.lock();
            let mut all: Vec<Running> = std::mem::take(&mut slots.running).into_values().collect();
            all.extend(slots.incoming.drain().map(|(_, r)| r));
            all.extend(slots.draining.drain().flat_map(|(_, r)| r));
            all
        };
        for r in all {
            let _ = r.task.await;
            self.retire(&r.ext);
        }
        self.upgrades.close();
        self.upgrades.wait().await;
        let reaper = self.reaper.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = reaper {
            let _ = task.await;
            // Nothing runs now: every child that is not a leader goes, until none is left.
            let deadline = Instant::now() + Duration::from_secs(2);
            loop {
                let left = process::reap_orphans(|_| false);
                if (left.reaped == 0 && left.killed == 0) || Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

/// What sees one replacement through: waits for the new version's handshake, then switches
/// and drains the old one, or gives the new one up.
struct SeeThrough {
    slots: SlotMap,
    name: String,
    generation: u64,
    shutdown: CancellationToken,
}

impl SeeThrough {
    async fn run(self, new: Extension, limit: Duration) {
        // A first failure may be cured by the restart, as for any start: it is given up only
        // in a state that waiting cannot cure (the fifth failure in a row among them).
        let settled = tokio::select! {
            r = new.wait_for(limit, |s| {
                matches!(
                    s,
                    State::Ready
                        | State::CrashLooping
                        | State::Incompatible
                        | State::Refused
                        | State::Stopped
                )
            }) => r,
            () = self.shutdown.cancelled() => return,
        };
        let ready = matches!(settled, Ok(State::Ready));
        let (taken, old) = {
            let mut slots = lock_slots(&self.slots);
            // Given up meanwhile (another replacement, a start, a stop): not ours to finish.
            if slots
                .incoming
                .get(&self.name)
                .is_none_or(|r| r.generation != self.generation)
            {
                return;
            }
            let taken = slots.incoming.remove(&self.name).expect("looked up above");
            if !ready {
                if let Some(old) = slots.running.get(&self.name) {
                    old.ext.set_retiring(false);
                }
                (Some(taken), None)
            } else {
                let old = slots.running.insert(self.name.clone(), taken);
                if let Some(old) = &old {
                    // From here every call through the old handle goes to the new version.
                    old.ext.set_successor(new.clone());
                }
                (None, old)
            }
        };
        if let Some(failed) = taken {
            let state = settled.unwrap_or_else(|s| s);
            tracing::warn!(extension = %self.name, version = %new.brief().version, %state, "the new version did not become ready; the one that served serves on");
            failed.ext.ask_to_stop();
            let _ = failed.task.await;
            let mut slots = lock_slots(&self.slots);
            // Shown with the state it failed in, not the `stopped` its stop left.
            let mut status = failed.ext.status();
            status.state = state;
            slots
                .failed
                .insert(self.name.clone(), (status, failed.origin));
            return;
        }
        let Some(old) = old else { return };
        tracing::info!(extension = %self.name, from = %old.ext.brief().version, to = %new.brief().version, "switched to the new version; the old one finishes its calls in flight");
        let old_ext = old.ext.clone();
        lock_slots(&self.slots)
            .draining
            .entry(self.name.clone())
            .or_default()
            .push(old);
        // Its calls in flight finish, bounded by the longest of their deadlines.
        let until = Instant::now()
            + old_ext.longest_wait(conduit_protocol::DEFAULT_CALL_DEADLINE, Instant::now());
        while old_ext.busy() && Instant::now() < until && !self.shutdown.is_cancelled() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        old_ext.ask_to_stop();
        let taken = {
            let mut slots = lock_slots(&self.slots);
            let runs = slots.draining.entry(self.name.clone()).or_default();
            let taken = runs
                .iter()
                .position(|r| r.ext.is(&old_ext))
                .map(|i| runs.remove(i));
            if runs.is_empty() {
                slots.draining.remove(&self.name);
            }
            taken
        };
        if let Some(old) = taken {
            let _ = old.task.await;
            let brief = old.ext.brief();
            new.update(|s| s.carry_history(&brief));
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
