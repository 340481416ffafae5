//! Artifact metadata. The content lives on disk under its sha256, written and verified by the
//! caller before it records the artifact here; the store holds only what describes it.
//!
//! Invariant: one row per digest. Recording the same content again returns the existing row
//! (the first name, media type and creator stay) and marks it stored now; recording a digest
//! with a different size is refused, since the same digest with two sizes means one of the
//! claims is wrong. A row whose content retention removed (`removed_at`) is kept, so its id
//! keeps its meaning; recording the content again brings it back (`retention.rs`).

use rusqlite::{Row, params};
use serde::{Deserialize, Serialize};

use crate::error::SqlContext;
use crate::error::StoreError;
use crate::rows::{col, collect, first, page};
use crate::tx::{ReadTx, WriteTx};

/// An artifact's metadata.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifact {
    pub id: i64,
    /// Lower-case hex; the content's address on disk.
    pub sha256: String,
    pub size: u64,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// The extension that sent it first (its creator).
    pub extension: String,
    pub created_at_ms: i64,
    /// When its content was last stored, mentioned by a new record, or found needed by a live
    /// record: its age for retention counts from here.
    #[serde(default)]
    pub touched_at_ms: i64,
    /// When retention decided to remove its content; `None` while the content is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed_at_ms: Option<i64>,
}

impl Artifact {
    /// Its id as the protocol writes it, `sha256:<hex>`.
    pub fn artifact_id(&self) -> String {
        conduit_protocol::artifact_id::format(&self.sha256)
    }

    /// Whether its content is kept (not removed by retention).
    pub fn retained(&self) -> bool {
        self.removed_at_ms.is_none()
    }
}

macro_rules! artifact_select {
    () => {
        "SELECT id, sha256, size, name, media_type, extension, created_at, touched_at, \
         removed_at FROM artifacts "
    };
}

const SQL_BY_ID: &str = concat!(artifact_select!(), "WHERE id = ?1");
const SQL_BY_SHA: &str = concat!(artifact_select!(), "WHERE sha256 = ?1");
const SQL_LIST: &str = concat!(artifact_select!(), "WHERE id > ?1 ORDER BY id LIMIT ?2");
/// Newest first, below a cursor (`views.rs`'s list); the same columns, so one `decode`.
pub(crate) const SQL_NEWEST: &str = concat!(
    artifact_select!(),
    "WHERE id < ?1 ORDER BY id DESC LIMIT ?2"
);

pub(crate) fn decode(row: &Row<'_>) -> Result<Artifact, StoreError> {
    let id: i64 = col(row, 0)?;
    let size: i64 = col(row, 2)?;
    Ok(Artifact {
        id,
        sha256: col(row, 1)?,
        size: u64::try_from(size).map_err(|_| StoreError::Decode {
            record: "artifact",
            id,
            field: "size",
            reason: format!("negative size {size}"),
        })?,
        name: col(row, 3)?,
        media_type: col(row, 4)?,
        extension: col(row, 5)?,
        created_at_ms: col(row, 6)?,
        touched_at_ms: col(row, 7)?,
        removed_at_ms: col(row, 8)?,
    })
}

fn check_digest(sha256: &str) -> Result<(), StoreError> {
    let ok = sha256.len() == 64
        && sha256
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if ok {
        Ok(())
    } else {
        Err(StoreError::Invalid {
            field: "sha256",
            reason: format!("{sha256:?} is not 64 lower-case hex digits"),
        })
    }
}

