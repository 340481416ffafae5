//! The payload nesting limit, and the one function that measures nesting.
//!
//! Every payload the host accepts (an event's, an emission's) is later sent inside envelopes:
//!
//! ```text
//!   {"jsonrpc":…,"params":{"kind":…,"inputs":[{"id":…,"payload": <payload> }]}}
//!   └ 1 message    └ 2 TriggerParams └ 3 inputs └ 4 Event
//! ```
//!
//! `work_kind.trigger` params and a `state.events` page are the deepest wraps (4 levels around
//! the payload, the message itself included); `dependency.filter` and `state.event` wrap it in
//! 3, `emit.commit` in 2. A receiver that reads typed values with a recursion limit (serde_json
//! stops at 128 levels, counting from the params it is handed) must be able to read every one of
//! them, so the host refuses a payload nested deeper than [`MAX_PAYLOAD_DEPTH`] when it is
//! accepted: `4 + 64 = 68` leaves 60 levels of margin below 128.
//!
//! Depth counts arrays and objects: a string or a number is 0 deep, `{}` and `[]` are 1,
//! `{"a":[1]}` is 2.
//!
//! Invariant: [`json_depth`] never recurses and allocates nothing, so no input, however deep,
//! can overflow a stack while it is measured. It runs before a payload is parsed into a value.

/// The deepest nesting of arrays and objects a payload may have (see the module docs for why 64).
pub const MAX_PAYLOAD_DEPTH: usize = 64;

/// How many levels the host wraps a payload in at most when it sends it (see the module docs).
pub const DEEPEST_ENVELOPE: usize = 4;

/// The deepest nesting of arrays and objects in the JSON text `json`, measured without
/// recursion. Brackets inside strings do not count. The text is not validated: invalid JSON is
/// measured as far as it goes and left for the parser to refuse.
pub fn json_depth(json: &str) -> usize {
    let bytes = json.as_bytes();
    let (mut depth, mut max, mut i) = (0usize, 0usize, 0usize);
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                // Skip the string in one search per escape: most of a payload's bytes are
                // string contents, and a tight search is several times faster than a state
                // machine stepping through each byte.
                i += 1;
                loop {
                    match bytes[i.min(bytes.len())..]
                        .iter()
                        .position(|&b| b == b'"' || b == b'\\')
                    {
                        None => return max,
                        Some(k) if bytes[i + k] == b'\\' => i += k + 2,
                        Some(k) => {
                            i += k + 1;
                            break;
                        }
                    }
                }
                continue;
            }
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    max
}

/// A payload nested deeper than [`MAX_PAYLOAD_DEPTH`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the payload is nested {depth} levels deep, more than the {limit} conduit accepts; flatten it (arrays and objects count one level each)"
)]
pub struct PayloadTooDeep {
    /// How deep it is.
    pub depth: usize,
    /// [`MAX_PAYLOAD_DEPTH`].
    pub limit: usize,
}

/// Refuse a payload (as JSON text) nested deeper than [`MAX_PAYLOAD_DEPTH`]. The API, the
/// `ingress.push` and `operation.emit` callbacks, `ingress.poll` results, the store and the CLI
/// all check with this.
pub fn check_payload_depth(json: &str) -> Result<(), PayloadTooDeep> {
    let depth = json_depth(json);
    if depth > MAX_PAYLOAD_DEPTH {
        Err(PayloadTooDeep {
            depth,
            limit: MAX_PAYLOAD_DEPTH,
        })
    } else {
        Ok(())
    }
}

/// A payload's JSON text that has passed [`check_payload_depth`]: the only ways to make one
/// check it, so whoever takes a `CheckedPayload` (the store) need not measure it again, and the
/// text goes from a request's body to the row as it came, never through a `Value`.
///
/// The text is JSON (a `RawValue` was parsed to make it), exactly as the sender wrote it,
/// whitespace included.
#[derive(Clone, Debug)]
pub struct CheckedPayload(Box<serde_json::value::RawValue>);

impl PartialEq for CheckedPayload {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for CheckedPayload {}

impl CheckedPayload {
    /// Check raw JSON against [`MAX_PAYLOAD_DEPTH`]; the text is kept as it is.
    pub fn check(raw: Box<serde_json::value::RawValue>) -> Result<CheckedPayload, PayloadTooDeep> {
        check_payload_depth(raw.get())?;
        Ok(CheckedPayload(raw))
    }

    /// Serialise a parsed value once and check it (a polled event's payload, which arrives
    /// parsed with its poll's answer).
    pub fn from_value(v: &serde_json::Value) -> Result<CheckedPayload, PayloadTooDeep> {
        // A `Value` always serialises (its keys are strings); `null` stands in if it ever did not.
        let raw = serde_json::value::to_raw_value(v).unwrap_or_else(|_| Self::null().0);
        Self::check(raw)
    }

    /// `null`, the payload of an event pushed without one.
    pub fn null() -> CheckedPayload {
        let raw = serde_json::value::RawValue::from_string("null".to_owned());
        CheckedPayload(raw.expect("`null` is JSON"))
    }

