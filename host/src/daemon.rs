//! `conduit daemon run`: the long-running process an operator starts (by hand, or under
//! systemd or launchd).
//!
//! It takes the state directory's exclusive lock, serves the management API on a Unix socket
//! in `<state>/run/`, runs every enabled package under the supervisor, and re-reads the package
//! registry whenever the CLI asks (`POST /v1/reload`, sent after install, remove, enable and
//! disable), so changes take effect without a restart. SIGTERM or SIGINT stops every extension
//! gracefully and exits 0.
//!
//! Invariant: registry changes are applied by one reconciler task, one request at a time, so
//! no lock is held while extensions start or stop; the API only sends it a request and waits
//! (bounded) for its report.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use conduit_supervisor::process::ChildCommand;
use conduit_supervisor::{CallbackHandlers, ExtensionSpec, State, Status, Supervisor};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::core::{Core, HostLoop, now_ms};
use crate::packages::{self, PackageRecord};
use crate::state_dir::StateDir;

/// How often the host loop makes a pass when nothing nudges it.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// The management socket's file name, inside `<state>/run/`.
pub const SOCKET_NAME: &str = "conduit.sock";

/// The management socket of a state directory.
pub fn socket_path(state: &StateDir) -> PathBuf {
    state.run_dir().join(SOCKET_NAME)
}

/// One extension as the API and the CLI show it: the supervisor's status plus what the
/// registry knows.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ExtensionView {
    #[serde(flatten)]
    pub status: Status,
    pub enabled: bool,
    pub installed_at_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// How its in-transaction calls stand (healthy, degraded, unresponsive); absent when the
    /// daemon does not run it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<crate::core::health::HealthView>,
}

impl ExtensionView {
    /// The view of a package the daemon is not running (disabled, or no daemon at all).
    pub fn offline(rec: &PackageRecord, daemon_running: bool) -> Self {
        let state = if !rec.enabled {
            State::Disabled
        } else if daemon_running {
            State::Starting
        } else {
            State::Stopped
        };
        ExtensionView {
            status: Status::new(
                &rec.name,
                &rec.version,
                state,
                Some(rec.manifest.capabilities.clone()),
            ),
            enabled: rec.enabled,
            installed_at_ms: rec.installed_at_ms,
            description: rec.manifest.description.clone(),
            health: None,
        }
    }
}

/// What a reload changed.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ReloadReport {
    pub started: Vec<String>,
    pub stopped: Vec<String>,
    pub restarted: Vec<String>,
    pub unchanged: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

/// The running daemon, shared by the API and the reconciler.
pub struct Daemon {
    state: StateDir,
    supervisor: Arc<Supervisor>,
    core: Arc<Core>,
    /// What each running extension was started from (version and install time), to tell a
    /// reinstall or upgrade from an unchanged package.
    started_from: Mutex<HashMap<String, String>>,
    reloads: mpsc::Sender<oneshot::Sender<ReloadReport>>,
    started_at_ms: i64,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("state", &self.state.path())
            .finish_non_exhaustive()
    }
}

impl Daemon {
    pub fn state_dir(&self) -> &StateDir {
        &self.state
    }

    pub fn started_at_ms(&self) -> i64 {
        self.started_at_ms
    }

    /// Ask the reconciler to apply the registry now; waits at most a minute for its report.
    pub async fn reload(&self) -> anyhow::Result<ReloadReport> {
        let (tx, rx) = oneshot::channel();
        self.reloads
            .send(tx)
            .await
            .context("the daemon is shutting down")?;
        tokio::time::timeout(Duration::from_secs(60), rx)
            .await
            .context("the reload did not finish within 60 s")?
            .context("the daemon is shutting down")
    }

    /// Every installed package, with the supervisor's status for those it runs.
    pub fn extensions(&self) -> anyhow::Result<Vec<ExtensionView>> {
        let records = packages::list(&self.state)?;
        Ok(records.iter().map(|r| self.view(r)).collect())
    }

