//! The protocol's rules about answers and fields, one function each.
//!
//! Every side that needs a rule calls the function here: the host's loop and callbacks, the
//! management API, the manifest check, `conduit ext check` and the Rust SDK. A rule changed
//! here changes for all of them at once, and `docs/protocol.md` states each one (the section
//! is named on each item).
//!
//! Invariant: pure functions of their inputs; no I/O.

use std::collections::HashSet;

use serde::de::DeserializeOwned;

use crate::calls::{CommitResult, IngressPollResult, RecurrenceResult, TriggerResult};
use crate::error::{ErrorCode, RpcError};

/// The longest `key` of a trigger group, and the longest `source`, `delivery_id` and `kind` of
/// an event, in bytes (§6.1, §7.5). Each is at least 1 byte.
pub const MAX_NAME_BYTES: usize = 200;

/// The most rows one page holds (`state.events`, the management API's lists), and the page
/// size when none is asked for (§7.2).
pub const MAX_PAGE: u32 = 200;
/// See [`MAX_PAGE`].
pub const DEFAULT_PAGE: u32 = 50;

/// Why an answer breaks its method's rules: the host applies the method's fallback, and the
/// checker fails the package, with this text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AnswerError(pub String);

fn bad(why: impl Into<String>) -> Result<(), AnswerError> {
    Err(AnswerError(why.into()))
}

impl TriggerResult {
    /// §6.1: every input's id in exactly one group, no other id, keys of 1 to
    /// [`MAX_NAME_BYTES`] bytes and distinct, no empty group.
    pub fn check(&self, inputs: &[i64]) -> Result<(), AnswerError> {
        let want: HashSet<i64> = inputs.iter().copied().collect();
        let mut seen = HashSet::new();
        let mut keys = HashSet::new();
        for g in &self.groups {
            if g.key.is_empty() || g.key.len() > MAX_NAME_BYTES {
                return bad(format!(
                    "group key `{}` is {} bytes; a key is 1 to {MAX_NAME_BYTES} bytes",
                    g.key,
                    g.key.len()
                ));
            }
            if !keys.insert(g.key.as_str()) {
                return bad(format!("group key `{}` appears twice", g.key));
            }
            if g.event_ids.is_empty() {
                return bad(format!("group `{}` names no event", g.key));
            }
            for id in &g.event_ids {
                if !want.contains(id) {
                    return bad(format!("event {id} was not in the batch {inputs:?}"));
                }
                if !seen.insert(*id) {
                    return bad(format!("event {id} is in two groups"));
                }
            }
        }
        if seen.len() != want.len() {
            let missing: Vec<i64> = inputs
                .iter()
                .filter(|i| !seen.contains(i))
                .copied()
                .collect();
            return bad(format!(
                "{} of {} inputs are in no group: {missing:?}",
                want.len() - seen.len(),
                want.len()
            ));
        }
        Ok(())
    }
}

impl RecurrenceResult {
    /// §6.2: `next_at_ms` after `fired_at_ms`, or `null` (stop the timer). The next firing.
    pub fn check(&self, fired_at_ms: i64) -> Result<Option<i64>, AnswerError> {
        match self.next_at_ms {
            Some(n) if n <= fired_at_ms => Err(AnswerError(format!(
                "next_at_ms {n} is not after fired_at_ms {fired_at_ms}"
            ))),
            next => Ok(next),
        }
    }
}

impl CommitResult {
    /// §6.4: every record has a non-empty `kind`.
    pub fn check(&self) -> Result<(), AnswerError> {
        match self.records.iter().position(|r| r.kind.is_empty()) {
            Some(i) => bad(format!("record {i} has an empty kind")),
            None => Ok(()),
        }
    }
}

impl IngressPollResult {
    /// §6.5: at most `limit` events.
    pub fn check(&self, limit: u32) -> Result<(), AnswerError> {
        if self.events.len() > limit as usize {
            return bad(format!("{} events for limit {limit}", self.events.len()));
        }
        Ok(())
    }
}

/// A field that breaks its rule, naming the field and the rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{field}` must be 1 to {max} bytes, not {len}")]
pub struct FieldError {
    pub field: &'static str,
    pub len: usize,
    pub max: usize,
}

impl From<FieldError> for RpcError {
    fn from(e: FieldError) -> Self {
        RpcError::new(ErrorCode::InvalidParams, e.to_string())
    }
}

/// §7.5: an event's `source`, `delivery_id` and `kind` are each 1 to [`MAX_NAME_BYTES`] bytes,
/// wherever the event comes from (`ingress.push`, an `ingress.poll` result, the API).
pub fn check_event_fields(source: &str, delivery_id: &str, kind: &str) -> Result<(), FieldError> {
    for (field, v) in [
        ("source", source),
        ("delivery_id", delivery_id),
        ("kind", kind),
    ] {
        if v.is_empty() || v.len() > MAX_NAME_BYTES {
            return Err(FieldError {
                field,
                len: v.len(),
                max: MAX_NAME_BYTES,
            });
        }
    }
    Ok(())
}

