//! One retention sweep over a state directory, the daemon's every `interval` and `conduit gc`'s
//! alike: artifact content (the store decides, `conduit_store::Store::sweep_artifacts`), content
//! files no row records, the logs of earlier runs, then a WAL checkpoint; and the sizes of what
//! is left.
//!
//! ```text
//!   artifacts  store: phase 1 decide (batches) ─► phase 2 delete files (batches)
//!   orphans    artifacts/sha256/<hex> without a row (gc, and every 16th periodic sweep)
//!   logs       logs/: plan (pure) ─► remove
//!   WAL        PASSIVE, then TRUNCATE when that copied every frame (idle)
//! ```
//!
//! Blocking: it reads and deletes files and runs store transactions; call it from a blocking
//! thread. A dry run reads only, deletes nothing and checkpoints nothing.
//!
//! Invariant: a sweep never removes a log while it cannot tell which packages are installed
//! (an unreadable registry skips the logs), and never deletes content a kept row records
//! (the store deletes files only inside the transaction that records them gone).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, UNIX_EPOCH};

use conduit_store::{ArtifactPolicy, RemovalReason, Store, StoreError, TxStats};
use serde::{Deserialize, Serialize};

use super::logs;
use super::settings::Retention;
use crate::state_dir::StateDir;

/// The most entries each of a report's lists shows (its counts are complete).
pub const REPORT_LIST_MAX: usize = 1000;

/// A content file no row records is removed only once at least this old (or the grace period,
/// if longer): a file just stored is recorded a moment later.
const ORPHAN_MIN_AGE: Duration = Duration::from_secs(60);

/// Whether a sweep looks for content files no row records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Orphans {
    /// Every content file is looked at (`conduit gc`, the daemon's first sweep and every 16th):
    /// one listing of `artifacts/sha256/`, a `stat` of each file, a lookup of each old one.
    All,
    /// Not this time: the folder is not listed.
    Skip,
}

/// What one sweep removed (or, in a dry run, would remove), kept, and left.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SweepReport {
    pub dry_run: bool,
    pub at_ms: i64,
    pub took_us: u64,
    pub artifacts: ArtifactsReport,
    pub logs: LogsReport,
    pub wal: WalReport,
    /// The sweep's store transactions: how many, and the longest (how long it held the
    /// writer, commit included; in a dry run, a reader).
    pub transactions: u64,
    pub longest_transaction_us: u64,
    /// All of them together.
    #[serde(default)]
    pub transactions_us: u64,
    pub sizes: Sizes,
    /// What could not be done (tried again at the next sweep).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

/// Artifact content.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ArtifactsReport {
    /// Content removed (at most [`REPORT_LIST_MAX`] listed), oldest first.
    pub removed: Vec<RemovedArtifact>,
    pub removed_count: u64,
    pub removed_bytes: u64,
    /// Old or over-budget content kept because a live record needs it.
    pub kept_live: u64,
    /// Content files removed (including ones an earlier, interrupted sweep decided on; in a
    /// dry run, those still waiting).
    pub files_deleted: u64,
    /// Content files no row records, removed (digests, at most [`REPORT_LIST_MAX`]).
    pub unrecorded_removed: Vec<String>,
    pub unrecorded_count: u64,
    pub unrecorded_bytes: u64,
    /// What is kept after the sweep.
    pub retained: u64,
    pub retained_bytes: u64,
    /// Bytes still over `max_bytes` (content live or within the grace period).
    pub over_budget_bytes: u64,
    /// The two phases' transactions: deciding (marking) and deleting the files.
    #[serde(default)]
    pub decide: TxStats,
    #[serde(default)]
    pub delete: TxStats,
}

/// One artifact whose content was removed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemovedArtifact {
    pub artifact_id: String,
    pub size: u64,
    pub touched_at_ms: i64,
    pub reason: RemovalReason,
}

/// The logs of `logs/`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LogsReport {
    pub removed: Vec<RemovedLog>,
    pub removed_count: u64,
    pub removed_bytes: u64,
    /// Files left in `logs/` and their bytes.
    pub retained: u64,
    pub retained_bytes: u64,
    /// Bytes still over `max_bytes` (current logs and files not conduit's are never removed).
    pub over_budget_bytes: u64,
    /// Whether the logs were looked at (not when the package registry could not be read).
    pub swept: bool,
}

/// One log file removed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemovedLog {
    pub file: String,
    pub size: u64,
    pub modified_at_ms: i64,
    pub reason: RemovalReason,
}

/// The WAL checkpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalReport {
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Emptied by a TRUNCATE checkpoint (the store was idle); else passive, or none (dry run).
    pub truncated: bool,
    pub checkpointed: bool,
    /// How long the passive checkpoint took (the writer not held), and the TRUNCATE (the
    /// writer held; 0 when not tried), in microseconds.
    #[serde(default)]
    pub passive_us: u64,
    #[serde(default)]
    pub truncate_us: u64,
}

