//! `conduit ext install|remove|enable|disable|rollback`: change what is installed, then tell a
//! running daemon so the change takes effect at once (and, with `--wait`, see that it did).
//!
//! These work whether or not a daemon runs: the registry on disk is the truth, and the daemon
//! re-reads it when asked (`POST /v1/reload`). `remove` and `disable` stop a running extension
//! before its files go away.

use std::path::PathBuf;
use std::process::ExitCode;

use conduit_host::packages::{self, InstallError, InstallOptions};
use serde_json::json;

use super::common::{StateArgs, daemon, need_daemon, print_json, reload, runtime};
use super::ext_wait::{DEFAULT_WAIT, Since, WaitArgs, wait_ready};
use super::outcome::{CliError, print};

/// Install a package from a folder or a .tar.gz (or upgrade or reinstall it).
#[derive(Debug, clap::Args)]
#[command(after_help = "\
The manifest is checked before anything changes; every file is hashed, so a package changed
after install is refused at start. A failed install changes nothing.

With a daemon running, the command waits (30 s unless --wait=TIMEOUT; --no-wait does not) until
the package is ready. An upgrade, downgrade or reinstall keeps the version it replaced: if the new
one does not become ready, conduit rolls back to it by itself and says so (`conduit ext rollback
NAME` does it by hand).

Installing the same version again from another source, or with other content, is refused
unless --force; the message says what changed.

Exit codes: 0 installed (and ready, when waited for); 1 could not install (disk, registry), or it
did not become ready (rolled back when there was a previous version); 2 the package is invalid or
unsafe, a downgrade or a changed reinstall was refused; 3 --wait was given and no daemon runs")]
pub(crate) struct InstallArgs {
    /// A package folder (holding conduit-extension.toml) or a .tar.gz of one.
    path: PathBuf,
    /// Allow installing a lower version than the one installed.
    #[arg(long)]
    allow_downgrade: bool,
    /// Allow reinstalling the same version from another source or with other content.
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    wait: WaitArgs,
    /// Print the outcome as JSON: {"change", "package", "daemon_running", "ready"?, …}.
    #[arg(long)]
    json: bool,
}

/// Remove an installed package (stopping it first if the daemon runs it).
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Its logs (logs/NAME.log*) and its data folder (data/NAME) are kept; --purge deletes the logs
too. The data folder is always left for you to delete.

