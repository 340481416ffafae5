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
use conduit_supervisor::{ExtensionSpec, Lifecycle, Overlap, State, Status, Supervisor, now_ms};
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
    /// A second version beside the one shown, during an upgrade without a gap (or the last
    /// one that failed to start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<OverlapView>,
}

/// The other version of a package during an upgrade, for `ext status`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OverlapView {
    /// `starting`: the new version is starting beside the one shown, which serves until it is
    /// ready. `draining`: the version shown took over; this one, replaced, finishes its calls
    /// in flight. `failed`: the last upgrade to this version did not become ready; the one
    /// shown serves on.
    pub phase: String,
    pub status: Status,
}

impl OverlapView {
    fn of(overlap: Overlap) -> OverlapView {
        let (phase, status) = match overlap {
            Overlap::Starting(e) => ("starting", e.status()),
            Overlap::Draining(e) => ("draining", e.status()),
            Overlap::Failed(s, _) => ("failed", *s),
        };
        OverlapView {
            phase: phase.to_owned(),
            status,
        }
    }
}

impl ExtensionView {
    /// The view of a package the daemon is not running (disabled, or no daemon at all), under
    /// `lifecycle` (the package's, with the operator's settings).
    pub fn offline(rec: &PackageRecord, daemon_running: bool, lifecycle: Lifecycle) -> Self {
        let state = if !rec.enabled {
            State::Disabled
        } else if !daemon_running {
            State::Stopped
        } else if lifecycle.on_demand() {
            State::Idle
        } else {
            State::Starting
        };
        let mut status = Status::new(
            &rec.name,
            &rec.version,
            state,
            Some(rec.manifest.capabilities.clone()),
        );
        status.start = lifecycle.start;
        status.idle_stop_after_ms = lifecycle.idle_stop_after.map(|d| d.as_millis() as u64);
        ExtensionView {
            status,
            enabled: rec.enabled,
            installed_at_ms: rec.installed_at_ms,
            description: rec.manifest.description.clone(),
            health: None,
            dev: rec.dev.then(|| rec.source.clone()),
            overlap: None,
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
    /// Of `restarted`: running, so the new version starts beside the old one, which serves
    /// until it is ready (an upgrade without a gap).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replacing: Vec<String>,
    /// Of `started` and `restarted`: on demand, so not started until something needs it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub on_demand: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

/// The running daemon, shared by the API and the reconciler.
pub struct Daemon {
    state: StateDir,
    supervisor: Arc<Supervisor>,
    core: Arc<Core>,
    reloads: mpsc::Sender<oneshot::Sender<ReloadReport>>,
    started_at_ms: i64,
    /// Reloads applied so far: the first one starts the daemon's extensions.
    reloads_done: std::sync::atomic::AtomicU64,
    /// Numbers the temporary folders of versions started beside a running one.
    overlaps: std::sync::atomic::AtomicU64,
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
            reloads,
            started_at_ms: now_ms(),
            reloads_done: std::sync::atomic::AtomicU64::new(0),
            overlaps: std::sync::atomic::AtomicU64::new(0),
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
                overlap: self.supervisor.overlap(&rec.name).map(OverlapView::of),
            },
            _ => {
                let mut v = ExtensionView::offline(rec, true, self.lifecycle(rec));
                // What the host loop holds its work for: its last handshake's, else its
                // manifest's.
                let caps = packages::handshakes::capabilities(&self.state, rec);
                v.status.capabilities = Some(Arc::new(caps));
                if let Some(last) = self.supervisor.last_status(&rec.name) {
                    v.status.carry_history(&last);
                }
                v
            }
        }
    }