/// What the state directory holds after the sweep, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sizes {
    pub database_bytes: u64,
    pub wal_bytes: u64,
    /// Content the store records as kept or still to delete.
    pub artifacts_bytes: u64,
    pub logs_bytes: u64,
}

/// The database's files.
pub fn db_path(state: &StateDir) -> PathBuf {
    state.path().join("conduit.db")
}

fn wal_path(state: &StateDir) -> PathBuf {
    state.path().join("conduit.db-wal")
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

/// The sizes of the database and its WAL now (two `stat`s).
pub fn db_sizes(state: &StateDir) -> (u64, u64) {
    (file_len(&db_path(state)), file_len(&wal_path(state)))
}

fn content_dir(state: &StateDir) -> PathBuf {
    state.artifacts_dir().join("sha256")
}

/// Where content set aside waits to be deleted: beside `sha256/`, on the same file system, so
/// setting a file aside is a rename.
fn trash_dir(state: &StateDir) -> PathBuf {
    state.artifacts_dir().join("trash")
}

/// Moves the content file of `sha256` into the trash (`Err` NotFound when it is not in place).
/// The store calls it inside the write transaction that records the content gone: a rename
/// costs tens of microseconds, where deleting can cost milliseconds (a file system mounted
/// with `discard` trims the freed blocks as it deletes).
/// The trash folder is made when the first file is set aside, so a sweep with nothing to
/// remove touches no folder.
fn set_aside(dir: &Path, trash: &Path, sha256: &str) -> std::io::Result<()> {
    let (from, to) = (dir.join(sha256), trash.join(sha256));
    match std::fs::rename(&from, &to) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !trash.exists() => {
            std::fs::create_dir_all(trash)?;
            std::fs::rename(&from, &to)
        }
        res => res,
    }
}

/// Deletes everything in the trash, and the trash folder itself, without holding the writer.
/// What is there belongs to no kept row: the store sets a file aside only for a row it records
/// gone in the same transaction, and a row kept again has its content back in place (checked
/// when recorded). The folder goes too, because a folder keeps the size it grew to: listing it
/// at the next sweep would cost what a large sweep once put there.
fn empty_trash(trash: &Path, errors: &mut Vec<String>) {
    let Ok(rd) = std::fs::read_dir(trash) else {
        return;
    };
    for entry in rd.flatten() {
        if let Err(e) = std::fs::remove_file(entry.path())
            && e.kind() != std::io::ErrorKind::NotFound
        {
            errors.push(format!("cannot delete {}: {e}", entry.path().display()));
        }
    }
    let _ = std::fs::remove_dir(trash);
}

fn modified_ms(meta: &std::fs::Metadata) -> i64 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as i64)
}