Exit codes: 0 removed; 1 registry or disk failure; 2 no such package")]
pub(crate) struct RemoveArgs {
    /// The package's name (`conduit ext list` shows them).
    #[arg(add = super::common::package_names())]
    name: String,
    /// Delete its logs too.
    #[arg(long)]
    purge: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// Disable an installed package (a running daemon stops it).
#[derive(Debug, clap::Args)]
pub(crate) struct NameArgs {
    /// The package's name (`conduit ext list` shows them).
    #[arg(add = super::common::package_names())]
    name: String,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// Enable an installed package (a running daemon starts it).
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Exit codes: 0 enabled (and ready, with --wait); 1 registry failure, or it did not become ready;
2 no such package; 3 --wait was given and no daemon runs")]
pub(crate) struct EnableArgs {
    /// The package's name (`conduit ext list` shows them).
    #[arg(add = super::common::package_names())]
    name: String,
    #[command(flatten)]
    wait: WaitArgs,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// Put back the version a package replaced at its last upgrade, downgrade or reinstall.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
The version rolled back from is kept in its place, so a second rollback undoes the first. With a
daemon running it restarts the package and waits (30 s unless --wait=TIMEOUT; --no-wait does
not) until it is ready.

Exit codes: 0 rolled back (and ready, when waited for); 1 registry or disk failure, or it did not
become ready; 2 no such package, or no previous version is kept")]
pub(crate) struct RollbackArgs {
    /// The package's name.
    #[arg(add = super::common::package_names())]
    name: String,
    #[command(flatten)]
    wait: WaitArgs,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

fn install_error(e: InstallError) -> CliError {
    use conduit_host::packages::InstallError as E;
    // The error's message already includes its cause; as an error chain it would print it
    // twice.
    let flat = anyhow::anyhow!("{e}");
    match e {
        E::Write { .. } | E::Package(_) => CliError::failure(flat),
        _ => CliError::usage(flat),
    }
}

/// The wait a command does: `Some(timeout)` or none. `default_on` commands wait when a daemon
/// runs unless `--no-wait`; the others only with `--wait`. An explicit `--wait` with no daemon
/// is exit 3.
fn wait_for(
    args: &WaitArgs,
    default_on: bool,
    daemon_running: bool,
    state: &conduit_host::state_dir::StateDir,
) -> Result<Option<std::time::Duration>, CliError> {
    match (args.wait, daemon_running) {
        (Some(_), false) => Err(CliError {
            code: 3,
            error: anyhow::anyhow!(
                "--wait needs a running daemon, and none runs on {}; start it with `conduit daemon run`, or leave out --wait",
                state.path().display()
            ),
        }),
        (Some(t), true) => Ok(Some(t)),
        (None, true) if default_on && !args.no_wait => Ok(Some(DEFAULT_WAIT)),
        _ => Ok(None),
    }
}

pub(crate) fn install(
    args: InstallArgs,
    state: &StateArgs,
    quiet: bool,
) -> Result<ExitCode, CliError> {
    let state = state.open()?;
    let rt = runtime()?;
    let running = daemon(&rt, &state).is_some();
    // Refuse `--wait` without a daemon before anything changes.
    let wait = wait_for(&args.wait, true, running, &state)?;
    let opts = InstallOptions {
        allow_downgrade: args.allow_downgrade,
        force: args.force,
        ..InstallOptions::default()
    };
    let outcome = packages::install(&state, &args.path, &opts).map_err(install_error)?;
    let name = outcome.record.name.clone();
    let since = Since::started_now();
    let daemon_report = reload(&rt, &state, args.json || quiet)?;
    let mut out = json!({ "change": outcome.to_string(), "package": &outcome.record, "daemon_running": daemon_report.is_some() });
    if !outcome.changes.is_empty() {
        out["changes"] = json!(outcome.changes);
    }
    if let Some(p) = &outcome.previous {
        out["previous"] = json!(p);
    }
    if !args.json {
        print(&format!("{outcome}\n"))?;
        for note in super::ext_set::install_notes(&outcome.record) {
            eprintln!("note: {note}");
        }
    }
    let wait = wait.filter(|_| outcome.record.enabled);
    let (Some(timeout), Some(_)) = (wait, &daemon_report) else {
        if args.json {
            print_json(&out)?;
        } else if daemon_report.is_none() && !quiet {
            eprintln!(
                "(no daemon is running on {}; `conduit daemon run` starts it)",
                state.path().display()
            );
        } else if !outcome.record.enabled && !quiet {
            eprintln!(
                "({name} is disabled, so it was not started; `conduit ext enable {name}` starts it)"
            );
        } else if !quiet {
            eprintln!(
                "(not waited for; `conduit ext status {name}` shows whether it became ready)"
            );
        }
        return Ok(ExitCode::SUCCESS);
    };
    let client = need_daemon(&rt, &state)?;
    match wait_ready(&rt, &client, &name, since, timeout)? {
        Ok(view) => {
            out["ready"] = json!(true);
            out["state"] = json!(view.status.state);
            if args.json {
                print_json(&out)?;
            } else if !quiet {
                eprintln!("{}", ready_line(&view));
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(not_ready) => {
            let mut msg = not_ready.describe(&name);
            let mut wait_json = not_ready.json();
            // The version it replaced is kept: put it back.
            if outcome.previous.is_some() {
                let back = packages::rollback(&state, &name).map_err(|e| {
                    CliError::failure(anyhow::anyhow!(
                        "{msg}\nand the automatic rollback failed: {e}"
                    ))
                })?;
                let since = Since::started_now();
                reload(&rt, &state, true)?;
                let again = wait_ready(&rt, &client, &name, since, timeout)?;
                let word = match &again {
                    Ok(_) => "which is ready".to_owned(),
                    Err(n) => format!("which is not ready either: {}", n.describe(&name)),
                };
                msg.push_str(&format!(
                    "\nrolled back to {name} {}, {word}\n({name} {} is kept: `conduit ext rollback {name}` tries it again)",
                    back.to.version, back.from.version
                ));
                wait_json["rolled_back_to"] = json!(back.to.version);
                wait_json["rollback_ready"] = json!(again.is_ok());
            }
            if args.json {
                for (k, v) in wait_json.as_object().into_iter().flatten() {
                    out[k] = v.clone();
                }
                print_json(&out)?;
            }
            Err(CliError::failure(anyhow::anyhow!("{msg}")))
        }
    }
}

/// `echo 0.1.0 is ready (pid 1234)`.
fn ready_line(view: &conduit_host::daemon::ExtensionView) -> String {
    let s = &view.status;
    match s.pid {
        Some(pid) => format!("{} {} is ready (pid {pid})", s.name, s.version),
        None => format!("{} {} is ready", s.name, s.version),
    }
}

pub(crate) fn remove(args: RemoveArgs, state: &StateArgs) -> Result<ExitCode, CliError> {
    let state = state.open_existing()?;
    packages::get(&state, &args.name).map_err(CliError::usage)?;
    let rt = runtime()?;
    // Stop it first, so no process runs from files being removed.
    if packages::set_enabled(&state, &args.name, false).map_err(CliError::failure)? {
        reload(&rt, &state, true)?;
    }
    let rec = packages::remove(&state, &args.name).map_err(CliError::failure)?;
    reload(&rt, &state, true)?;
    // Its logs are kept unless --purge; its data folder (what the extension kept) is always
    // left for the operator.
    let logs = [
        state.logs_dir().join(format!("{}.log", rec.name)),
        state.logs_dir().join(format!("{}.log.1", rec.name)),
    ];
    let mut purged = Vec::new();
    if args.purge {
        for path in &logs {
            if std::fs::remove_file(path).is_ok() {
                purged.push(path.clone());
            }
        }
    }
    let kept_logs: Vec<&PathBuf> = logs.iter().filter(|p| p.exists()).collect();
    let data = state.path().join("data").join(&rec.name);
    if args.json {
        return print_json(&json!({
            "removed": rec.name,
            "version": rec.version,
            "logs_kept": kept_logs,
            "logs_purged": purged,
            "data_kept": data.exists().then_some(&data),
        }))
        .map(|()| ExitCode::SUCCESS);
    }
    print(&format!("removed {} {}\n", rec.name, rec.version))?;
    if let Some(log) = kept_logs.first() {
        note!(
            "(its logs {} are kept; `conduit ext remove --purge` deletes them, or delete them by hand)",
            log.display()
        );
    }
    if data.exists() {
        note!(
            "(its data folder {} is kept; delete it if you no longer need it)",
            data.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn disable(args: NameArgs, state: &StateArgs) -> Result<ExitCode, CliError> {
    let state = state.open_existing()?;
    let changed = packages::set_enabled(&state, &args.name, false).map_err(|e| match e {
        packages::PackageError::NotInstalled { .. } => CliError::usage(e),
        other => CliError::failure(other),
    })?;
    let rt = runtime()?;
    let daemon = if changed {
        reload(&rt, &state, args.json)?
    } else {
        None
    };
    if args.json {
        return print_json(&json!({ "name": args.name, "enabled": false, "changed": changed, "daemon_running": daemon.is_some() }))
            .map(|()| ExitCode::SUCCESS);
    }
    let text = if changed {
        format!("{} disabled\n", args.name)
    } else {
        format!("{} was already disabled\n", args.name)
    };
    print(&text)?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn enable(
    args: EnableArgs,
    state: &StateArgs,
    quiet: bool,
) -> Result<ExitCode, CliError> {
    let state = state.open_existing()?;
    let rt = runtime()?;
    let running = daemon(&rt, &state).is_some();
    let wait = wait_for(&args.wait, false, running, &state)?;
    let changed = packages::set_enabled(&state, &args.name, true).map_err(|e| match e {
        packages::PackageError::NotInstalled { .. } => CliError::usage(e),
        other => CliError::failure(other),
    })?;
    let since = if changed {
        Since::started_now()
    } else {
        Since::Now
    };
    let daemon = if changed {
        reload(&rt, &state, args.json || quiet)?
    } else {
        daemon(&rt, &state).map(|_| serde_json::Value::Null)
    };
    let mut out = json!({ "name": args.name, "enabled": true, "changed": changed, "daemon_running": daemon.is_some() });
    if !args.json {
        let text = if changed {
            format!("{} enabled\n", args.name)
        } else {
            format!("{} was already enabled\n", args.name)
        };
        print(&text)?;
    }
    finish_wait(
        &rt, &state, &args.name, since, wait, args.json, quiet, &mut out,
    )
}

pub(crate) fn rollback(
    args: RollbackArgs,
    state: &StateArgs,
    quiet: bool,
) -> Result<ExitCode, CliError> {
    let state = state.open_existing()?;
    let rt = runtime()?;
    let running = daemon(&rt, &state).is_some();
    let wait = wait_for(&args.wait, true, running, &state)?;
    let back = packages::rollback(&state, &args.name).map_err(|e| match e {
        packages::PackageError::NotInstalled { .. } | packages::PackageError::NoPrevious { .. } => {
            CliError::usage(e)
        }
        other => CliError::failure(other),
    })?;
    let since = Since::started_now();
    let daemon = reload(&rt, &state, args.json || quiet)?;
    let mut out = json!({ "name": args.name, "from": back.from.version, "to": back.to.version, "package": back.to, "daemon_running": daemon.is_some() });
    if !args.json {
        print(&format!(
            "rolled back {} from {} to {} ({} is kept: a second rollback returns to it)\n",
            args.name, back.from.version, back.to.version, back.from.version
        ))?;
    }
    let wait = wait.filter(|_| back.to.enabled);
    finish_wait(
        &rt, &state, &args.name, since, wait, args.json, quiet, &mut out,
    )
}

/// Wait (when asked) and print the outcome; the JSON object `out` gets `ready` and the state.
#[allow(clippy::too_many_arguments)]
pub(crate) fn finish_wait(
    rt: &tokio::runtime::Runtime,
    state: &conduit_host::state_dir::StateDir,
    name: &str,
    since: Since,
    wait: Option<std::time::Duration>,
    json_out: bool,
    quiet: bool,
    out: &mut serde_json::Value,
) -> Result<ExitCode, CliError> {
    let Some(timeout) = wait else {
        if json_out {
            print_json(out)?;
        }
        return Ok(ExitCode::SUCCESS);
    };
    let client = need_daemon(rt, state)?;
    match wait_ready(rt, &client, name, since, timeout)? {
        Ok(view) => {
            out["ready"] = json!(true);
            out["state"] = json!(view.status.state);
            if json_out {
                print_json(out)?;
            } else if !quiet {
                eprintln!("{}", ready_line(&view));
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(not_ready) => {
            if json_out {
                for (k, v) in not_ready.json().as_object().into_iter().flatten() {
                    out[k] = v.clone();
                }
                print_json(out)?;
            }
            Err(CliError::failure(anyhow::anyhow!(
                "{}",
                not_ready.describe(name)
            )))
        }
    }
}
