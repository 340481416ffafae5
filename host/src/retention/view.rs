//! What an operator sees of an artifact: its metadata (size, creator, when stored and touched),
//! whether its content is kept, whether a live record needs it, and the records that mention
//! it. The one shape `GET /v1/artifacts`, `GET /v1/artifacts/{id}` and `conduit artifacts
//! list|show` (with or without a daemon) answer.
//!
//! Invariant: `live` and each reference's `live` come from the store's one liveness rule
//! (`ReadTx::artifact_live`, `ReadTx::artifact_references`), never from a second reading.

use conduit_store::{Artifact, ArtifactRef, ReadTx, StoreError};
use serde::{Deserialize, Serialize};

/// How many references one artifact's answer lists (`references_total` counts them all).
pub const REFERENCES_SHOWN: u32 = 100;

/// One artifact as the API and the CLI show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactView {
    /// `sha256:<hex>`, as `artifact.close` answered.
    pub artifact_id: String,
    #[serde(flatten)]
    pub artifact: Artifact,
    /// `kept`, or `removed` (by retention; the id stays, the content is gone).
    pub state: String,
    /// Whether a live record mentions it (it is then never removed).
    pub live: bool,
    /// The records that mention it (one artifact's answer only; the first
    /// [`REFERENCES_SHOWN`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub references: Option<Vec<ArtifactRef>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub references_total: Option<u64>,
}

/// A page of artifacts: oldest first after a cursor, as the other lists page (`next_after`
/// is the last id, `null` on an empty page), or newest first before one, as the web view
/// reads them (`next_before`, `null` on a page shorter than asked).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactPage {
    pub artifacts: Vec<ArtifactView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<Option<i64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_before: Option<Option<i64>>,
}

/// Which way a page of artifacts goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Oldest first, ids above the cursor (from the start when `None`).
    After(Option<i64>),
    /// Newest first, ids below the cursor (from the newest when `None`).
    Before(Option<i64>),
}

fn view(r: &ReadTx<'_>, artifact: Artifact) -> Result<ArtifactView, StoreError> {
    Ok(ArtifactView {
        artifact_id: artifact.artifact_id(),
        state: if artifact.retained() {
            "kept"
        } else {
            "removed"
        }
        .to_owned(),
        live: r.artifact_live(&artifact.sha256)?,
        artifact,
        references: None,
        references_total: None,
    })
}

/// The artifact whose digest is `sha256`, with its references; `None` if it was never stored.
pub fn one(r: &ReadTx<'_>, sha256: &str) -> Result<Option<ArtifactView>, StoreError> {
    let Some(artifact) = r.artifact_by_sha256(sha256)? else {
        return Ok(None);
    };
    let refs = r.artifact_references(sha256, REFERENCES_SHOWN)?;
    let mut v = view(r, artifact)?;
    v.references = Some(refs.references);
    v.references_total = Some(refs.total);
    Ok(Some(v))
}

/// A page of artifacts, removed ones included, in `order`.
pub fn page(r: &ReadTx<'_>, order: Order, limit: u32) -> Result<ArtifactPage, StoreError> {
    let rows = match order {
        Order::After(after) => r.artifacts_after(after, limit)?,
        Order::Before(before) => r.list_artifacts(before, limit)?,
    };
    let last = rows.last().map(|a| a.id);
    let (next_after, next_before) = match order {
        Order::After(_) => (Some(last), None),
        Order::Before(_) => (None, Some(last.filter(|_| rows.len() == limit as usize))),
    };
    let artifacts = rows
        .into_iter()
        .map(|a| view(r, a))
        .collect::<Result<_, _>>()?;
    Ok(ArtifactPage {
        artifacts,
        next_after,
        next_before,
    })
}

/// What a reader of content retention removed is told (the API's 410 and `conduit artifacts
/// get` alike).
pub fn removed_message(sha256: &str, at_ms: i64) -> String {
    format!(
        "the content of artifact sha256:{sha256} was removed by retention at {}; its id and the records that mention it stay (`conduit config show` lists the retention settings)",
        conduit_supervisor::log::utc_timestamp(at_ms)
    )
}
