//! The rules about lines rather than calls: `malformed-line`, `oversized-line` and
//! `stdout-only-protocol`.
//!
//! The first two write to the package's stdin directly (through the instance's pump, between
//! two of the session's frames) and read its answers from the stdout log, because the session
//! ignores answers with `"id": null` and answers to ids it never used. The third judges every
//! line every instance wrote.
//!
//! Invariant: each rule ends with a probe request, so "the session goes on" is checked, not
//! assumed.

use conduit_protocol::{ErrorCode, MAX_MESSAGE_BYTES};

use super::common::{RAW_ID, alive, ms};
use super::ids::{MALFORMED_LINE, OVERSIZED_LINE, STDOUT_ONLY};
use crate::check::ctx::Ctx;
use crate::check::instance::{Instance, Seen};
use crate::check::report::RuleResult;

/// The garbage line of `malformed-line` (docs/protocol.md §14 shows it too).
pub(crate) const GARBAGE: &[u8] = b"this is not json\n";

/// How many offending lines a report quotes.
const QUOTED: usize = 3;

/// `malformed-line`: a line that is not JSON is answered `parse_error` with `"id": null`, and
/// the next request is still served.
pub(crate) async fn malformed_line(ctx: &Ctx<'_>, inst: &mut Instance) -> RuleResult {
    let fix = "answer a line that is not JSON with {\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32700,…}} and keep reading: one bad line never ends a session (docs/protocol.md §2)";
    let mark = inst.stdout.mark();
    if let Err(e) = inst.write_raw(GARBAGE.to_vec(), ctx.prompt()).await {
        let state = inst.state_note().await;
        return RuleResult::fail(
            MALFORMED_LINE,
            format!("could not write a garbage line: {e}; {state}"),
            fix,
        );
    }
    let answer = inst
        .stdout
        .wait_for(mark, ctx.prompt(), |s| match s {
            Seen::NullIdError { code } => Some(*code),
            _ => None,
        })
        .await;
    if let Err(why) = alive(&inst.peer(), ctx.prompt()).await {
        let state = inst.state_note().await;
        return RuleResult::fail(
            MALFORMED_LINE,
            format!("after the line `this is not json`, the package {why}; {state}"),
            fix,
        );
    }
    match answer {
        Some(code) if code == ErrorCode::ParseError.number() => RuleResult::pass(
            MALFORMED_LINE,
            "answered `this is not json` with parse_error and id null, then served the next request",
        ),
        Some(code) => RuleResult::fail(
            MALFORMED_LINE,
            format!(
                "answered `this is not json` with error code {code} instead of parse_error (-32700)"
            ),
            fix,
        ),
        None => RuleResult::fail(
            MALFORMED_LINE,
            format!(
                "did not answer the line `this is not json` (no error with id null within {} ms), though it went on serving",
                ms(ctx.prompt())
            ),
            fix,
        ),
    }
}

