//! `_meta` in params: the remaining time of a request, carried from caller to receiver
//! (docs/protocol.md §11).
//!
//! The host writes `"_meta":{"remaining_ms":N}` as the first member of a request's params
//! object, byte for byte, as it writes the params into the request's frame ([`write_params`],
//! the one writer of `_meta`); a receiver strips it before its handler reads the params, cheaply
//! when it is written that way, and by parsing the object otherwise.
//!
//! Invariant: params without a top-level `_meta` are never rewritten; what is stripped is only
//! the top-level member.

use crate::message::RequestParams;

/// The reserved member of every protocol method's params.
pub const META: &str = "_meta";

const PREFIX: &str = "{\"_meta\":{\"remaining_ms\":";

/// Append a request's params to `out`: `params` as they are, or, when `remaining_ms` is given,
/// with `"_meta":{"remaining_ms":N}` as their first member. The one place `_meta` is written.
///
/// The member goes in as the params are written, not by rewriting them afterwards: the prefix
/// `{"_meta":{"remaining_ms":N}` is written first, then the params, whose own opening `{`
/// becomes the `,` after `_meta` (an empty object is closed instead). Params that are not an
/// object, or that already name a `_meta` (text that contains `"_meta"` anywhere, a value whose
/// first member is `_meta`), are left as they are. If `params` fails, `out` may hold part of
/// them: discard it.
pub fn write_params<P: RequestParams + ?Sized>(
    out: &mut Vec<u8>,
    params: &P,
    remaining_ms: Option<u64>,
) -> Result<(), serde_json::Error> {
    let Some(ms) = remaining_ms else {
        return params.write_to(out);
    };
    // Text is looked at before it is written: no prefix to take back.
    if let Some(text) = params.as_json()
        && (!text.trim_start().starts_with('{') || text.contains("\"_meta\""))
    {
        return params.write_to(out);
    }
    let start = out.len();
    out.extend_from_slice(PREFIX.as_bytes());
    out.extend_from_slice(itoa::Buffer::new().format(ms).as_bytes());
    out.push(b'}');
    let at = out.len();
    params.write_to(out)?;
    let open = at
        + out[at..]
            .iter()
            .take_while(|b| b.is_ascii_whitespace())
            .count();
    let written = &out[open..];
    if written.first() != Some(&b'{') || written.starts_with(b"{\"_meta\"") {
        // Not an object, or one with a `_meta` of its own (typed params never have one): the
        // params alone. Rare, so the copy does not matter.
        out.drain(start..at);
        return Ok(());
    }
    let inner = &written[1..];
    let inner_ws = inner.iter().take_while(|b| b.is_ascii_whitespace()).count();
    if inner.get(inner_ws) == Some(&b'}') {
        // `{}`: `_meta` is the only member; what followed the `}` is whitespace at most.
        out.truncate(at);
        out.push(b'}');
    } else {
        out[open] = b',';
    }
    Ok(())
}

/// What [`strip`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stripped {
    /// The params without their top-level `_meta`.
    pub params: String,
    /// `_meta.remaining_ms`, when it is an integer ≥ 0.
    pub remaining_ms: Option<u64>,
}

