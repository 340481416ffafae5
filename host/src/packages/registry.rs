//! The record of every installed package, and the lock that serialises changes to the store.
//!
//! Layout (format 2): one file per package, `packages/.records/<name>.json` (a [`PackageRecord`]),
//! and `packages/registry.json`, which holds only the format number. One file per package makes
//! an install, remove or enable cost the same with one package installed or a thousand: it reads
//! and writes that package's record only (a single file of every record grew by a record per
//! install and was read, rewritten and fsynced whole each time). Format 1 (every record inside
//! `registry.json`) is still read; the first change under the exclusive lock rewrites it as
//! format 2.
//!
//! Invariant: a record file, and `registry.json`, is only ever replaced whole (written to a
//! temporary file in `<state>/tmp/`, fsynced, renamed over the old one, and the folder fsynced),
//! so a reader sees a package's old record or its new one, never a mix, and a crash never leaves
//! one half-written. A change touches one record, so it is as atomic as before. Unknown fields are
//! tolerated on read, so an older conduit can read a newer registry of the same format number.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::manifest::Manifest;
use crate::state_dir::StateDir;

/// The registry's file name inside `<state>/packages/`: the format number (and, in format 1,
/// every record).
pub const REGISTRY_FILE: &str = "registry.json";

/// The folder of the per-package records inside `<state>/packages/`. Package names are
/// `[a-z0-9-]`, so no package folder can have this name.
pub const RECORDS_DIR: &str = ".records";

/// The registry format this code writes. Bump it only for a change an older reader would
/// misread; adding a field does not need it.
const FORMAT: u32 = 2;

/// The format that kept every record inside `registry.json`; read, and rewritten on change.
const FORMAT_SINGLE_FILE: u32 = 1;

/// One installed package, as recorded at install time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackageRecord {
    pub name: String,
    pub version: String,
    /// When it was installed (or last reinstalled or upgraded), in Unix milliseconds.
    pub installed_at_ms: u64,
    /// Whether the daemon should run it. Installs enable; reinstalls and upgrades keep the flag.
    pub enabled: bool,
    /// The absolute path of the folder or archive it was installed from.
    pub source: PathBuf,
    /// The manifest, as validated when it was installed.
    #[serde(with = "manifest_serde")]
    pub manifest: Manifest,
    /// Every regular file of the package folder, by path relative to it (`/`-separated).
    pub files: BTreeMap<String, FileRecord>,
    /// A development install (`conduit ext dev`): nothing was copied, the daemon runs the
    /// package from `source` as it is now, and `files` is empty — the files are the author's,
    /// changing on purpose, so they are not checked (see `verify.rs`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dev: bool,
}

impl PackageRecord {
    /// The total size of the package's files, in bytes.
    pub fn total_bytes(&self) -> u64 {
        self.files.values().map(|f| f.size).sum()
    }
}

/// What was installed at one path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    /// Lowercase hex.
    pub sha256: String,
    pub size: u64,
    /// Whether any execute bit is set. Other mode bits are normalised at install time (0644 or
    /// 0755), so this is the only one worth recording.
    pub executable: bool,
}

/// Why the registry could not be read or changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PackageError {
    #[error("no package named `{name}` is installed; `conduit ext list` shows the installed ones")]
    NotInstalled { name: String },
    #[error(
        "the package registry {} is damaged ({message}); move it aside and reinstall your packages with `conduit ext install`",
        path.display()
    )]
    Corrupt { path: PathBuf, message: String },
    #[error(
        "the package registry {} has format {found}, newer than this conduit understands ({FORMAT}); upgrade conduit",
        path.display()
    )]
    NewerFormat { path: PathBuf, found: u32 },
    #[error(
        "could not undo a failed change to package `{name}` ({message}); its previous files are kept in {}: move that folder to {} by hand, or reinstall the package",
        kept.display(), dir.display()
    )]
    Stranded {
        name: String,
        message: String,
        kept: PathBuf,
        dir: PathBuf,
    },
    #[error(
        "`{name}` has no previous version to roll back to (only an upgrade, downgrade or reinstall keeps one, and only the last)"
    )]
    NoPrevious { name: String },
    #[error("cannot {action} {}: {source}; check that the state directory is writable and the disk is not full", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl PackageError {
    pub(crate) fn io(action: &'static str, path: &Path, source: io::Error) -> PackageError {
        PackageError::Io {
            action,
            path: path.to_owned(),
            source,
        }
    }
}