    /// The JSON text.
    pub fn as_str(&self) -> &str {
        self.0.get()
    }
}

impl From<PayloadTooDeep> for crate::error::RpcError {
    /// `invalid_params`, with `data` `{"limit": 64, "depth": <depth>}`.
    fn from(e: PayloadTooDeep) -> Self {
        crate::error::RpcError::new(crate::error::ErrorCode::InvalidParams, e.to_string())
            .with_data(&serde_json::json!({ "limit": e.limit, "depth": e.depth }))
    }
}

/// `n` nested arrays around `leaf` (`nested(2, "1")` is `[[1]]`): deep payloads for tests.
pub fn nested(n: usize, leaf: &str) -> String {
    let mut s = String::with_capacity(2 * n + leaf.len());
    s.extend(std::iter::repeat_n('[', n));
    s.push_str(leaf);
    s.extend(std::iter::repeat_n(']', n));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calls::{CommitParams, EventsPage, FilterParams, TriggerParams};
    use crate::message::Message;

    #[test]
    fn depth_counts_arrays_and_objects_not_strings() {
        assert_eq!(json_depth("1"), 0);
        assert_eq!(json_depth(r#""[{""#), 0);
        assert_eq!(json_depth("{}"), 1);
        assert_eq!(json_depth(r#"{"a":[1,{"b":"]]]"}]}"#), 3);
        assert_eq!(json_depth(r#"["\"[", ["\\"], [[]]]"#), 3);
        assert_eq!(json_depth(&nested(100_000, "0")), 100_000, "no recursion");
        // Unfinished input is measured as far as it goes, never a panic.
        assert_eq!(json_depth(r#"[{"a\"#), 2);
        assert_eq!(json_depth(r#"[["abc"#), 2);
        assert_eq!(json_depth("[[\"\\"), 2);
    }

    #[test]
    fn the_limit_is_enforced_at_its_edge() {
        assert!(check_payload_depth(&nested(MAX_PAYLOAD_DEPTH, "0")).is_ok());
        let err = check_payload_depth(&nested(MAX_PAYLOAD_DEPTH + 1, "0")).unwrap_err();
        assert_eq!(err.depth, MAX_PAYLOAD_DEPTH + 1);
        assert!(err.to_string().contains("64"), "{err}");
        let rpc = crate::RpcError::from(err);
        assert!(rpc.is(crate::ErrorCode::InvalidParams));
        assert_eq!(rpc.data.unwrap().get(), r#"{"depth":65,"limit":64}"#);
    }

    #[test]
    fn a_checked_payload_keeps_its_text_and_holds_the_limit_at_its_edge() {
        let raw = |s: &str| serde_json::value::RawValue::from_string(s.to_owned()).unwrap();
        let p = CheckedPayload::check(raw(r#"{ "a" : [1, 2] }"#)).unwrap();
        assert_eq!(p.as_str(), r#"{ "a" : [1, 2] }"#, "kept as written");
        let at = nested(MAX_PAYLOAD_DEPTH, "0");
        assert_eq!(CheckedPayload::check(raw(&at)).unwrap().as_str(), at);
        let past = CheckedPayload::check(raw(&nested(MAX_PAYLOAD_DEPTH + 1, "0"))).unwrap_err();
        assert_eq!(past.depth, MAX_PAYLOAD_DEPTH + 1);
        let v: serde_json::Value = serde_json::from_str(&nested(MAX_PAYLOAD_DEPTH, "0")).unwrap();
        assert!(CheckedPayload::from_value(&v).is_ok());
        let v = serde_json::json!([v]);
        assert_eq!(
            CheckedPayload::from_value(&v).unwrap_err().depth,
            MAX_PAYLOAD_DEPTH + 1
        );
        assert_eq!(CheckedPayload::null().as_str(), "null");
    }

    /// Parse a whole message line as a receiver does: the envelope with raw params, then the
    /// typed params.
    fn receive<P: serde::de::DeserializeOwned>(line: &str) -> Result<P, String> {
        match Message::parse(line.as_bytes()).map_err(|e| e.to_string())? {
            Message::Request { params, .. } => {
                serde_json::from_str(params.unwrap().get()).map_err(|e| e.to_string())
            }
            Message::Response { result, .. } => {
                serde_json::from_str(result.unwrap().get()).map_err(|e| e.to_string())
            }
            other => Err(format!("unexpected {other:?}")),
        }
    }

    #[test]
    fn every_envelope_around_a_payload_at_the_limit_parses_with_margin() {
        // Past the limit still parses in every wrap, up to serde_json's own limit (128 levels
        // counted from the params): the margin is real. One level more and the trigger fails,
        // which is the failure the limit exists to prevent.
        let serde_max = 128 - DEEPEST_ENVELOPE;
        for depth in [
            MAX_PAYLOAD_DEPTH,
            MAX_PAYLOAD_DEPTH + 1,
            serde_max,
            serde_max + 1,
        ] {
            let p = nested(depth - 1, r#"{"thread":"t"}"#);
            let event = format!(
                r#"{{"id":1,"source":"s","delivery_id":"d","kind":"k","payload":{p},"accepted_at_ms":0}}"#
            );
            let trigger = format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"work_kind.trigger","params":{{"kind":"k","inputs":[{event}]}}}}"#
            );
            let filter = format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"dependency.filter","params":{{"filter":"f","wait_id":1,"subject":"s","event":{event}}}}}"#
            );
            let commit = format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"emit.commit","params":{{"emission":"e","commit_id":"c","payload":{p}}}}}"#
            );
            let page = format!(r#"{{"jsonrpc":"2.0","id":1,"result":{{"events":[{event}]}}}}"#);
            let msg = format!("{depth} levels");
            assert_eq!(json_depth(&trigger), depth + DEEPEST_ENVELOPE);
            if depth > serde_max {
                let err = receive::<TriggerParams>(&trigger).unwrap_err();
                assert!(err.contains("recursion limit"), "{err}");
                continue;
            }
            receive::<TriggerParams>(&trigger).expect(&msg);
            receive::<FilterParams>(&filter).expect(&msg);
            receive::<CommitParams>(&commit).expect(&msg);
            receive::<EventsPage>(&page).expect(&msg);
        }
    }
}
