//! `conduit ext dev PATH`: the development loop. The package folder is installed in development
//! mode (`packages::install_dev`: the daemon runs it from the folder, unchecked), the folder is
//! watched (`watch.rs`), each change is built (`[dev] build`, `build.rs`), installed again and
//! restarted; the extension's stderr and every call the host makes to it (method, latency,
//! outcome, from the daemon's journal, `GET /v1/extensions/{name}/calls`) are streamed as
//! events (`out.rs`). On Ctrl-C, SIGTERM or SIGHUP the dev install is removed (unless `--keep`),
//! and with `--standalone` the scratch daemon (`scratch.rs`) is stopped and its folder deleted.
//!
//! Not here: what a dev install is (`packages/dev.rs`), how the daemon treats one (held
//! `stopped` after a failure instead of restarted, journaled: `ExtensionSpec::development`).
//!
//! Invariant: whatever ends the session — a signal, the daemon going away, an error — the
//! clean-up runs, and it decides from the registry, not from what the session believes it did:
//! a dev install of this folder under this name is removed if present.

mod build;
mod out;
mod scratch;
mod watch;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use conduit_host::client::Client;
use conduit_host::packages;
use conduit_host::state_dir::StateDir;
use nix::fcntl::{Flock, FlockArg};
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::common::StateArgs;
use super::outcome::CliError;
use out::{Event, Out};

/// How often the extension's log, calls and state are read.
const POLL: Duration = Duration::from_millis(200);

/// How long a daemon that was running may stop answering before the session gives up.
const DAEMON_GONE_AFTER: Duration = Duration::from_secs(10);

/// The longest stderr line shown whole, in bytes.
const MAX_STDERR_LINE: usize = build::MAX_LINE;

