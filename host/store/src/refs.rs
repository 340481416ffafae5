//! Which records mention which artifact, and whether a live record still needs one: the one
//! rule retention keeps an artifact by (`ref_live!`), and the totals of the content kept.
//!
//! ```text
//!   a record written ──note_refs──► artifact_refs (digest, record, id) + touch the artifact
//!   artifact_live(digest) ──► ref_live! over that digest's rows, each record looked up by id
//! ```
//!
//! **What keeps an artifact alive** is one rule, [`ref_live!`]: a record that mentions its id
//! and is live — an Event not yet routed, or routed to a Work that is not done; a planned
//! Emission (its payload); an active Wait (its subject). The records of a committed Emission,
//! Events of done Work or of none, satisfied Waits and finished Emissions mention artifacts as
//! history: they keep their ids, not the content.
//!
//! Invariant: every write of a record that can carry an artifact id (an Event's or Emission's
//! payload, an emission record's body, a Wait's subject) calls [`note_refs`] in its own
//! transaction, so a mention is recorded exactly when the record exists; the lookups go through
//! the primary keys, never a scan.

use rusqlite::params;
use serde::{Deserialize, Serialize};

use crate::error::{SqlContext, StoreError};
use crate::rows::{col, collect};
use crate::tx::{ReadTx, WriteTx};

/// The kind of record that mentions an artifact.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Referrer {
    /// An Event's payload.
    Event,
    /// An Emission's payload.
    Emission,
    /// A record a committed Emission wrote (its id is the Emission's).
    EmissionRecord,
    /// A Wait's subject.
    Wait,
}

impl Referrer {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Referrer::Event => "event",
            Referrer::Emission => "emission",
            Referrer::EmissionRecord => "emission_record",
            Referrer::Wait => "wait",
        }
    }

    fn parse(s: &str) -> Option<Referrer> {
        match s {
            "event" => Some(Referrer::Event),
            "emission" => Some(Referrer::Emission),
            "emission_record" => Some(Referrer::EmissionRecord),
            "wait" => Some(Referrer::Wait),
            _ => None,
        }
    }
}

/// A record that mentions an artifact, and whether it keeps the artifact alive now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactRef {
    pub record: Referrer,
    pub id: i64,
    pub live: bool,
}

/// The records that mention one artifact: the first page, and how many there are.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct References {
    pub references: Vec<ArtifactRef>,
    pub total: u64,
}

/// How much content the store says is on disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactTotals {
    /// Artifacts whose content is kept, and its bytes.
    pub retained: u64,
    pub retained_bytes: u64,
    /// Artifacts whose removal was decided but whose file is not deleted yet.
    pub removing: u64,
    pub removing_bytes: u64,
}

/// Whether the record `r` (a row of `artifact_refs`) keeps its artifact alive now: the one
/// rule, used by the sweep and by every answer that shows references.
macro_rules! ref_live {
    () => {
        "(CASE r.record \
           WHEN 'event' THEN EXISTS (SELECT 1 FROM events e WHERE e.id = r.record_id \
             AND (e.routed_at IS NULL OR EXISTS (SELECT 1 FROM work w \
               WHERE w.id = e.work_id AND w.state != 'done'))) \
           WHEN 'emission' THEN EXISTS (SELECT 1 FROM emissions m \
             WHERE m.id = r.record_id AND m.state = 'planned') \
           WHEN 'wait' THEN EXISTS (SELECT 1 FROM waits x \
             WHERE x.id = r.record_id AND x.state = 'active') \
           ELSE 0 END)"
    };
}

pub(crate) const SQL_LIVE: &str = concat!(
    "SELECT EXISTS (SELECT 1 FROM artifact_refs r WHERE r.sha256 = ?1 AND ",
    ref_live!(),
    ")"
);
const SQL_REFS: &str = concat!(
    "SELECT r.record, r.record_id, ",
    ref_live!(),
    " FROM artifact_refs r WHERE r.sha256 = ?1 ORDER BY r.record, r.record_id LIMIT ?2"
);
const SQL_PURGING_TOTAL: &str = "SELECT count(*), coalesce(sum(size), 0) FROM artifacts \
     WHERE removed_at IS NOT NULL AND purged_at IS NULL";

