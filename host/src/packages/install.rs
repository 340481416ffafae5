//! Installing a package from a folder or a `.tar.gz`: validate, stage, hash, swap.
//!
//! ```text
//! source ──validate manifest (folders)──▶ lock packages/ ──▶ stage into tmp/install-XXXXXX/pkg
//!        ──manifest (archives), command, version order──▶ hash every file
//!        ──▶ rename packages/<name> aside ──▶ rename staged folder in ──▶ write registry
//!        (the old record under `previous`) ──▶ move the old version to packages/<name>.previous
//!        (the one kept before goes) ──▶ drop staging
//! ```
//!
//! Invariant: until the staged folder is renamed in, nothing outside `tmp/install-XXXXXX/` has
//! changed, and that folder is deleted on every return; after it, each failure undoes the steps
//! before it. So a failed install leaves the state directory as it found it.

use std::cmp::Ordering;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::archive;
use super::layout::package_dir;
use super::registry::{
    FileRecord, PackageError, PackageRecord, REGISTRY_FILE, Registry, StoreLock, sweep_stale,
    sync_dir,
};
use super::tree::{Budget, Scan, StageError, UnsafeEntry, copy_folder, scan, sync_tree};
use crate::manifest::{MANIFEST_FILE, Manifest, ManifestError};
use crate::state_dir::StateDir;

/// The largest total size of a package's files an install accepts by default (1 GiB).
pub const DEFAULT_MAX_TOTAL_BYTES: u64 = 1 << 30;

/// The most files, folders and links an install accepts by default.
pub const DEFAULT_MAX_ENTRIES: u64 = 100_000;

/// How an install may go.
#[derive(Debug, Clone)]
pub struct InstallOptions {
    /// Allow replacing an installed package with a lower version.
    pub allow_downgrade: bool,
    /// The most bytes of files a package may hold; more is refused as a likely archive bomb.
    pub max_total_bytes: u64,
    /// The most files, folders and links a package may hold.
    pub max_entries: u64,
    /// Allow reinstalling the same version from another source or with other content.
    pub force: bool,
}

impl Default for InstallOptions {
    fn default() -> InstallOptions {
        InstallOptions {
            allow_downgrade: false,
            max_total_bytes: DEFAULT_MAX_TOTAL_BYTES,
            max_entries: DEFAULT_MAX_ENTRIES,
            force: false,
        }
    }
}

/// What an install did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstallOutcome {
    #[serde(flatten)]
    pub change: InstallChange,
    /// The package's record as now written in the registry.
    pub record: PackageRecord,
    /// What differs from the version it replaced, for a reinstall of the same version (a
    /// forced one); empty otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<String>,
    /// The version it replaced, kept for `conduit ext rollback` (none for a new install).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
}

/// How the installed version relates to what was there before.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum InstallChange {
    /// The package was not installed.
    Installed,
    /// A lower version was replaced.
    Upgraded { from: String, to: String },
    /// A higher version was replaced (only with [`InstallOptions::allow_downgrade`]).
    Downgraded { from: String, to: String },
    /// The same version was installed again; its files were replaced and re-hashed.
    Reinstalled,
}

impl fmt::Display for InstallOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = &self.record.name;
        match &self.change {
            InstallChange::Installed => write!(f, "installed {name} {}", self.record.version),
            InstallChange::Upgraded { from, to } => {
                write!(f, "upgraded {name} from {from} to {to}")
            }
            InstallChange::Downgraded { from, to } => {
                write!(f, "downgraded {name} from {from} to {to}")
            }
            InstallChange::Reinstalled => write!(f, "reinstalled {name} {}", self.record.version),
        }?;
        if !self.changes.is_empty() {
            write!(f, " ({})", self.changes.join("; "))?;
        }
        Ok(())
    }
}

