//! `conduit ext install|remove|enable|disable`: change what is installed, then tell a running
//! daemon so the change takes effect at once.
//!
//! These work whether or not a daemon runs: the registry on disk is the truth, and the daemon
//! re-reads it when asked (`POST /v1/reload`). `remove` and `disable` stop a running extension
//! before its files go away.

use std::path::PathBuf;
use std::process::ExitCode;

use conduit_host::packages::{self, InstallOptions};
use serde_json::json;

use super::common::{StateArgs, print_json, reload, runtime};
use super::{CliError, print};

/// Install a package from a folder or a .tar.gz (or upgrade or reinstall it).
#[derive(Debug, clap::Args)]
#[command(after_help = "\
The manifest is checked before anything changes; every file is hashed, so a package changed
after install is refused at start. A failed install changes nothing.

Exit codes: 0 installed, 1 could not install (disk, registry), 2 the package is invalid or unsafe")]
pub(crate) struct InstallArgs {
    /// A package folder (holding conduit-extension.toml) or a .tar.gz of one.
    path: PathBuf,
    /// Allow installing a lower version than the one installed.
    #[arg(long)]
    allow_downgrade: bool,
    /// Print the installed record as JSON.
    #[arg(long)]
    json: bool,
}

/// Remove an installed package (stopping it first if the daemon runs it).
#[derive(Debug, clap::Args)]
pub(crate) struct NameArgs {
    /// The package's name (`conduit ext list` shows them).
    name: String,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) fn install(args: InstallArgs, state: &StateArgs) -> Result<ExitCode, CliError> {
    let state = state.open()?;
    let opts = InstallOptions {
        allow_downgrade: args.allow_downgrade,
        ..InstallOptions::default()
    };
    let outcome = packages::install(&state, &args.path, &opts).map_err(|e| {
        use conduit_host::packages::InstallError as E;
        // The error's message already includes its cause; as an error chain it would print it
        // twice.
        let flat = anyhow::anyhow!("{e}");
        match e {
            E::Write { .. } | E::Package(_) => CliError::failure(flat),
            _ => CliError::usage(flat),
        }
    })?;
    let rt = runtime()?;
    let daemon = reload(&rt, &state, args.json)?;
    if args.json {
        return print_json(&json!({ "change": outcome.to_string(), "package": &outcome.record, "daemon_running": daemon.is_some() }))
            .map(|()| ExitCode::SUCCESS);
    }
    print(&format!("{outcome}\n"))?;
    for note in super::ext_set::install_notes(&outcome.record) {
        eprintln!("note: {note}");
    }
    if daemon.is_none() {
        eprintln!(
            "(no daemon is running on {}; `conduit daemon run` starts it)",
            state.path().display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn remove(args: NameArgs, state: &StateArgs) -> Result<ExitCode, CliError> {
    let state = state.open_existing()?;
    packages::get(&state, &args.name).map_err(CliError::usage)?;
    let rt = runtime()?;
    // Stop it first, so no process runs from files being removed.
    if packages::set_enabled(&state, &args.name, false).map_err(CliError::failure)? {
        reload(&rt, &state, true)?;
    }
    let rec = packages::remove(&state, &args.name).map_err(CliError::failure)?;
    reload(&rt, &state, true)?;
    // Its logs go with it; its data folder (what the extension kept) is left for the operator.
    for path in [
        state.logs_dir().join(format!("{}.log", rec.name)),
        state.logs_dir().join(format!("{}.log.1", rec.name)),
        state.run_dir().join(format!("{}.pgid", rec.name)),
    ] {
        let _ = std::fs::remove_file(path);
    }
    let data = state.path().join("data").join(&rec.name);
    if data.exists() && !args.json {
        eprintln!(
            "(its data folder {} is kept; delete it if you no longer need it)",
            data.display()
        );
    }
    if args.json {
        return print_json(&json!({ "removed": rec.name, "version": rec.version }))
            .map(|()| ExitCode::SUCCESS);
    }
    print(&format!("removed {} {}\n", rec.name, rec.version))?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn set_enabled(
    args: NameArgs,
    enabled: bool,
    state: &StateArgs,
) -> Result<ExitCode, CliError> {
    let state = state.open_existing()?;
    let changed = packages::set_enabled(&state, &args.name, enabled).map_err(|e| match e {
        packages::PackageError::NotInstalled { .. } => CliError::usage(e),
        other => CliError::failure(other),
    })?;
    let rt = runtime()?;
    let daemon = if changed {
        reload(&rt, &state, args.json)?
    } else {
        None
    };
    let word = if enabled { "enabled" } else { "disabled" };
    if args.json {
        return print_json(&json!({ "name": args.name, "enabled": enabled, "changed": changed, "daemon_running": daemon.is_some() }))
            .map(|()| ExitCode::SUCCESS);
    }
    let text = if changed {
        format!("{} {word}\n", args.name)
    } else {
        format!("{} was already {word}\n", args.name)
    };
    print(&text)?;
    Ok(ExitCode::SUCCESS)
}