/// The registry as one operation sees it: the records it read, and what it changes.
///
/// [`Registry::load`] reads every record; [`Registry::load_one`] only the named one (what an
/// install, remove, enable or verify needs). [`Registry::save`] writes the records that differ
/// from what was read and deletes those taken out, so a change costs one record's write.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    pub(crate) packages: BTreeMap<String, PackageRecord>,
    /// The version each package replaced at its last upgrade, downgrade or reinstall, whose
    /// files are kept in `packages/<name>.previous/` for `conduit ext rollback`; stored as
    /// `packages/.records/<name>.previous.json`.
    pub(crate) previous: BTreeMap<String, PackageRecord>,
    /// The kept records as read, to tell what [`Registry::save`] must write or delete.
    read_previous: BTreeMap<String, PackageRecord>,
    /// The records as read, to tell what [`Registry::save`] must write or delete.
    read: BTreeMap<String, PackageRecord>,
    /// The store is in format 1 (or has no `registry.json` yet): the next save writes every
    /// record it holds and then the format-2 `registry.json`.
    upgrade: bool,
}

/// `registry.json` in format 1, and the format number of every format.
#[derive(Deserialize)]
struct SingleFile {
    #[serde(default)]
    packages: BTreeMap<String, PackageRecord>,
}

#[derive(Serialize, Deserialize)]
struct Head {
    format: u32,
}

/// What `registry.json` says.
enum Stored {
    /// No registry file: nothing was installed yet (or a first install crashed before writing
    /// it; its records are read all the same).
    Missing,
    /// Format 1: every record is in the file.
    SingleFile(BTreeMap<String, PackageRecord>),
    /// Format 2: the records are in [`RECORDS_DIR`].
    Records,
}

impl Registry {
    /// Reads every record; a store nothing was ever installed in has none, and that is empty.
    pub(crate) fn load(state: &StateDir) -> Result<Registry, PackageError> {
        let ((packages, previous), upgrade) = match read_head(state)? {
            Stored::SingleFile(all) => ((all, BTreeMap::new()), true),
            Stored::Missing => (read_all_records(state)?, true),
            Stored::Records => (read_all_records(state)?, false),
        };
        Ok(Registry {
            read: packages.clone(),
            packages,
            read_previous: previous.clone(),
            previous,
            upgrade,
        })
    }

    /// Reads the record of `name` only (if it is installed). In format 1 every record is read,
    /// since the first save rewrites them all.
    pub(crate) fn load_one(state: &StateDir, name: &str) -> Result<Registry, PackageError> {
        match read_head(state)? {
            Stored::SingleFile(_) => Registry::load(state),
            stored => {
                let packages: BTreeMap<String, PackageRecord> = read_record(state, name)?
                    .map(|r| (name.to_owned(), r))
                    .into_iter()
                    .collect();
                let previous: BTreeMap<String, PackageRecord> =
                    read_record_at(&previous_record_path(state, name), name)?
                        .map(|r| (name.to_owned(), r))
                        .into_iter()
                        .collect();
                Ok(Registry {
                    read: packages.clone(),
                    packages,
                    read_previous: previous.clone(),
                    previous,
                    upgrade: matches!(stored, Stored::Missing),
                })
            }
        }
    }