/// A page size outside 1 to [`MAX_PAGE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`limit` must be 1 to {MAX_PAGE}, not {0}")]
pub struct PageError(pub u32);

impl From<PageError> for RpcError {
    fn from(e: PageError) -> Self {
        RpcError::new(ErrorCode::InvalidParams, e.to_string())
    }
}

/// §7.2: the page size asked for, [`DEFAULT_PAGE`] when absent, refused outside 1 to
/// [`MAX_PAGE`].
pub fn page_limit(asked: Option<u32>) -> Result<u32, PageError> {
    let limit = asked.unwrap_or(DEFAULT_PAGE);
    if (1..=MAX_PAGE).contains(&limit) {
        Ok(limit)
    } else {
        Err(PageError(limit))
    }
}

/// §3.1: the params of a protocol method. Absent params read as `{}`; present ones must be a
/// JSON object (`null`, a scalar or an array is `invalid_params`: serde would otherwise read a
/// struct from a positional array). A mismatch with `T` is `invalid_params` naming the method.
pub fn parse_params<T: DeserializeOwned>(
    method: &str,
    params: Option<&str>,
) -> Result<T, RpcError> {
    let raw = params.unwrap_or("{}");
    if !raw.trim_start().starts_with('{') {
        return Err(RpcError::invalid_params(
            method,
            "params must be a JSON object (§3.1)",
        ));
    }
    serde_json::from_str(raw).map_err(|e| RpcError::invalid_params(method, e))
}

/// [`parse_params`] for a method whose params carry a `payload` (`operation.emit`,
/// `ingress.push`): the payload is measured against [`MAX_PAYLOAD_DEPTH`](crate::MAX_PAYLOAD_DEPTH)
/// (§1.3) before anything is parsed into a value, the order the management API keeps too.
pub fn parse_params_with_payload<T: DeserializeOwned>(
    method: &str,
    params: Option<&str>,
) -> Result<T, RpcError> {
    #[derive(serde::Deserialize)]
    struct Payload<'a> {
        #[serde(borrow, default)]
        payload: Option<&'a serde_json::value::RawValue>,
    }
    // Params that do not read even this far are refused, with serde's reason, below.
    if let Some(raw) = params
        && let Ok(Payload { payload: Some(p) }) = serde_json::from_str::<Payload<'_>>(raw)
    {
        crate::depth::check_payload_depth(p.get())?;
    }
    parse_params(method, params)
}

/// How a caller reads an error answer's code (§12). `-32000` is the code most JSON-RPC
/// libraries use for any server error; conduit's `overloaded` always carries `data.limit` (or,
/// for the held-bytes bound, `data.held_bytes_limit`), so a `-32000` without either is a
/// generic server error: not an overload, and not retryable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// `overloaded` with its limit: retry after a request finishes, or after a short backoff.
    Overloaded,
    /// Another code marked retryable in §12 (`deadline_exceeded`, `extension_exited`,
    /// `shutting_down`, `storage_full`).
    Retryable,
    /// Everything else, codes conduit does not know and a `-32000` without a limit included.
    Permanent,
}

impl ErrorClass {
    /// Whether the same request may succeed if sent again later, unchanged.
    pub fn is_retryable(self) -> bool {
        !matches!(self, ErrorClass::Permanent)
    }
}

/// Classify an error by its code and `data` (§12).
pub fn classify(code: i32, data: Option<&str>) -> ErrorClass {
    if code == ErrorCode::Overloaded.number() {
        let has_limit = data
            .and_then(|d| serde_json::from_str::<serde_json::Value>(d).ok())
            .is_some_and(|d| d["limit"].is_u64() || d["held_bytes_limit"].is_u64());
        return if has_limit {
            ErrorClass::Overloaded
        } else {
            ErrorClass::Permanent
        };
    }
    match ErrorCode::from_number(code) {
        Some(c) if c.is_retryable() => ErrorClass::Retryable,
        _ => ErrorClass::Permanent,
    }
}