/// Develop a package: install it in development mode, rebuild and restart it on every change.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
The loop: the folder is installed as a development install (nothing is copied: the daemon runs
it from the folder as it is, and does not check its files), then watched. Each change (after
--debounce-ms without another) is built with the manifest's build command, if it has one:

  [dev]
  build = \"cargo build --release\"   # run by `sh -c` in the package folder
  ignore = [\"dist\"]                 # names whose changes do not count

and the extension is restarted. A failed build is shown and nothing is restarted: the last good
version keeps running. A version that fails to start (a syntax error) shows its stderr and stays
stopped with the cause, not restarted in a loop, until the next change. Changes under target/,
node_modules/, __pycache__/ and names starting with `.` never count.

Shown as it happens: build output (`build|`), the extension's stderr (`NAME|`), its state
(`ready:`, `stopped:`), and every call the host makes to it (`call: METHOD 1.20 ms ok`).
--json writes one JSON object a line instead: {\"event\": \"session\" | \"change\" |
\"build_started\" | \"build_output\" | \"build_finished\" | \"installed\" | \"install_failed\" |
\"state\" | \"stderr\" | \"call\" | \"missed_calls\" | \"note\" | \"ended\", …}
(docs/operations.md, \"The development loop\").

Ctrl-C (SIGINT), SIGTERM or SIGHUP end the session and leave nothing behind: the dev install
is removed with the log it wrote, unless --keep; with --standalone the scratch daemon is
stopped and its folder deleted.

The daemon: the one running on the state directory (--state-dir), or with --standalone a
scratch one in a new temporary folder. A daemon that runs as a service (its `GET /v1/health`
says so: systemd gave it INVOCATION_ID with NOTIFY_SOCKET or is its parent, or launchd's
XPC_SERVICE_NAME is conduit's label) is refused unless --force: it is someone's real daemon.

Examples:
  conduit ext dev ./my-package --standalone    a scratch daemon, gone at Ctrl-C
  conduit ext dev ./my-package                 the daemon already running
  conduit ext dev ./my-package --json | jq -c 'select(.event == \"call\")'

Exit codes: 0 ended by Ctrl-C, SIGTERM or SIGHUP, and cleaned up; 1 a failure (the daemon
stopped answering or exited, the clean-up failed); 2 unusable input (no package there, a
manifest that does not validate, the name installed from the store or in development from
another folder, a daemon running as a service without --force, another `ext dev` of the name);
3 no daemon runs on the state directory (start one, or pass --standalone).")]
pub(crate) struct Args {
    /// The package folder (it holds conduit-extension.toml).
    path: PathBuf,
    /// Start a scratch daemon on a new temporary state directory for this session, instead of
    /// using the running one; it is stopped and deleted at the end.
    #[arg(long)]
    standalone: bool,
    /// Keep the development install when the session ends (the running daemon keeps running
    /// it; `conduit ext remove NAME` removes it).
    #[arg(long, conflicts_with = "standalone")]
    keep: bool,
    /// Use a daemon that runs as a service anyway.
    #[arg(long)]
    force: bool,
    /// How long the folder must be quiet after a change before it is built and restarted.
    #[arg(long, default_value_t = 300, value_name = "MS", value_parser = clap::value_parser!(u64).range(50..=10_000))]
    debounce_ms: u64,
    /// Write events as JSON, one object a line.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: Args, state: &StateArgs, quiet: bool) -> Result<ExitCode, CliError> {
    if args.standalone && state.state_dir.is_some() {
        return Err(CliError::usage(anyhow::anyhow!(
            "--standalone makes its own scratch state directory; leave out --state-dir, or leave out --standalone to use the daemon of that state directory"
        )));
    }
    let rt = super::common::runtime()?;
    rt.block_on(main(args, state, quiet))
}

/// What ends a session.
#[derive(Debug)]
enum End {
    Signal(&'static str),
    Failed(CliError),
}

/// The signals that end a session.
struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Signals {
    fn install() -> Result<Signals, CliError> {
        let one = |k| {
            signal(k).map_err(|e| CliError::failure(anyhow::anyhow!("cannot catch signals: {e}")))
        };
        Ok(Signals {
            int: one(SignalKind::interrupt())?,
            term: one(SignalKind::terminate())?,
            hup: one(SignalKind::hangup())?,
        })
    }

    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "SIGINT",
            _ = self.term.recv() => "SIGTERM",
            _ = self.hup.recv() => "SIGHUP",
        }
    }
}

async fn main(args: Args, state_args: &StateArgs, quiet: bool) -> Result<ExitCode, CliError> {
    // Caught before anything exists to clean up, so a Ctrl-C at any point is handled.
    let mut signals = Signals::install()?;
    let out = Out {
        json: args.json,
        quiet,
    };
    let (state, client, mut scratch) = if args.standalone {
        let started = tokio::select! {
            s = scratch::Scratch::start() => s.map_err(CliError::failure)?,
            _ = signals.recv() => return Ok(ExitCode::SUCCESS),
        };
        (started.state.clone(), started.client.clone(), Some(started))
    } else {
        let state = state_args.open()?;
        let client = super::common::need_daemon_async(&state).await?;
        refuse_a_service(&client, &state, args.force).await?;
        (state, client, None)
    };
    let prepared = prepare(&state, &args.path);
    let (folder, manifest, lock) = match prepared {
        Ok(p) => p,
        Err(e) => {
            if let Some(s) = scratch.take() {
                s.stop().await;
            }
            return Err(e);
        }
    };
    let name = manifest.name.clone();
    let mut s = Session {
        out,
        state,
        client,
        folder,
        name: name.clone(),
        log_existed: false,
        data_existed: false,
        follow: None,
        carry: Vec::new(),
        cursor: 0,
        last_state: None,
        silent_since: None,
        installed: false,
    };
    s.log_existed = s.log_path().exists();
    s.data_existed = s.data_path().exists();
    s.follow = Some(super::ext_logs::Follow::from_end(&s.log_path()));
    s.emit(&Event::Session {
        name: name.clone(),
        version: manifest.version.clone(),
        path: s.folder.display().to_string(),
        state_dir: s.state.path().display().to_string(),
        daemon: if scratch.is_some() {
            "standalone"
        } else {
            "running"
        },
        debounce_ms: args.debounce_ms,
        build: manifest.dev.build.clone(),
    });
    let quiet_for = Duration::from_millis(args.debounce_ms);
    let end = tokio::select! {
        e = s.run(&manifest.dev.ignore, quiet_for, &mut scratch) => End::Failed(e),
        sig = signals.recv() => End::Signal(sig),
    };
    let cleaned = s.clean_up(args.keep, scratch.is_some()).await;
    let scratch_removed = match scratch {
        Some(sc) => Some(sc.stop().await),
        None => None,
    };
    // Unlinked while still held: a session that opened it meanwhile finds it locked.
    let _ = std::fs::remove_file(lock_path(&s.state, &name));
    drop(lock);
    let by = match &end {
        End::Signal(sig) => (*sig).to_owned(),
        End::Failed(e) => format!("an error: {:#}", e.error),
    };
    let removed = matches!(cleaned, Ok(true));
    s.emit(&Event::Ended {
        by,
        removed,
        kept: args.keep && s.installed,
        scratch_removed,
    });
    cleaned?;
    match end {
        End::Signal(_) => Ok(ExitCode::SUCCESS),
        End::Failed(e) => Err(e),
    }
}

/// Refuse a daemon that runs as a service, unless `force`.
async fn refuse_a_service(client: &Client, state: &StateDir, force: bool) -> Result<(), CliError> {
    let health = client.get("/v1/health").await.map_err(CliError::failure)?;
    let service = &health["service"];
    if service.is_null() || force {
        return Ok(());
    }
    let unit = service["unit"]
        .as_str()
        .map(|u| format!(" `{u}`"))
        .unwrap_or_default();
    Err(CliError::usage(anyhow::anyhow!(
        "the daemon on {} runs as a {} service{unit} ({}); `conduit ext dev` would run unchecked code under development in it. Use a scratch daemon (`conduit ext dev --standalone PATH`), or pass --force to use this one anyway",
        state.path().display(),
        service["manager"].as_str().unwrap_or("managed"),
        service["evidence"].as_str().unwrap_or("its health says so"),
    )))
}

/// Check the folder can be dev-installed and take the session's lock on its name.
fn prepare(
    state: &StateDir,
    path: &Path,
) -> Result<
    (
        PathBuf,
        conduit_host::manifest::Manifest,
        Flock<std::fs::File>,
    ),
    CliError,
> {
    let (folder, manifest) = packages::check_dev(state, path).map_err(CliError::usage)?;
    let lock_file = lock_path(state, &manifest.name);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_file)
        .map_err(|e| {
            CliError::failure(anyhow::anyhow!("cannot open {}: {e}", lock_file.display()))
        })?;
    let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|_| {
        CliError::usage(anyhow::anyhow!(
            "another `conduit ext dev` serves `{}` on {}; end it first (Ctrl-C in its terminal)",
            manifest.name,
            state.path().display()
        ))
    })?;
    Ok((folder, manifest, lock))
}

/// The lock file of the session developing `name` on a state directory.
fn lock_path(state: &StateDir, name: &str) -> PathBuf {
    state.run_dir().join(format!("dev-{name}.lock"))
}

/// One development session's state.
struct Session {
    out: Out,
    state: StateDir,
    client: Client,
    folder: PathBuf,
    name: String,
    /// Whether the package's log and data folder existed before the session (then they are
    /// left as they are).
    log_existed: bool,
    data_existed: bool,
    follow: Option<super::ext_logs::Follow>,
    /// A partial stderr line, waiting for its end.
    carry: Vec<u8>,
    /// The last call sequence number shown.
    cursor: u64,
    /// The last state shown: (state, pid, error).
    last_state: Option<(String, Option<u32>, Option<String>)>,
    /// Since when the daemon has not answered.
    silent_since: Option<tokio::time::Instant>,
    /// Whether a version was installed (and is what runs).
    installed: bool,
}

impl Session {
    fn emit(&self, ev: &Event) {
        // A closed stdout ends nothing: the session goes on until its signal.
        let _ = self.out.emit(&self.name, ev);
    }

    fn log_path(&self) -> PathBuf {
        self.state.logs_dir().join(format!("{}.log", self.name))
    }

    fn data_path(&self) -> PathBuf {
        self.state.path().join("data").join(&self.name)
    }

    /// The loop; returns only on a failure.
    async fn run(
        &mut self,
        ignore: &[String],
        quiet_for: Duration,
        scratch: &mut Option<scratch::Scratch>,
    ) -> CliError {
        let mut watcher = match watch::Watcher::start(&self.folder, ignore) {
            Ok(w) => w,
            Err(e) => return CliError::failure(e),
        };
        self.emit(&Event::Note {
            message: format!(
                "watching {} folder{} of {}",
                watcher.watched(),
                if watcher.watched() == 1 { "" } else { "s" },
                self.folder.display()
            ),
        });
        if let Err(e) = self.cycle(scratch).await {
            return e;
        }
        let mut tick = tokio::time::interval(POLL);
        loop {
            tokio::select! {
                ch = watcher.next(quiet_for) => match ch {
                    Ok(ch) => {
                        self.emit(&Event::Change { paths: ch.paths, more: ch.more });
                        if let Err(e) = self.cycle(scratch).await {
                            return e;
                        }
                    }
                    Err(e) => return CliError::failure(e),
                },
                _ = tick.tick() => {
                    if let Err(e) = self.poll(scratch).await {
                        return e;
                    }
                }
            }
        }
    }

    /// One round after a change: read the manifest, build, install, restart.
    async fn cycle(&mut self, scratch: &mut Option<scratch::Scratch>) -> Result<(), CliError> {
        let manifest = match conduit_host::manifest::Manifest::load(&self.folder) {
            Ok(m) => m,
            Err(e) => {
                self.emit(&Event::InstallFailed {
                    error: e.to_string(),
                    kept: self.installed,
                });
                return Ok(());
            }
        };
        if manifest.name != self.name {
            self.emit(&Event::InstallFailed {
                error: format!(
                    "the manifest's name changed from `{}` to `{}`; a session develops one name: end it (Ctrl-C) and start `conduit ext dev` again",
                    self.name, manifest.name
                ),
                kept: self.installed,
            });
            return Ok(());
        }
        if let Some(command) = &manifest.dev.build {
            self.emit(&Event::BuildStarted {
                command: command.clone(),
            });
            let mut b = match build::Build::start(command, &self.folder) {
                Ok(b) => b,
                Err(e) => {
                    self.emit(&Event::BuildFinished {
                        ok: false,
                        exit_code: None,
                        took_ms: 0,
                        tail: vec![format!("cannot start /bin/sh: {e}")],
                        kept: self.installed,
                    });
                    return Ok(());
                }
            };
            let mut tick = tokio::time::interval(POLL);
            let done = loop {
                tokio::select! {
                    step = b.next() => match step {
                        Ok(build::Step::Line(line)) => self.emit(&Event::BuildOutput { line }),
                        Ok(build::Step::Done { ok, code, took, tail }) => break (ok, code, took, tail),
                        Err(e) => break (false, None, Duration::ZERO, vec![format!("cannot wait for the build: {e}")]),
                    },
                    // The running version's stderr and calls go on while it builds.
                    _ = tick.tick() => self.poll(scratch).await?,
                }
            };
            let (ok, exit_code, took, tail) = done;
            self.emit(&Event::BuildFinished {
                ok,
                exit_code,
                took_ms: took.as_millis() as u64,
                tail,
                kept: !ok && self.installed,
            });
            if !ok {
                return Ok(());
            }
        }
        match packages::install_dev(&self.state, &self.folder) {
            Ok(rec) => {
                self.installed = true;
                self.emit(&Event::Installed {
                    name: rec.name.clone(),
                    version: rec.version.clone(),
                });
            }
            Err(e) => {
                self.emit(&Event::InstallFailed {
                    error: e.to_string(),
                    kept: self.installed,
                });
                return Ok(());
            }
        }
        // A reinstall changed the install time: the reload restarts it.
        if let Err(e) = self.client.post("/v1/reload", None).await {
            self.emit(&Event::Note {
                message: format!("the daemon could not apply the install: {e:#}"),
            });
        }
        Ok(())
    }

    /// Show what the extension wrote, the calls made to it, and its state, since the last look.
    async fn poll(&mut self, scratch: &mut Option<scratch::Scratch>) -> Result<(), CliError> {
        if let Some(sc) = scratch
            && let Some(why) = sc.exited()
        {
            return Err(CliError::failure(anyhow::anyhow!("{why}")));
        }
        self.stderr_lines();
        if !self.installed {
            return Ok(());
        }
        let name = self.name.clone();
        let calls = self
            .client
            .get(&format!(
                "/v1/extensions/{name}/calls?after={}",
                self.cursor
            ))
            .await;
        let view = self.client.get(&format!("/v1/extensions/{name}")).await;
        let (calls, view) = match (calls, view) {
            (Ok(c), Ok(v)) => (c, v),
            (Err(e), _) | (_, Err(e)) => {
                let since = *self
                    .silent_since
                    .get_or_insert_with(tokio::time::Instant::now);
                if since.elapsed() > DAEMON_GONE_AFTER {
                    return Err(CliError::failure(anyhow::anyhow!(
                        "the daemon on {} stopped answering: {e:#}",
                        self.state.path().display()
                    )));
                }
                return Ok(());
            }
        };
        self.silent_since = None;
        let missed = calls["missed"].as_u64().unwrap_or(0);
        if missed > 0 {
            self.emit(&Event::MissedCalls { missed });
        }
        for c in calls["calls"].as_array().into_iter().flatten() {
            let Ok(entry) =
                serde_json::from_value::<conduit_supervisor::journal::CallEntry>(c.clone())
            else {
                continue;
            };
            self.emit(&Event::Call {
                seq: entry.seq,
                method: entry.method,
                took_us: entry.took_us,
                outcome: entry.outcome,
                error_code: entry.error_code,
                error: entry.error,
            });
        }
        self.cursor = calls["next"].as_u64().unwrap_or(self.cursor);
        // The stderr a failed start wrote comes before the state that names its cause.
        self.stderr_lines();
        let st = view["state"].as_str().unwrap_or("unknown").to_owned();
        let pid = view["pid"].as_u64().map(|p| p as u32);
        // The cause of a run that is not running; a new start does not have one yet.
        let error = (st != "ready" && st != "starting")
            .then(|| view["last_error"].as_str().map(str::to_owned))
            .flatten();
        // A pid shown for a start is news only once it is ready.
        let now = (st.clone(), pid.filter(|_| st == "ready"), error.clone());
        if self.last_state.as_ref() != Some(&now) {
            self.last_state = Some(now);
            self.emit(&Event::State {
                state: st,
                pid,
                version: view["version"].as_str().unwrap_or("").to_owned(),
                error,
            });
        }
        Ok(())
    }

    /// Emit the whole lines the extension's log gained.
    fn stderr_lines(&mut self) {
        let Some(f) = self.follow.as_mut() else {
            return;
        };
        let new = f.read_new();
        if new.is_empty() {
            return;
        }
        self.carry.extend_from_slice(&new);
        let mut lines = Vec::new();
        while let Some(i) = self.carry.iter().position(|&b| b == b'\n') {
            let rest = self.carry.split_off(i + 1);
            self.carry.truncate(i);
            lines.push(build::line_text(&self.carry));
            self.carry = rest;
        }
        if self.carry.len() > MAX_STDERR_LINE {
            lines.push(build::line_text(&self.carry));
            self.carry.clear();
        }
        for line in lines {
            self.emit(&Event::Stderr { line });
        }
    }

    /// Remove the dev install of this folder, if there is one and `keep` is not set: disabled
    /// (the daemon stops it), removed, and the log and data folder it made deleted. With a
    /// scratch daemon the whole state directory goes, so only the stop matters. Whether
    /// something was removed.
    async fn clean_up(&mut self, keep: bool, standalone: bool) -> Result<bool, CliError> {
        if keep || standalone {
            return Ok(false);
        }
        let rec = match packages::get(&self.state, &self.name) {
            Ok(r) if r.dev && r.source == self.folder => r,
            _ => return Ok(false),
        };
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            CliError::failure(anyhow::anyhow!(
                "cannot remove the development install of `{}` ({what}: {e}); remove it with `conduit ext remove {}`",
                rec.name,
                rec.name
            ))
        };
        if packages::set_enabled(&self.state, &self.name, false).map_err(|e| fail("disable", &e))? {
            // Stopped before its record goes, as `conduit ext remove` does. A daemon that no
            // longer answers has nothing to stop.
            let _ = self.client.post("/v1/reload", None).await;
        }
        packages::remove(&self.state, &self.name).map_err(|e| fail("remove", &e))?;
        let _ = self.client.post("/v1/reload", None).await;
        if !self.log_existed {
            let log = self.log_path();
            let _ = std::fs::remove_file(&log);
            let _ = std::fs::remove_file(log.with_extension("log.1"));
        }
        if !self.data_existed {
            let _ = std::fs::remove_dir_all(self.data_path());
        }
        Ok(true)
    }
}