/// Why an install was refused or failed. Whatever the variant, the state directory is as it was
/// before the call (see the module invariant), except for [`PackageError::Stranded`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InstallError {
    #[error("cannot install {}: {problem}", origin.display())]
    Source { origin: PathBuf, problem: String },
    #[error("cannot install {}: {source}", origin.display())]
    Manifest {
        origin: PathBuf,
        // Boxed: a manifest error is large, and every `Result` of this module carries the enum.
        #[source]
        source: Box<ManifestError>,
    },
    #[error(
        "cannot install {}: `command` program `{program}` {problem}",
        origin.display()
    )]
    Command {
        origin: PathBuf,
        program: String,
        problem: String,
    },
    #[error("cannot install {}: `{entry}` {problem}", origin.display())]
    Unsafe {
        origin: PathBuf,
        entry: String,
        problem: UnsafeEntry,
    },
    #[error(
        "cannot install {}: its files add up to more than {}, the limit for a package (is it an archive bomb?); make the package smaller",
        origin.display(), human_bytes(*limit)
    )]
    TooLarge { origin: PathBuf, limit: u64 },
    #[error(
        "cannot install {}: it holds more than {limit} files, folders and links, the limit for a package (is it an archive bomb?); make the package smaller",
        origin.display()
    )]
    TooManyEntries { origin: PathBuf, limit: u64 },
    #[error(
        "cannot install {}: it is not a valid .tar.gz archive ({source}); check that it was made with `tar -czf` and copied whole",
        origin.display()
    )]
    CorruptArchive {
        origin: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "cannot install {}: the archive has no {MANIFEST_FILE} at its top level, nor in a single top-level folder; pack the package folder itself (`tar -C <folder> -czf <archive> .`)",
        origin.display()
    )]
    NoManifest { origin: PathBuf },
    #[error("cannot install {}: cannot read {}: {source}", origin.display(), path.display())]
    Read {
        origin: PathBuf,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "refusing to downgrade `{name}` from {installed} to {requested}; pass --allow-downgrade to install the older version anyway"
    )]
    Downgrade {
        name: String,
        installed: String,
        requested: String,
    },
    #[error(
        "`{name}` {version} is already installed, and this is not the same package: {}; pass --force to replace it anyway, or give the new package another version",
        changes.join("; ")
    )]
    Changed {
        name: String,
        version: String,
        changes: Vec<String>,
    },
    #[error(
        "`{name}` is a development install from {} (`conduit ext dev`); stop that session (Ctrl-C), or remove it with `conduit ext remove {name}`, first",
        source_dir.display()
    )]
    DevInstalled { name: String, source_dir: PathBuf },
    #[error(
        "`{name}` {version} is installed from the package store, not in development; `conduit ext dev` does not replace it: remove it first (`conduit ext remove {name}`), or give the package under development another name"
    )]
    NotDev { name: String, version: String },
    #[error(
        "cannot install {}: cannot write {}: {source}; check that the state directory is writable and the disk is not full",
        origin.display(), path.display()
    )]
    Write {
        origin: PathBuf,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Package(#[from] PackageError),
}

impl InstallError {
    fn from_stage(origin: &Path, e: StageError) -> InstallError {
        let origin = origin.to_owned();
        match e {
            StageError::Unsafe { entry, problem } => InstallError::Unsafe {
                origin,
                entry,
                problem,
            },
            StageError::TooLarge { limit } => InstallError::TooLarge { origin, limit },
            StageError::Corrupt(source) => InstallError::CorruptArchive { origin, source },
            StageError::TooManyEntries { limit } => InstallError::TooManyEntries { origin, limit },
            StageError::NoManifest => InstallError::NoManifest { origin },
            StageError::Read { path, source } => InstallError::Read {
                origin,
                path,
                source,
            },
            StageError::Write { path, source } => InstallError::Write {
                origin,
                path,
                source,
            },
        }
    }
}

/// `n` bytes in the largest binary unit that divides it (limits are round numbers).
fn human_bytes(n: u64) -> String {
    for (unit, size) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if n >= size && n.is_multiple_of(size) {
            return format!("{} {unit}", n / size);
        }
    }
    format!("{n} bytes")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SourceKind {
    Folder,
    Archive,
}

/// Installs the package at `source` (a package folder, or a `.tar.gz` of one) into `state`.
///
/// A folder's manifest is validated before anything else happens; an archive's as soon as it is
/// unpacked into staging. Links inside a folder or an archive are installed as copies of the file
/// they reach, and refused if they reach outside the package, a folder, or nothing. Installing
/// over an installed package of the same name upgrades or reinstalls it (keeping its enabled
/// flag); a lower version is refused unless `opts.allow_downgrade`. Blocks while another install
/// or remove on the same state directory is running.
pub fn install(
    state: &StateDir,
    source: &Path,
    opts: &InstallOptions,
) -> Result<InstallOutcome, InstallError> {
    let source_err = |problem: String| InstallError::Source {
        origin: source.to_owned(),
        problem,
    };
    let origin = std::path::absolute(source).map_err(|e| source_err(e.to_string()))?;
    let kind = source_kind(&origin)?;
    if kind == SourceKind::Folder {
        let manifest = Manifest::load(&origin).map_err(|e| InstallError::Manifest {
            origin: origin.clone(),
            source: Box::new(e),
        })?;
        refuse_state_inside(state, &origin)?;
        // Refuse a downgrade before the copy; it is checked again under the lock below.
        plan(&Registry::load_one(state, &manifest.name)?, &manifest, opts)?;
    }

    let _lock = StoreLock::exclusive(state)?;
    sweep_stale(state);
    let staging = tempfile::Builder::new()
        .prefix("install-")
        .tempdir_in(state.tmp_dir())
        .map_err(|e| InstallError::Write {
            origin: origin.clone(),
            path: state.tmp_dir(),
            source: e,
        })?;
    let staged = staging.path().join("pkg");
    let mut budget = Budget::new(opts.max_total_bytes, opts.max_entries);
    let root = match kind {
        SourceKind::Folder => copy_folder(&origin, &staged, &mut budget).map(|()| staged),
        SourceKind::Archive => archive::extract(&origin, &staged, &mut budget),
    }
    .map_err(|e| InstallError::from_stage(&origin, e))?;

    // The staged copy is what gets installed, so its manifest is the one that counts (for a
    // folder it is normally the one validated above).
    let manifest = load_staged_manifest(&origin, &root, kind)?;
    let registry = Registry::load_one(state, &manifest.name)?;
    let change = plan(&registry, &manifest, opts)?;
    let Scan { files, others } = scan(&root).map_err(|e| InstallError::Read {
        origin: origin.clone(),
        path: root.clone(),
        source: e,
    })?;
    // Staging never creates links or special files; finding one means the invariant broke.
    if let Some((path, kind)) = others.into_iter().next() {
        return Err(InstallError::Unsafe {
            origin,
            entry: path,
            problem: UnsafeEntry::Special { kind },
        });
    }
    check_command(&origin, &manifest, &files)?;
    sync_tree(&root).map_err(|e| InstallError::Write {
        origin: origin.clone(),
        path: root.clone(),
        source: e,
    })?;
    let previous = registry.packages.get(&manifest.name);
    let changes = match (&change, previous) {
        (InstallChange::Reinstalled, Some(old)) => {
            let changes = differences(old, &origin, &files);
            if !changes.is_empty() && !opts.force {
                return Err(InstallError::Changed {
                    name: manifest.name.clone(),
                    version: manifest.version.clone(),
                    changes,
                });
            }
            changes
        }
        _ => Vec::new(),
    };
    let previous = previous.map(|r| r.version.clone());

    let enabled = registry
        .packages
        .get(&manifest.name)
        .is_none_or(|r| r.enabled);
    let record = PackageRecord {
        name: manifest.name.clone(),
        version: manifest.version.clone(),
        // Records keep unsigned milliseconds; a clock before 1970 reads as 0.
        installed_at_ms: u64::try_from(conduit_supervisor::now_ms()).unwrap_or(0),
        enabled,
        source: PathBuf::from(origin.to_string_lossy().into_owned()),
        manifest,
        files,
        dev: false,
    };
    swap(state, registry, staging, &root, &record, &origin)?;
    // Installed read-only (see `readonly`); a failure here leaves a working, writable package,
    // which is logged rather than undone.
    let target = package_dir(state, &record.name);
    if let Err(e) = super::readonly::make_read_only(&target) {
        tracing::warn!(package = %record.name, error = %e, "cannot make the installed package read-only");
    }
    // The files were hashed in staging just now: keep their stats (after the mode change above,
    // which moves their ctime), so the first start checks them without hashing again (see
    // `verify.rs`).
    super::verify::remember(state, &record);
    Ok(InstallOutcome {
        change,
        record,
        changes,
        previous,
    })
}

/// What a reinstall of the same version would change: its source, and which files differ.
fn differences(
    old: &PackageRecord,
    origin: &Path,
    files: &std::collections::BTreeMap<String, FileRecord>,
) -> Vec<String> {
    let mut out = Vec::new();
    if old.source != origin {
        out.push(format!(
            "its source changes from {} to {}",
            old.source.display(),
            origin.display()
        ));
    }
    let mut what = Vec::new();
    for (path, f) in files {
        match old.files.get(path) {
            None => what.push(format!("{path} added")),
            Some(o) if o.sha256 != f.sha256 => what.push(format!("{path} changed")),
            Some(o) if o.executable != f.executable => {
                what.push(format!("{path} changed its executable bit"))
            }
            Some(_) => {}
        }
    }
    for path in old.files.keys() {
        if !files.contains_key(path) {
            what.push(format!("{path} removed"));
        }
    }
    if !what.is_empty() {
        let n = what.len();
        let shown: Vec<String> = what.iter().take(5).cloned().collect();
        let more = if n > 5 {
            format!(", and {} more", n - 5)
        } else {
            String::new()
        };
        out.push(format!(
            "{n} file{} differ{}: {}{more}",
            if n == 1 { "" } else { "s" },
            if n == 1 { "s" } else { "" },
            shown.join(", ")
        ));
    }
    out
}

fn source_kind(origin: &Path) -> Result<SourceKind, InstallError> {
    let err = |problem: String| InstallError::Source {
        origin: origin.to_owned(),
        problem,
    };
    let meta = fs::metadata(origin).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => {
            err("it does not exist; give the path of a package folder or a .tar.gz archive".into())
        }
        _ => err(format!("cannot read it ({e})")),
    })?;
    if meta.is_dir() {
        return Ok(SourceKind::Folder);
    }
    if meta.is_file()
        && archive::looks_gzipped(origin).map_err(|e| err(format!("cannot read it ({e})")))?
    {
        return Ok(SourceKind::Archive);
    }
    Err(err("it is neither a package folder nor a gzip-compressed tar archive (.tar.gz); give the folder holding conduit-extension.toml, or pack it with `tar -C <folder> -czf <archive> .`".into()))
}

