//! `conduit ext set NAME KEY=VALUE…`: the operator's settings for one package (its limits,
//! whether its declared sandbox paths are granted, whether its sandbox is off), written to
//! `<state>/settings.toml`; a running daemon restarts the package under them at once.

use std::process::ExitCode;

use conduit_host::packages::{self, settings};
use conduit_supervisor::limits::{self, LimitKey};
use serde_json::json;

use super::common::{StateArgs, print_json, reload, runtime};
use super::outcome::{CliError, print};

/// Set an installed package's limits or sandbox (the operator's decision; it wins over the
/// package's asks).
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Keys:
  limits.memory=256MiB     resident memory of the whole process tree (16MiB to 1TiB)
  limits.cpu=0.5           share of one CPU (0.01 to 1024; 50% also works)
  limits.tasks=64          processes and threads (1 to 100000)
  limits.open_files=256    descriptors per process (16 to 1048576)
  limits.KEY=default       back to the package's ask or the default
  sandbox=off|on           turn the filesystem sandbox off (or back on) for this package
  sandbox.grant=yes|no     grant the paths the package's [sandbox] declares

Examples:
  conduit ext set notes limits.memory=256MiB limits.cpu=0.25
  conduit ext set notes sandbox.grant=yes

A running daemon restarts the package under the new settings. `conduit ext status NAME` shows
the limits in force and where each came from.

Exit codes: 0 set; 2 no such package, or a key or value that cannot be used (nothing changed)")]
pub(crate) struct Args {
    /// The package's name (`conduit ext list` shows them).
    #[arg(add = super::common::package_names())]
    name: String,
    /// One or more KEY=VALUE (see the keys below).
    #[arg(required = true, value_name = "KEY=VALUE")]
    settings: Vec<String>,
    /// Print the package's settings and the limits now in force as JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: Args, state: &StateArgs) -> Result<ExitCode, CliError> {
    let state = state.open_existing()?;
    let rec = packages::get(&state, &args.name).map_err(CliError::usage)?;
    // Every pair is checked before any is written: a bad one changes nothing.
    let mut pairs = Vec::new();
    let mut trial = settings::for_package(&state, &args.name).map_err(CliError::failure)?;
    for s in &args.settings {
        let Some((k, v)) = s.split_once('=') else {
            return Err(CliError::usage(anyhow::anyhow!(
                "`{s}` is not KEY=VALUE; e.g. `limits.memory=256MiB` (see `conduit ext set --help`)"
            )));
        };
        settings::apply(&mut trial, k.trim(), v.trim()).map_err(CliError::usage)?;
        pairs.push((k.trim().to_owned(), v.trim().to_owned()));
    }
    let mut now = trial;
    for (k, v) in &pairs {
        now = settings::set(&state, &args.name, k, v).map_err(CliError::failure)?;
    }
    let resolved = limits::resolve(&rec.name, &rec.manifest.limits, &now.limits);
    let rt = runtime()?;
    let daemon = reload(&rt, &state, args.json)?;
    if args.json {
        return print_json(&json!({
            "name": rec.name,
            "limits": resolved.limits,
            "sources": resolved.sources,
            "sandbox": if now.sandbox_off { "off" } else { "on" },
            "sandbox_granted": now.grant,
            "daemon_running": daemon.is_some(),
        }))
        .map(|()| ExitCode::SUCCESS);
    }
    let mut text = format!("{}: ", rec.name);
    let shown: Vec<String> = LimitKey::ALL
        .iter()
        .map(|k| format!("{k} {}", resolved.limits.show(*k)))
        .collect();
    text.push_str(&format!("limits {}", shown.join(", ")));
    text.push_str(if now.sandbox_off {
        "; sandbox off\n"
    } else if now.grant {
        "; sandbox on, declared paths granted\n"
    } else {
        "; sandbox on\n"
    });
    print(&text)?;
    if daemon.is_none() {
        eprintln!("(no daemon is running; the settings apply at its next start)");
    }
    Ok(ExitCode::SUCCESS)
}

