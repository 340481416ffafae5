//! Retention in the store: the sweep that decides which artifact content goes, in short
//! transactions, and the WAL checkpoint. Which records keep an artifact alive is `refs.rs`'s one
//! rule (`ref_live!`), which the sweep asks for each candidate.
//!
//! ```text
//!   sweep, phase 1: artifacts_retained, oldest first ──► live? touch : mark removed_at
//!   sweep, phase 2: artifacts_purging ──► set the file aside (caller's closure) ──► purged_at
//!   (the caller deletes what it set aside once the transaction committed, off the writer)
//! ```
//!
//! An artifact stored, mentioned by a new record, or found live within the grace period is
//! never removed (its extension may be about to write the record that mentions it).
//!
//! The store does not touch content: phase 2 calls the caller's closure to set a file aside
//! (the daemon renames it into a trash folder: tens of microseconds, where deleting a file can
//! take milliseconds on a file system that discards freed blocks) inside the write transaction
//! that records it gone, so an artifact recorded again (which checks its content is in place
//! inside its own write transaction) can never be left pointing at a file set aside; the caller
//! deletes what it set aside after the commit, without holding the writer. The order makes a
//! crash harmless: the mark is committed before any file is moved, so after a crash the next
//! sweep finds the marked rows through `artifacts_purging` and finishes them, and whatever is
//! in the trash belongs to no kept row (a kept row's content is always in place); no kept row
//! ever points at missing content.
//!
//! Invariants: every transaction here handles at most [`SWEEP_BATCH`] rows and stops taking
//! more once it has held the writer for [`SWEEP_TX_BUDGET`]; every read goes through an index
//! over candidates (`artifacts_retained`, `artifacts_purging`, the refs' primary key), so a
//! sweep with nothing to do costs the same at any history size. Times of records are passed
//! in; only the transactions' durations are measured here (a monotonic clock, for the bound).

use std::time::{Duration, Instant};

use rusqlite::params;
use serde::{Deserialize, Serialize};

use crate::error::{SqlContext, StoreError};
use crate::rows::{col, collect, first};
use crate::store::Store;
use crate::tx::{ReadTx, WriteTx};

/// The most candidate rows one sweep transaction handles.
pub const SWEEP_BATCH: u32 = 100;

/// A sweep transaction takes no further row once it has held the writer this long.
pub const SWEEP_TX_BUDGET: Duration = Duration::from_millis(2);

/// How long the TRUNCATE checkpoint waits for readers before it gives up until the next sweep.
pub const TRUNCATE_WAIT: Duration = Duration::from_millis(10);

/// What the sweep may remove: content no live record needs, older than `max_age_ms`, or the
/// oldest while the kept content is over `max_bytes`; never content touched within
/// `grace_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArtifactPolicy {
    pub max_age_ms: i64,
    pub max_bytes: u64,
    pub grace_ms: i64,
}

/// Why content was removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RemovalReason {
    /// Older than `max_age`.
    Age,
    /// The kept content was over `max_bytes`, and this was the oldest no live record needs.
    Budget,
}

/// One artifact whose content the sweep removed (or, in a dry run, would remove).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Removal {
    pub id: i64,
    pub sha256: String,
    pub size: u64,
    pub touched_at_ms: i64,
    pub reason: RemovalReason,
}

/// How long a sweep's transactions held the writer (or, in a dry run, a reader).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxStats {
    pub transactions: u64,
    /// The longest one, in microseconds.
    pub longest_us: u64,
    /// All of them together, in microseconds.
    pub total_us: u64,
}

impl TxStats {
    fn add(&mut self, took: Duration) {
        let us = took.as_micros() as u64;
        self.transactions += 1;
        self.longest_us = self.longest_us.max(us);
        self.total_us += us;
    }

    /// Both together.
    pub fn merge(&mut self, other: TxStats) {
        self.transactions += other.transactions;
        self.longest_us = self.longest_us.max(other.longest_us);
        self.total_us += other.total_us;
    }
}