/// Copying a folder that holds the state directory would copy staging into itself.
pub(crate) fn refuse_state_inside(state: &StateDir, origin: &Path) -> Result<(), InstallError> {
    let (Ok(real_state), Ok(real_origin)) = (state.path().canonicalize(), origin.canonicalize())
    else {
        return Ok(());
    };
    if real_state.starts_with(&real_origin) {
        return Err(InstallError::Source {
            origin: origin.to_owned(),
            problem: format!(
                "the state directory {} is inside it; move the state directory out of the package folder, or install from an archive",
                state.path().display()
            ),
        });
    }
    Ok(())
}

/// Reads the staged manifest. Errors name it where the operator can find it (in the folder, or
/// inside the archive: `notes.tar.gz/notes/conduit-extension.toml`), not inside staging, which
/// is gone by the time they are read.
fn load_staged_manifest(
    origin: &Path,
    root: &Path,
    kind: SourceKind,
) -> Result<Manifest, InstallError> {
    let manifest_err = |e| InstallError::Manifest {
        origin: origin.to_owned(),
        source: Box::new(e),
    };
    let mut shown = origin.to_owned();
    // An archive's `root` is staging's `pkg` or `pkg/<top>`; name the top folder if there is one.
    if kind == SourceKind::Archive
        && let Some(top) = root
            .parent()
            .filter(|p| p.file_name() == Some("pkg".as_ref()))
            .and(root.file_name())
    {
        shown.push(top);
    }
    shown.push(MANIFEST_FILE);
    let text = crate::manifest::read_capped(&root.join(MANIFEST_FILE)).map_err(|e| {
        InstallError::Read {
            origin: origin.to_owned(),
            path: shown.clone(),
            source: e,
        }
    })?;
    if text.len() > crate::manifest::MAX_MANIFEST_BYTES {
        return Err(manifest_err(ManifestError::TooLarge { path: shown }));
    }
    let text = String::from_utf8(text).map_err(|e| {
        manifest_err(ManifestError::Read {
            path: shown.clone(),
            source: io::Error::new(io::ErrorKind::InvalidData, e),
            hint: "the manifest must be UTF-8 text",
        })
    })?;
    Manifest::parse(&text, &shown).map_err(manifest_err)
}