/// Take the top-level `_meta` out of a params object. `None` when there is none (the params
/// are then used as they are, at no cost).
pub fn strip(params: &str) -> Option<Stripped> {
    if !params.contains("\"_meta\"") {
        return None;
    }
    // Fast path: the host's own spelling, `{"_meta":{"remaining_ms":N}` first.
    if let Some(rest) = params.trim_start().strip_prefix(PREFIX) {
        let end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if end > 0
            && let Ok(ms) = rest[..end].parse::<u64>()
            && let Some(after) = rest[end..].strip_prefix('}')
        {
            let tail = after.trim_start();
            if let Some(more) = tail.strip_prefix(',') {
                return Some(Stripped {
                    params: format!("{{{more}"),
                    remaining_ms: Some(ms),
                });
            }
            if tail.starts_with('}') {
                return Some(Stripped {
                    params: "{}".to_owned(),
                    remaining_ms: Some(ms),
                });
            }
        }
    }
    // Any other spelling: parse the object (a `"_meta"` inside a string or a nested value is
    // not the member, and leaves the params alone).
    let mut map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(params).ok()?;
    let meta = map.remove(META)?;
    Some(Stripped {
        params: serde_json::to_string(&map).ok()?,
        remaining_ms: meta.get("remaining_ms").and_then(serde_json::Value::as_u64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::message::{JsonText, Typed};

    /// What [`write_params`] makes of `params`, given as text.
    fn with_text(params: &str, ms: Option<u64>) -> String {
        let mut out = b"[".to_vec(); // what was written before stays
        write_params(&mut out, &JsonText(params), ms).unwrap();
        assert_eq!(out[0], b'[');
        String::from_utf8(out[1..].to_vec()).unwrap()
    }

    /// The same, for a value serialized as it is written.
    fn with_value(params: &impl serde::Serialize, ms: Option<u64>) -> String {
        let mut out = b"[".to_vec();
        write_params(&mut out, &Typed(params), ms).unwrap();
        String::from_utf8(out[1..].to_vec()).unwrap()
    }

    #[test]
    fn the_host_writes_the_remaining_time_first_and_only_into_objects() {
        let ms = Some(250);
        assert_eq!(
            with_text(r#"{"text":"hi"}"#, ms),
            r#"{"_meta":{"remaining_ms":250},"text":"hi"}"#
        );
        assert_eq!(
            with_value(&serde_json::json!({"text": "hi"}), ms),
            r#"{"_meta":{"remaining_ms":250},"text":"hi"}"#
        );
        assert_eq!(with_text("{}", Some(0)), r#"{"_meta":{"remaining_ms":0}}"#);
        assert_eq!(
            with_value(&crate::calls::Empty {}, Some(0)),
            r#"{"_meta":{"remaining_ms":0}}"#
        );
        assert_eq!(
            with_text(" { } ", Some(7)),
            r#"{"_meta":{"remaining_ms":7}}"#
        );
        // Whitespace before the params' own `{` stays, before the `,` that took its place.
        let spaced = with_text(" {\"a\":1} ", Some(7));
        assert_eq!(spaced, r#"{"_meta":{"remaining_ms":7} ,"a":1} "#);
        assert_eq!(strip(&spaced).unwrap().params, r#"{"a":1} "#);
        for not_object in ["[1]", "null", "7", "\"x\""] {
            assert_eq!(with_text(not_object, Some(1)), not_object);
            let v: serde_json::Value = serde_json::from_str(not_object).unwrap();
            assert_eq!(with_value(&v, Some(1)), not_object);
        }
        // Params that name a `_meta` of their own keep it, alone.
        assert_eq!(
            with_text(r#"{"_meta":{"x":1}}"#, Some(1)),
            r#"{"_meta":{"x":1}}"#
        );
        assert_eq!(
            with_value(&serde_json::json!({"_meta": {"x": 1}}), Some(1)),
            r#"{"_meta":{"x":1}}"#
        );
        // Without a remaining time, the params as they are.
        assert_eq!(with_text(r#"{"a":1}"#, None), r#"{"a":1}"#);
        for p in [r#"{"text":"hi","n":[1,{"a":2}]}"#, "{}", r#"{"a":{}}"#] {
            let with = with_text(p, Some(30_000));
            let v: serde_json::Value = serde_json::from_str(&with).unwrap();
            assert_eq!(v["_meta"]["remaining_ms"], 30_000, "{with}");
            let back = strip(&with).unwrap();
            assert_eq!(back.remaining_ms, Some(30_000));
            assert_eq!(
                serde_json::from_str::<serde_json::Value>(&back.params).unwrap(),
                serde_json::from_str::<serde_json::Value>(p).unwrap()
            );
        }
    }

    #[test]
    fn a_receiver_strips_only_the_top_level_member() {
        assert_eq!(strip(r#"{"text":"hi"}"#), None);
        assert_eq!(strip(r#"{"text":"\"_meta\""}"#), None, "inside a string");
        assert_eq!(strip(r#"{"a":{"_meta":1}}"#), None, "nested");
        let other = strip(r#"{"text":"hi", "_meta" : {"remaining_ms": 5, "x": 1}}"#).unwrap();
        assert_eq!(other.remaining_ms, Some(5));
        assert_eq!(other.params, r#"{"text":"hi"}"#);
        let odd = strip(r#"{"_meta":"soon","a":1}"#).unwrap();
        assert_eq!(odd.remaining_ms, None);
        assert_eq!(odd.params, r#"{"a":1}"#);
        assert_eq!(
            strip(r#"{"_meta":{"remaining_ms":-1},"a":1}"#).unwrap(),
            Stripped {
                params: r#"{"a":1}"#.into(),
                remaining_ms: None
            }
        );
    }

    /// Prints what `_meta` costs per request on the sizes the budget gate uses (a 4.4 KiB
    /// trigger, a 100-byte echo): the host's writing of the params with it, and the receiver's
    /// strip. A benchmark,
    /// not a check: `cargo test --release -p conduit-protocol meta_cost -- --ignored --nocapture`.
    #[test]
    #[ignore = "a benchmark; prints numbers"]
    fn meta_cost() {
        let note = "lorem ipsum dolor sit amet ".repeat(40);
        let inputs: Vec<String> = (0..4)
            .map(|i| format!(r#"{{"id":{i},"source":"mail","delivery_id":"d-{i}","kind":"note.posted","payload":{{"text":"{note}"}},"accepted_at_ms":1}}"#))
            .collect();
        let trigger = format!(r#"{{"kind":"note","inputs":[{}]}}"#, inputs.join(","));
        let echo = r#"{"text":"a short echo of about one hundred bytes, as the round-trip benchmark sends"}"#;
        for (name, p) in [("trigger", trigger.as_str()), ("echo", echo)] {
            let n = 100_000u32;
            let t = std::time::Instant::now();
            let mut keep = 0;
            let mut out = Vec::with_capacity(p.len() + 64);
            for _ in 0..n {
                out.clear();
                write_params(&mut out, &JsonText(std::hint::black_box(p)), Some(250)).unwrap();
                keep += out.len();
            }
            let insert = t.elapsed() / n;
            let with = with_text(p, Some(250));
            let t = std::time::Instant::now();
            for _ in 0..n {
                keep += strip(std::hint::black_box(&with)).unwrap().params.len();
            }
            let stripped = t.elapsed() / n;
            let t = std::time::Instant::now();
            for _ in 0..n {
                keep += usize::from(strip(std::hint::black_box(p)).is_none());
            }
            let absent = t.elapsed() / n;
            println!(
                "{name} ({} bytes): insert {insert:?}, strip {stripped:?}, look without _meta {absent:?} ({keep})",
                p.len()
            );
        }
    }
}
