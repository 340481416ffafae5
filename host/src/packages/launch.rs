//! How a package's extension is launched: the one place that turns a manifest and the
//! operator's settings into a [`PackageLaunch`] (program, folders, limits, sandbox, cgroup).
//! The daemon and `conduit ext check` both call [`plan`], and both spawn the result through
//! `ChildCommand::for_package`, so the checker runs a package exactly as the daemon would.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use conduit_supervisor::cgroup::Delegated;
use conduit_supervisor::limits::{self, Resolved};
use conduit_supervisor::process::PackageLaunch;

use super::settings::PackageSettings;
use crate::manifest::Manifest;

/// A launch and what an operator should be told about it.
#[derive(Clone, Debug)]
pub struct LaunchPlan {
    pub launch: PackageLaunch,
    pub limits: Resolved,
    /// Asks of the package that are not granted, each with the command that grants it.
    pub notes: Vec<String>,
}

/// The folders a package runs with.
#[derive(Clone, Debug)]
pub struct Folders {
    pub package: PathBuf,
    pub data: PathBuf,
    pub tmp: PathBuf,
}

/// Plan the launch of `manifest`'s package from `folders`, under `settings`. Creates the data
/// and temporary folders; where the daemon's cgroup is delegated, the package's cgroup too.
pub fn plan(
    manifest: &Manifest,
    program: PathBuf,
    args: Vec<String>,
    folders: &Folders,
    settings: &PackageSettings,
) -> std::io::Result<LaunchPlan> {
    std::fs::create_dir_all(&folders.data)?;
    std::fs::create_dir_all(&folders.tmp)?;
    let name = &manifest.name;
    let resolved = limits::resolve(name, &manifest.limits, &settings.limits);
    let mut notes = resolved.not_granted.clone();
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let sandbox = if settings.sandbox_off {
        None
    } else {
        let (mut read, write) = if settings.grant {
            manifest.sandbox.expand(home.as_deref())
        } else {
            if !manifest.sandbox.is_empty() {
                notes.push(sandbox_ask(name, manifest));
            }
            (Vec::new(), Vec::new())
        };
        if !manifest.command[0].contains('/') {
            read.extend(interpreter_roots(&program));
        }
        Some((read, write))
    };
    let cgroup = match delegated() {
        Some(d) => Some(d.create(name, &resolved.limits)?),
        None => None,
    };
    Ok(LaunchPlan {
        launch: PackageLaunch {
            name: name.clone(),
            dir: folders.package.clone(),
            program,
            args: args.into_iter().map(Into::into).collect(),
            data_dir: folders.data.clone(),
            tmp_dir: folders.tmp.clone(),
            limits: resolved.limits,
            sandbox,
            cgroup,
        },
        limits: resolved,
        notes,
    })
}

/// What of the installation a program found on `PATH` belongs to is readable (and executable)
/// in the sandbox: an interpreter installed under the home folder (pyenv's shims, a virtualenv,
/// nvm's node) is outside the system folders but must run. For a program in a folder named
/// `shims` (pyenv) that is the folder above it (`~/.pyenv`: the shim runs pyenv, which runs a
/// version under it); in a folder named `bin`, that folder and its siblings `lib`, `lib64` and
/// `pyvenv.cfg` (a virtualenv's, nvm's), never the whole parent — `~/.cargo/bin`'s parent holds
/// credentials, `~/.local/bin`'s the keyrings; elsewhere, the program's own folder. For a link,
/// the same for what it leads to as well. Only paths that exist are given.
pub fn interpreter_roots(program: &Path) -> Vec<PathBuf> {
    let roots = |p: &Path| -> Vec<PathBuf> {
        let Some(dir) = p.parent() else {
            return Vec::new();
        };
        match (dir.file_name().and_then(|n| n.to_str()), dir.parent()) {
            (Some("shims"), Some(up)) => vec![up.to_owned()],
            (Some("bin"), Some(up)) => {
                let mut v = vec![dir.to_owned()];
                v.extend(
                    ["lib", "lib64", "pyvenv.cfg"]
                        .iter()
                        .map(|s| up.join(s))
                        .filter(|p| p.exists()),
                );
                v
            }
            _ => vec![dir.to_owned()],
        }
    };
    let mut out = roots(program);
    if let Ok(real) = program.canonicalize() {
        for r in roots(&real) {
            if !out.contains(&r) {
                out.push(r);
            }
        }
    }
    // `/` itself is never granted.
    out.retain(|p| p.parent().is_some());
    out
}

/// What the package's `[sandbox]` asks for, and how to grant it.
pub fn sandbox_ask(name: &str, manifest: &Manifest) -> String {
    let mut parts = Vec::new();
    if !manifest.sandbox.read.is_empty() {
        parts.push(format!("to read {}", manifest.sandbox.read.join(", ")));
    }
    if !manifest.sandbox.write.is_empty() {
        parts.push(format!("to write {}", manifest.sandbox.write.join(", ")));
    }
    format!(
        "the package asks {}, beyond its sandbox's defaults; `conduit ext set {name} sandbox.grant=yes` grants it",
        parts.join(" and ")
    )
}

/// The daemon's delegated cgroup subtree, prepared once (the daemon moved into its leaf and
/// the controllers enabled), when the environment says it is delegated. A subtree that cannot
/// be prepared is logged and not used: rlimits and the supervisor enforce the limits then.
pub fn delegated() -> Option<&'static Delegated> {
    static CELL: OnceLock<Option<Delegated>> = OnceLock::new();
    CELL.get_or_init(|| {
        let d = Delegated::from_env()?;
        match d.prepare(std::process::id()) {
            Ok(enabled) => {
                tracing::info!(root = %d.root().display(), ?enabled, "per-extension cgroups in the delegated subtree");
                Some(d)
            }
            Err(e) => {
                tracing::warn!(root = %d.root().display(), error = %e, "cannot use the delegated cgroup; limits fall back to rlimits and the supervisor");
                None
            }
        }
    })
    .as_ref()
}

/// The temporary folder of package `name` under `run_dir`.
pub fn tmp_dir(run_dir: &Path, name: &str) -> PathBuf {
    run_dir.join("tmp").join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interpreter_s_installation_is_readable_but_never_a_whole_home_folder() {
        let d = tempfile::tempdir().unwrap();
        let home = d.path();
        for dir in [".pyenv/shims", ".cargo/bin", "venv/bin", "venv/lib"] {
            std::fs::create_dir_all(home.join(dir)).unwrap();
        }
        std::fs::write(home.join("venv/pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        std::fs::write(home.join(".cargo/credentials.toml"), "token\n").unwrap();
        assert_eq!(
            interpreter_roots(&home.join(".pyenv/shims/python3")),
            [home.join(".pyenv")]
        );
        assert_eq!(
            interpreter_roots(&home.join(".cargo/bin/tool")),
            [home.join(".cargo/bin")]
        );
        assert_eq!(
            interpreter_roots(&home.join("venv/bin/python")),
            [
                home.join("venv/bin"),
                home.join("venv/lib"),
                home.join("venv/pyvenv.cfg")
            ]
        );
        assert_eq!(
            interpreter_roots(Path::new("/python3")),
            Vec::<PathBuf>::new()
        );
    }
}
