//! The registry of supervised extensions ([`Supervisor`]): starts each one's actor, stops it,
//! lists them, keeps the last status of those that stopped, and, while this process is a child
//! subreaper, reaps the orphans that come to it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::actor::actor;
use crate::extension::Extension;
use crate::process;
use crate::rest::Resting;
use crate::spec::{CallbackHandlers, ExtensionSpec};
use crate::status::{State, Status};

struct Running {
    ext: Extension,
    task: JoinHandle<()>,
}

type RunningMap = Arc<Mutex<HashMap<String, Running>>>;

/// All supervised extensions.
pub struct Supervisor {
    running: RunningMap,
    /// The last status of each package that stopped, for its history (exits, last error).
    retired: Mutex<HashMap<String, Status>>,
    handlers: CallbackHandlers,
    shutdown: CancellationToken,
    /// Reaps (and kills) adopted orphans while this process is a subreaper.
    reaper: Mutex<Option<JoinHandle<()>>>,
    /// The resting extensions, watched by one sweep (see `rest.rs`).
    resting: Arc<Resting>,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor").finish_non_exhaustive()
    }
}

fn lock_map(map: &RunningMap) -> std::sync::MutexGuard<'_, HashMap<String, Running>> {
    map.lock().unwrap_or_else(|p| p.into_inner())
}

/// Reap adopted orphans, and kill those no running extension claims; whether there were any.
fn reap_once(map: &RunningMap) -> bool {
    let exts: Vec<Extension> = lock_map(map).values().map(|r| r.ext.clone()).collect();
    let found = process::reap_orphans(|id| exts.iter().any(|e| e.owns(id)));
    if found.killed > 0 {
        tracing::warn!(
            killed = found.killed,
            "killed processes whose extension had stopped (they had left its process tree)"
        );
    }
    found.any()
}

impl Supervisor {
    /// A supervisor. Must be called inside a tokio runtime. If this process is a child
    /// subreaper ([`process::become_subreaper`]), it also reaps the orphans that come to it and
    /// kills those of extensions that no longer run.
    pub fn new(handlers: CallbackHandlers) -> Self {
        let running: RunningMap = Arc::new(Mutex::new(HashMap::new()));
        let shutdown = CancellationToken::new();
        let reaper = process::is_subreaper().then(|| {
            let (map, stop) = (running.clone(), shutdown.clone());
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
            running,
            retired: Mutex::new(HashMap::new()),
            handlers,
            shutdown,
            reaper: Mutex::new(reaper),
            resting,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Running>> {
        lock_map(&self.running)
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

    /// Start supervising `spec`. An extension of the same name is stopped first.
    ///
    /// The new extension is listed (as `starting`) at once, even while the one it replaces is
    /// still stopping: whoever asks in between (the host loop) sees an extension about to
    /// start, not a gap.
    pub async fn start(&self, spec: ExtensionSpec) -> Extension {
        let (cmds, cmd_rx) = mpsc::unbounded_channel();
        let mut status = Status::new(
            &spec.name,
            &spec.version,
            State::Starting,
            spec.declared.clone(),
        );
        let earlier = self
            .retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&spec.name);
        if let Some(e) = &earlier {
            status.carry_history(e);
        }
        let ext = Extension::new(spec.name.clone(), status, cmds);
        if spec.development {
            ext.journal().enable();
        }
        let handler = (self.handlers)(&spec.name);
        let mut running = self.lock();
        let previous = running.remove(&spec.name);
        let (actor_ext, shutdown) = (ext.clone(), self.shutdown.child_token());
        let resting = self.resting.clone();
        let task = tokio::spawn(async move {
            // The old one stops first (it owns the package's processes and log); its history
            // goes on in the new one.
            if let Some(old) = previous {
                old.ext.ask_to_stop();
                let _ = old.task.await;
                let old = old.ext.brief();
                actor_ext.update(|s| s.carry_history(&old));
            }
            actor(actor_ext, spec, handler, cmd_rx, shutdown, resting).await
        });
        running.insert(
            ext.name().to_owned(),
            Running {
                ext: ext.clone(),
                task,
            },
        );
        drop(running);
        ext
    }

    /// Stop an extension gracefully and forget it (its history is kept). Does nothing if it is
    /// not supervised.
    pub async fn stop(&self, name: &str) {
        let running = self.lock().remove(name);
        if let Some(r) = running {
            r.ext.ask_to_stop();
            let _ = r.task.await;
            self.retire(&r.ext);
        }
    }

    pub fn get(&self, name: &str) -> Option<Extension> {
        self.lock().get(name).map(|r| r.ext.clone())
    }

    /// How many extensions rest now: idle, watched by their CPU clock alone (see the
    /// `rest` module).
    pub fn resting(&self) -> usize {
        self.resting.count()
    }

    /// Every supervised extension, by name.
    pub fn list(&self) -> Vec<Extension> {
        let mut v: Vec<Extension> = self.lock().values().map(|r| r.ext.clone()).collect();
        v.sort_by(|a, b| a.name().cmp(b.name()));
        v
    }

    /// Stop every extension gracefully, all at once, and wait for them; then kill whatever
    /// adopted orphan is left.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        let all: Vec<Running> = self.lock().drain().map(|(_, r)| r).collect();
        for r in all {
            let _ = r.task.await;
            self.retire(&r.ext);
        }
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

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