/// What an operator should know of a package at install: the limits and sandbox paths it asks
/// for, and whether this system has a sandbox at all.
pub(crate) fn install_notes(rec: &packages::PackageRecord) -> Vec<String> {
    let mut notes = Vec::new();
    let m = &rec.manifest;
    if !m.limits.is_empty() {
        let r = limits::resolve(&rec.name, &m.limits, &Default::default());
        let shown: Vec<String> = LimitKey::ALL
            .iter()
            .filter(|k| m.limits.get(**k).is_some())
            .map(|k| format!("{k} {}", r.limits.show(*k)))
            .collect();
        if !shown.is_empty() {
            notes.push(format!(
                "limits in force from the package: {}",
                shown.join(", ")
            ));
        }
        notes.extend(r.not_granted);
    }
    if !m.sandbox.is_empty() {
        notes.push(packages::launch::sandbox_ask(&rec.name, m));
    }
    if let Err(why) = conduit_supervisor::sandbox::landlock_abi() {
        notes.push(format!(
            "no filesystem sandbox on this system ({why}): the extension can read and write whatever this user can"
        ));
    }
    notes
}

/// The `ext status` lines of an extension's limits, sandbox and use.
pub(crate) fn write_resources(out: &mut String, r: &conduit_supervisor::Resources) {
    use std::fmt::Write as _;
    let l = &r.limits;
    let _ = writeln!(
        out,
        "  limits        memory {}, cpu {}, tasks {}, open files {}",
        l.show(LimitKey::Memory),
        l.show(LimitKey::Cpu),
        l.tasks,
        l.open_files
    );
    let _ = writeln!(out, "  enforced by   {}", r.mechanism);
    write_sandbox(out, &r.sandbox);
    if let Some(u) = &r.usage {
        let _ = writeln!(
            out,
            "  using         memory {}, cpu {:.2}, tasks {} in {} processes{}",
            limits::format_bytes(u.rss_bytes),
            u.cpu,
            u.tasks,
            u.processes,
            if u.throttled {
                " (held to its CPU share now)"
            } else {
                ""
            }
        );
    }
    if r.limit_stops > 0 {
        let _ = writeln!(out, "  limit stops   {}", r.limit_stops);
    }
    for n in &r.notes {
        let _ = writeln!(out, "  note          {n}");
    }
}

/// The sandbox with every path it lets through, so a refusal (`EACCES`, `Permission denied`)
/// can be checked against the list: reads, then writes (the device files every extension may
/// write are named once, not listed).
fn write_sandbox(out: &mut String, sandbox: &conduit_supervisor::sandbox::SandboxStatus) {
    use conduit_supervisor::sandbox::{DEVICE_WRITE, SandboxStatus};
    use std::fmt::Write as _;
    let SandboxStatus::Landlock { abi, read, write } = sandbox else {
        let _ = writeln!(out, "  sandbox       {}", sandbox.summary());
        return;
    };
    let _ = writeln!(
        out,
        "  sandbox       Landlock (ABI {abi}): any path not below is refused (EACCES)"
    );
    let shown = |paths: &[std::path::PathBuf]| -> Vec<String> {
        paths
            .iter()
            .filter(|p| !DEVICE_WRITE.iter().any(|d| p.as_os_str() == *d))
            .map(|p| p.display().to_string())
            .collect()
    };
    wrapped(out, "reads", &shown(read));
    let mut writes = shown(write);
    if write
        .iter()
        .any(|p| DEVICE_WRITE.iter().any(|d| p.as_os_str() == *d))
    {
        writes.push(
            "the device files /dev/null, /dev/zero, /dev/full, /dev/random, /dev/urandom, /dev/shm"
                .into(),
        );
    }
    wrapped(out, "writes", &writes);
}

/// `  LABEL         a, b, c` with the list wrapped at about 100 columns, continued under it.
fn wrapped(out: &mut String, label: &str, items: &[String]) {
    use std::fmt::Write as _;
    let mut line = format!("  {label:<13} ");
    let indent = line.len();
    let mut first = true;
    for item in items {
        if !first && line.len() + item.len() + 2 > 100 {
            line.push(',');
            let _ = writeln!(out, "{}", line.trim_end());
            line = " ".repeat(indent);
        } else if !first {
            line.push_str(", ");
        }
        line.push_str(item);
        first = false;
    }
    let _ = writeln!(out, "{}", line.trim_end());
}