    /// Writes what changed since the load; see the module invariant. A record that is not
    /// loaded is left as it is.
    pub(crate) fn save(&mut self, state: &StateDir) -> Result<(), PackageError> {
        let records = state.packages_dir().join(RECORDS_DIR);
        if !records.is_dir() {
            fs::create_dir_all(&records).map_err(|e| PackageError::io("create", &records, e))?;
        }
        let mut wrote = false;
        for (name, rec) in &self.packages {
            if self.upgrade || self.read.get(name) != Some(rec) {
                let path = record_path(state, name);
                write_atomically(state, &path, rec)
                    .map_err(|e| PackageError::io("write", &path, e))?;
                wrote = true;
            }
        }
        for name in self.read.keys().filter(|n| !self.packages.contains_key(*n)) {
            let path = record_path(state, name);
            match fs::remove_file(&path) {
                Ok(()) => wrote = true,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(PackageError::io("delete", &path, e)),
            }
        }
        for (name, rec) in &self.previous {
            if self.read_previous.get(name) != Some(rec) {
                let path = previous_record_path(state, name);
                write_atomically(state, &path, rec)
                    .map_err(|e| PackageError::io("write", &path, e))?;
                wrote = true;
            }
        }
        for name in self
            .read_previous
            .keys()
            .filter(|n| !self.previous.contains_key(*n))
        {
            let path = previous_record_path(state, name);
            match fs::remove_file(&path) {
                Ok(()) => wrote = true,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(PackageError::io("delete", &path, e)),
            }
        }
        if wrote {
            sync_dir(&records).map_err(|e| PackageError::io("write", &records, e))?;
        }
        if self.upgrade {
            // Last: until this rename a reader still reads format 1 whole, which holds every
            // record but the one being changed, as it was.
            let path = state.packages_dir().join(REGISTRY_FILE);
            write_atomically(state, &path, &Head { format: FORMAT })
                .and_then(|()| sync_dir(&state.packages_dir()))
                .map_err(|e| PackageError::io("write", &path, e))?;
            self.upgrade = false;
        }
        self.read = self.packages.clone();
        self.read_previous = self.previous.clone();
        Ok(())
    }
}

/// `packages/.records/<name>.json`.
fn record_path(state: &StateDir, name: &str) -> PathBuf {
    state
        .packages_dir()
        .join(RECORDS_DIR)
        .join(format!("{name}.json"))
}

fn corrupt(path: &Path, message: impl Into<String>) -> PackageError {
    PackageError::Corrupt {
        path: path.to_owned(),
        message: message.into(),
    }
}

fn read_head(state: &StateDir) -> Result<Stored, PackageError> {
    let path = state.packages_dir().join(REGISTRY_FILE);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Stored::Missing),
        Err(e) => return Err(PackageError::io("read", &path, e)),
    };
    // Look at the format number first, so a newer registry is reported as newer rather than
    // as damaged when its shape changed.
    let head: Head = serde_json::from_slice(&bytes).map_err(|e| corrupt(&path, e.to_string()))?;
    match head.format {
        f if f > FORMAT => Err(PackageError::NewerFormat { path, found: f }),
        FORMAT_SINGLE_FILE | 0 => {
            let file: SingleFile =
                serde_json::from_slice(&bytes).map_err(|e| corrupt(&path, e.to_string()))?;
            if let Some((key, rec)) = file.packages.iter().find(|(k, r)| **k != r.name) {
                return Err(corrupt(
                    &path,
                    format!("the entry `{key}` records a package named `{}`", rec.name),
                ));
            }
            Ok(Stored::SingleFile(file.packages))
        }
        _ => Ok(Stored::Records),
    }
}

/// `packages/.records/<name>.previous.json`: the record of the version kept for a rollback.
/// Package names have no dots, so no package's own record has this name.
fn previous_record_path(state: &StateDir, name: &str) -> PathBuf {
    state
        .packages_dir()
        .join(RECORDS_DIR)
        .join(format!("{name}.previous.json"))
}

/// The record of `name` in [`RECORDS_DIR`], if there is one.
fn read_record(state: &StateDir, name: &str) -> Result<Option<PackageRecord>, PackageError> {
    read_record_at(&record_path(state, name), name)
}

