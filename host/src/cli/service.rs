//! `conduit service install|uninstall|status`: the systemd unit or launchd property list that
//! runs `conduit daemon run` under the platform's service manager.
//!
//! These commands write or remove one file (and, on uninstall, the links `systemctl enable`
//! made to it) and never run `systemctl` or `launchctl`: they print the command to run next.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use conduit_host::service::{
    self, Existing, GENERATED_MARK, LAUNCHD_LABEL, Manager, SYSTEMD_UNIT, Scope, ServiceConfig,
};
use conduit_host::state_dir::{self, StateDir};
use serde_json::json;

use super::common::{StateArgs, daemon, print_json, runtime};
use super::outcome::{CliError, print};

/// Which file: the manager, the scope.
#[derive(Debug, clap::Args)]
pub(crate) struct Target {
    /// A service of your own user's service manager (the default).
    #[arg(long, conflicts_with = "system")]
    user: bool,
    /// A service of the machine's service manager (needs root).
    #[arg(long)]
    system: bool,
    /// Write a systemd unit, whatever the platform (the default on Linux).
    #[arg(long, conflicts_with = "launchd")]
    systemd: bool,
    /// Write a launchd property list, whatever the platform (the default on macOS).
    #[arg(long)]
    launchd: bool,
}

impl Target {
    fn scope(&self) -> Scope {
        if self.system {
            Scope::System
        } else {
            Scope::User
        }
    }

    fn manager(&self) -> Manager {
        match (self.systemd, self.launchd) {
            (true, _) => Manager::Systemd,
            (_, true) => Manager::Launchd,
            _ => Manager::native(),
        }
    }
}

/// Write the service file that runs `conduit daemon run` on this state directory.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
The file runs this very binary (its absolute path) with --state-dir, so moving or replacing
the binary elsewhere means installing again; a binary inside a cargo build folder (one holding
CACHEDIR.TAG, or `target/` beside a Cargo.toml) is warned about. PATH in the file is the
installing shell's, each folder once and relative folders left out. Nothing is started: the command to run next is
printed. An existing file that differs is kept unless --force is given.

  conduit service install --print            see the unit without installing it
  conduit service install                    ~/.config/systemd/user/conduit.service
  sudo conduit service install --system      /etc/systemd/system/conduit.service, state in
                                             /var/lib/conduit unless --state-dir says otherwise

Exit codes: 0 written (or already the same); 1 a different file is there (use --force) or it
cannot be written; 2 bad arguments (e.g. --system without root).")]
pub(crate) struct InstallArgs {
    #[command(flatten)]
    target: Target,
    /// Write the file to stdout instead of installing it.
    #[arg(long)]
    print: bool,
    /// Overwrite a file that differs from what would be written.
    #[arg(long)]
    force: bool,
    /// Print {"path", "manager", "scope", "state_dir", "written", "next"}.
    #[arg(long, conflicts_with = "print")]
    json: bool,
}

/// Remove the service file (and the links `systemctl enable` made to it).
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Only a file `conduit service install` wrote is removed, unless --force is given. A running
service keeps running until its manager stops it: the commands for that are printed.

Exit codes: 0 removed (or nothing was there); 1 the file was not written by conduit (use
--force) or cannot be removed.")]
pub(crate) struct UninstallArgs {
    #[command(flatten)]
    target: Target,
    /// Remove the file even if it was not written by `conduit service install`.
    #[arg(long)]
    force: bool,
    /// Print {"path", "removed"}.
    #[arg(long)]
    json: bool,
}

/// Say whether the service file is installed and current, and whether its daemon runs.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
The daemon line counts its extensions as `GET /v1/health` does: ready (and in no trouble), and
each one in trouble (crash-looping, refused, incompatible, unresponsive, over-limit, backing-off,
degraded) with since when it went wrong.

Exit codes: 0 installed, current, its daemon answers and no extension is in trouble; 1 not
installed, out of date, its daemon is not running, or an extension is in trouble (the output
says which and what to do).")]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    target: Target,
    /// Print {"path", "installed", "current", "daemon"}.
    #[arg(long)]
    json: bool,
}

