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

/// A page of artifacts, as the other lists page (`next_after` is the last id, `null` on an
/// empty page).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactPage {
    pub artifacts: Vec<ArtifactView>,
    pub next_after: Option<i64>,
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

/// A page of artifacts with ids above `after`, oldest first, removed ones included.
pub fn page(r: &ReadTx<'_>, after: Option<i64>, limit: u32) -> Result<ArtifactPage, StoreError> {
    let rows = r.list_artifacts(after, limit)?;
    let next_after = rows.last().map(|a| a.id);
    let artifacts = rows
        .into_iter()
        .map(|a| view(r, a))
        .collect::<Result<_, _>>()?;
    Ok(ArtifactPage {
        artifacts,
        next_after,
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
