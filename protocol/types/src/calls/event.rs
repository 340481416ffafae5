//! The events both directions carry: [`Event`] (as the host stores it), [`NewEvent`] (pushed or
//! polled, before it has an id), and [`Empty`], the result of methods with nothing to say.
//!
//! Invariant: a leaf of `calls`; it imports nothing of the crate.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// An event as the host stores it and shows it to extensions.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[non_exhaustive]
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

impl Event {
    pub fn new(
        id: i64,
        source: impl Into<String>,
        delivery_id: impl Into<String>,
        kind: impl Into<String>,
        payload: Value,
        accepted_at_ms: i64,
    ) -> Self {
        Event {
            id,
            source: source.into(),
            delivery_id: delivery_id.into(),
            kind: kind.into(),
            payload,
            accepted_at_ms,
        }
    }
}

/// An event being pushed or polled, before the host gave it an id.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[non_exhaustive]
pub struct NewEvent {
    pub delivery_id: String,
    pub kind: String,
    pub payload: Value,
}

impl NewEvent {
    pub fn new(delivery_id: impl Into<String>, kind: impl Into<String>, payload: Value) -> Self {
        NewEvent {
            delivery_id: delivery_id.into(),
            kind: kind.into(),
            payload,
        }
    }
}

/// An empty object, the result of methods with nothing to say (`shutdown`, `artifact.abort`).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Empty {}