/// The record at `path`, which must name the package `name`, if there is one.
fn read_record_at(path: &Path, name: &str) -> Result<Option<PackageRecord>, PackageError> {
    let path = path.to_owned();
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(PackageError::io("read", &path, e)),
    };
    let rec: PackageRecord =
        serde_json::from_slice(&bytes).map_err(|e| corrupt(&path, e.to_string()))?;
    if rec.name != name {
        return Err(corrupt(
            &path,
            format!(
                "the file of `{name}` records a package named `{}`",
                rec.name
            ),
        ));
    }
    Ok(Some(rec))
}

type Records = BTreeMap<String, PackageRecord>;

/// Every record in [`RECORDS_DIR`], and every kept previous record. Names that are neither
/// `<name>.json` nor `<name>.previous.json` (a temporary file of an editor, say) are skipped.
fn read_all_records(state: &StateDir) -> Result<(Records, Records), PackageError> {
    let dir = state.packages_dir().join(RECORDS_DIR);
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok((BTreeMap::new(), BTreeMap::new()));
        }
        Err(e) => return Err(PackageError::io("read", &dir, e)),
    };
    let mut out = BTreeMap::new();
    let mut kept = BTreeMap::new();
    for entry in entries {
        let entry = entry.map_err(|e| PackageError::io("read", &dir, e))?;
        let file_name = entry.file_name();
        let Some(name) = file_name.to_str().and_then(|n| n.strip_suffix(".json")) else {
            continue;
        };
        if name.is_empty() || name.starts_with('.') {
            continue;
        }
        if let Some(pkg) = name.strip_suffix(".previous") {
            if let Some(rec) = read_record_at(&entry.path(), pkg)? {
                kept.insert(pkg.to_owned(), rec);
            }
            continue;
        }
        if let Some(rec) = read_record(state, name)? {
            out.insert(name.to_owned(), rec);
        }
    }
    Ok((out, kept))
}

