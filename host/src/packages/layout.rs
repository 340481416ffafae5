//! Where things are under `<state>/packages/`: a package's folder and the kept stats of its
//! last full check (see `verify.rs`).
//!
//! A leaf: the registry, the installer and the verifier all find paths here, so none of them
//! needs another for a path.

use std::fs;
use std::path::PathBuf;

use crate::state_dir::StateDir;

/// The folder a package named `name` is (or would be) installed in.
pub fn package_dir(state: &StateDir, name: &str) -> PathBuf {
    state.packages_dir().join(name)
}

/// The folder of the kept stats inside `<state>/packages/`. Package names are `[a-z0-9-]`, so no
/// package folder can have this name.
pub const VERIFIED_DIR: &str = ".verified";

/// `packages/.verified/<name>.json`: the stats of `name`'s files at its last full check.
pub(crate) fn verified_path(state: &StateDir, name: &str) -> PathBuf {
    state
        .packages_dir()
        .join(VERIFIED_DIR)
        .join(format!("{name}.json"))
}

/// Forgets the kept stats of a removed package.
pub(crate) fn forget_verified(state: &StateDir, name: &str) {
    let _ = fs::remove_file(verified_path(state, name));
}
