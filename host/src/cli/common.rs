//! What the subcommands share: the state directory, a runtime, the daemon's client, output.

use std::path::PathBuf;

use anyhow::Context;
use conduit_host::client::Client;
use conduit_host::state_dir::{self, StateDir};

use super::outcome::{CliError, print};

/// `--state-dir`, shared by every command that touches state.
#[derive(Clone, Debug, Default, clap::Args)]
pub(crate) struct StateArgs {
    /// The state directory (packages, logs, the daemon's socket). Default: $CONDUIT_STATE_DIR,
    /// else $XDG_STATE_HOME/conduit or ~/.local/state/conduit (macOS: ~/Library/Application
    /// Support/conduit).
    #[arg(long, global = true, value_name = "DIR")]
    pub(crate) state_dir: Option<PathBuf>,
}

impl StateArgs {
    /// Resolve and open a state directory that must already exist, for a command that changes
    /// what is installed (remove, enable, disable, rollback, set): a missing one is refused
    /// rather than created empty (a mistyped --state-dir would otherwise look like "nothing
    /// installed"), and nothing is written before the refusal.
    pub(crate) fn open_existing(&self) -> Result<StateDir, CliError> {
        let resolved =
            state_dir::resolve_from_env(self.state_dir.as_deref()).map_err(CliError::usage)?;
        if !resolved.path.exists() {
            return Err(missing(&resolved));
        }
        self.open()
    }

    /// Resolve the state directory for a command that only reads it or asks the daemon
    /// (`ext list`, `ext status`, `metrics`, the lists, `events push`, …): nothing is created
    /// and no mode changed, so a query never writes to disk. The platform default not existing
    /// yet is a normal first run (nothing installed, no daemon); a path someone gave that does
    /// not exist is most likely a typo, and refused.
    pub(crate) fn open_read_only(&self) -> Result<StateDir, CliError> {
        let resolved =
            state_dir::resolve_from_env(self.state_dir.as_deref()).map_err(CliError::usage)?;
        let given = !matches!(resolved.source, state_dir::StateDirSource::PlatformDefault);
        if given && !resolved.path.exists() {
            return Err(missing(&resolved));
        }
        StateDir::read_only(&resolved.path)
            .with_context(|| format!("state directory from {}", resolved.source))
            .map_err(CliError::usage)
    }

    /// Resolve and open the state directory (created if missing).
    pub(crate) fn open(&self) -> Result<StateDir, CliError> {
        let resolved =
            state_dir::resolve_from_env(self.state_dir.as_deref()).map_err(CliError::usage)?;
        // Which folders are open to others before the open tightens them, so the note names
        // the one that was (the root, or a layout folder such as `logs/`).
        let loose = loose_folders(&resolved.path);
        let state = StateDir::open(&resolved.path)
            .with_context(|| format!("state directory from {}", resolved.source))
            .map_err(CliError::usage)?;
        if state.tightened_from().is_some() {
            for (path, mode) in &loose {
                eprintln!(
                    "note: {} was mode {mode:o}, open to other users; made it owner-only (0700)",
                    path.display()
                );
            }
        }
        Ok(state)
    }
}

/// The refusal of a state directory that does not exist (exit 2).
fn missing(resolved: &state_dir::ResolvedStateDir) -> CliError {
    CliError::usage(anyhow::anyhow!(
        "no conduit state directory at {} (from {}): nothing is installed there; check --state-dir or \
         CONDUIT_STATE_DIR, or install a package first with `conduit ext install PATH`",
        resolved.path.display(),
        resolved.source
    ))
}

/// The state directory and those of its layout folders that exist and give other users any
/// access, with their modes.
fn loose_folders(root: &std::path::Path) -> Vec<(PathBuf, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let layout = ["packages", "logs", "run", "artifacts", "tmp"];
    for p in std::iter::once(root.to_owned()).chain(layout.iter().map(|s| root.join(s))) {
        if let Ok(m) = std::fs::metadata(&p)
            && m.is_dir()
            && m.permissions().mode() & 0o077 != 0
        {
            out.push((p, m.permissions().mode() & 0o7777));
        }
    }
    out
}