/// Replaces `path` with `value` as pretty JSON: a temporary file in `<state>/tmp/`, fsynced, then
/// renamed over it. The caller fsyncs the folder.
fn write_atomically(state: &StateDir, path: &Path, value: &impl Serialize) -> io::Result<()> {
    let mut tmp = tempfile::Builder::new()
        .prefix("registry-")
        .tempfile_in(state.tmp_dir())?;
    serde_json::to_writer_pretty(&mut tmp, value)?;
    tmp.write_all(b"\n")?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Makes renames into `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A `flock` on the `packages/` folder itself (no lock file to create, so taking it changes
/// nothing on disk). Released on drop.
#[derive(Debug)]
pub(crate) struct StoreLock {
    _lock: Flock<File>,
}

impl StoreLock {
    /// Waits for the exclusive lock: another install or remove finishes first.
    pub(crate) fn exclusive(state: &StateDir) -> Result<StoreLock, PackageError> {
        StoreLock::take(state, FlockArg::LockExclusive)
    }

    /// Waits for a shared lock: reads that must not see half of a change.
    pub(crate) fn shared(state: &StateDir) -> Result<StoreLock, PackageError> {
        StoreLock::take(state, FlockArg::LockShared)
    }

    /// A shared lock if no install or remove holds the store now; `None` if one does.
    pub(crate) fn try_shared(state: &StateDir) -> Result<Option<StoreLock>, PackageError> {
        match StoreLock::take(state, FlockArg::LockSharedNonblock) {
            Ok(lock) => Ok(Some(lock)),
            Err(PackageError::Io { source, .. })
                if source.raw_os_error() == Some(nix::libc::EWOULDBLOCK) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    fn take(state: &StateDir, arg: FlockArg) -> Result<StoreLock, PackageError> {
        let dir = state.packages_dir();
        let file = File::open(&dir).map_err(|e| PackageError::io("open", &dir, e))?;
        let lock = Flock::lock(file, arg)
            .map_err(|(_, errno)| PackageError::io("lock", &dir, errno.into()))?;
        Ok(StoreLock { _lock: lock })
    }
}

/// The prefixes of what mutations create in `<state>/tmp/`: staging, trash and registry temp files.
const SCRATCH_PREFIXES: [&str; 3] = ["install-", "remove-", "registry-"];

/// Deletes scratch left in `<state>/tmp/` by an install or remove that was killed.
///
/// Call only with the exclusive [`StoreLock`] held: every scratch entry is created and removed
/// under that lock, so with it held any that exist belong to a process that died. Failures are
/// ignored; the next sweep tries again.
pub(crate) fn sweep_stale(state: &StateDir) {
    let Ok(entries) = fs::read_dir(state.tmp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !SCRATCH_PREFIXES.iter().any(|p| name.starts_with(p)) {
            continue;
        }
        let path = entry.path();
        let _ = match entry.file_type() {
            Ok(t) if t.is_dir() => fs::remove_dir_all(&path),
            _ => fs::remove_file(&path),
        };
    }
}

/// Renames a scratch folder that must outlive the sweep (it holds the only copy of a package
/// after a failed undo) to a name the sweep leaves alone; returns where it is.
pub(crate) fn keep_out_of_sweep(dir: PathBuf) -> PathBuf {
    let Some(name) = dir.file_name().and_then(|n| n.to_str()) else {
        return dir;
    };
    let kept = dir.with_file_name(format!("kept-{name}"));
    match fs::rename(&dir, &kept) {
        Ok(()) => kept,
        Err(_) => dir,
    }
}

/// Every installed package, ordered by name.
pub fn list(state: &StateDir) -> Result<Vec<PackageRecord>, PackageError> {
    Ok(Registry::load(state)?.packages.into_values().collect())
}

/// The record of the package named `name`.
pub fn get(state: &StateDir, name: &str) -> Result<PackageRecord, PackageError> {
    Registry::load_one(state, name)?
        .packages
        .remove(name)
        .ok_or_else(|| PackageError::NotInstalled {
            name: name.to_owned(),
        })
}

/// Turns the package named `name` on or off for the daemon; returns whether the flag changed.
pub fn set_enabled(state: &StateDir, name: &str, enabled: bool) -> Result<bool, PackageError> {
    let _lock = StoreLock::exclusive(state)?;
    let mut registry = Registry::load_one(state, name)?;
    let rec = registry
        .packages
        .get_mut(name)
        .ok_or_else(|| PackageError::NotInstalled {
            name: name.to_owned(),
        })?;
    if rec.enabled == enabled {
        return Ok(false);
    }
    rec.enabled = enabled;
    registry.save(state)?;
    Ok(true)
}

/// The manifest as stored in a record. [`Manifest`] is the validated in-memory form and has no
/// serde of its own; this mirror keeps the registry's shape under this module's control.
mod manifest_serde {
    use conduit_protocol::Capabilities;
    use serde::{Deserialize, Serialize};

    use crate::manifest::{DevAsk, Manifest, SandboxAsk};
    use conduit_supervisor::limits::LimitSet;

    #[derive(Serialize, Deserialize)]
    struct Stored {
        name: String,
        version: String,
        protocol: Vec<u32>,
        command: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        description: Option<String>,
        #[serde(default)]
        capabilities: Capabilities,
        #[serde(default, skip_serializing_if = "LimitSet::is_empty")]
        limits: LimitSet,
        #[serde(default, skip_serializing_if = "SandboxAsk::is_empty")]
        sandbox: SandboxAsk,
        #[serde(default, skip_serializing_if = "DevAsk::is_empty")]
        dev: DevAsk,
    }

    pub(super) fn serialize<S: serde::Serializer>(m: &Manifest, s: S) -> Result<S::Ok, S::Error> {
        Stored {
            name: m.name.clone(),
            version: m.version.clone(),
            protocol: m.protocol.clone(),
            command: m.command.clone(),
            description: m.description.clone(),
            capabilities: m.capabilities.clone(),
            limits: m.limits.clone(),
            sandbox: m.sandbox.clone(),
            dev: m.dev.clone(),
        }
        .serialize(s)
    }

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Manifest, D::Error> {
        let s = Stored::deserialize(d)?;
        Ok(Manifest {
            name: s.name,
            version: s.version,
            protocol: s.protocol,
            command: s.command,
            description: s.description,
            capabilities: s.capabilities,
            limits: s.limits,
            sandbox: s.sandbox,
            dev: s.dev,
        })
    }
}