/// Where the daemon's state lives for this service: --state-dir or $CONDUIT_STATE_DIR when
/// given, else /var/lib/conduit for a system service and the user's default for a user one.
fn service_state_dir(state: &StateArgs, scope: Scope) -> Result<PathBuf, CliError> {
    let resolved =
        state_dir::resolve_from_env(state.state_dir.as_deref()).map_err(CliError::usage)?;
    let path = match (scope, resolved.source) {
        (Scope::System, state_dir::StateDirSource::PlatformDefault) => {
            PathBuf::from("/var/lib/conduit")
        }
        _ => resolved.path,
    };
    std::path::absolute(&path)
        .with_context(|| format!("cannot make {} absolute", path.display()))
        .map_err(CliError::usage)
}

fn config(target: &Target, state: &StateArgs) -> Result<ServiceConfig, CliError> {
    let scope = target.scope();
    if scope == Scope::System && !nix::unistd::Uid::effective().is_root() {
        return Err(CliError::usage(anyhow::anyhow!(
            "a system service is installed by root: run `sudo conduit service install --system`, \
             or drop --system for a service of your own user"
        )));
    }
    let program = std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .context("cannot find the path of this conduit binary")
        .map_err(CliError::failure)?;
    Ok(ServiceConfig {
        manager: target.manager(),
        scope,
        program,
        state_dir: service_state_dir(state, scope)?,
        path_env: std::env::var("PATH")
            .ok()
            .map(|p| service::clean_path(&p))
            .filter(|p| !p.is_empty()),
    })
}

fn install_path(cfg: &ServiceConfig) -> Result<PathBuf, CliError> {
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty());
    let xdg = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|x| !x.is_empty())
        .map(PathBuf::from);
    match (cfg.scope, home) {
        (Scope::User, None) => Err(CliError::usage(anyhow::anyhow!(
            "$HOME is not set, so there is no user service folder; set HOME or use --system"
        ))),
        (_, home) => Ok(cfg.install_path(
            Path::new(&home.unwrap_or_else(|| "/".into())),
            xdg.as_deref(),
        )),
    }
}

fn names(cfg: &ServiceConfig) -> (&'static str, &'static str) {
    let manager = match cfg.manager {
        Manager::Systemd => "systemd",
        Manager::Launchd => "launchd",
    };
    let scope = match cfg.scope {
        Scope::User => "user",
        Scope::System => "system",
    };
    (manager, scope)
}

