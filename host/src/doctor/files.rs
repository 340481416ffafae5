//! The checks of what is on disk: the state directory's ownership and modes, the store
//! (`quick_check` on a read-only connection, bounded), free disk, the WAL's size, and the
//! installed packages' files against their records. Blocking; read-only.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::options::Options;
use super::report::Check;
use super::text::{bytes, cut, sh};
use crate::packages;
use crate::state_dir::{LAYOUT, PRIVATE_MODE, StateDir, StateDirSource};

/// Below this much free space the daemon's writes are about to fail.
pub(super) const DISK_FAIL_BYTES: u64 = 100 * 1024 * 1024;
/// Below this much (or 10% of the file system) it is time to look.
pub(super) const DISK_WARN_BYTES: u64 = 1024 * 1024 * 1024;
/// A WAL past this size means checkpoints have not been able to reset it for a long while.
pub(super) const WAL_WARN_BYTES: u64 = 128 * 1024 * 1024;

/// The state directory: present, a directory, ours, mode 0700 with its layout. The handle
/// (read-only) when the other checks may look inside.
pub(super) fn state_dir(o: &Options) -> (Option<StateDir>, Check) {
    const NAME: &str = "state-dir";
    let path = std::path::absolute(&o.state_dir.path).unwrap_or(o.state_dir.path.clone());
    let from = o.state_dir.source;
    let meta = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let found = format!(
                "no state directory at {} (from {from}): nothing is installed there",
                path.display()
            );
            let check = match from {
                StateDirSource::PlatformDefault => Check::warn(
                    NAME,
                    found,
                    "conduit ext install PATH   # installs a package and creates it",
                ),
                _ => Check::fail(
                    NAME,
                    found,
                    format!(
                        "check --state-dir and CONDUIT_STATE_DIR, or install into it: conduit --state-dir {} ext install PATH",
                        sh(&path)
                    ),
                ),
            };
            return (None, check);
        }
        Err(e) => {
            return (
                None,
                Check::fail(
                    NAME,
                    format!("cannot read {}: {e}", path.display()),
                    format!("ls -ld {}", sh(&path)),
                ),
            );
        }
    };
    if !meta.is_dir() {
        return (
            None,
            Check::fail(
                NAME,
                format!("{} is not a directory", path.display()),
                format!("mv {} {}.moved", sh(&path), sh(&path)),
            ),
        );
    }
    let uid = nix::unistd::geteuid().as_raw();
    if meta.uid() != uid {
        return (
            None,
            Check::fail(
                NAME,
                format!(
                    "{} is owned by uid {}, not by you (uid {uid}): its owner could replace the code the daemon runs",
                    path.display(),
                    meta.uid()
                ),
                format!("sudo chown -R {uid} {}", sh(&path)),
            ),
        );
    }
    let mut loose = Vec::new();
    let mut missing = Vec::new();
    let mut foreign = Vec::new();
    if meta.mode() & 0o077 != 0 {
        loose.push((path.clone(), meta.mode() & 0o7777));
    }
    for sub in LAYOUT {
        let p = path.join(sub);
        match std::fs::symlink_metadata(&p) {
            Err(_) => missing.push(p),
            Ok(m) if !m.is_dir() || m.uid() != uid => foreign.push(p),
            Ok(m) if m.mode() & 0o077 != 0 => loose.push((p, m.mode() & 0o7777)),
            Ok(_) => {}
        }
    }
    let state = StateDir::read_only(&path).ok();
    let check = if !foreign.is_empty() {
        let names: Vec<String> = foreign.iter().map(|p| p.display().to_string()).collect();
        let fix: Vec<String> = foreign
            .iter()
            .map(|p| format!("mv {} {}.moved && mkdir -m 700 {}", sh(p), sh(p), sh(p)))
            .collect();
        Check::fail(
            NAME,
            format!(
                "{} {} not a folder of yours (a link, a file, or another user's): the daemon refuses to start",
                names.join(", "),
                if names.len() == 1 { "is" } else { "are" }
            ),
            fix.join(" && "),
        )
    } else if !loose.is_empty() {
        let shown: Vec<String> = loose
            .iter()
            .map(|(p, m)| format!("{} is mode {m:04o}", p.display()))
            .collect();
        let paths: Vec<String> = loose.iter().map(|(p, _)| sh(p)).collect();
        Check::fail(
            NAME,
            format!(
                "{}: other users can read or replace what conduit runs",
                shown.join(", ")
            ),
            format!("chmod {PRIVATE_MODE:o} {}", paths.join(" ")),
        )
    } else if !missing.is_empty() {
        let paths: Vec<String> = missing.iter().map(|p| sh(p)).collect();
        Check::warn(
            NAME,
            format!(
                "{} missing (no daemon has run here yet, or it was deleted)",
                paths.join(", ")
            ),
            format!("mkdir -m 700 {}", paths.join(" ")),
        )
    } else {
        Check::ok(
            NAME,
            format!(
                "{} (from {from}): yours, mode {PRIVATE_MODE:04o}, its folders in place",
                path.display()
            ),
        )
    };
    (state, check)
}

