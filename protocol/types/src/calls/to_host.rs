//! The params and results of the callbacks an extension makes (§7, §8).
//!
//! Invariant: imports only `event.rs` of its siblings.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::event::Event;

// ---- extension → host: callbacks ----------------------------------------------------------

/// `state.event` params.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventRef {
    pub event_id: i64,
}

impl EventRef {
    pub const fn new(event_id: i64) -> Self {
        EventRef { event_id }
    }
}

/// `state.events` params: a page of events, oldest first.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventsQuery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Only events with a larger id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_id: Option<i64>,
    /// 1 to 200; 50 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

impl EventsQuery {
    /// The oldest events of every source, a page of the default size.
    pub fn new() -> Self {
        EventsQuery::default()
    }

    pub fn with_source(mut self, source: impl Into<String>) -> Self {
        self.source = Some(source.into());
        self
    }

    pub fn with_after_id(mut self, after_id: i64) -> Self {
        self.after_id = Some(after_id);
        self
    }

    pub fn with_limit(mut self, limit: u32) -> Self {
        self.limit = Some(limit);
        self
    }
}

/// `state.events` result.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[non_exhaustive]
pub struct EventsPage {
    pub events: Vec<Event>,
}

impl EventsPage {
    pub fn new(events: Vec<Event>) -> Self {
        EventsPage { events }
    }
}

/// `state.work` params.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkRef {
    pub work_id: i64,
}

impl WorkRef {
    pub const fn new(work_id: i64) -> Self {
        WorkRef { work_id }
    }
}

/// A Work as extensions see it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct Work {
    pub id: i64,
    pub kind: String,
    pub key: String,
    /// `open`, `ready` or `done`.
    pub state: String,
    pub event_ids: Vec<i64>,
}

impl Work {
    pub fn new(
        id: i64,
        kind: impl Into<String>,
        key: impl Into<String>,
        state: impl Into<String>,
        event_ids: Vec<i64>,
    ) -> Self {
        Work {
            id,
            kind: kind.into(),
            key: key.into(),
            state: state.into(),
            event_ids,
        }
    }
}

/// `operation.emit` params: plan an emission for the host to commit.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[non_exhaustive]
pub struct EmitParams {
    pub emission: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_id: Option<i64>,
    pub payload: Value,
}

impl EmitParams {
    pub fn new(emission: impl Into<String>, payload: Value) -> Self {
        EmitParams {
            emission: emission.into(),
            work_id: None,
            payload,
        }
    }

    pub fn with_work_id(mut self, work_id: i64) -> Self {
        self.work_id = Some(work_id);
        self
    }
}

/// `operation.emit` result.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct EmitResult {
    pub emission_id: i64,
    pub commit_id: String,
}

impl EmitResult {
    pub fn new(emission_id: i64, commit_id: impl Into<String>) -> Self {
        EmitResult {
            emission_id,
            commit_id: commit_id.into(),
        }
    }
}

/// `ingress.push` params.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[non_exhaustive]
pub struct PushParams {
    pub source: String,
    pub delivery_id: String,
    pub kind: String,
    pub payload: Value,
}

impl PushParams {
    pub fn new(
        source: impl Into<String>,
        delivery_id: impl Into<String>,
        kind: impl Into<String>,
        payload: Value,
    ) -> Self {
        PushParams {
            source: source.into(),
            delivery_id: delivery_id.into(),
            kind: kind.into(),
            payload,
        }
    }
}

/// `ingress.push` result: sent only after the event is committed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct PushResult {
    pub event_id: i64,
    /// True when this delivery was accepted before; no second event was made.
    pub duplicate: bool,
}

impl PushResult {
    pub const fn new(event_id: i64, duplicate: bool) -> Self {
        PushResult {
            event_id,
            duplicate,
        }
    }
}

/// `artifact.open` params.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArtifactOpen {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// The size the sender expects to send, if known (lets the host refuse early).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Asks to send the bytes on the bulk pipe (`initialize`'s `bulk`) rather than as
    /// `artifact.chunk` calls; the host grants it with a `bulk_tag`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bulk: bool,
}

impl ArtifactOpen {
    pub fn new(name: impl Into<String>) -> Self {
        ArtifactOpen {
            name: name.into(),
            ..ArtifactOpen::default()
        }
    }

    pub fn with_media_type(mut self, media_type: impl Into<String>) -> Self {
        self.media_type = Some(media_type.into());
        self
    }

    pub fn with_size(mut self, size: u64) -> Self {
        self.size = Some(size);
        self
    }

