//! Params and results of every method after the handshake, in both directions.
//!
//! Times are Unix milliseconds (`*_ms`), sizes are bytes, binary data is standard base64 with
//! padding. Inbound types ignore unknown fields and outbound ones skip empty optionals, so
//! fields can be added without a new protocol version.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// An event as the host stores it and shows it to extensions.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Event {
    pub id: i64,
    pub source: String,
    pub delivery_id: String,
    pub kind: String,
    pub payload: Value,
    /// When the host accepted it.
    #[serde(default)]
    pub accepted_at_ms: i64,
}

// ---- host → extension: the four in-transaction calls -------------------------------------

/// `work_kind.trigger` params: a batch of pending inputs for one work kind.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TriggerParams {
    pub kind: String,
    pub inputs: Vec<Event>,
}

/// `work_kind.trigger` result: which Work each input goes to.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TriggerResult {
    pub groups: Vec<TriggerGroup>,
}

/// Inputs that go to the same Work, named by `key` within the kind.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TriggerGroup {
    pub key: String,
    pub event_ids: Vec<i64>,
    /// Whether these inputs make the Work ready to run (false: queue them only).
    #[serde(default = "yes")]
    pub start: bool,
}

fn yes() -> bool {
    true
}

/// `recurrence.next` params: a timer fired.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RecurrenceParams {
    pub recurrence: String,
    pub timer_id: i64,
    /// The timer's spec, as written when it was created (for `digest`: `every 15m`, or a
    /// cron-like `M H * * *`).
    pub spec: String,
    pub fired_at_ms: i64,
}

/// `recurrence.next` result: when the timer fires next, or `null` to stop it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RecurrenceResult {
    pub next_at_ms: Option<i64>,
}

/// `dependency.filter` params: does `event` satisfy the wait?
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FilterParams {
    pub filter: String,
    pub wait_id: i64,
    /// What the wait is for, as written when it was created.
    pub subject: String,
    pub event: Event,
}

/// `dependency.filter` result.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct FilterResult {
    pub satisfied: bool,
}

/// `emit.commit` params: a planned emission is being committed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CommitParams {
    pub emission: String,
    /// Unique per emission: a commit with the same id is the same commit.
    pub commit_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_id: Option<i64>,
    pub payload: Value,
}

/// `emit.commit` result: the records the host writes in the same transaction.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CommitResult {
    pub records: Vec<Record>,
}

/// One record written with an emission.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Record {
    pub kind: String,
    pub body: Value,
}

// ---- host → extension: ingress and the conformance method ---------------------------------

/// `ingress.poll` params: what has the source seen since `cursor`?
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct IngressPollParams {
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    pub limit: u32,
}

/// `ingress.poll` result.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct IngressPollResult {
    pub events: Vec<NewEvent>,
    /// Where the next poll starts; unchanged (or absent) when nothing is new.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

/// An event being pushed or polled, before the host gave it an id.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NewEvent {
    pub delivery_id: String,
    pub kind: String,
    pub payload: Value,
}

/// `check.sleep` params: hold the request for `ms` milliseconds, or until cancelled.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SleepParams {
    pub ms: u64,
}

/// `check.sleep` result.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SleepResult {
    pub slept_ms: u64,
}

// ---- extension → host: callbacks ----------------------------------------------------------

/// `state.event` params.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct EventRef {
    pub event_id: i64,
}

/// `state.events` params: a page of events, oldest first.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
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

/// `state.events` result.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EventsPage {
    pub events: Vec<Event>,
}

/// `state.work` params.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct WorkRef {
    pub work_id: i64,
}

/// A Work as extensions see it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Work {
    pub id: i64,
    pub kind: String,
    pub key: String,
    /// `open`, `ready` or `done`.
    pub state: String,
    pub event_ids: Vec<i64>,
}

/// `operation.emit` params: plan an emission for the host to commit.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EmitParams {
    pub emission: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_id: Option<i64>,
    pub payload: Value,
}

/// `operation.emit` result.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct EmitResult {
    pub emission_id: i64,
    pub commit_id: String,
}

/// `ingress.push` params.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PushParams {
    pub source: String,
    pub delivery_id: String,
    pub kind: String,
    pub payload: Value,
}

/// `ingress.push` result: sent only after the event is committed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PushResult {
    pub event_id: i64,
    /// True when this delivery was accepted before; no second event was made.
    pub duplicate: bool,
}

/// `artifact.open` params.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
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

/// `artifact.open` result.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
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

/// `artifact.chunk` params: chunk `seq` (0, 1, 2, … in order) of a stream.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ArtifactChunk {
    pub stream_id: String,
    pub seq: u64,
    /// Base64 (standard alphabet, padded).
    pub data: String,
}

/// `artifact.chunk` result.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChunkAck {
    /// Bytes received so far on this stream.
    pub received: u64,
}

/// `artifact.close` params: the sender's claim, checked by the host.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ArtifactClose {
    pub stream_id: String,
    pub size: u64,
    /// The content's SHA-256 as the sender computed or knew it, in hex; the host verifies it.
    /// Optional where the open's answer said `sha256_optional` (docs/protocol.md §8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// `artifact.close` result: what the host stored, under the digest it computed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
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
    pub fn new(sha256: String, size: u64) -> Self {
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
pub struct ArtifactAbort {
    pub stream_id: String,
}

/// An empty object, the result of methods with nothing to say (`shutdown`, `artifact.abort`).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Empty {}