/// What one artifact sweep did (or, in a dry run, would do).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactSweep {
    /// Content this sweep decided to remove, oldest first.
    pub removed: Vec<Removal>,
    /// Candidates kept because a live record needs them (touched, so not examined again soon).
    pub kept_live: u64,
    /// Content files set aside (those decided now and any an earlier sweep left), and their
    /// bytes. In a dry run: the files an earlier sweep decided to remove and did not yet.
    pub deleted: u64,
    pub deleted_bytes: u64,
    /// Files that could not be set aside (tried again at the next sweep).
    pub delete_errors: Vec<String>,
    /// Bytes still over `max_bytes` after the sweep (content live or within the grace period).
    pub over_budget_bytes: u64,
    /// Every transaction of the sweep; `decide` and `delete` are its two phases.
    pub tx: TxStats,
    pub decide: TxStats,
    pub delete: TxStats,
}

/// What a WAL checkpoint did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Frames in the WAL, and how many of them are now in the database file.
    pub frames: i64,
    pub checkpointed: i64,
    /// The WAL file was truncated to zero bytes (nothing was writing or reading an old
    /// snapshot); otherwise the checkpoint was passive.
    pub truncated: bool,
    /// How long the TRUNCATE held the writer, in microseconds (0 when it was not tried).
    pub held_us: u64,
    /// How long the passive checkpoint took, without holding the writer, in microseconds.
    pub passive_us: u64,
}

/// The sweep's candidates: kept content older than the grace period, after a cursor, oldest
/// first, through `artifacts_retained`.
pub(crate) const SQL_CANDIDATES: &str = "SELECT id, sha256, size, touched_at FROM artifacts \
     WHERE removed_at IS NULL AND touched_at < ?3 AND (touched_at, id) > (?1, ?2) \
     ORDER BY touched_at, id LIMIT ?4";
/// Content whose removal was decided and whose file is not yet deleted, through
/// `artifacts_purging`.
pub(crate) const SQL_PURGING: &str = "SELECT id, sha256, size FROM artifacts \
     WHERE removed_at IS NOT NULL AND purged_at IS NULL AND id > ?1 ORDER BY id LIMIT ?2";

impl ReadTx<'_> {
    fn candidates(
        &self,
        after: (i64, i64),
        younger_than: i64,
        limit: u32,
    ) -> Result<Vec<(i64, String, u64, i64)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(SQL_CANDIDATES)
            .context("prepare retention candidates read")?;
        collect(
            &mut stmt,
            params![after.0, after.1, younger_than, i64::from(limit)],
            "read retention candidates",
            |row| {
                let size: i64 = col(row, 2)?;
                Ok((col(row, 0)?, col(row, 1)?, size.max(0) as u64, col(row, 3)?))
            },
        )
    }

    fn purging(&self, after: i64, limit: u32) -> Result<Vec<(i64, String, u64)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(SQL_PURGING)
            .context("prepare removals read")?;
        collect(
            &mut stmt,
            params![after, i64::from(limit)],
            "read removals",
            |row| {
                let size: i64 = col(row, 2)?;
                Ok((col(row, 0)?, col(row, 1)?, size.max(0) as u64))
            },
        )
    }

    /// Whether content with digest `sha256` has no row that keeps or is removing it: no row at
    /// all, or one whose content was deleted already.
    fn unrecorded(&self, sha256: &str) -> Result<bool, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT purged_at IS NOT NULL FROM artifacts WHERE sha256 = ?1")
            .context("prepare artifact lookup")?;
        let row: Option<bool> = first(&mut stmt, [sha256], "look an artifact up", |row| {
            col(row, 0)
        })?;
        Ok(row.unwrap_or(true))
    }
}

/// What the sweep does with one candidate, kept content older than the grace period, taken
/// oldest first: a pure function of its facts, so the rule is tested without a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing from here on is removable: this one and every younger one are within `max_age`,
    /// and the kept content is within `max_bytes`.
    Stop,
    /// A live record needs it: keep it, and count it as touched now.
    KeepLive,
    /// Remove its content.
    Remove(RemovalReason),
}