/// `conduit.db`: `quick_check` on a read-only connection, at most `o.store_timeout`.
pub(super) fn store(o: &Options, state: &StateDir) -> Option<Check> {
    const NAME: &str = "store";
    let db = state.path().join("conduit.db");
    let size = match std::fs::metadata(&db) {
        Ok(m) => m.len(),
        Err(_) => {
            return Some(Check::ok(
                NAME,
                "no store yet: the daemon creates conduit.db when it first starts",
            ));
        }
    };
    let check = match conduit_store::inspect(&db, o.store_timeout) {
        Ok(i) if i.schema_version > i.known_version as i64 => Check::warn(
            NAME,
            format!(
                "{} has schema version {}, newer than the {} this conduit knows: the daemon from this binary refuses it",
                db.display(),
                i.schema_version,
                i.known_version
            ),
            "run the newer conduit that migrated it (`conduit --version` is this one)",
        ),
        Ok(i) => match i.quick_check {
            Ok(()) => Check::ok(
                NAME,
                format!(
                    "{} ({}): quick_check ok in {} ms, schema version {}",
                    db.display(),
                    bytes(size),
                    i.took.as_millis(),
                    i.schema_version
                ),
            ),
            Err(conduit_store::QuickCheck::Problems(p)) => Check::fail(
                NAME,
                format!("{} failed quick_check: {}", db.display(), cut(&p, 300)),
                recover_fix(&db),
            ),
            Err(conduit_store::QuickCheck::TimedOut(t)) => Check::warn(
                NAME,
                format!(
                    "quick_check of {} ({}) did not finish within {:.0} s",
                    db.display(),
                    bytes(size),
                    t.as_secs_f64()
                ),
                format!(
                    "conduit doctor --store-timeout {}",
                    (o.store_timeout.as_secs() * 6).max(60)
                ),
            ),
        },
        Err(e) => Check::fail(
            NAME,
            format!("cannot check {} read-only: {e}", db.display()),
            "conduit daemon run   # its start recovers the store, or says why it cannot",
        ),
    };
    Some(check)
}

/// How to get a damaged store's records back into a sound file.
fn recover_fix(db: &Path) -> String {
    let recovered = db.with_file_name("conduit-recovered.db");
    format!(
        "sqlite3 {} .recover | sqlite3 {}   # then, with the daemon stopped, keep conduit.db aside and move the recovered file into its place",
        sh(db),
        sh(&recovered)
    )
}