/// The request line of `oversized-line`: `MAX_MESSAGE_BYTES + 1` bytes of JSON, then `\n`.
pub(crate) fn oversized_request(id: i64) -> Vec<u8> {
    let prefix = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"echo","params":{{"text":""#);
    let suffix = r#""}}"#;
    let body = MAX_MESSAGE_BYTES + 1;
    let mut line = Vec::with_capacity(body + 1);
    line.extend_from_slice(prefix.as_bytes());
    line.resize(body - suffix.len(), b'x');
    line.extend_from_slice(suffix.as_bytes());
    line.push(b'\n');
    line
}

/// `oversized-line`: a request of 16 MiB + 1 byte is answered `message_too_large` for its id,
/// and the next request is still served.
pub(crate) async fn oversized_line(ctx: &Ctx<'_>, inst: &mut Instance) -> RuleResult {
    let fix = "read stdin with a bounded read: once a line passes 16,777,216 bytes, discard it up to the next newline, answer message_too_large (-32004) to the id found in its first 4,096 bytes, and go on (docs/protocol.md §2)";
    let mark = inst.stdout.mark();
    if let Err(e) = inst
        .write_raw(oversized_request(RAW_ID), ctx.opts.timeout)
        .await
    {
        // The pump may be stuck in the middle of the line: the session cannot go on.
        let state = inst.state_note().await;
        inst.finish().await;
        return RuleResult::fail(
            OVERSIZED_LINE,
            format!("while a request of 16 MiB + 1 byte was being written, {e}; {state}"),
            fix,
        );
    }
    let answer = inst
        .stdout
        .wait_for(mark, ctx.prompt(), |s| match s {
            Seen::Answer { id, error } if id.as_num() == Some(RAW_ID) => Some(*error),
            _ => None,
        })
        .await;
    if let Err(why) = alive(&inst.peer(), ctx.prompt()).await {
        let state = inst.state_note().await;
        return RuleResult::fail(
            OVERSIZED_LINE,
            format!("after a request of 16 MiB + 1 byte, the package {why}; {state}"),
            fix,
        );
    }
    match answer {
        Some(Some(code)) if code == ErrorCode::MessageTooLarge.number() => RuleResult::pass(
            OVERSIZED_LINE,
            format!(
                "answered the 16 MiB + 1 byte request (id {RAW_ID}) with message_too_large, then served the next request"
            ),
        ),
        Some(Some(code)) => RuleResult::fail(
            OVERSIZED_LINE,
            format!(
                "answered the 16 MiB + 1 byte request (id {RAW_ID}) with error code {code} instead of message_too_large (-32004)"
            ),
            fix,
        ),
        Some(None) => RuleResult::fail(
            OVERSIZED_LINE,
            format!(
                "served the 16 MiB + 1 byte request (id {RAW_ID}) as if it were within the cap"
            ),
            fix,
        ),
        None => {
            let null_id = inst
                .stdout
                .snapshot()
                .iter()
                .skip(mark)
                .any(|s| matches!(s, Seen::NullIdError { .. }));
            let instead = if null_id {
                "; it answered an error with id null instead, but the id is in the line's first bytes"
            } else {
                ""
            };
            RuleResult::fail(
                OVERSIZED_LINE,
                format!(
                    "survived a request of 16 MiB + 1 byte but did not answer its id {RAW_ID} with message_too_large within {} ms{instead}",
                    ms(ctx.prompt())
                ),
                fix,
            )
        }
    }
}

/// `stdout-only-protocol`: every line every instance wrote was a JSON-RPC message.
pub(crate) fn stdout_only(logs: &[(&'static str, Vec<Seen>)]) -> RuleResult {
    let mut bad = Vec::new();
    let mut notes = Vec::new();
    let mut total = 0;
    for (label, lines) in logs {
        for s in lines {
            total += 1;
            match s {
                Seen::NotJson { sample } => bad.push(format!("`{sample}` ({label} instance)")),
                Seen::NotMessage { sample, reason } => {
                    bad.push(format!("`{sample}` ({label} instance; {reason})"))
                }
                Seen::Long { len, object: false } => {
                    bad.push(format!("a line of {len} bytes that is not a JSON object ({label} instance)"))
                }
                Seen::Long { len, object: true } if *len > MAX_MESSAGE_BYTES => bad.push(format!(
                    "a message of {len} bytes, over the {MAX_MESSAGE_BYTES}-byte cap ({label} instance)"
                )),
                // The checker kills each instance at its end, which may cut a line being
                // written; only a person reading the report can tell, so it is a note.
                Seen::Cut { len } => notes.push(format!(
                    "the {label} instance's stdout ended with {len} bytes and no newline (a message cut off, or a print without a newline)"
                )),
                _ => {}
            }
        }
    }
    if bad.is_empty() {
        return RuleResult::pass(
            STDOUT_ONLY,
            format!("all {total} lines the package wrote to stdout were JSON-RPC messages"),
        )
        .with_notes(notes);
    }
    let n = bad.len();
    let more = if n > QUOTED {
        format!(" and {} more", n - QUOTED)
    } else {
        String::new()
    };
    bad.truncate(QUOTED);
    RuleResult::fail(
        STDOUT_ONLY,
        format!(
            "the package wrote {n} line{} to stdout that {} not JSON-RPC: {}{more}",
            if n == 1 { "" } else { "s" },
            if n == 1 { "is" } else { "are" },
            bad.join(", ")
        ),
        "print logs to stderr, never stdout: stdout carries only protocol messages, one JSON object per line (docs/protocol.md §2)",
    )
    .with_notes(notes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::report::Status;

    #[test]
    fn the_oversized_request_is_one_byte_over_the_cap() {
        let line = oversized_request(RAW_ID);
        assert_eq!(
            line.len(),
            MAX_MESSAGE_BYTES + 2,
            "16 MiB + 1 byte, plus the newline"
        );
        assert_eq!(line.last(), Some(&b'\n'));
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["id"], RAW_ID);
        assert_eq!(v["method"], "echo");
    }

    #[test]
    fn stdout_only_names_the_offending_lines() {
        let ok = stdout_only(&[("main", vec![Seen::Call, Seen::NullIdError { code: -32700 }])]);
        assert_eq!(ok.status, Status::Pass);
        let bad = stdout_only(&[(
            "main",
            vec![
                Seen::NotJson {
                    sample: "starting up".into(),
                },
                Seen::Call,
                Seen::Long {
                    len: 5_000_000,
                    object: true,
                },
            ],
        )]);
        assert_eq!(bad.status, Status::Fail);
        assert!(
            bad.detail
                .contains("1 line to stdout that is not JSON-RPC: `starting up` (main instance)"),
            "{}",
            bad.detail
        );
        assert!(
            bad.fix
                .unwrap()
                .contains("print logs to stderr, never stdout")
        );
    }
}