    /// Ask for the bulk pipe (§8.1).
    pub fn with_bulk(mut self, bulk: bool) -> Self {
        self.bulk = bulk;
        self
    }
}

/// `artifact.open` result.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArtifactOpened {
    pub stream_id: String,
    /// Largest chunk the host accepts, before base64.
    pub max_chunk_bytes: usize,
    /// How many chunks may be unanswered at once.
    pub window: usize,
    /// Granted a `bulk: true` open: the tag of this stream's frames on the bulk pipe. The
    /// stream then takes no `artifact.chunk`. Absent: send chunks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bulk_tag: Option<u32>,
    /// The host computes the content's SHA-256 itself and answers it at close, so the close
    /// may leave `sha256` out (docs/protocol.md §8). Absent (`false`, an older host): the close
    /// must carry it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sha256_optional: bool,
}

impl ArtifactOpened {
    /// An answer without a bulk tag that requires the close's `sha256` (as an older host's).
    pub fn new(stream_id: impl Into<String>, max_chunk_bytes: usize, window: usize) -> Self {
        ArtifactOpened {
            stream_id: stream_id.into(),
            max_chunk_bytes,
            window,
            bulk_tag: None,
            sha256_optional: false,
        }
    }

    pub fn with_bulk_tag(mut self, bulk_tag: u32) -> Self {
        self.bulk_tag = Some(bulk_tag);
        self
    }

    /// Say whether the close may leave `sha256` out (the host hashes what it receives).
    pub fn with_sha256_optional(mut self, optional: bool) -> Self {
        self.sha256_optional = optional;
        self
    }
}

/// `artifact.chunk` params: chunk `seq` (0, 1, 2, … in order) of a stream.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArtifactChunk {
    pub stream_id: String,
    pub seq: u64,
    /// Base64 (standard alphabet, padded).
    pub data: String,
}

impl ArtifactChunk {
    pub fn new(stream_id: impl Into<String>, seq: u64, data: impl Into<String>) -> Self {
        ArtifactChunk {
            stream_id: stream_id.into(),
            seq,
            data: data.into(),
        }
    }
}

/// `artifact.chunk` result.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChunkAck {
    /// Bytes received so far on this stream.
    pub received: u64,
}

impl ChunkAck {
    pub const fn new(received: u64) -> Self {
        ChunkAck { received }
    }
}

/// `artifact.close` params: the sender's claim, checked by the host.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArtifactClose {
    pub stream_id: String,
    pub size: u64,
    /// The content's SHA-256 as the sender computed or knew it, in hex; the host verifies it.
    /// Optional where the open's answer said `sha256_optional` (docs/protocol.md §8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

impl ArtifactClose {
    /// A close claiming `size` bytes and no digest (the host computes it).
    pub fn new(stream_id: impl Into<String>, size: u64) -> Self {
        ArtifactClose {
            stream_id: stream_id.into(),
            size,
            sha256: None,
        }
    }

    /// Claim the content's SHA-256 (lower-case hex), which the host then checks.
    pub fn with_sha256(mut self, sha256: impl Into<String>) -> Self {
        self.sha256 = Some(sha256.into());
        self
    }
}

/// `artifact.close` result: what the host stored, under the digest it computed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArtifactStored {
    /// `sha256:<hex>`.
    pub artifact_id: String,
    pub size: u64,
    /// The SHA-256 of the bytes the host received, lower-case hex. Absent from an older
    /// host's answer (read as empty): [`ArtifactStored::digest`] then reads it from
    /// `artifact_id`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sha256: String,
}

impl ArtifactStored {
    /// The answer for content of `size` bytes whose SHA-256 is `sha256` (lower-case hex).
    pub fn new(sha256: impl Into<String>, size: u64) -> Self {
        let sha256 = sha256.into();
        ArtifactStored {
            artifact_id: format!("sha256:{sha256}"),
            size,
            sha256,
        }
    }

    /// The stored content's SHA-256 (lower-case hex), from `sha256` or, in an older host's
    /// answer, from `artifact_id`; `None` when neither holds one.
    pub fn digest(&self) -> Option<&str> {
        if !self.sha256.is_empty() {
            return Some(&self.sha256);
        }
        self.artifact_id.strip_prefix("sha256:")
    }
}

/// `artifact.abort` params.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArtifactAbort {
    pub stream_id: String,
}

impl ArtifactAbort {
    pub fn new(stream_id: impl Into<String>) -> Self {
        ArtifactAbort {
            stream_id: stream_id.into(),
        }
    }
}