/// The verdict on a candidate touched at `touched_at`, with `over` bytes of kept content past
/// the budget so far, given whether a live record needs it (`live` is asked only when it
/// matters: it costs a lookup).
pub fn verdict(
    touched_at: i64,
    age_cutoff: i64,
    over: i128,
    live: impl FnOnce() -> Result<bool, StoreError>,
) -> Result<Verdict, StoreError> {
    let old = touched_at < age_cutoff;
    if !old && over <= 0 {
        return Ok(Verdict::Stop);
    }
    if live()? {
        return Ok(Verdict::KeepLive);
    }
    Ok(Verdict::Remove(if old {
        RemovalReason::Age
    } else {
        RemovalReason::Budget
    }))
}

/// Where phase 1 of a sweep is: its cursor over `artifacts_retained` and the bytes still over
/// the budget, carried from one transaction to the next.
struct Deciding {
    cursor: (i64, i64),
    over: i128,
    age_cutoff: i64,
    grace_cutoff: i64,
    now: i64,
}

/// One candidate the sweep decided about.
type Decided = (i64, String, u64, i64, Verdict);

/// One transaction of phase 1: the verdicts on the next candidates, applied when `mark` is the
/// write transaction (`None`: a dry run, nothing written), and whether phase 1 is finished.
fn decide_batch(
    r: &ReadTx<'_>,
    mark: Option<&WriteTx<'_>>,
    st: &mut Deciding,
    began: Instant,
) -> Result<(Vec<Decided>, bool), StoreError> {
    let rows = r.candidates(st.cursor, st.grace_cutoff, SWEEP_BATCH)?;
    let mut decided = Vec::new();
    let mut done = rows.is_empty();
    for (id, sha, size, touched_at) in rows {
        if began.elapsed() >= SWEEP_TX_BUDGET && !decided.is_empty() {
            break;
        }
        let v = verdict(touched_at, st.age_cutoff, st.over, || r.artifact_live(&sha))?;
        if v == Verdict::Stop {
            done = true;
            break;
        }
        st.cursor = (touched_at, id);
        if let Some(w) = mark {
            apply(w, id, v, st.now)?;
        }
        if let Verdict::Remove(_) = v {
            st.over -= i128::from(size);
        }
        decided.push((id, sha, size, touched_at, v));
    }
    Ok((decided, done))
}