/// One sweep of `state` at `now_ms` under `retention`. `stop` is asked between transactions
/// (the daemon is stopping: the rest waits for the next sweep).
pub fn sweep(
    state: &StateDir,
    store: &Store,
    retention: &Retention,
    now_ms: i64,
    dry_run: bool,
    orphans: Orphans,
    stop: &dyn Fn() -> bool,
) -> Result<SweepReport, StoreError> {
    let started = Instant::now();
    let mut report = SweepReport {
        dry_run,
        at_ms: now_ms,
        ..SweepReport::default()
    };
    let mut tx = TxStats::default();
    let dir = content_dir(state);
    let trash = trash_dir(state);
    if !dry_run {
        // What an interrupted sweep set aside goes first.
        empty_trash(&trash, &mut report.errors);
    }

    // Artifact content: the store decides and sets files aside, in short transactions; the
    // files are deleted after, off the writer.
    let a = &retention.artifacts;
    let policy = ArtifactPolicy {
        max_age_ms: a.max_age.as_millis() as i64,
        max_bytes: a.max_bytes,
        grace_ms: a.grace.as_millis() as i64,
    };
    let swept = store.sweep_artifacts(
        policy,
        now_ms,
        dry_run,
        |sha| set_aside(&dir, &trash, sha),
        stop,
    )?;
    empty_trash(&trash, &mut report.errors);
    tx.merge(swept.tx);
    let r = &mut report.artifacts;
    r.removed_count = swept.removed.len() as u64;
    r.removed_bytes = swept.removed.iter().map(|x| x.size).sum();
    r.removed = swept
        .removed
        .iter()
        .take(REPORT_LIST_MAX)
        .map(|x| RemovedArtifact {
            artifact_id: conduit_protocol::artifact_id::format(&x.sha256),
            size: x.size,
            touched_at_ms: x.touched_at_ms,
            reason: x.reason,
        })
        .collect();
    r.kept_live = swept.kept_live;
    r.files_deleted = swept.deleted;
    r.over_budget_bytes = swept.over_budget_bytes;
    r.decide = swept.decide;
    r.delete = swept.delete;
    report.errors.extend(swept.delete_errors);

    // Content files no row records.
    if orphans == Orphans::All && !stop() {
        let min_age = ORPHAN_MIN_AGE.max(a.grace).as_millis() as i64;
        let (candidates, sizes) = unrecorded_candidates(&dir, now_ms - min_age);
        let (removed, t) =
            store.remove_unrecorded(&candidates, dry_run, |sha| set_aside(&dir, &trash, sha))?;
        tx.merge(t);
        empty_trash(&trash, &mut report.errors);
        let r = &mut report.artifacts;
        r.unrecorded_bytes = removed
            .iter()
            .filter_map(|sha| sizes.get(sha))
            .copied()
            .sum();
        r.unrecorded_count = removed.len() as u64;
        r.unrecorded_removed = removed.into_iter().take(REPORT_LIST_MAX).collect();
    }

    // Logs of earlier runs.
    if !stop() {
        match installed(state) {
            Ok(installed) => sweep_logs(state, &installed, retention, now_ms, dry_run, &mut report),
            Err(e) => report.errors.push(format!(
                "logs were not swept: cannot tell which packages are installed: {e}"
            )),
        }
    }

    // The WAL.
    let wal = wal_path(state);
    report.wal.bytes_before = file_len(&wal);
    if !dry_run && !stop() {
        let c = store.checkpoint_wal()?;
        if c.held_us > 0 {
            // The TRUNCATE held the writer; the passive part did not.
            tx.merge(TxStats {
                transactions: 1,
                longest_us: c.held_us,
                total_us: c.held_us,
            });
        }
        report.wal.checkpointed = true;
        report.wal.truncated = c.truncated;
        report.wal.passive_us = c.passive_us;
        report.wal.truncate_us = c.held_us;
    }
    report.wal.bytes_after = file_len(&wal);

    let totals = store.read(|r| r.artifact_totals())?;
    report.artifacts.retained = totals.retained;
    report.artifacts.retained_bytes = totals.retained_bytes;
    let (db, wal_bytes) = db_sizes(state);
    report.sizes = Sizes {
        database_bytes: db,
        wal_bytes,
        artifacts_bytes: totals.retained_bytes + totals.removing_bytes,
        logs_bytes: report.logs.retained_bytes,
    };
    report.transactions = tx.transactions;
    report.longest_transaction_us = tx.longest_us;
    report.transactions_us = tx.total_us;
    report.took_us = started.elapsed().as_micros() as u64;
    Ok(report)
}

/// The names of the installed packages (the registry's records).
fn installed(state: &StateDir) -> anyhow::Result<HashSet<String>> {
    Ok(crate::packages::list(state)?
        .into_iter()
        .map(|r| r.name)
        .collect())
}

fn sweep_logs(
    state: &StateDir,
    installed: &HashSet<String>,
    retention: &Retention,
    now_ms: i64,
    dry_run: bool,
    report: &mut SweepReport,
) {
    let dir = state.logs_dir();
    let files = match logs::scan(&dir, installed) {
        Ok(f) => f,
        Err(e) => {
            report
                .errors
                .push(format!("cannot read {}: {e}", dir.display()));
            return;
        }
    };
    let (plan, over) = logs::plan(&files, retention.logs, now_ms);
    let mut gone = vec![false; files.len()];
    let r = &mut report.logs;
    r.swept = true;
    for (i, reason) in plan {
        let f = &files[i];
        if !dry_run && let Err(e) = logs::remove(&dir, f) {
            report.errors.push(format!(
                "cannot remove {}: {e}",
                dir.join(&f.name).display()
            ));
            continue;
        }
        gone[i] = true;
        let r = &mut report.logs;
        r.removed_count += 1;
        r.removed_bytes += f.size;
        if r.removed.len() < REPORT_LIST_MAX {
            r.removed.push(RemovedLog {
                file: f.name.clone(),
                size: f.size,
                modified_at_ms: f.modified_ms,
                reason,
            });
        }
    }
    let r = &mut report.logs;
    for (f, gone) in files.iter().zip(&gone) {
        if !gone {
            r.retained += 1;
            r.retained_bytes += f.size;
        }
    }
    r.over_budget_bytes = over;
}

/// The content files old enough to be no stream's (modified before `older_than_ms`), with
/// their sizes. A folder not there yet holds none.
fn unrecorded_candidates(
    dir: &Path,
    older_than_ms: i64,
) -> (Vec<String>, std::collections::HashMap<String, u64>) {
    let mut names = Vec::new();
    let mut sizes = std::collections::HashMap::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return (names, sizes);
    };
    for entry in rd.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let ours = name.len() == conduit_protocol::artifact_id::DIGEST_HEX_LEN
            && name
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !ours {
            continue;
        }
        let Ok(meta) = entry.metadata() else { continue };
        if modified_ms(&meta) >= older_than_ms {
            continue;
        }
        sizes.insert(name.clone(), meta.len());
        names.push(name);
    }
    names.sort();
    (names, sizes)
}
