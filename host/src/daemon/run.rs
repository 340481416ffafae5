//! The startup and shutdown wiring of `conduit daemon run`: signals first, the state lock, the
//! store, the supervisor and the core, the host loop thread, the reconciler task, the memory
//! trimmer, the retention sweeper, the management API and (under systemd) the notifier; then, on
//! SIGTERM or SIGINT, each stopped in
//! turn, every wait bounded.
//!
//! This is the one part of the daemon that imports the API, the telemetry export and the
//! notifier; they see the daemon only through [`Daemon`](super::handle::Daemon).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use conduit_supervisor::{CallbackHandlers, Supervisor};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::handle::{Daemon, POLL_INTERVAL, ReloadReport, SettingError, socket_path};
use crate::core::{Core, HostLoop};
use crate::state_dir::StateDir;

/// Kill what extensions of an earlier daemon left running, from their ledgers. A daemon killed
/// with SIGKILL takes its extensions with it (their parent-death signal), but not the processes
/// they started.
fn sweep_leftovers(state: &StateDir) {
    for (name, killed) in conduit_supervisor::tree::sweep_ledgers(&state.run_dir()) {
        tracing::warn!(
            extension = name,
            killed,
            "killed processes an earlier daemon's extension left running"
        );
    }
}

/// Remove the temporary folders of versions an earlier daemon started beside a running one
/// (`run/tmp/<name>@<n>`): nothing runs from them now, and each daemon numbers its own.
fn sweep_overlap_folders(state: &StateDir) {
    let tmp = state.run_dir().join("tmp");
    let Ok(entries) = std::fs::read_dir(&tmp) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().contains('@') {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Run the daemon on `state` until SIGTERM or SIGINT (or `stop` is cancelled).
pub async fn run(state: StateDir, stop: CancellationToken) -> anyhow::Result<()> {
    // Signals first: a SIGTERM (or SIGHUP from a service manager) during startup must get the
    // graceful path, not the default action.
    let signals = Signals::new()?;
    let unresponsive_after = crate::core::health::parse_unresponsive_after(
        std::env::var(crate::core::health::UNRESPONSIVE_AFTER_ENV)
            .ok()
            .as_deref(),
    )
    .map_err(SettingError)?;
    let api_limits = crate::api::Limits::from_env().map_err(SettingError)?;
    let lock = state.lock_exclusive()?;
    // Orphans of an extension's processes come to the daemon, not to init (see
    // `conduit_supervisor::tree`).
    if !conduit_supervisor::process::become_subreaper() {
        tracing::debug!("not a child subreaper here: only process groups are stopped");
    }
    sweep_leftovers(&state);
    sweep_overlap_folders(&state);
    let socket = socket_path(&state);
    let listener = crate::api::bind(&socket)?;
    // A start that fails after this point must not leave a socket behind that looks like a
    // daemon to clients and to whoever starts the next one.
    let _socket_file = RemoveOnDrop(socket.clone());
    let (reloads, mut reload_rx) = mpsc::channel::<oneshot::Sender<ReloadReport>>(16);
    let shutdown = stop.child_token();

    // The callbacks of each extension are served by the core, which needs the supervisor to
    // call extensions: the supervisor gets a weak reference, filled in once the core exists.
    let core_cell: Arc<std::sync::OnceLock<std::sync::Weak<Core>>> =
        Arc::new(std::sync::OnceLock::new());
    let handlers: CallbackHandlers = {
        let cell = core_cell.clone();
        Arc::new(move |name: &str| {
            let weak = cell.get().cloned().unwrap_or_default();
            Arc::new(crate::core::callbacks::CallbackHandler::new(weak, name))
                as Arc<dyn conduit_rpc::Handler>
        })
    };
    let supervisor = Arc::new(Supervisor::new(handlers));
    let db = state.path().join("conduit.db");
    let store = tokio::task::spawn_blocking(move || conduit_store::Store::open(&db))
        .await
        .context("opening the store panicked")?
        .context("cannot open the store")?;
    let core = Arc::new(Core::new(
        Arc::new(store),
        supervisor.clone(),
        state.artifacts_dir(),
        state.tmp_dir(),
    ));
    core.set_unresponsive_after(unresponsive_after);
    let _ = core_cell.set(Arc::downgrade(&core));
    let swept = core.artifacts.sweep_partial();
    if swept > 0 {
        tracing::warn!(
            files = swept,
            "removed artifact streams an earlier daemon left unfinished"
        );
    }
    let sweeper = Arc::new(crate::retention::Sweeper::new(
        state.clone(),
        core.store.clone(),
    ));
    let daemon = Arc::new(Daemon::new(
        state.clone(),
        supervisor.clone(),
        core.clone(),
        reloads,
        sweeper.clone(),
    ));
    // The metrics export (when configured) gathers from this daemon from now on.
    crate::telemetry::metrics::export_from(&daemon);
    let host_loop = HostLoop::new(
        core.clone(),
        tokio::runtime::Handle::current(),
        POLL_INTERVAL,
        shutdown.clone(),
    )
    .spawn()
    .context("cannot start the host loop thread")?;

    let reconciler = {
        let daemon = daemon.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    req = reload_rx.recv() => match req {
                        Some(reply) => { let _ = reply.send(daemon.reconcile().await); }
                        None => break,
                    },
                    () = shutdown.cancelled() => break,
                }
            }
        })
    };
    // Free memory given back after bursts (`memory.rs`).
    let trimmer = tokio::spawn(super::memory::trim(shutdown.clone()));
    // Retention: every `retention.interval`, the first a minute after the start.
    let sweeps = sweeper.clone().spawn(shutdown.clone());
    let api = tokio::spawn(crate::api::serve_with(
        listener,
        daemon.clone(),
        shutdown.clone(),
        api_limits,
    ));
    let first = match daemon.reload().await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %crate::error_chain::chain(&e), "the first reload failed; extensions start at the next reload");
            ReloadReport::default()
        }
    };
    tracing::info!(pid = lock.pid(), state_dir = %state.path().display(), socket = %socket.display(), started = %first.started.join(" "), "conduit daemon running");
    for e in &first.errors {
        tracing::error!("{e}");
    }
    // Under systemd: readiness once the extensions have settled, status lines, the watchdog.
    let notifier = crate::service::notify::Notifier::from_env();
    let notify_task = notifier
        .clone()
        .map(|n| tokio::spawn(n.run(daemon.clone(), shutdown.clone())));

    signals.wait(&shutdown, &daemon).await;
    tracing::info!("stopping extensions");
    let extender = notifier.map(|n| {
        n.stopping();
        // A stop is bounded step by step; extending stops after a minute, so a stop that
        // hangs after all is still ended by the service manager.
        tokio::spawn(async move {
            for _ in 0..6 {
                n.extend_stop();
                tokio::time::sleep(crate::service::notify::EXTEND_EVERY).await;
            }
        })
    });
    shutdown.cancel();
    sweeper.stop();
    if let Some(t) = notify_task {
        let _ = t.await;
    }
    // A sweep in progress ends after its current transaction (each is a few milliseconds).
    if tokio::time::timeout(Duration::from_secs(5), sweeps)
        .await
        .is_err()
    {
        tracing::warn!("the retention sweep did not end within 5 s of the stop");
    }
    let _ = reconciler.await;
    let _ = trimmer.await;
    // The loop finishes its pass (each call is bounded by its deadline) before extensions stop.
    let _ = tokio::task::spawn_blocking(move || host_loop.join()).await;
    daemon.supervisor().shutdown().await;
    core.tasks.close();
    let _ = tokio::time::timeout(Duration::from_secs(5), core.tasks.wait()).await;
    // Open connections (a client reading an artifact slowly) get a few seconds, not for ever.
    let abort = api.abort_handle();
    if tokio::time::timeout(Duration::from_secs(5), api)
        .await
        .is_err()
    {
        tracing::warn!("management connections were still open after 5 s; closing them");
        abort.abort();
    }
    if let Some(t) = extender {
        t.abort();
    }
    let _ = std::fs::remove_file(&socket);
    drop(lock);
    tracing::info!("conduit daemon stopped");
    Ok(())
}

/// Removes a file when dropped (however `run` returns).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The signals the daemon handles, registered before anything else starts.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("cannot handle SIGTERM")?,
            int: signal(SignalKind::interrupt()).context("cannot handle SIGINT")?,
            hup: signal(SignalKind::hangup()).context("cannot handle SIGHUP")?,
        })
    }

    /// Wait for SIGTERM or SIGINT (stop) while answering SIGHUP (re-read the package registry,
    /// as a reload through the API does).
    async fn wait(mut self, shutdown: &CancellationToken, daemon: &Daemon) {
        loop {
            tokio::select! {
                _ = self.term.recv() => return tracing::info!("SIGTERM received"),
                _ = self.int.recv() => return tracing::info!("SIGINT received"),
                _ = self.hup.recv() => match daemon.reload().await {
                    Ok(r) => tracing::info!(started = %r.started.join(" "), stopped = %r.stopped.join(" "), restarted = %r.restarted.join(" "), "SIGHUP: package registry applied"),
                    Err(e) => tracing::error!(error = %crate::error_chain::chain(&e), "SIGHUP: reload failed"),
                },
                () = shutdown.cancelled() => return,
            }
        }
    }
}
