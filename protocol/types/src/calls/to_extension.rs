//! The params and results of the host's calls to an extension after the handshake (§6): the
//! four in-transaction calls, `ingress.poll` and `check.sleep`.
//!
//! Invariant: imports only `event.rs` of its siblings.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::event::{Event, NewEvent};

// ---- host → extension: the four in-transaction calls -------------------------------------

/// `work_kind.trigger` params: a batch of pending inputs for one work kind.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[non_exhaustive]
pub struct TriggerParams {
    pub kind: String,
    pub inputs: Vec<Event>,
}

impl TriggerParams {
    pub fn new(kind: impl Into<String>, inputs: Vec<Event>) -> Self {
        TriggerParams {
            kind: kind.into(),
            inputs,
        }
    }
}

/// `work_kind.trigger` result: which Work each input goes to.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct TriggerResult {
    pub groups: Vec<TriggerGroup>,
}

impl TriggerResult {
    pub fn new(groups: Vec<TriggerGroup>) -> Self {
        TriggerResult { groups }
    }
}

/// Inputs that go to the same Work, named by `key` within the kind.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct TriggerGroup {
    pub key: String,
    pub event_ids: Vec<i64>,
    /// Whether these inputs make the Work ready to run (false: queue them only).
    #[serde(default = "yes")]
    pub start: bool,
}

impl TriggerGroup {
    /// Inputs that make the Work `key` ready to run (`start: true`).
    pub fn new(key: impl Into<String>, event_ids: Vec<i64>) -> Self {
        TriggerGroup {
            key: key.into(),
            event_ids,
            start: true,
        }
    }

    /// Inputs queued on the Work `key` without making it ready (`start: false`).
    pub fn queued(key: impl Into<String>, event_ids: Vec<i64>) -> Self {
        TriggerGroup {
            start: false,
            ..TriggerGroup::new(key, event_ids)
        }
    }
}

fn yes() -> bool {
    true
}

/// `recurrence.next` params: a timer fired.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecurrenceParams {
    pub recurrence: String,
    pub timer_id: i64,
    /// The timer's spec, as written when it was created (for `digest`: `every 15m`, or a
    /// cron-like `M H * * *`).
    pub spec: String,
    pub fired_at_ms: i64,
}

impl RecurrenceParams {
    pub fn new(
        recurrence: impl Into<String>,
        timer_id: i64,
        spec: impl Into<String>,
        fired_at_ms: i64,
    ) -> Self {
        RecurrenceParams {
            recurrence: recurrence.into(),
            timer_id,
            spec: spec.into(),
            fired_at_ms,
        }
    }
}

/// `recurrence.next` result: when the timer fires next, or `null` to stop it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecurrenceResult {
    pub next_at_ms: Option<i64>,
}

impl RecurrenceResult {
    /// Fire next at `next_at_ms` (or stop the timer, with `None`).
    pub const fn new(next_at_ms: Option<i64>) -> Self {
        RecurrenceResult { next_at_ms }
    }

    /// Fire next at `next_at_ms`.
    pub const fn at(next_at_ms: i64) -> Self {
        RecurrenceResult::new(Some(next_at_ms))
    }

    /// Stop the timer (`next_at_ms: null`).
    pub const fn stop() -> Self {
        RecurrenceResult::new(None)
    }
}

/// `dependency.filter` params: does `event` satisfy the wait?
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[non_exhaustive]
pub struct FilterParams {
    pub filter: String,
    pub wait_id: i64,
    /// What the wait is for, as written when it was created.
    pub subject: String,
    pub event: Event,
}

impl FilterParams {
    pub fn new(
        filter: impl Into<String>,
        wait_id: i64,
        subject: impl Into<String>,
        event: Event,
    ) -> Self {
        FilterParams {
            filter: filter.into(),
            wait_id,
            subject: subject.into(),
            event,
        }
    }
}

/// `dependency.filter` result.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct FilterResult {
    pub satisfied: bool,
}

impl FilterResult {
    pub const fn new(satisfied: bool) -> Self {
        FilterResult { satisfied }
    }
}

/// `emit.commit` params: a planned emission is being committed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[non_exhaustive]
pub struct CommitParams {
    pub emission: String,
    /// Unique per emission: a commit with the same id is the same commit.
    pub commit_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_id: Option<i64>,
    pub payload: Value,
}

impl CommitParams {
    pub fn new(emission: impl Into<String>, commit_id: impl Into<String>, payload: Value) -> Self {
        CommitParams {
            emission: emission.into(),
            commit_id: commit_id.into(),
            work_id: None,
            payload,
        }
    }

    pub fn with_work_id(mut self, work_id: Option<i64>) -> Self {
        self.work_id = work_id;
        self
    }
}

/// `emit.commit` result: the records the host writes in the same transaction.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[non_exhaustive]
pub struct CommitResult {
    pub records: Vec<Record>,
}

impl CommitResult {
    pub fn new(records: Vec<Record>) -> Self {
        CommitResult { records }
    }
}

/// One record written with an emission.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[non_exhaustive]
pub struct Record {
    pub kind: String,
    pub body: Value,
}

impl Record {
    pub fn new(kind: impl Into<String>, body: Value) -> Self {
        Record {
            kind: kind.into(),
            body,
        }
    }
}

// ---- host → extension: ingress and the conformance method ---------------------------------

/// `ingress.poll` params: what has the source seen since `cursor`?
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct IngressPollParams {
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    pub limit: u32,
}

impl IngressPollParams {
    pub fn new(source: impl Into<String>, limit: u32) -> Self {
        IngressPollParams {
            source: source.into(),
            cursor: None,
            limit,
        }
    }

    pub fn with_cursor(mut self, cursor: Option<String>) -> Self {
        self.cursor = cursor;
        self
    }
}

/// `ingress.poll` result.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[non_exhaustive]
pub struct IngressPollResult {
    pub events: Vec<NewEvent>,
    /// Where the next poll starts; unchanged (or absent) when nothing is new.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

impl IngressPollResult {
    pub fn new(events: Vec<NewEvent>) -> Self {
        IngressPollResult {
            events,
            cursor: None,
        }
    }

    pub fn with_cursor(mut self, cursor: impl Into<String>) -> Self {
        self.cursor = Some(cursor.into());
        self
    }
}

/// `check.sleep` params: hold the request for `ms` milliseconds, or until cancelled.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct SleepParams {
    pub ms: u64,
}

impl SleepParams {
    pub const fn new(ms: u64) -> Self {
        SleepParams { ms }
    }
}

/// `check.sleep` result.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct SleepResult {
    pub slept_ms: u64,
}

impl SleepResult {
    pub const fn new(slept_ms: u64) -> Self {
        SleepResult { slept_ms }
    }
}
