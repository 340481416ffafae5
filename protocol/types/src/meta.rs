//! `_meta` in params: the remaining time of a request, carried from caller to receiver
//! (docs/protocol.md §11).
//!
//! The host writes `"_meta":{"remaining_ms":N}` as the first member of a request's params
//! object, byte for byte, without parsing the params; a receiver strips it before its handler
//! reads the params, cheaply when it is written that way, and by parsing the object otherwise.
//!
//! Invariant: params without a top-level `_meta` are never rewritten; what is stripped is only
//! the top-level member.

/// The reserved member of every protocol method's params.
pub const META: &str = "_meta";

const PREFIX: &str = "{\"_meta\":{\"remaining_ms\":";

/// `params` with `"_meta":{"remaining_ms":remaining_ms}` as its first member, or `None` when
/// `params` is not an object or already names a `_meta` anywhere (left as it is).
pub fn with_remaining_ms(params: &str, remaining_ms: u64) -> Option<String> {
    let trimmed = params.trim_start();
    // Already there in the host's spelling (the typed call wrote it): no scan.
    if trimmed.starts_with("{\"_meta\"") {
        return None;
    }
    let body = trimmed.strip_prefix('{')?;
    if body.contains("\"_meta\"") {
        return None;
    }
    let digits = remaining_ms.to_string();
    let empty = body.trim_start().starts_with('}');
    let mut out = String::with_capacity(params.len() + PREFIX.len() + digits.len() + 2);
    out.push_str(PREFIX);
    out.push_str(&digits);
    out.push('}');
    if !empty {
        out.push(',');
    }
    out.push_str(body);
    Some(out)
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

    #[test]
    fn the_host_inserts_the_remaining_time_first_and_only_into_objects() {
        assert_eq!(
            with_remaining_ms(r#"{"text":"hi"}"#, 250).unwrap(),
            r#"{"_meta":{"remaining_ms":250},"text":"hi"}"#
        );
        assert_eq!(
            with_remaining_ms("{}", 0).unwrap(),
            r#"{"_meta":{"remaining_ms":0}}"#
        );
        assert_eq!(
            with_remaining_ms(" { } ", 7).unwrap(),
            r#"{"_meta":{"remaining_ms":7} } "#
        );
        for not_object in ["[1]", "null", "7", "\"x\""] {
            assert_eq!(with_remaining_ms(not_object, 1), None, "{not_object}");
        }
        assert_eq!(with_remaining_ms(r#"{"_meta":{"x":1}}"#, 1), None);
        for p in [r#"{"text":"hi","n":[1,{"a":2}]}"#, "{}", r#"{"a":{}}"#] {
            let with = with_remaining_ms(p, 30_000).unwrap();
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
    /// trigger, a 100-byte echo): the host's insertion, and the receiver's strip. A benchmark,
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
            for _ in 0..n {
                keep += with_remaining_ms(std::hint::black_box(p), 250)
                    .unwrap()
                    .len();
            }
            let insert = t.elapsed() / n;
            let with = with_remaining_ms(p, 250).unwrap();
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
