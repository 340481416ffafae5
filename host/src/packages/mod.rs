//! The package store: installed extension packages on disk, and the registry that records them.
//!
//! ```text
//! <state>/packages/
//! ├── registry.json        {"format": 2} (format 1 held every record here; still read)
//! ├── .records/notes.json  the PackageRecord of `notes`: one file per package
//! ├── .verified/notes.json the stats of `notes`'s files at its last full check (see `verify.rs`)
//! ├── notes/               the installed files of package `notes`, exactly as recorded
//! │   ├── conduit-extension.toml
//! │   └── bin/conduit-notes
//! └── echo/
//! ├── echo.previous/        the version `echo` replaced at its last upgrade, downgrade or
//! │                        reinstall (recorded under `previous` in the registry), for a rollback
//! <state>/tmp/install-XXXXXX/   staging for one install; gone when the install returns
//! <state>/tmp/remove-XXXXXX/    a removed package on its way out
//! <state>/tmp/kept-…/           a previous version kept after an undo failed (see the error)
//! ```
//!
//! Scratch a killed install or remove leaves in `tmp/` is swept by the next one, under the lock.
//!
//! Package names are `[a-z0-9-]` (the manifest enforces it), so no package folder can be called
//! `registry.json`, `.records` or `.verified`.
//!
//! Invariants:
//! - Every mutation ([`install`], [`remove`], [`set_enabled`], [`rollback`]) holds an exclusive `flock` on the
//!   `packages/` folder; [`verify`] holds a shared one, so it never sees half of a swap. [`list`]
//!   and [`get`] need no lock: the registry is only ever replaced whole, by rename.
//! - A package folder holds only regular files and folders: links are resolved at install time
//!   and their targets copied, so nothing installed can point outside the package.
//! - Every regular file of a package folder is in its record's `files`, with its sha256, size
//!   and executable bit; [`verify`] re-checks exactly that before the daemon starts a package
//!   (hashing again only when the files' stats changed since the last full check).
//! - A failed install, remove or enable leaves `packages/` as it was: installs are staged under
//!   `<state>/tmp/` and swapped in by rename, and each step after the first is undone on failure.
//!   A crash (not a failure) between the swap's renames can leave a package folder missing or
//!   newer than its record; [`verify`] then refuses the package and says to reinstall it.
//!
//! A development install (`conduit ext dev`, `dev.rs`) is a record without a folder here: the
//! daemon runs it from the author's folder ([`files_dir`]) and its files are not checked.
//!
//! This module does not start, stop or talk to packages, and it does not know whether a daemon is
//! running: a caller that replaces or removes a running package stops it first.

mod archive;
mod dev;
mod install;
pub mod launch;
mod layout;
mod lifecycle;
pub(crate) mod readonly;
mod registry;
pub mod settings;
mod tree;
mod verify;

#[cfg(test)]
mod tests;

pub use dev::{check_dev, files_dir, install_dev};
pub use install::{
    DEFAULT_MAX_ENTRIES, DEFAULT_MAX_TOTAL_BYTES, InstallChange, InstallError, InstallOptions,
    InstallOutcome, install,
};
pub use layout::{VERIFIED_DIR, package_dir};
pub use lifecycle::{Rollback, previous, remove, rollback};
pub use registry::{
    FileRecord, PackageError, PackageRecord, RECORDS_DIR, REGISTRY_FILE, get, list, set_enabled,
};
pub use tree::UnsafeEntry;
pub use verify::{Checked, FileChange, TamperError, VerifyError, verify, verify_read_only};

/// Entry points for the fuzz targets in `fuzz/`, compiled only under `--cfg fuzzing` (which
/// `cargo fuzz` sets), so the crate's API stays as it is.
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing {
    use std::path::{Path, PathBuf};

    /// Unpacks `archive` into `dest` (which must not exist) with the given budget, as an install
    /// does; the error is returned as text (its variant and fields).
    pub fn extract(
        archive: &Path,
        dest: &Path,
        max_bytes: u64,
        max_entries: u64,
    ) -> Result<PathBuf, String> {
        let mut budget = super::tree::Budget::new(max_bytes, max_entries);
        super::archive::extract(archive, dest, &mut budget).map_err(|e| format!("{e:?}"))
    }
}
