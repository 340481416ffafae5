//! Tamper detection: does an installed package folder still hold exactly what was recorded?
//!
//! The daemon calls [`verify`] before every start of a package, so code changed after install
//! (by hand, by another program, by a careless or hostile process of the same user) is refused,
//! not run.
//!
//! Invariant: a package passes only if its folder holds exactly the recorded regular files, with
//! the recorded sha256, size and executable bit, and nothing but folders besides.
//!
//! Hashing every file before every start costs a thousand packages seconds of CPU at each daemon
//! start, so the files are hashed in full once, and afterwards checked through what the kernel
//! says of them. After an install, and after every full check that passes, the stat of each file
//! (device, inode, size, mode, modification and status-change time to the nanosecond) is kept in
//! `packages/.verified/<name>.json`, tied to the record it was taken under. A later check that
//! finds the same files with the same stats passes without reading them; any difference (a new,
//! missing or replaced file, any write, `chmod` or `touch`) falls back to hashing every file,
//! which reports exactly what changed. The status-change time (`ctime`) cannot be set by an
//! unprivileged process: any write or change of metadata moves it to the current time. So the
//! shortcut is passed only by someone who can set the system clock or write the disk beneath
//! the file system, or who rewrites the `.verified` file too — that is, by whoever can write the
//! state directory, who could rewrite the registry's recorded hashes just as well.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::layout::{VERIFIED_DIR, package_dir, verified_path};
use super::registry::{FileRecord, PackageError, PackageRecord, Registry, StoreLock};
use super::tree::scan;
use crate::state_dir::StateDir;

/// What a check that passed found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// Every file is as installed.
    Files,
    /// A development install (`conduit ext dev`): it runs from the author's folder, `source`,
    /// whose files change on purpose, so none was checked.
    DevInstall { source: PathBuf },
}

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
    #[error(
        "cannot check package `{name}` now: an install or remove is under way; try again when it is done"
    )]
    Busy { name: String },
}

/// Checks that the installed files of the package named `name` are those of its record: by
/// their stats when they match those kept at the last full check, else by hashing every file
/// (see the module documentation).
///
/// Waits for a running install or remove to finish, so it never sees half of one.
pub fn verify(state: &StateDir, name: &str) -> Result<Checked, VerifyError> {
    let _lock = StoreLock::shared(state)?;
    check(state, name, true)
}

/// [`verify`] that writes nothing (the stats of a full check are not kept) and waits for
/// nothing: while an install or remove holds the store, it fails at once with
/// [`VerifyError::Busy`]. For `conduit doctor`, which must change nothing.
pub fn verify_read_only(state: &StateDir, name: &str) -> Result<Checked, VerifyError> {
    let Some(_lock) = StoreLock::try_shared(state)? else {
        return Err(VerifyError::Busy {
            name: name.to_owned(),
        });
    };
    check(state, name, false)
}

/// The check itself, under the caller's shared lock; `remember` keeps the stats of a full
/// check that passed.
fn check(state: &StateDir, name: &str, remember: bool) -> Result<Checked, VerifyError> {
    let registry = Registry::load_one(state, name)?;
    let Some(record) = registry.packages.get(name) else {
        return Err(PackageError::NotInstalled {
            name: name.to_owned(),
        }
        .into());
    };
    if record.dev {
        return Ok(Checked::DevInstall {
            source: record.source.clone(),
        });
    }
    let dir = package_dir(state, name);
    let before = stat_tree(&dir);
    if let (Some(seen), Some(now)) = (read_seen(state, name), &before)
        && seen.record == record_identity(record)
        && *now == seen.files
    {
        return Ok(Checked::Files);
    }
    hash_and_compare(&dir, record)?;
    // Kept only if nothing changed while the files were being hashed.
    if let Some(before) = before
        && remember
    {
        keep(state, record, before);
    }
    Ok(Checked::Files)
}