pub(crate) fn install(args: InstallArgs, state: &StateArgs) -> Result<ExitCode, CliError> {
    let cfg = config(&args.target, state)?;
    let text = cfg.render();
    if args.print {
        print(&text)?;
        return Ok(ExitCode::SUCCESS);
    }
    let path = install_path(&cfg)?;
    let before = service::existing(&path, &text)
        .with_context(|| format!("cannot read {}", path.display()))
        .map_err(CliError::failure)?;
    if before == Existing::Different && !args.force {
        return Err(CliError::failure(anyhow::anyhow!(
            "{} exists and differs from what would be written (edited by hand, or written for \
             another binary or state directory); see the difference with `conduit service install \
             --print | diff {} -`, then overwrite it with --force",
            path.display(),
            path.display()
        )));
    }
    // The state directory must exist before the service starts: the unit names it as the one
    // writable path, and systemd refuses to start a unit whose writable path is missing.
    StateDir::open(&cfg.state_dir)
        .with_context(|| {
            format!(
                "cannot create the state directory {}",
                cfg.state_dir.display()
            )
        })
        .map_err(CliError::failure)?;
    let written = before != Existing::Same;
    if written {
        service::write_atomically(&path, &text)
            .with_context(|| format!("cannot write {}", path.display()))
            .map_err(CliError::failure)?;
    }
    let next = cfg.next_steps(&path);
    let (manager, scope) = names(&cfg);
    let warnings: Vec<String> = build_folder_warning(&cfg).into_iter().collect();
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    if args.json {
        print_json(&json!({
            "path": path,
            "manager": manager,
            "scope": scope,
            "state_dir": cfg.state_dir,
            "written": written,
            "next": next,
            "warnings": warnings,
        }))?;
    } else {
        let what = if written { "wrote" } else { "unchanged:" };
        let mut out = format!(
            "{what} {} ({manager}, {scope} service; state in {})\nnext:\n",
            path.display(),
            cfg.state_dir.display()
        );
        for n in &next {
            out.push_str(&format!("  {n}\n"));
        }
        print(&out)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The warning for a service that would run a binary inside a build folder, if it would.
fn build_folder_warning(cfg: &ServiceConfig) -> Option<String> {
    let target = service::build_folder(&cfg.program, Path::is_file)?;
    Some(format!(
        "the service runs {}, inside the build folder {}: the next build or `cargo clean` changes          or removes what it runs; install the binary first (e.g. `cargo install --path host --root ~/.local`),          then run `~/.local/bin/conduit service install --force`",
        cfg.program.display(),
        target.display()
    ))
}

/// The `*.wants/` links `systemctl enable` made to the unit at `path`.
fn enable_links(path: &Path) -> Vec<PathBuf> {
    let Some(dir) = path.parent() else {
        return Vec::new();
    };
    let mut links = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let wants = e.path();
        if !wants.is_dir() || !wants.to_string_lossy().ends_with(".wants") {
            continue;
        }
        let link = wants.join(SYSTEMD_UNIT);
        if std::fs::read_link(&link)
            .is_ok_and(|to| to == path || to.file_name() == path.file_name())
        {
            links.push(link);
        }
    }
    links
}

pub(crate) fn uninstall(args: UninstallArgs, state: &StateArgs) -> Result<ExitCode, CliError> {
    let cfg = config(&args.target, state)?;
    let path = install_path(&cfg)?;
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            return Err(CliError::failure(
                anyhow::Error::new(e).context(format!("cannot read {}", path.display())),
            ));
        }
    };
    let removed = match &text {
        None => false,
        Some(t) if !t.contains(GENERATED_MARK) && !args.force => {
            return Err(CliError::failure(anyhow::anyhow!(
                "{} was not written by `conduit service install`; remove it yourself, or with --force",
                path.display()
            )));
        }
        Some(_) => {
            if cfg.manager == Manager::Systemd {
                for link in enable_links(&path) {
                    std::fs::remove_file(&link)
                        .with_context(|| format!("cannot remove {}", link.display()))
                        .map_err(CliError::failure)?;
                }
            }
            std::fs::remove_file(&path)
                .with_context(|| format!("cannot remove {}", path.display()))
                .map_err(CliError::failure)?;
            true
        }
    };
    let steps = cfg.stop_steps(&path);
    if args.json {
        print_json(&json!({ "path": path, "removed": removed, "next": steps }))?;
    } else if removed {
        let mut out = format!(
            "removed {}\na daemon it started keeps running until its manager stops it:\n",
            path.display()
        );
        for s in &steps {
            out.push_str(&format!("  {s}\n"));
        }
        print(&out)?;
    } else {
        print(&format!(
            "nothing to remove: {} does not exist\n",
            path.display()
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn status(args: StatusArgs, state: &StateArgs) -> Result<ExitCode, CliError> {
    let cfg = config(&args.target, state)?;
    let path = install_path(&cfg)?;
    let text = cfg.render();
    let existing = service::existing(&path, &text)
        .with_context(|| format!("cannot read {}", path.display()))
        .map_err(CliError::failure)?;
    let rt = runtime()?;
    // Read only: a status never creates the state directory it looks at.
    let health = StateDir::read_only(&cfg.state_dir)
        .ok()
        .and_then(|s| daemon(&rt, &s))
        .and_then(|c| rt.block_on(c.get("/v1/health")).ok());
    let installed = existing != Existing::Absent;
    let current = existing == Existing::Same;
    // The daemon answering is not enough: an extension in trouble makes the service unwell.
    let ok = current && health.as_ref().is_some_and(|h| h["status"] == "ok");
    if args.json {
        print_json(&json!({
            "path": path,
            "label": match cfg.manager { Manager::Systemd => SYSTEMD_UNIT, Manager::Launchd => LAUNCHD_LABEL },
            "installed": installed,
            "current": current,
            "state_dir": cfg.state_dir,
            "daemon": health,
        }))?;
    } else {
        let file = match existing {
            Existing::Absent => "not installed: `conduit service install` writes it".to_owned(),
            Existing::Same => "installed and current".to_owned(),
            Existing::Different => "installed, but differs from what `conduit service install` would write now (another binary or state directory, or edited): `conduit service install --force` rewrites it".to_owned(),
        };
        let daemon = match &health {
            Some(h) => {
                let line = serde_json::from_value::<conduit_host::daemon::trouble::Summary>(
                    h["extensions"].clone(),
                )
                .map_or_else(
                    |e| format!("(cannot read its extensions: {e})"),
                    |s| s.line(),
                );
                format!("running, pid {}, {line}", h["pid"])
            }
            None => format!(
                "not running on {} (start it: {})",
                cfg.state_dir.display(),
                cfg.next_steps(&path)[0]
            ),
        };
        print(&format!("{}: {file}\ndaemon: {daemon}\n", path.display()))?;
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