    /// The lifecycle `rec` runs under: its manifest's, with the operator's settings.
    pub(crate) fn lifecycle(&self, rec: &PackageRecord) -> Lifecycle {
        packages::settings::for_package(&self.state, &rec.name)
            .unwrap_or_default()
            .lifecycle(&rec.manifest.lifecycle)
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
    /// [`reload::decide`]), then stop and start through the supervisor; a package that runs
    /// and changed is replaced without a gap ([`Supervisor::replace`]). Only the reconciler
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
        let first = self
            .reloads_done
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            == 0;
        let enabled: HashMap<&str, &PackageRecord> = records
            .iter()
            .filter(|r| r.enabled)
            .map(|r| (r.name.as_str(), r))
            .collect();
        let wanted: BTreeMap<String, String> = enabled
            .values()
            .map(|rec| (rec.name.clone(), self.fingerprint(rec)))
            .collect();
        let (running, incoming) = self.supervisor.origins();
        let plan = reload::decide(&wanted, &running, &incoming);
        for name in plan.stop {
            self.supervisor.stop(&name).await;
            report.stopped.push(name);
        }
        for name in &plan.cancel {
            self.supervisor.cancel(name).await;
        }
        for name in &plan.unchanged {
            self.supervisor.forget_failed(name, &wanted[name]);
        }
        report.unchanged = plan.unchanged;
        let why = if first {
            "started with the daemon"
        } else {
            "started by an install, enable or change of its settings"
        };
        for (name, launch) in plan.launch {
            let rec = enabled[name.as_str()];
            let origin = wanted[&name].clone();
            // A development install is replaced in place: its author's change is what runs
            // next, and a broken one is shown held stopped with its cause (`conduit ext dev`),
            // not hidden behind the version it replaces.
            if launch == Launch::Restart && !rec.dev {
                // Running and ready: the new version starts beside it, and takes over once its
                // handshake is done.
                let replaced = match self.spec(rec, origin.clone(), why, true) {
                    Ok(spec) => self.supervisor.replace(spec).is_some(),
                    Err(e) => {
                        report.errors.push(format!("{name}: {e:#}"));
                        continue;
                    }
                };
                if replaced {
                    report.replacing.push(name.clone());
                    report.restarted.push(name);
                    continue;
                }
            }
            match self.spec(rec, origin, why, false) {
                Ok(spec) => {
                    if spec.lifecycle.on_demand() {
                        report.on_demand.push(name.clone());
                    }
                    self.supervisor.start(spec).await;
                    match launch {
                        Launch::Restart => report.restarted.push(name),
                        Launch::Start => report.started.push(name),
                    }
                }
                Err(e) => report.errors.push(format!("{name}: {e:#}")),
            }
        }
        // What is installed but not supervised (disabled, or its start could not be prepared)
        // keeps what waits for it, held by the host loop until it runs again.
        let dormant: crate::core::Dormant = records
            .iter()
            .filter(|r| self.supervisor.get(&r.name).is_none())
            .map(|r| {
                let caps = packages::handshakes::capabilities(&self.state, r);
                (r.name.clone(), Arc::new(caps))
            })
            .collect();
        self.core.set_dormant(dormant);
        // Every enabled package is supervised now (at least `starting`), so the owner of each
        // of its kinds is known: routing may begin.
        self.core.mark_registry_applied();
        for list in [
            &mut report.started,
            &mut report.stopped,
            &mut report.restarted,
            &mut report.unchanged,
            &mut report.replacing,
            &mut report.on_demand,
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

    /// Every installed package with its capabilities as best known without running it (its
    /// last handshake's, else its manifest's), in name order: who owns which event kinds,
    /// disabled packages included.
    pub fn owners(&self) -> anyhow::Result<Vec<(String, conduit_protocol::Capabilities)>> {
        Ok(packages::list(&self.state)?
            .iter()
            .map(|r| {
                (
                    r.name.clone(),
                    packages::handshakes::capabilities(&self.state, r),
                )
            })
            .collect())
    }

    /// The spec of `rec`'s package, started from `origin` (its fingerprint) for `why`. One
    /// started `beside` a running version gets temporary files and a process ledger of its
    /// own (the data folder is shared: see docs/operations.md, "Upgrades without a gap").
    fn spec(
        &self,
        rec: &PackageRecord,
        origin: String,
        why: &str,
        beside: bool,
    ) -> anyhow::Result<ExtensionSpec> {
        // A development install runs from the author's folder.
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
        // Package names have no `@`: `<name>@<n>` is never another package's.
        let own = if beside {
            let n = self
                .overlaps
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                + 1;
            format!("{}@{n}", rec.name)
        } else {
            rec.name.clone()
        };
        let folders = packages::launch::Folders {
            package: dir.clone(),
            tmp: packages::launch::tmp_dir(&self.state.run_dir(), &own),
            data: data_dir,
        };
        let plan = packages::launch::plan(&rec.manifest, program, args, &folders, &settings)
            .with_context(|| format!("cannot prepare the folders of {}", rec.name))?;
        let (command, confine) = ChildCommand::for_package(&plan.launch);
        let log = self.state.logs_dir().join(format!("{}.log", rec.name));
        let mut spec = ExtensionSpec::new(&rec.name, &rec.version, command, log);
        spec.declared = Some(packages::handshakes::capabilities(&self.state, rec));
        spec.confine = confine;
        spec.limit_notes = plan.notes;
        spec.limit_sources = plan.limits.sources;
        spec.bulk = Some(self.core.artifacts.bulk_sink(&rec.name));
        spec.development = rec.dev;
        spec.lifecycle = settings.lifecycle(&rec.manifest.lifecycle);
        spec.start_reason = if beside {
            format!("started beside the running version to replace it ({why})")
        } else {
            why.to_owned()
        };
        spec.origin = origin;
        let artifacts = self.core.artifacts.clone();
        let name = rec.name.clone();
        spec.open_streams = Some(Arc::new(move || artifacts.open_streams_of(&name)));
        spec.on_ready = Some(self.on_ready(rec));
        let state = self.state.clone();
        let name = rec.name.clone();
        let resolve_error = resolved.err().map(|e| e.to_string());
        spec.ledger = Some(
            self.state
                .run_dir()
                .join(format!("{own}{}", conduit_supervisor::tree::LEDGER_SUFFIX)),
        );
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

    /// What a run of `rec`'s package does once ready: nudge the host loop (work held for it
    /// can go now), and keep what its handshake declared when that changed (off the runtime's
    /// workers), so the package's capabilities are known while it does not run.
    fn on_ready(&self, rec: &PackageRecord) -> conduit_supervisor::ReadyHook {
        let core = Arc::downgrade(&self.core);
        let state = self.state.clone();
        let (name, version, installed_at_ms) =
            (rec.name.clone(), rec.version.clone(), rec.installed_at_ms);
        Arc::new(move |ext: &conduit_supervisor::Extension| {
            if let Some(core) = core.upgrade() {
                core.nudge();
            }
            let s = ext.brief();
            let (Some(caps), Some(protocol_version)) = (s.capabilities, s.protocol_version) else {
                return;
            };
            let record = packages::handshakes::HandshakeRecord {
                version: version.clone(),
                installed_at_ms,
                protocol_version,
                capabilities: (*caps).clone(),
                at_ms: now_ms(),
                by: "daemon".into(),
            };
            let (state, name) = (state.clone(), name.clone());
            tokio::task::spawn_blocking(move || {
                let same = packages::handshakes::recorded(&state, &name).is_some_and(|h| {
                    h.version == record.version
                        && h.installed_at_ms == record.installed_at_ms
                        && h.capabilities == record.capabilities
                });
                if !same && let Err(e) = packages::handshakes::record(&state, &name, &record) {
                    tracing::warn!(extension = %name, error = %e, "cannot keep what the handshake declared");
                }
            });
        })
    }
}

/// A daemon setting (an environment variable) that does not parse: permanent, retrying will
/// not help.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SettingError(pub String);
