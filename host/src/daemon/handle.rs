//! The running daemon as the rest of the host sees it: the [`Daemon`] handle the API, the
//! telemetry, the service notifier and the CLI use, the views they read, and the I/O of a
//! reload (reading the registry, starting and stopping through the supervisor).
//!
//! It imports none of its users: the startup wiring that does (`run`) lives beside it. What a
//! reload changes is decided by [`reload::decide`], a pure function; this file only gathers the
//! facts and applies the plan.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use conduit_supervisor::process::ChildCommand;
use conduit_supervisor::{ExtensionSpec, State, Status, Supervisor, now_ms};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use super::reload::{self, Launch};
use crate::core::Core;
use crate::packages::{self, PackageRecord};
use crate::retention::Sweeper;
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
    /// For a development install (`conduit ext dev`), the folder it runs from; its files are
    /// not checked (`packages::Checked::DevInstall`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev: Option<PathBuf>,
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
            dev: rec.dev.then(|| rec.source.clone()),
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
    /// The retention sweeps (periodic, and `POST /v1/gc`).
    sweeper: Arc<Sweeper>,
    /// The registry's records as last read for an overview, with the stamp of the files they
    /// were read from (see [`Daemon::records`]).
    records: Mutex<Option<(RegistryStamp, Arc<Vec<PackageRecord>>)>>,
}

/// When the registry's files last changed: the records folder and `registry.json` (every record
/// is replaced by a rename into the folder, which changes its modification time).
type RegistryStamp = [Option<std::time::SystemTime>; 2];

fn registry_stamp(state: &StateDir) -> RegistryStamp {
    let dir = state.packages_dir();
    let at = |p: PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    [
        at(dir.join(packages::RECORDS_DIR)),
        at(dir.join(packages::REGISTRY_FILE)),
    ]
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("state", &self.state.path())
            .finish_non_exhaustive()
    }
}

impl Daemon {
    /// The handle of a daemon whose reconciler reads `reloads`; `run` builds it once.
    pub(crate) fn new(
        state: StateDir,
        supervisor: Arc<Supervisor>,
        core: Arc<Core>,
        reloads: mpsc::Sender<oneshot::Sender<ReloadReport>>,
        sweeper: Arc<Sweeper>,
    ) -> Daemon {
        Daemon {
            state,
            supervisor,
            core,
            started_from: Mutex::new(HashMap::new()),
            reloads,
            started_at_ms: now_ms(),
            sweeper,
            records: Mutex::new(None),
        }
    }

    /// The retention sweeper (its counters, and a sweep on demand).
    pub fn sweeper(&self) -> &Arc<Sweeper> {
        &self.sweeper
    }

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

    /// Every installed package's record, ordered by name, read again only when the registry's
    /// files changed since the last read or a reload ran: an overview of a thousand packages
    /// every two seconds then costs two `stat`s, not a thousand files parsed. A change within
    /// the file system's timestamp granularity of the last read could go unseen, but every
    /// change the CLI makes is followed by a reload, which drops what is kept.
    pub fn records(&self) -> anyhow::Result<Arc<Vec<PackageRecord>>> {
        let stamp = registry_stamp(&self.state);
        let mut kept = self.records.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, recs)) = &*kept
            && *at == stamp
            && stamp[0].is_some()
        {
            return Ok(recs.clone());
        }
        let recs = Arc::new(packages::list(&self.state)?);
        *kept = Some((stamp, recs.clone()));
        Ok(recs)
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
                dev: rec.dev.then(|| rec.source.clone()),
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

    /// Restart a running extension now, at an operator's request (the exit's record says so).
    /// `false` if it is not running here.
    pub fn restart(&self, name: &str) -> bool {
        match self.supervisor.get(name) {
            Some(ext) => {
                ext.restart(conduit_supervisor::StopRequest::operator_restart());
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

    /// Apply the registry: read it and the operator's settings, decide (a pure
    /// [`reload::decide`]), then stop and start through the supervisor. Only the reconciler
    /// task calls it, one request at a time.
    pub(crate) async fn reconcile(&self) -> ReloadReport {
        // The same file holds the retention settings: the sweeper reads them again.
        self.sweeper.settings_changed();
        *self.records.lock().unwrap_or_else(|p| p.into_inner()) = None;
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
        let enabled: HashMap<&str, &PackageRecord> = records
            .iter()
            .filter(|r| r.enabled)
            .map(|r| (r.name.as_str(), r))
            .collect();
        let wanted: BTreeMap<String, String> = enabled
            .values()
            .map(|rec| (rec.name.clone(), self.fingerprint(rec)))
            .collect();
        let running = self.started_from().clone();
        let plan = reload::decide(&wanted, &running);
        for name in plan.stop {
            self.supervisor.stop(&name).await;
            self.started_from().remove(&name);
            report.stopped.push(name);
        }
        report.unchanged = plan.unchanged;
        for (name, launch) in plan.launch {
            let rec = enabled[name.as_str()];
            match self.spec(rec) {
                Ok(spec) => {
                    self.supervisor.start(spec).await;
                    self.started_from()
                        .insert(name.clone(), wanted[&name].clone());
                    match launch {
                        Launch::Restart => report.restarted.push(name),
                        Launch::Start => report.started.push(name),
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

    /// What a package would be started from: its version and install time, and the operator's
    /// settings (`ext set` restarts the package).
    fn fingerprint(&self, rec: &PackageRecord) -> String {
        let settings = packages::settings::for_package(&self.state, &rec.name)
            .map(|s| s.fingerprint())
            .unwrap_or_default();
        format!("{}@{}@{settings}", rec.version, rec.installed_at_ms)
    }

    fn started_from(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.started_from.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn spec(&self, rec: &PackageRecord) -> anyhow::Result<ExtensionSpec> {
        let dir = packages::files_dir(&self.state, rec);
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
        spec.bulk = Some(self.core.artifacts.bulk_sink(&rec.name));
        spec.development = rec.dev;
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
            packages::verify(&state, &name)
                .map(|_| ())
                .map_err(|e| e.to_string())
        }));
        Ok(spec)
    }
}

/// A daemon setting (an environment variable) that does not parse: permanent, retrying will
/// not help.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SettingError(pub String);