/// What installing `manifest` over the registry's current state would be.
fn plan(
    registry: &Registry,
    manifest: &Manifest,
    opts: &InstallOptions,
) -> Result<InstallChange, InstallError> {
    let Some(old) = registry.packages.get(&manifest.name) else {
        return Ok(InstallChange::Installed);
    };
    if old.dev {
        return Err(InstallError::DevInstalled {
            name: old.name.clone(),
            source_dir: old.source.clone(),
        });
    }
    let (from, to) = (old.version.clone(), manifest.version.clone());
    match compare_versions(&from, &to) {
        Ordering::Equal => Ok(InstallChange::Reinstalled),
        Ordering::Less => Ok(InstallChange::Upgraded { from, to }),
        Ordering::Greater if opts.allow_downgrade => Ok(InstallChange::Downgraded { from, to }),
        Ordering::Greater => Err(InstallError::Downgrade {
            name: manifest.name.clone(),
            installed: from,
            requested: to,
        }),
    }
}

/// Semver precedence. The manifest only admits valid semver, so the fallback (plain string
/// order) only matters for a hand-edited registry.
fn compare_versions(a: &str, b: &str) -> Ordering {
    match (semver::Version::parse(a), semver::Version::parse(b)) {
        (Ok(a), Ok(b)) => a.cmp_precedence(&b),
        _ => a.cmp(b),
    }
}