impl Store {
    /// [`Store::write`], with how long the transaction held the writer: from its first
    /// statement to the end of its commit (the fsync included).
    fn held_write<T>(
        &self,
        f: impl FnOnce(&mut WriteTx<'_>, Instant) -> Result<T, StoreError>,
    ) -> Result<(T, Duration), StoreError> {
        let mut began = None;
        let out = self.write(|w| {
            let t = Instant::now();
            began = Some(t);
            f(w, t)
        })?;
        Ok((out, began.map_or(Duration::ZERO, |t| t.elapsed())))
    }

    /// [`Store::read`], with how long the read took.
    fn held_read<T>(
        &self,
        f: impl FnOnce(&ReadTx<'_>, Instant) -> Result<T, StoreError>,
    ) -> Result<(T, Duration), StoreError> {
        let mut began = None;
        let out = self.read(|r| {
            let t = Instant::now();
            began = Some(t);
            f(r, t)
        })?;
        Ok((out, began.map_or(Duration::ZERO, |t| t.elapsed())))
    }

    /// One artifact sweep at `now` under `policy`: decide which content goes (phase 1), then
    /// set aside the files decided on, now or by an earlier sweep (phase 2), each with
    /// `set_aside(sha256)` inside the transaction that records it gone (a missing file counts as
    /// set aside); the caller deletes them once this returns. A dry run writes nothing and sets
    /// nothing aside: it reads on a reader and reports what a sweep would decide, and the files
    /// an earlier sweep left to remove.
    ///
    /// `stop` is asked between transactions; when it answers true the sweep ends early (the
    /// daemon is stopping), leaving whatever is undone to the next one.
    pub fn sweep_artifacts(
        &self,
        policy: ArtifactPolicy,
        now: i64,
        dry_run: bool,
        mut set_aside: impl FnMut(&str) -> std::io::Result<()>,
        stop: &dyn Fn() -> bool,
    ) -> Result<ArtifactSweep, StoreError> {
        let mut out = ArtifactSweep::default();
        let totals = self.read(|r| r.artifact_totals())?;
        let mut st = Deciding {
            cursor: (i64::MIN, i64::MIN),
            over: i128::from(totals.retained_bytes) - i128::from(policy.max_bytes),
            age_cutoff: now.saturating_sub(policy.max_age_ms),
            grace_cutoff: now.saturating_sub(policy.grace_ms),
            now,
        };
        // Phase 1: decide, a batch per transaction.
        loop {
            if stop() {
                return Ok(out);
            }
            let ((decided, done), held) = if dry_run {
                self.held_read(|r, t| decide_batch(r, None, &mut st, t))?
            } else {
                self.held_write(|w, t| {
                    let w: &WriteTx<'_> = w;
                    decide_batch(w, Some(w), &mut st, t)
                })?
            };
            out.decide.add(held);
            out.tx.add(held);
            for (id, sha256, size, touched_at_ms, v) in decided {
                match v {
                    Verdict::KeepLive => out.kept_live += 1,
                    Verdict::Remove(reason) => out.removed.push(Removal {
                        id,
                        sha256,
                        size,
                        touched_at_ms,
                        reason,
                    }),
                    Verdict::Stop => {}
                }
            }
            if done {
                break;
            }
        }
        out.over_budget_bytes = st.over.max(0) as u64;
        if dry_run {
            let totals = self.read(|r| r.artifact_totals())?;
            out.deleted = totals.removing;
            out.deleted_bytes = totals.removing_bytes;
            return Ok(out);
        }
        // Phase 2: set the files aside, each recorded gone in the transaction that moves it.
        let mut after = 0;
        loop {
            if stop() {
                return Ok(out);
            }
            let ((n, bytes, errors, last, done), held) = self.held_write(|w, began| {
                let rows = w.purging(after, SWEEP_BATCH)?;
                let done = rows.is_empty();
                let (mut n, mut bytes, mut errors, mut last) = (0u64, 0u64, Vec::new(), after);
                let mut mark = w
                    .conn()
                    .prepare_cached("UPDATE artifacts SET purged_at = ?2 WHERE id = ?1")
                    .context("prepare a removal's record")?;
                for (id, sha, size) in rows {
                    if began.elapsed() >= SWEEP_TX_BUDGET && last != after {
                        break;
                    }
                    last = id;
                    match set_aside(&sha) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                            errors.push(format!("sha256:{sha}: {e}"));
                            continue;
                        }
                        _ => {}
                    }
                    mark.execute(params![id, now])
                        .with_context(|| format!("record artifact {id} removed"))?;
                    n += 1;
                    bytes += size;
                }
                Ok((n, bytes, errors, last, done))
            })?;
            out.delete.add(held);
            out.tx.add(held);
            out.deleted += n;
            out.deleted_bytes += bytes;
            out.delete_errors.extend(errors);
            if done {
                break;
            }
            after = last;
        }
        Ok(out)
    }

    /// Sets aside, with `set_aside(sha256)`, content files that no row keeps or is removing (a
    /// crash between storing a file and recording it, or a record that failed), each checked
    /// and set aside inside a write transaction so a concurrent record of the same content
    /// cannot cross it; the caller deletes them once this returns. Returns the digests set
    /// aside (in a dry run: that would be).
    pub fn remove_unrecorded(
        &self,
        digests: &[String],
        dry_run: bool,
        mut set_aside: impl FnMut(&str) -> std::io::Result<()>,
    ) -> Result<(Vec<String>, TxStats), StoreError> {
        let mut removed = Vec::new();
        let mut tx = TxStats::default();
        let mut rest = digests;
        while !rest.is_empty() {
            let take = rest.len().min(SWEEP_BATCH as usize);
            let mut handled = 0;
            let (found, held) = if dry_run {
                self.held_read(|r, _| {
                    let mut found = Vec::new();
                    for sha in &rest[..take] {
                        handled += 1;
                        if r.unrecorded(sha)? {
                            found.push(sha.clone());
                        }
                    }
                    Ok(found)
                })?
            } else {
                self.held_write(|w, began| {
                    let mut found = Vec::new();
                    for sha in &rest[..take] {
                        if began.elapsed() >= SWEEP_TX_BUDGET && handled > 0 {
                            break;
                        }
                        handled += 1;
                        if w.unrecorded(sha)? {
                            match set_aside(sha) {
                                Ok(()) => found.push(sha.clone()),
                                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                                Err(e) => tracing::warn!(sha256 = %sha, error = %e, "cannot set unrecorded artifact content aside"),
                            }
                        }
                    }
                    Ok(found)
                })?
            };
            tx.add(held);
            removed.extend(found);
            rest = &rest[handled.max(1)..];
        }
        Ok((removed, tx))
    }