/// Free space on the state directory's file system.
pub(super) fn disk(state: &StateDir) -> Option<Check> {
    const NAME: &str = "disk";
    let path = state.path();
    let check = match nix::sys::statvfs::statvfs(path) {
        Err(e) => Check::warn(
            NAME,
            format!("cannot read the free space of {}: {e}", path.display()),
            format!("df -h {}", sh(path)),
        ),
        // `fsblkcnt_t` and friends are not `u64` on every platform.
        #[allow(clippy::unnecessary_cast)]
        Ok(v) => {
            let unit = v.fragment_size() as u64;
            let free = v.blocks_available() as u64 * unit;
            let total = v.blocks() as u64 * unit;
            let share = if total == 0 {
                100.0
            } else {
                free as f64 * 100.0 / total as f64
            };
            let found = format!(
                "{} free of {} ({share:.0}%) on the file system of {}",
                bytes(free),
                bytes(total),
                path.display()
            );
            let fix = format!(
                "du -sh {}/* | sort -h   # what conduit keeps there; free space on that file system",
                sh(path)
            );
            if free < DISK_FAIL_BYTES {
                Check::fail(NAME, format!("{found}: writes are about to fail"), fix)
            } else if free < DISK_WARN_BYTES || share < 10.0 {
                Check::warn(NAME, found, fix)
            } else {
                Check::ok(NAME, found)
            }
        }
    };
    Some(check)
}

/// The size of `conduit.db-wal`.
pub(super) fn wal(state: &StateDir) -> Option<Check> {
    const NAME: &str = "wal";
    let db = state.path().join("conduit.db");
    let wal = state.path().join("conduit.db-wal");
    let check = match std::fs::metadata(&wal) {
        Err(_) => Check::ok(
            NAME,
            "no WAL file (the store is closed, or there is none yet)",
        ),
        Ok(m) if m.len() > WAL_WARN_BYTES => Check::warn(
            NAME,
            format!(
                "{} is {}: checkpoints have not been able to reset it (a long read held them off)",
                wal.display(),
                bytes(m.len())
            ),
            format!("sqlite3 {} 'PRAGMA wal_checkpoint(TRUNCATE)'", sh(&db)),
        ),
        Ok(m) => Check::ok(NAME, format!("{} is {}", wal.display(), bytes(m.len()))),
    };
    Some(check)
}

/// Every installed package's files against its record, without writing the kept stats; one
/// line for all when none changed, else one line per changed package.
pub(super) fn packages(state: &StateDir) -> Vec<Check> {
    const NAME: &str = "packages";
    let records = match packages::list(state) {
        Ok(r) => r,
        Err(e) => {
            return vec![Check::fail(
                NAME,
                format!("cannot read the package registry: {e}"),
                format!("ls -la {}", sh(&state.packages_dir())),
            )];
        }
    };
    if records.is_empty() {
        return vec![Check::ok(NAME, "no packages installed")];
    }
    let mut out = Vec::new();
    for rec in &records {
        let name = format!("package {}", rec.name);
        match packages::verify_read_only(state, &rec.name) {
            Ok(packages::Checked::Files) => {}
            // Not a failure, but not what a production daemon should run either: code that
            // changes under it, unchecked.
            Ok(packages::Checked::DevInstall { source }) => out.push(Check::warn(
                name,
                format!(
                    "a development install from {} (`conduit ext dev`): its files are the author's and are not checked",
                    source.display()
                ),
                format!(
                    "conduit ext remove {}   # then, when it is ready: conduit ext install {}",
                    rec.name,
                    sh(&source)
                ),
            )),
            Err(packages::VerifyError::Tampered(t)) => {
                let changes: Vec<String> =
                    t.changes.iter().take(5).map(|c| c.to_string()).collect();
                let more = t.changes.len().saturating_sub(5);
                out.push(Check::fail(
                    name,
                    format!(
                        "files changed after install: {}{}{}",
                        changes.join(", "),
                        if more > 0 {
                            format!(" and {more} more")
                        } else {
                            String::new()
                        },
                        if rec.enabled {
                            "; the daemon refuses to start it"
                        } else {
                            ""
                        }
                    ),
                    format!("conduit ext install {}", sh(&t.installed_from)),
                ));
            }
            Err(packages::VerifyError::Busy { .. }) => out.push(Check::warn(
                name,
                "not checked: an install or remove is under way",
                "conduit doctor   # again, once it is done",
            )),
            Err(e) => out.push(Check::fail(
                name,
                e.to_string(),
                format!("conduit ext install {}", sh(&rec.source)),
            )),
        }
    }
    if out.is_empty() {
        out.push(Check::ok(
            NAME,
            format!(
                "{} package{}, every file as installed",
                records.len(),
                if records.len() == 1 { "" } else { "s" }
            ),
        ));
    }
    out
}