/// A `command` program given as a path must be an executable file of the package. (A bare name
/// is looked up on `PATH` when the daemon starts the package, whose `PATH` may differ from the
/// installer's, so it is not checked here.)
fn check_command(
    origin: &Path,
    manifest: &Manifest,
    files: &std::collections::BTreeMap<String, FileRecord>,
) -> Result<(), InstallError> {
    let program = &manifest.command[0];
    if !program.contains('/') {
        return Ok(());
    }
    let err = |problem: &str| InstallError::Command {
        origin: origin.to_owned(),
        program: program.clone(),
        problem: problem.to_owned(),
    };
    // Resolved the way the supervisor will: relative to the package folder, `..` allowed as
    // long as it stays inside.
    let Some(key) = archive::resolve_target(&[], program).map(|parts| parts.join("/")) else {
        return Err(err(
            "is not a path inside the package; name a file in the package folder, e.g. \"./bin/tool\"",
        ));
    };
    match files.get(&key) {
        None => Err(err(
            "is not a file in the package; build or copy the program into the package, or fix `command`",
        )),
        Some(f) if !f.executable => Err(err(
            "is not executable; `chmod +x` it before packing, or fix `command`",
        )),
        Some(_) => Ok(()),
    }
}

/// Puts the staged package in place and records it; undoes what it did on failure.
fn swap(
    state: &StateDir,
    mut registry: Registry,
    staging: tempfile::TempDir,
    root: &Path,
    record: &PackageRecord,
    origin: &Path,
) -> Result<(), InstallError> {
    let name = &record.name;
    let target = package_dir(state, name);
    let aside = staging.path().join("previous");
    let write_err = |path: &Path, source| InstallError::Write {
        origin: origin.to_owned(),
        path: path.to_owned(),
        source,
    };
    // The installed version is read-only; moving a folder to another parent needs its write bit.
    super::readonly::make_writable(&target).map_err(|e| write_err(&target, e))?;
    let had_old = match fs::rename(&target, &aside) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => return Err(write_err(&target, e)),
    };
    // Puts the previous version back after `cause`. If even that fails, the previous version must
    // outlive staging's cleanup, and the error says where it is.
    let undo = |staging: tempfile::TempDir, cause: InstallError| -> InstallError {
        let back = had_old.then(|| fs::rename(&aside, &target));
        if let Some(Ok(())) = back {
            // It was made writable to be moved aside; it goes back read-only.
            let _ = super::readonly::make_read_only(&target);
        }
        match back {
            Some(Err(e)) => {
                let kept = super::registry::keep_out_of_sweep(staging.keep()).join("previous");
                PackageError::Stranded {
                    name: name.clone(),
                    message: format!("{cause}; then restoring the previous version failed: {e}"),
                    kept,
                    dir: target.clone(),
                }
                .into()
            }
            _ => cause,
        }
    };
    if let Err(e) = fs::rename(root, &target) {
        return Err(undo(staging, write_err(&target, e)));
    }
    // The version replaced is kept (folder and record) for `conduit ext rollback`.
    let old = registry.packages.insert(name.clone(), record.clone());
    match old.filter(|_| had_old) {
        Some(old) => registry.previous.insert(name.clone(), old),
        None => registry.previous.remove(name),
    };
    let registry_path = state.packages_dir().join(REGISTRY_FILE);
    let saved = fail_point("before-registry-save")
        .map_err(|e| PackageError::io("write", &registry_path, e))
        .and_then(|()| registry.save(state));
    if let Err(e) = saved {
        // Take the new version back out, so the previous one can return to its place.
        if let Err(back) = fs::rename(&target, root) {
            let cause = InstallError::Write {
                origin: origin.to_owned(),
                path: target.clone(),
                source: back,
            };
            return Err(undo(
                staging,
                InstallError::Write {
                    origin: origin.to_owned(),
                    path: registry_path,
                    source: io::Error::other(format!(
                        "{e}; then taking the new version out failed: {cause}"
                    )),
                },
            ));
        }
        return Err(undo(staging, e.into()));
    }
    // The registry's rename is durable already; make the package folder's rename durable too.
    // A failure here changes nothing a reader can see, so it is not worth undoing.
    let _ = sync_dir(&state.packages_dir());
    super::lifecycle::keep_previous(
        state,
        &mut registry,
        name,
        had_old.then_some(&aside),
        staging,
    );
    Ok(())
}

/// A test hook: fails the named step when a test has armed it on this thread.
#[cfg(test)]
pub(crate) fn fail_point(step: &'static str) -> io::Result<()> {
    FAIL_AT.with(|f| {
        if f.get() == Some(step) {
            Err(io::Error::other(format!("injected failure at {step}")))
        } else {
            Ok(())
        }
    })
}

#[cfg(not(test))]
#[inline(always)]
pub(crate) fn fail_point(_step: &'static str) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
thread_local! {
    pub(crate) static FAIL_AT: std::cell::Cell<Option<&'static str>> = const { std::cell::Cell::new(None) };
}
