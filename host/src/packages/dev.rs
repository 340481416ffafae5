//! Development installs, for `conduit ext dev`: a record that points at the author's folder
//! instead of a copy in the store.
//!
//! A dev install copies nothing and hashes nothing: the daemon runs the package from its folder
//! as it is at each start ([`files_dir`]), so a rebuild or an edited script is what the next
//! start runs. Its record has `dev: true` and no `files`; the integrity check says "development
//! install, not checked" instead of comparing files (`verify.rs`), `conduit ext status` and
//! `conduit doctor` say so.
//!
//! Not here: watching, building, restarting (the CLI's `ext dev`), and removing (a dev install is
//! removed like any other; its package folder in the store does not exist, so a remove takes
//! the record alone and never touches the author's folder).
//!
//! Invariant: a dev install never replaces a package installed from the store, and an install
//! from the store never replaces a dev install (both refuse, saying what to do); a dev install
//! from another folder is refused too, so two `ext dev` sessions never fight over one name.

use std::path::{Path, PathBuf};

use super::install::{InstallError, refuse_state_inside};
use super::layout::package_dir;
use super::registry::{PackageRecord, Registry, StoreLock, sweep_stale};
use crate::manifest::Manifest;
use crate::state_dir::StateDir;

/// Where the daemon runs `rec` from: its folder in the store, or the author's folder for a dev
/// install.
pub fn files_dir(state: &StateDir, rec: &PackageRecord) -> PathBuf {
    if rec.dev {
        rec.source.clone()
    } else {
        package_dir(state, &rec.name)
    }
}

/// Whether `folder` can be dev-installed now, without changing anything: its manifest (read
/// and validated), the state directory not inside it, and no package of its name installed
/// from the store or in development from another folder. `conduit ext dev` asks before its
/// first build, so a refusal does not wait for one.
pub fn check_dev(state: &StateDir, folder: &Path) -> Result<(PathBuf, Manifest), InstallError> {
    let source_err = |problem: String| InstallError::Source {
        origin: folder.to_owned(),
        problem,
    };
    let origin = folder.canonicalize().map_err(|e| {
        source_err(format!(
            "cannot read it ({e}); give the path of a package folder"
        ))
    })?;
    if !origin.is_dir() {
        return Err(source_err(
            "it is not a folder; `conduit ext dev` works on a package folder (one holding conduit-extension.toml)".into(),
        ));
    }
    let manifest = Manifest::load(&origin).map_err(|e| InstallError::Manifest {
        origin: origin.clone(),
        source: Box::new(e),
    })?;
    refuse_state_inside(state, &origin)?;
    conflict(
        Registry::load_one(state, &manifest.name)?
            .packages
            .get(&manifest.name),
        &origin,
    )?;
    Ok((origin, manifest))
}

/// The refusal of a dev install of `origin` over `old`, if it is one.
fn conflict(old: Option<&PackageRecord>, origin: &Path) -> Result<(), InstallError> {
    match old {
        Some(old) if !old.dev => Err(InstallError::NotDev {
            name: old.name.clone(),
            version: old.version.clone(),
        }),
        Some(old) if old.source != origin => Err(InstallError::DevInstalled {
            name: old.name.clone(),
            source_dir: old.source.clone(),
        }),
        _ => Ok(()),
    }
}

/// Record the package folder `folder` as a development install, enabled, installed now (a
/// later time than the record it replaces, so a running daemon restarts it on reload). Reading
/// the manifest again each time is what picks up its changes. Refused as [`check_dev`] says.
pub fn install_dev(state: &StateDir, folder: &Path) -> Result<PackageRecord, InstallError> {
    let (origin, manifest) = check_dev(state, folder)?;
    let _lock = StoreLock::exclusive(state)?;
    sweep_stale(state);
    let mut registry = Registry::load_one(state, &manifest.name)?;
    // Again under the lock: another session may have installed the name meanwhile.
    let old = registry.packages.get(&manifest.name);
    conflict(old, &origin)?;
    let now = u64::try_from(conduit_supervisor::now_ms()).unwrap_or(0);
    // Later than the record it replaces, even within one millisecond: the reconciler restarts
    // a package whose install time changed.
    let installed_at_ms = old.map_or(now, |old| now.max(old.installed_at_ms + 1));
    let record = PackageRecord {
        name: manifest.name.clone(),
        version: manifest.version.clone(),
        installed_at_ms,
        enabled: true,
        source: origin,
        manifest,
        files: Default::default(),
        dev: true,
    };
    registry
        .packages
        .insert(record.name.clone(), record.clone());
    registry.save(state)?;
    Ok(record)
}