/// Records that the record `(record, id)`, whose stored text is `text`, mentions every
/// artifact id found in it, and counts each such artifact as touched `now`. The one place a
/// reference is recorded; every write of a record that can carry an id calls it.
pub(crate) fn note_refs(
    tx: &WriteTx<'_>,
    record: Referrer,
    id: i64,
    text: &str,
    now: i64,
) -> Result<(), StoreError> {
    let digests = conduit_protocol::artifact_id::find_in(text);
    if digests.is_empty() {
        return Ok(());
    }
    let what = || format!("record the artifacts {} {id} mentions", record.as_str());
    let conn = tx.conn();
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO artifact_refs (sha256, record, record_id) VALUES (?1, ?2, ?3) \
             ON CONFLICT DO NOTHING",
        )
        .with_context(what)?;
    let mut touch = conn
        .prepare_cached(
            "UPDATE artifacts SET touched_at = max(touched_at, ?2) \
             WHERE sha256 = ?1 AND removed_at IS NULL",
        )
        .with_context(what)?;
    for sha in &digests {
        insert
            .execute(params![sha, record.as_str(), id])
            .with_context(what)?;
        touch.execute(params![sha, now]).with_context(what)?;
    }
    Ok(())
}

impl ReadTx<'_> {
    /// Whether a live record mentions the artifact with digest `sha256` ([`ref_live!`]).
    pub fn artifact_live(&self, sha256: &str) -> Result<bool, StoreError> {
        self.conn
            .prepare_cached(SQL_LIVE)
            .and_then(|mut stmt| stmt.query_row([sha256], |row| row.get(0)))
            .context("read whether an artifact is needed")
    }

    /// The records that mention the artifact with digest `sha256`, up to `limit` of them
    /// (by kind, then id), each with whether it keeps the artifact alive, and how many there
    /// are in all.
    pub fn artifact_references(&self, sha256: &str, limit: u32) -> Result<References, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(SQL_REFS)
            .context("prepare artifact references read")?;
        let references = collect(
            &mut stmt,
            params![sha256, i64::from(limit)],
            "read artifact references",
            |row| {
                let kind: String = col(row, 0)?;
                let id: i64 = col(row, 1)?;
                Ok(ArtifactRef {
                    record: Referrer::parse(&kind).ok_or_else(|| StoreError::Decode {
                        record: "artifact reference",
                        id,
                        field: "record",
                        reason: format!("unknown record kind {kind:?}"),
                    })?,
                    id,
                    live: col(row, 2)?,
                })
            },
        )?;
        let total: i64 = self
            .conn
            .prepare_cached("SELECT count(*) FROM artifact_refs WHERE sha256 = ?1")
            .and_then(|mut stmt| stmt.query_row([sha256], |row| row.get(0)))
            .context("count artifact references")?;
        Ok(References {
            references,
            total: total.max(0) as u64,
        })
    }

    /// How much content is kept, from the totals the triggers keep (one row), and how much is
    /// waiting to be deleted (the few rows of `artifacts_purging`).
    pub fn artifact_totals(&self) -> Result<ArtifactTotals, StoreError> {
        let (retained, retained_bytes): (i64, i64) = self
            .conn
            .prepare_cached("SELECT count, bytes FROM artifact_totals WHERE id = 1")
            .and_then(|mut stmt| stmt.query_row([], |row| Ok((row.get(0)?, row.get(1)?))))
            .context("read the artifact totals")?;
        let (removing, removing_bytes): (i64, i64) = self
            .conn
            .prepare_cached(SQL_PURGING_TOTAL)
            .and_then(|mut stmt| stmt.query_row([], |row| Ok((row.get(0)?, row.get(1)?))))
            .context("read the artifacts being removed")?;
        let u = |n: i64| n.max(0) as u64;
        Ok(ArtifactTotals {
            retained: u(retained),
            retained_bytes: u(retained_bytes),
            removing: u(removing),
            removing_bytes: u(removing_bytes),
        })
    }
}