impl ReadTx<'_> {
    /// One artifact by id, or `None`.
    pub fn artifact(&self, id: i64) -> Result<Option<Artifact>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(SQL_BY_ID)
            .context("prepare artifact read")?;
        first(&mut stmt, [id], "read an artifact", decode)
    }

    /// One artifact by its content digest (lower-case hex), or `None`.
    pub fn artifact_by_sha256(&self, sha256: &str) -> Result<Option<Artifact>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(SQL_BY_SHA)
            .context("prepare artifact read")?;
        first(&mut stmt, [sha256], "read an artifact", decode)
    }

    /// A page of artifacts with ids above `after_id` (from the start when `None`), oldest
    /// first, whether their content is kept or was removed (newest first:
    /// [`ReadTx::list_artifacts`]).
    pub fn artifacts_after(
        &self,
        after_id: Option<i64>,
        limit: u32,
    ) -> Result<Vec<Artifact>, StoreError> {
        let limit = page(limit)?;
        let mut stmt = self
            .conn
            .prepare_cached(SQL_LIST)
            .context("prepare artifacts list")?;
        collect(
            &mut stmt,
            params![after_id.unwrap_or(0), limit],
            "list artifacts",
            decode,
        )
    }
}

impl WriteTx<'_> {
    /// [`WriteTx::record_artifact`] for content the caller has just put on disk, refused with
    /// [`StoreError::ContentMissing`] (and nothing recorded) unless `present()`, asked inside
    /// this transaction, still finds the content there. The retention sweep deletes content
    /// only inside its own write transactions, so once this commits the content stays until a
    /// later sweep decides otherwise: no kept row ever points at a deleted file.
    #[allow(clippy::too_many_arguments)]
    pub fn record_stored_artifact(
        &mut self,
        sha256: &str,
        size: u64,
        name: &str,
        media_type: Option<&str>,
        extension: &str,
        now: i64,
        present: impl FnOnce() -> bool,
    ) -> Result<Artifact, StoreError> {
        let artifact = self.record_artifact(sha256, size, name, media_type, extension, now)?;
        if !present() {
            return Err(StoreError::ContentMissing {
                sha256: sha256.to_owned(),
            });
        }
        Ok(artifact)
    }

    /// Records an artifact whose content is already on disk under `sha256`; returns its row,
    /// the existing one when the digest was recorded before. Either way the artifact counts as
    /// stored `now` for retention; a row whose content retention removed is kept again (the
    /// caller has just put the content back on disk, and checks it is there before it commits:
    /// the sweep deletes content only inside a write transaction, so the two cannot cross).
    pub fn record_artifact(
        &mut self,
        sha256: &str,
        size: u64,
        name: &str,
        media_type: Option<&str>,
        extension: &str,
        now: i64,
    ) -> Result<Artifact, StoreError> {
        check_digest(sha256)?;
        let stored_size = i64::try_from(size).map_err(|_| StoreError::Invalid {
            field: "size",
            reason: format!("{size} is larger than the store can hold"),
        })?;
        if let Some(artifact) = self.artifact_by_sha256(sha256)? {
            if artifact.size != size {
                return Err(StoreError::ArtifactMismatch {
                    sha256: sha256.to_owned(),
                    recorded: artifact.size,
                    size,
                });
            }
            let mut stmt = self
                .conn()
                .prepare_cached(concat!(
                    "UPDATE artifacts SET touched_at = max(touched_at, ?2), removed_at = NULL, \
                     purged_at = NULL WHERE id = ?1 RETURNING ",
                    "id, sha256, size, name, media_type, extension, created_at, touched_at, \
                     removed_at"
                ))
                .with_context(|| format!("record artifact {sha256} again"))?;
            return first(
                &mut stmt,
                params![artifact.id, now],
                "record an artifact again",
                decode,
            )?
            .ok_or(StoreError::NotFound {
                record: "artifact",
                id: artifact.id,
            });
        }
        let mut stmt = self
            .conn()
            .prepare_cached(
                "INSERT INTO artifacts (sha256, size, name, media_type, extension, created_at, \
                 touched_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6) \
                 RETURNING id, sha256, size, name, media_type, extension, created_at, \
                 touched_at, removed_at",
            )
            .with_context(|| format!("record artifact {sha256}"))?;
        first(
            &mut stmt,
            params![sha256, stored_size, name, media_type, extension, now],
            "insert an artifact",
            decode,
        )?
        .ok_or_else(|| StoreError::Invalid {
            field: "sha256",
            reason: format!("inserting {sha256} returned no row"),
        })
    }
}
