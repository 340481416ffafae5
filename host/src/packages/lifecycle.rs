//! Changes to an installed package other than its install: removing it, keeping the version an
//! install replaced (`<name>.previous/`), and rolling back to that version.
//!
//! Each moves package folders by rename under the exclusive [`StoreLock`] and, like an install,
//! leaves the store as it was when it fails (see the `packages` module's invariants). Records
//! are read and written through the registry; this module owns no file format.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::layout::{forget_verified, package_dir};
use super::readonly;
use super::registry::{
    PackageError, PackageRecord, Registry, StoreLock, keep_out_of_sweep, sweep_stale, sync_dir,
};
use crate::state_dir::StateDir;

/// Uninstalls the package named `name`: its folder and its record. Returns the record it had.
///
/// The folder is first renamed into `<state>/tmp/`, then the registry is written, then the folder
/// deleted; if the registry cannot be written the folder is put back.
pub fn remove(state: &StateDir, name: &str) -> Result<PackageRecord, PackageError> {
    let _lock = StoreLock::exclusive(state)?;
    sweep_stale(state);
    let mut registry = Registry::load_one(state, name)?;
    let Some(rec) = registry.packages.remove(name) else {
        return Err(PackageError::NotInstalled {
            name: name.to_owned(),
        });
    };
    registry.previous.remove(name);
    let dir = package_dir(state, name);
    let trash = tempfile::Builder::new()
        .prefix("remove-")
        .tempdir_in(state.tmp_dir())
        .map_err(|e| PackageError::io("create a folder in", &state.tmp_dir(), e))?;
    let aside = trash.path().join(name);
    // The installed folder is read-only; moving and deleting it needs its write bits.
    readonly::make_writable(&dir).map_err(|e| PackageError::io("make writable", &dir, e))?;
    let moved = match fs::rename(&dir, &aside) {
        Ok(()) => true,
        // A record without its folder (a crash mid-install, or a hand-deleted folder): removing
        // the record is all that is left to do.
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => return Err(PackageError::io("move aside", &dir, e)),
    };
    if let Err(e) = registry.save(state) {
        if moved && let Err(back) = fs::rename(&aside, &dir) {
            return Err(PackageError::Stranded {
                name: name.to_owned(),
                message: format!(
                    "the registry could not be written: {e}; then moving the folder back failed: {back}"
                ),
                kept: keep_out_of_sweep(trash.keep()).join(name),
                dir,
            });
        }
        return Err(e);
    }
    // The kept previous version goes too (a leftover of it is harmless: nothing reads it
    // without its record).
    let _ = fs::rename(previous_dir(state, name), trash.path().join("previous"));
    forget_verified(state, name);
    super::handshakes::forget(state, name);
    // `trash` deletes the old files when dropped; if that fails, the next sweep retries.
    Ok(rec)
}

/// Where the version a package replaced is kept. Package names are `[a-z0-9-]`, so no package
/// folder can be called `<name>.previous`.
pub(crate) fn previous_dir(state: &StateDir, name: &str) -> PathBuf {
    state.packages_dir().join(format!("{name}.previous"))
}

/// After an install saved the registry: move the replaced version's folder (`aside`, inside
/// `staging`) to [`previous_dir`], dropping the one kept before, then drop `staging`. If the
/// folder cannot be kept, its record is dropped too, so a rollback never finds half of it.
/// The kept folder stays writable (the install made it so to move it aside): nothing runs from it,
/// and a rollback or remove moves or deletes it.
pub(crate) fn keep_previous(
    state: &StateDir,
    registry: &mut Registry,
    name: &str,
    aside: Option<&Path>,
    staging: tempfile::TempDir,
) {
    let kept = previous_dir(state, name);
    // The older kept version is deleted with staging.
    match fs::rename(&kept, staging.path().join("older")) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(_) => {
            let _ = fs::remove_dir_all(&kept);
        }
    }
    if let Some(aside) = aside
        && let Err(e) = fs::rename(aside, &kept)
    {
        tracing::warn!(package = name, error = %e, "cannot keep the previous version for a rollback");
        registry.previous.remove(name);
        let _ = registry.save(state);
    }
    let _ = sync_dir(&state.packages_dir());
    drop(staging);
}

/// What a rollback did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rollback {
    /// The version now installed (the one kept before).
    pub to: PackageRecord,
    /// The version rolled back from, now kept in its place for another rollback.
    pub from: PackageRecord,
}

/// Puts back the version the package named `name` replaced at its last upgrade, downgrade or
/// reinstall, keeping the one rolled back from (so a second rollback undoes the first). The
/// enabled flag stays as it is. Like an install, a failure leaves the store as it was.
pub fn rollback(state: &StateDir, name: &str) -> Result<Rollback, PackageError> {
    let _lock = StoreLock::exclusive(state)?;
    sweep_stale(state);
    let mut registry = Registry::load_one(state, name)?;
    let Some(current) = registry.packages.get(name).cloned() else {
        return Err(PackageError::NotInstalled {
            name: name.to_owned(),
        });
    };
    let kept = previous_dir(state, name);
    let Some(mut previous) = registry
        .previous
        .get(name)
        .cloned()
        .filter(|_| kept.is_dir())
    else {
        return Err(PackageError::NoPrevious {
            name: name.to_owned(),
        });
    };
    previous.enabled = current.enabled;
    let dir = package_dir(state, name);
    let scratch = tempfile::Builder::new()
        .prefix("install-")
        .tempdir_in(state.tmp_dir())
        .map_err(|e| PackageError::io("create a folder in", &state.tmp_dir(), e))?;
    let aside = scratch.path().join("current");
    // The installed version is read-only, and moving a folder to another parent needs its write
    // bit; the kept version is writable (see `keep_previous`) and goes in read-only.
    readonly::make_writable(&dir).map_err(|e| PackageError::io("make writable", &dir, e))?;
    fs::rename(&dir, &aside).map_err(|e| PackageError::io("move aside", &dir, e))?;
    if let Err(e) = fs::rename(&kept, &dir) {
        let _ = fs::rename(&aside, &dir);
        let _ = readonly::make_read_only(&dir);
        return Err(PackageError::io("move into place", &kept, e));
    }
    if let Err(e) = readonly::make_read_only(&dir) {
        tracing::warn!(package = name, error = %e, "cannot make the rolled-back package read-only");
    }
    registry.packages.insert(name.to_owned(), previous.clone());
    registry.previous.insert(name.to_owned(), current.clone());
    if let Err(e) = registry.save(state) {
        let _ = fs::rename(&dir, &kept);
        let _ = fs::rename(&aside, &dir);
        return Err(e);
    }
    if let Err(e) = fs::rename(&aside, &kept) {
        // The rollback itself is done; only the version rolled back from is lost.
        tracing::warn!(package = name, error = %e, "cannot keep the version rolled back from");
        registry.previous.remove(name);
        let _ = registry.save(state);
    }
    let _ = sync_dir(&state.packages_dir());
    Ok(Rollback {
        to: previous,
        from: current,
    })
}

/// The version kept for a rollback of the package named `name`, if any.
pub fn previous(state: &StateDir, name: &str) -> Result<Option<PackageRecord>, PackageError> {
    Ok(Registry::load_one(state, name)?
        .previous
        .remove(name)
        .filter(|_| previous_dir(state, name).is_dir()))
}
