//! Tamper detection: does an installed package folder still hold exactly what was recorded?
//!
//! The daemon calls [`verify`] before every start of a package, so code changed after install
//! (by hand, by another program, by an attacker with write access) is refused, not run.
//!
//! Invariant: a package passes only if its folder holds exactly the recorded regular files, with
//! the recorded sha256, size and executable bit, and nothing but folders besides. Every file is
//! hashed in full; there is no shortcut through sizes or timestamps, which a tamperer controls.

use std::fmt;
use std::io;
use std::path::PathBuf;

use super::registry::{PackageError, Registry, StoreLock};
use super::tree::scan;
use super::{FileRecord, package_dir};
use crate::state_dir::StateDir;

/// How many changes a [`TamperError`] message lists before summarising the rest.
const SHOWN_CHANGES: usize = 5;

/// One difference between an installed package folder and its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileChange {
    /// A recorded file whose contents or executable bit differ.
    Modified {
        path: String,
        was: FileRecord,
        now: FileRecord,
    },
    /// A recorded file that is gone.
    Missing { path: String },
    /// A regular file that was not installed.
    Added { path: String },
    /// Something that is not a regular file or folder (a symlink, a fifo) where none was
    /// installed; `kind` says what it is.
    NotAFile { path: String, kind: &'static str },
}

impl FileChange {
    /// The path, relative to the package folder.
    pub fn path(&self) -> &str {
        match self {
            FileChange::Modified { path, .. }
            | FileChange::Missing { path }
            | FileChange::Added { path }
            | FileChange::NotAFile { path, .. } => path,
        }
    }
}

impl fmt::Display for FileChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileChange::Modified { path, was, now } if was.sha256 != now.sha256 => write!(
                f,
                "{path} changed (sha256 {}…, installed {}…)",
                &now.sha256[..12.min(now.sha256.len())],
                &was.sha256[..12.min(was.sha256.len())]
            ),
            FileChange::Modified { path, now, .. } => write!(
                f,
                "{path} {} its executable bit",
                if now.executable { "gained" } else { "lost" }
            ),
            FileChange::Missing { path } => write!(f, "{path} is missing"),
            FileChange::Added { path } => write!(f, "{path} was added"),
            FileChange::NotAFile { path, kind } => write!(f, "{path} is now a {kind}"),
        }
    }
}

/// An installed package whose files no longer match its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TamperError {
    pub name: String,
    /// Where it was installed from, for the reinstall hint.
    pub installed_from: PathBuf,
    /// Every difference found, ordered by path; never empty.
    pub changes: Vec<FileChange>,
}

impl fmt::Display for TamperError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "package `{}` was modified after install: ", self.name)?;
        for (i, change) in self.changes.iter().take(SHOWN_CHANGES).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{change}")?;
        }
        if self.changes.len() > SHOWN_CHANGES {
            write!(f, " and {} more", self.changes.len() - SHOWN_CHANGES)?;
        }
        write!(
            f,
            "; reinstall it with `conduit ext install {}`",
            self.installed_from.display()
        )
    }
}

impl std::error::Error for TamperError {}

/// Why a package could not be verified.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    #[error(transparent)]
    Tampered(#[from] TamperError),
    #[error(transparent)]
    Package(#[from] PackageError),
    #[error(
        "cannot check package `{name}`: cannot read {}: {source}; check the permissions of the state directory, or reinstall the package",
        path.display()
    )]
    Read {
        name: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Re-hashes the installed files of the package named `name` and compares them with its record.
///
/// Waits for a running install or remove to finish, so it never sees half of one.
pub fn verify(state: &StateDir, name: &str) -> Result<(), VerifyError> {
    let _lock = StoreLock::shared(state)?;
    let registry = Registry::load(state)?;
    let Some(record) = registry.packages.get(name) else {
        return Err(PackageError::NotInstalled {
            name: name.to_owned(),
        }
        .into());
    };
    let dir = package_dir(state, name);
    let found = match scan(&dir) {
        Ok(found) => found,
        // The whole folder gone is every file missing: report it the same way.
        Err(e) if e.kind() == io::ErrorKind::NotFound && !dir.exists() => Default::default(),
        Err(e) => {
            return Err(VerifyError::Read {
                name: name.to_owned(),
                path: dir,
                source: e,
            });
        }
    };

    let mut changes = Vec::new();
    for (path, was) in &record.files {
        match found.files.get(path) {
            Some(now) if now == was => {}
            Some(now) => changes.push(FileChange::Modified {
                path: path.clone(),
                was: was.clone(),
                now: now.clone(),
            }),
            None => match found.others.get(path) {
                Some(kind) => changes.push(FileChange::NotAFile {
                    path: path.clone(),
                    kind,
                }),
                None => changes.push(FileChange::Missing { path: path.clone() }),
            },
        }
    }
    for path in found
        .files
        .keys()
        .filter(|p| !record.files.contains_key(*p))
    {
        changes.push(FileChange::Added { path: path.clone() });
    }
    for (path, kind) in found
        .others
        .iter()
        .filter(|(p, _)| !record.files.contains_key(*p))
    {
        changes.push(FileChange::NotAFile {
            path: path.clone(),
            kind,
        });
    }
    if changes.is_empty() {
        return Ok(());
    }
    changes.sort_by(|a, b| a.path().cmp(b.path()));
    Err(TamperError {
        name: name.to_owned(),
        installed_from: record.source.clone(),
        changes,
    }
    .into())
}