impl RpcError {
    /// How to read this error (§12): see [`classify`].
    pub fn class(&self) -> ErrorClass {
        classify(self.code, self.data.as_deref().map(|d| d.get()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calls::{Record, TriggerGroup};

    fn group(key: &str, ids: &[i64]) -> TriggerGroup {
        TriggerGroup {
            key: key.into(),
            event_ids: ids.to_vec(),
            start: true,
        }
    }

    #[test]
    fn a_trigger_answer_covers_each_input_once_with_usable_keys() {
        let ok = TriggerResult {
            groups: vec![group("thread:1", &[1, 2]), group("thread:2", &[3])],
        };
        assert_eq!(ok.check(&[1, 2, 3]), Ok(()));
        let at_limit = "k".repeat(MAX_NAME_BYTES);
        let over = "k".repeat(MAX_NAME_BYTES + 1);
        assert_eq!(
            TriggerResult {
                groups: vec![group(&at_limit, &[1, 2, 3])]
            }
            .check(&[1, 2, 3]),
            Ok(())
        );
        for (bad, why) in [
            (vec![group("a", &[1, 2])], "in no group: [3]"),
            (vec![group("a", &[1, 2]), group("b", &[2, 3])], "two groups"),
            (vec![group("a", &[1, 2, 3, 4])], "not in the batch"),
            (vec![group("a", &[1]), group("a", &[2, 3])], "twice"),
            (vec![group("", &[1, 2, 3])], "1 to 200 bytes"),
            (vec![group(&over, &[1, 2, 3])], "is 201 bytes"),
            (
                vec![group("a", &[1, 2, 3]), group("b", &[])],
                "names no event",
            ),
        ] {
            let err = TriggerResult { groups: bad }.check(&[1, 2, 3]).unwrap_err();
            assert!(err.0.contains(why), "{err}");
        }
    }

    #[test]
    fn a_recurrence_answer_is_after_the_firing_or_null() {
        let r = |n| RecurrenceResult { next_at_ms: n };
        assert_eq!(r(Some(101)).check(100), Ok(Some(101)));
        assert_eq!(r(None).check(100), Ok(None));
        assert!(r(Some(100)).check(100).is_err());
        assert!(r(Some(-5)).check(100).is_err());
    }

    #[test]
    fn commit_records_have_kinds_and_polls_stay_within_their_limit() {
        let rec = |k: &str| Record {
            kind: k.into(),
            body: serde_json::json!({}),
        };
        assert_eq!(CommitResult { records: vec![] }.check(), Ok(()));
        assert_eq!(
            CommitResult {
                records: vec![rec("n")]
            }
            .check(),
            Ok(())
        );
        assert!(
            CommitResult {
                records: vec![rec("n"), rec("")]
            }
            .check()
            .is_err()
        );
        let ev = crate::calls::NewEvent {
            delivery_id: "d".into(),
            kind: "k".into(),
            payload: serde_json::json!(null),
        };
        let poll = |n| IngressPollResult {
            events: vec![ev.clone(); n],
            cursor: None,
        };
        assert_eq!(poll(2).check(2), Ok(()));
        assert!(poll(3).check(2).is_err());
    }

    #[test]
    fn event_fields_are_1_to_200_bytes() {
        let at = "x".repeat(MAX_NAME_BYTES);
        let over = "x".repeat(MAX_NAME_BYTES + 1);
        assert_eq!(check_event_fields("s", &at, "k"), Ok(()));
        let e = check_event_fields("s", &over, "k").unwrap_err();
        assert_eq!(e.field, "delivery_id");
        assert_eq!(
            e.to_string(),
            "`delivery_id` must be 1 to 200 bytes, not 201"
        );
        assert_eq!(
            check_event_fields("", "d", "k").unwrap_err().field,
            "source"
        );
        assert_eq!(check_event_fields("s", "d", "").unwrap_err().field, "kind");
        assert_eq!(RpcError::from(e).code, ErrorCode::InvalidParams.number());
    }

    #[test]
    fn pages_are_1_to_200_and_50_by_default() {
        assert_eq!(page_limit(None), Ok(DEFAULT_PAGE));
        assert_eq!(page_limit(Some(1)), Ok(1));
        assert_eq!(page_limit(Some(MAX_PAGE)), Ok(MAX_PAGE));
        assert_eq!(page_limit(Some(0)), Err(PageError(0)));
        assert_eq!(page_limit(Some(MAX_PAGE + 1)), Err(PageError(201)));
    }

    #[test]
    fn params_are_objects_only() {
        #[derive(serde::Deserialize, Debug)]
        struct P {
            #[allow(dead_code)]
            event_id: i64,
        }
        #[derive(serde::Deserialize, Debug, Default)]
        struct Opt {
            #[serde(default)]
            limit: Option<u32>,
        }
        assert!(parse_params::<P>("m", Some(r#"{"event_id":1}"#)).is_ok());
        assert_eq!(parse_params::<Opt>("m", None).unwrap().limit, None);
        for bad in ["[1]", "null", "7", "\"x\"", " [ 1 ]"] {
            let e = parse_params::<P>("state.event", Some(bad)).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidParams.number(), "{bad}");
            assert!(e.message.contains("must be a JSON object"), "{bad}: {e}");
        }
        let e = parse_params::<P>("state.event", Some("{}")).unwrap_err();
        assert!(e.message.contains("`state.event`"), "{e}");
    }

    #[test]
    fn minus_32000_is_an_overload_only_with_its_limit() {
        assert_eq!(RpcError::overloaded(64).class(), ErrorClass::Overloaded);
        assert_eq!(
            classify(-32000, Some(r#"{"held_bytes_limit":50331648}"#)),
            ErrorClass::Overloaded
        );
        for data in [
            None,
            Some("null"),
            Some("{}"),
            Some(r#"{"limit":"64"}"#),
            Some("[64]"),
        ] {
            let c = classify(-32000, data);
            assert_eq!(c, ErrorClass::Permanent, "{data:?}");
            assert!(!c.is_retryable());
        }
        assert_eq!(classify(-32002, None), ErrorClass::Retryable);
        assert_eq!(classify(-32603, None), ErrorClass::Permanent);
        assert_eq!(classify(-31999, None), ErrorClass::Permanent);
    }
}
