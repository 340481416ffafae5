//! `conduit config show|get|set|unset`: the daemon's own settings (today, retention), kept in
//! `<state>/settings.toml` beside the packages' settings. A running daemon reads them again
//! before its next sweep (told at once through a reload); no restart.

use std::process::ExitCode;

use conduit_host::packages::settings;
use conduit_host::retention::RetentionSettings;
use conduit_host::retention::settings::{Entry, KEYS, key};
use serde_json::json;

use super::common::{StateArgs, print_json, reload, runtime};
use super::outcome::{CliError, print};

/// The keys, their defaults and what each decides, for `--help`.
fn keys_help() -> String {
    let mut out = String::from("Settings (default in brackets):\n");
    for k in KEYS {
        out.push_str(&format!(
            "  {:<30} [{}] {}\n",
            k.full_name(),
            k.default_value(),
            k.what
        ));
    }
    out.push_str(
        "\nDurations are a whole number and a unit (s, m, h, d, w): 30d, 12h, 10m. Sizes: 512MiB,\n\
         2GiB, 500MB or bytes. `KEY=default` (or `conduit config unset KEY`) goes back to the\n\
         default. docs/operations.md (\"Retention\") says how to size them.\n\n\
         Exit codes: 0 done; 1 the settings file could not be read or written; 2 an unknown key,\n\
         a value out of its bounds, or a settings file with a bad value (nothing changed)",
    );
    out
}

/// Show, read or change the daemon's settings.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Every setting with its value, its default and where the value comes from.
    #[command(after_help = keys_help())]
    Show(ShowArgs),
    /// One setting's value in force.
    #[command(after_help = keys_help())]
    Get(GetArgs),
    /// Set one or more settings (all are checked before any is written).
    #[command(after_help = keys_help())]
    Set(SetArgs),
    /// Put settings back to their defaults.
    #[command(after_help = keys_help())]
    Unset(UnsetArgs),
}

#[derive(Debug, clap::Args)]
pub(crate) struct ShowArgs {
    /// Print [{"key", "value", "default", "source", "what"}, …].
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct GetArgs {
    /// The setting, e.g. `retention.artifacts.max_age`.
    key: String,
    /// Print {"key", "value", "default", "source", "what"}.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct SetArgs {
    /// One or more KEY=VALUE, e.g. `retention.artifacts.max_bytes=10GiB`.
    #[arg(required = true, value_name = "KEY=VALUE")]
    settings: Vec<String>,
    /// Print every setting afterwards, as `config show --json` does.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct UnsetArgs {
    /// One or more keys.
    #[arg(required = true, value_name = "KEY")]
    keys: Vec<String>,
    /// Print every setting afterwards, as `config show --json` does.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(cmd: Command, state: &StateArgs) -> Result<ExitCode, CliError> {
    // `show` and `get` only read; `set` and `unset` write settings.toml.
    let state = match cmd {
        Command::Show(_) | Command::Get(_) => state.open_read_only()?,
        Command::Set(_) | Command::Unset(_) => state.open_existing()?,
    };
    // A file with a bad value is the operator's to fix: exit 2, naming the file and the key.
    let current = settings::retention(&state).map_err(CliError::usage)?;
    match cmd {
        Command::Show(a) => show(&current.entries(), a.json),
        Command::Get(a) => {
            let k = key(&a.key).map_err(CliError::usage)?;
            let full = k.full_name();
            let entries = current.entries();
            let e = entries
                .iter()
                .find(|e| e.key == full)
                .expect("every key has an entry");
            if a.json {
                print_json(e)?;
            } else {
                print(&format!("{}\n", e.value))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Set(a) => {
            let mut next = current;
            for pair in &a.settings {
                let Some((k, v)) = pair.split_once('=') else {
                    return Err(CliError::usage(anyhow::anyhow!(
                        "`{pair}` is not KEY=VALUE; e.g. `retention.artifacts.max_age=30d` (see `conduit config set --help`)"
                    )));
                };
                next.apply(k.trim(), v.trim()).map_err(CliError::usage)?;
            }
            save(&state, &next, a.json)
        }
        Command::Unset(a) => {
            let mut next = current;
            for k in &a.keys {
                next.unset(k.trim()).map_err(CliError::usage)?;
            }
            save(&state, &next, a.json)
        }
    }
}

fn save(
    state: &conduit_host::state_dir::StateDir,
    next: &RetentionSettings,
    json_out: bool,
) -> Result<ExitCode, CliError> {
    settings::save_retention(state, next).map_err(CliError::failure)?;
    let rt = runtime()?;
    // The reload tells a running daemon to read the settings again now.
    let daemon = reload(&rt, state, true)?;
    if json_out {
        print_json(&json!({
            "settings": next.entries(),
            "daemon_running": daemon.is_some(),
        }))?;
    } else {
        show(&next.entries(), false)?;
        if daemon.is_some() {
            note!("the running daemon sweeps under these settings from now on");
        } else {
            note!(
                "(no daemon is running; the settings apply at its next start, and to `conduit gc`)"
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn show(entries: &[Entry], json_out: bool) -> Result<ExitCode, CliError> {
    if json_out {
        print_json(&entries)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = format!("{:<30} {:<10} {:<10} SOURCE\n", "KEY", "VALUE", "DEFAULT");
    for e in entries {
        out.push_str(&format!(
            "{:<30} {:<10} {:<10} {}\n",
            e.key, e.value, e.default, e.source
        ));
    }
    print(&out)?;
    Ok(ExitCode::SUCCESS)
}