    /// Checkpoints the WAL into the database file: first passively, on a reader connection,
    /// copying what no reader still needs while writes go on (the writer is not held: this is
    /// the part that copies pages and syncs the file); then, when that copied every frame —
    /// nothing was written meanwhile and no reader holds an older snapshot, the store is idle
    /// — with TRUNCATE on the writer, which empties the `-wal` file, waiting at most
    /// [`TRUNCATE_WAIT`] for a reader that starts meanwhile (and giving up until the next
    /// sweep if one does).
    pub fn checkpoint_wal(&self) -> Result<Checkpoint, StoreError> {
        let run =
            |conn: &rusqlite::Connection, mode: &str| -> Result<(i64, i64, i64), StoreError> {
                conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |row| {
                    Ok((row.get(0)?, row.get(1)?, row.get(2)?))
                })
                .with_context(|| format!("checkpoint the WAL ({mode})"))
            };
        let began = Instant::now();
        let (busy, frames, checkpointed) = self.with_reader(|conn| run(conn, "PASSIVE"))?;
        let mut out = Checkpoint {
            frames,
            checkpointed,
            truncated: false,
            held_us: 0,
            passive_us: began.elapsed().as_micros() as u64,
        };
        if busy != 0 || frames != checkpointed {
            return Ok(out);
        }
        self.with_writer(|conn| {
            let held = Instant::now();
            conn.busy_timeout(TRUNCATE_WAIT)
                .context("shorten the busy timeout for a checkpoint")?;
            let res = run(conn, "TRUNCATE");
            conn.busy_timeout(crate::limits::BUSY_TIMEOUT)
                .context("restore the busy timeout after a checkpoint")?;
            out.truncated = res?.0 == 0;
            out.held_us = held.elapsed().as_micros() as u64;
            Ok(out)
        })
    }
}

/// Applies a verdict in the sweep's write transaction: touch what is live, mark what goes.
fn apply(w: &WriteTx<'_>, id: i64, v: Verdict, now: i64) -> Result<(), StoreError> {
    let sql = match v {
        Verdict::KeepLive => "UPDATE artifacts SET touched_at = max(touched_at, ?2) WHERE id = ?1",
        Verdict::Remove(_) => "UPDATE artifacts SET removed_at = ?2 WHERE id = ?1",
        Verdict::Stop => return Ok(()),
    };
    w.conn()
        .prepare_cached(sql)
        .and_then(|mut stmt| stmt.execute(params![id, now]))
        .with_context(|| format!("record the sweep's verdict on artifact {id}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never() -> Result<bool, StoreError> {
        panic!("liveness was asked although it did not matter")
    }

    #[test]
    fn the_verdict_follows_age_then_budget_and_asks_liveness_only_when_it_matters() {
        let cutoff = 1_000;
        // Young and within the budget: the sweep stops, without a lookup.
        assert_eq!(verdict(1_000, cutoff, 0, never).unwrap(), Verdict::Stop);
        assert_eq!(verdict(5_000, cutoff, -10, never).unwrap(), Verdict::Stop);
        // Old: removed for its age unless a live record needs it.
        assert_eq!(
            verdict(999, cutoff, 0, || Ok(false)).unwrap(),
            Verdict::Remove(RemovalReason::Age)
        );
        assert_eq!(
            verdict(999, cutoff, 0, || Ok(true)).unwrap(),
            Verdict::KeepLive
        );
        // Young but over the budget (one byte is enough): removed for the budget.
        assert_eq!(
            verdict(5_000, cutoff, 1, || Ok(false)).unwrap(),
            Verdict::Remove(RemovalReason::Budget)
        );
        assert_eq!(
            verdict(5_000, cutoff, 1, || Ok(true)).unwrap(),
            Verdict::KeepLive
        );
    }
}