/// The full check: every file hashed and compared with the record.
fn hash_and_compare(dir: &Path, record: &PackageRecord) -> Result<(), VerifyError> {
    let name = &record.name;
    let dir = dir.to_owned();
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

/// What the kernel said of one installed file at the last full check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct FileStat {
    dev: u64,
    ino: u64,
    size: u64,
    mode: u32,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// `packages/.verified/<name>.json`.
#[derive(Debug, Serialize, Deserialize)]
struct Seen {
    /// [`record_identity`] of the record the stats were taken under.
    record: String,
    files: BTreeMap<String, FileStat>,
}

/// Names one record: a reinstall of the same version, or a hand-edited record, gives another.
fn record_identity(record: &PackageRecord) -> String {
    let mut h = Sha256::new();
    for (path, f) in &record.files {
        h.update(path.as_bytes());
        h.update(b"\0");
        h.update(f.sha256.as_bytes());
        h.update(format!("\0{}\0{}\n", f.size, f.executable).as_bytes());
    }
    format!(
        "{}@{}:{}",
        record.version,
        record.installed_at_ms,
        hex::encode(h.finalize())
    )
}

fn read_seen(state: &StateDir, name: &str) -> Option<Seen> {
    let bytes = fs::read(verified_path(state, name)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The stats of every regular file under `root`, without following links; `None` if anything
/// but files and folders is there, or a folder cannot be read (the full check then says what).
fn stat_tree(root: &Path) -> Option<BTreeMap<String, FileStat>> {
    let mut out = BTreeMap::new();
    let mut todo: Vec<(PathBuf, String)> = vec![(root.to_owned(), String::new())];
    while let Some((dir, rel)) = todo.pop() {
        for entry in fs::read_dir(&dir).ok()? {
            let entry = entry.ok()?;
            let name = entry.file_name().into_string().ok()?;
            let key = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let meta = fs::symlink_metadata(entry.path()).ok()?;
            if meta.is_dir() {
                todo.push((entry.path(), key));
            } else if meta.is_file() {
                out.insert(
                    key,
                    FileStat {
                        dev: meta.dev(),
                        ino: meta.ino(),
                        size: meta.size(),
                        mode: meta.mode(),
                        mtime: (meta.mtime(), meta.mtime_nsec()),
                        ctime: (meta.ctime(), meta.ctime_nsec()),
                    },
                );
            } else {
                return None;
            }
        }
    }
    Some(out)
}

/// Keeps the stats of the package's files as they are now, for the next [`verify`]. Call only
/// when the files are known to be the record's: right after an install put them in place, or
/// after a full check passed. Best effort: without the file, the next check hashes in full.
pub(crate) fn remember(state: &StateDir, record: &PackageRecord) {
    if let Some(files) = stat_tree(&package_dir(state, &record.name)) {
        keep(state, record, files);
    }
}

/// Writes `files` as the kept stats of `record`, if they are still the stats on disk.
fn keep(state: &StateDir, record: &PackageRecord, files: BTreeMap<String, FileStat>) {
    if stat_tree(&package_dir(state, &record.name)).as_ref() != Some(&files) {
        return;
    }
    // The same paths and sizes as the record, or it is not the record's tree.
    let matches = files.len() == record.files.len()
        && record
            .files
            .iter()
            .all(|(p, f)| files.get(p).is_some_and(|s| s.size == f.size));
    if !matches {
        return;
    }
    let seen = Seen {
        record: record_identity(record),
        files,
    };
    let write = || -> io::Result<()> {
        let folder = state.packages_dir().join(VERIFIED_DIR);
        fs::create_dir_all(&folder)?;
        let mut tmp = tempfile::Builder::new()
            .prefix("registry-")
            .tempfile_in(state.tmp_dir())?;
        serde_json::to_writer(&mut tmp, &seen)?;
        tmp.write_all(b"\n")?;
        // No fsync: a lost or torn file only means the next check hashes in full.
        tmp.persist(verified_path(state, &record.name))
            .map_err(|e| e.error)?;
        Ok(())
    };
    if let Err(e) = write() {
        tracing::debug!(package = %record.name, error = %e, "cannot keep the verified stats");
    }
}