    /// One package's view, or `None` if it is not installed.
    pub fn extension(&self, name: &str) -> anyhow::Result<Option<ExtensionView>> {
        // One record read, whatever the number of packages.
        match packages::get(&self.state, name) {
            Ok(rec) => Ok(Some(self.view(&rec))),
            Err(packages::PackageError::NotInstalled { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn view(&self, rec: &PackageRecord) -> ExtensionView {
        match self.supervisor.get(&rec.name) {
            Some(ext) if rec.enabled => ExtensionView {
                status: ext.status(),
                enabled: true,
                installed_at_ms: rec.installed_at_ms,
                description: rec.manifest.description.clone(),
                health: Some(self.core.health_view(&rec.name)),
            },
            _ => {
                let mut v = ExtensionView::offline(rec, true);
                if let Some(last) = self.supervisor.last_status(&rec.name) {
                    v.status.carry_history(&last);
                }
                v
            }
        }
    }

    /// Restart a running extension now. `false` if it is not running here.
    pub fn restart(&self, name: &str) -> bool {
        match self.supervisor.get(name) {
            Some(ext) => {
                ext.restart();
                true
            }
            None => false,
        }
    }

    /// The supervised extension, for callers inside the daemon.
    pub fn supervisor(&self) -> &Supervisor {
        &self.supervisor
    }

    /// The coordination core: the store, the host loop's nudge, artifacts.
    pub fn core(&self) -> &Arc<Core> {
        &self.core
    }

    async fn reconcile(&self) -> ReloadReport {
        let mut report = ReloadReport::default();
        let records = match packages::list(&self.state) {
            Ok(r) => r,
            Err(e) => {
                report
                    .errors
                    .push(format!("cannot read the package registry: {e}"));
                return report;
            }
        };
        let wanted: HashMap<String, &PackageRecord> = records
            .iter()
            .filter(|r| r.enabled)
            .map(|r| (r.name.clone(), r))
            .collect();
        let running: Vec<String> = self
            .started_from
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        for name in running {
            if !wanted.contains_key(&name) {
                self.supervisor.stop(&name).await;
                self.started_from
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&name);
                report.stopped.push(name);
            }
        }
        for (name, rec) in wanted {
            // The operator's settings are part of it: `ext set` restarts the package.
            let settings = packages::settings::for_package(&self.state, &name)
                .map(|s| s.fingerprint())
                .unwrap_or_default();
            let fingerprint = format!("{}@{}@{settings}", rec.version, rec.installed_at_ms);
            let before = self
                .started_from
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&name)
                .cloned();
            if before.as_deref() == Some(fingerprint.as_str()) {
                report.unchanged.push(name);
                continue;
            }
            match self.spec(rec) {
                Ok(spec) => {
                    self.supervisor.start(spec).await;
                    self.started_from
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(name.clone(), fingerprint);
                    if before.is_some() {
                        report.restarted.push(name)
                    } else {
                        report.started.push(name)
                    }
                }
                Err(e) => report.errors.push(format!("{name}: {e:#}")),
            }
        }
        // Every enabled package is supervised now (at least `starting`), so the owner of each
        // of its kinds is known: routing may begin.
        self.core.mark_registry_applied();
        for list in [
            &mut report.started,
            &mut report.stopped,
            &mut report.restarted,
            &mut report.unchanged,
        ] {
            list.sort();
        }
        report
    }

    fn spec(&self, rec: &PackageRecord) -> anyhow::Result<ExtensionSpec> {
        let dir = packages::package_dir(&self.state, &rec.name);
        let data_dir = self.state.path().join("data").join(&rec.name);
        // A command that does not resolve is reported by the preflight (state `refused`, with
        // the reason) rather than here, so that it shows in the status like any other refusal.
        let resolved = rec.manifest.resolve_command(&dir);
        let (program, args) = match &resolved {
            Ok(r) => (r.program.clone(), r.args.clone()),
            Err(_) => (
                dir.join(&rec.manifest.command[0]),
                rec.manifest.command[1..].to_vec(),
            ),
        };
        let settings = packages::settings::for_package(&self.state, &rec.name)?;
        let folders = packages::launch::Folders {
            package: dir.clone(),
            tmp: packages::launch::tmp_dir(&self.state.run_dir(), &rec.name),
            data: data_dir,
        };
        let plan = packages::launch::plan(&rec.manifest, program, args, &folders, &settings)
            .with_context(|| format!("cannot prepare the folders of {}", rec.name))?;
        let (command, confine) = ChildCommand::for_package(&plan.launch);
        let log = self.state.logs_dir().join(format!("{}.log", rec.name));
        let mut spec = ExtensionSpec::new(&rec.name, &rec.version, command, log);
        spec.declared = Some(rec.manifest.capabilities.clone());
        spec.confine = confine;
        spec.limit_notes = plan.notes;
        spec.limit_sources = plan.limits.sources;
        let state = self.state.clone();
        let name = rec.name.clone();
        let resolve_error = resolved.err().map(|e| e.to_string());
        spec.ledger = Some(self.state.run_dir().join(format!(
            "{}{}",
            rec.name,
            conduit_supervisor::tree::LEDGER_SUFFIX
        )));
        spec.preflight = Some(Arc::new(move || {
            if let Some(e) = &resolve_error {
                return Err(e.clone());
            }
            packages::verify(&state, &name).map_err(|e| e.to_string())
        }));
        Ok(spec)
    }
}

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
    let daemon = Arc::new(Daemon {
        state: state.clone(),
        supervisor: supervisor.clone(),
        core: core.clone(),
        started_from: Mutex::new(HashMap::new()),
        reloads,
        started_at_ms: now_ms(),
    });
    // The metrics export (when configured) gathers from this daemon from now on.
    crate::telemetry::otlp_metrics::serve_from(&daemon);
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
    if let Some(t) = notify_task {
        let _ = t.await;
    }
    let _ = reconciler.await;
    // The loop finishes its pass (each call is bounded by its deadline) before extensions stop.
    let _ = tokio::task::spawn_blocking(move || host_loop.join()).await;
    daemon.supervisor.shutdown().await;
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

/// A daemon setting (an environment variable) that does not parse: permanent, retrying will
/// not help.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SettingError(pub String);

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