/// The installed packages' names as shell completions of a package name argument
/// (`conduit ext status <TAB>`), each with its description. Run by the completion engine in
/// this binary (`COMPLETE=<shell> conduit -- <words>`); it reads the registry of the state
/// directory the words name (`--state-dir DIR`), else $CONDUIT_STATE_DIR or the default, and
/// never creates or changes anything. No state directory, or one that cannot be read: none.
pub(crate) fn package_names() -> clap_complete::ArgValueCandidates {
    clap_complete::ArgValueCandidates::new(|| {
        let words: Vec<std::ffi::OsString> = std::env::args_os().collect();
        let flag = words.iter().enumerate().find_map(|(i, w)| {
            let w = w.to_str()?;
            match w.strip_prefix("--state-dir") {
                Some("") => words.get(i + 1).map(PathBuf::from),
                Some(v) => v.strip_prefix('=').map(PathBuf::from),
                None => None,
            }
        });
        let Ok(resolved) = state_dir::resolve_from_env(flag.as_deref()) else {
            return Vec::new();
        };
        let Ok(state) = StateDir::read_only(&resolved.path) else {
            return Vec::new();
        };
        conduit_host::packages::list(&state)
            .unwrap_or_default()
            .into_iter()
            .map(|r| {
                let c = clap_complete::CompletionCandidate::new(r.name);
                match r.manifest.description {
                    Some(d) => c.help(Some(d.into())),
                    None => c,
                }
            })
            .collect()
    })
}

static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `-q`: leave out notes on stderr.
pub(crate) fn set_quiet(quiet: bool) {
    QUIET.store(quiet, std::sync::atomic::Ordering::Relaxed);
}

/// Whether `-q` was given.
pub(crate) fn quiet() -> bool {
    QUIET.load(std::sync::atomic::Ordering::Relaxed)
}

/// A small runtime for one command.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
        .map_err(CliError::failure)
}

/// The running daemon's client, if one answers on this state directory's socket.
pub(crate) fn daemon(rt: &tokio::runtime::Runtime, state: &StateDir) -> Option<Client> {
    rt.block_on(Client::connect(&conduit_host::daemon::socket_path(state)))
}

/// Print `value` as pretty JSON and a newline.
pub(crate) fn print_json(value: &impl serde::Serialize) -> Result<(), CliError> {
    let mut text = serde_json::to_string_pretty(value)
        .context("cannot serialize the output")
        .map_err(CliError::failure)?;
    text.push('\n');
    print(&text)
}

/// Ask a running daemon to apply the registry; say what it did. No daemon: nothing to do.
pub(crate) fn reload(
    rt: &tokio::runtime::Runtime,
    state: &StateDir,
    quiet: bool,
) -> Result<Option<serde_json::Value>, CliError> {
    let Some(client) = daemon(rt, state) else {
        return Ok(None);
    };
    let report = rt
        .block_on(client.post("/v1/reload", None))
        .context("the package registry changed, but the running daemon could not apply it; run `conduit ext list` to see its state")
        .map_err(CliError::failure)?;
    if !quiet {
        // `started` means a start was begun, not that it succeeded: the wait (`--wait`) or
        // `conduit ext status` says how it went.
        for (key, verb) in [
            ("started", "is starting"),
            ("restarted", "is restarting"),
            ("stopped", "stopped"),
        ] {
            for name in report[key]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str())
            {
                eprintln!("the running daemon {verb} `{name}`");
            }
        }
        for e in report["errors"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str())
        {
            eprintln!("warning: {e}");
        }
    }
    Ok(Some(report))
}

/// The running daemon's client, or exit code 3 saying how to start one.
pub(crate) fn need_daemon(
    rt: &tokio::runtime::Runtime,
    state: &StateDir,
) -> Result<Client, CliError> {
    daemon(rt, state).ok_or_else(|| CliError {
        code: 3,
        error: anyhow::anyhow!(
            "no daemon is running on {}; start it with `conduit daemon run`",
            state.path().display()
        ),
    })
}

/// [`need_daemon`] from inside a runtime.
pub(crate) async fn need_daemon_async(state: &StateDir) -> Result<Client, CliError> {
    Client::connect(&conduit_host::daemon::socket_path(state))
        .await
        .ok_or_else(|| CliError {
            code: 3,
            error: anyhow::anyhow!(
                "no daemon is running on {}; start it with `conduit daemon run`, or pass --standalone for a scratch one",
                state.path().display()
            ),
        })
}

/// An API error answer as a CLI error: a 4xx is the caller's input (exit 2), anything else a
/// failure (exit 1); the message is the API's own.
pub(crate) fn api_error(status: hyper::StatusCode, body: &serde_json::Value) -> CliError {
    let msg = anyhow::anyhow!(
        "{}",
        body["error"]["message"]
            .as_str()
            .unwrap_or("the daemon refused")
    );
    if status.is_client_error() {
        CliError::usage(msg)
    } else {
        CliError::failure(msg)
    }
}

/// The daemon's client for a view (`top`, `web`), and the state directory it serves, found
/// without creating or changing anything; exit 3, saying how to start one, when none answers.
pub(crate) fn view_client(
    rt: &tokio::runtime::Runtime,
    state: &StateArgs,
) -> Result<(PathBuf, Client), CliError> {
    let dir = state.open_read_only()?;
    let client = need_daemon(rt, &dir)?;
    Ok((dir.path().to_owned(), client))
}
