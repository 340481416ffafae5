//! Fuzz target: classifying a received line (`conduit_protocol::message::Message::parse`).
//!
//! Input: one line, any bytes. Checked:
//! - nothing panics;
//! - `Message::parse` (lines in the writers' own bytes matched, other plain messages read in one
//!   pass) agrees with the field-by-field reading on every object
//!   (`Message::parse_field_by_field`);
//! - a parse error is reported exactly when the line is not JSON (valid JSON of any shape is an
//!   invalid request or a bad response, never a parse error, and nothing that is not JSON is
//!   accepted);
//! - every accepted message survives being written back with the writers the session uses and
//!   read again (same id, method, params, result or error);
//! - every answer the receiver would send (`MessageError::reply`) is itself a well-formed error
//!   response carrying the same id and error.
#![no_main]

use conduit_protocol::message::{
    Message, MessageError, RequestParams, write_error, write_notification, write_request,
    write_result,
};
use libfuzzer_sys::fuzz_target;
use serde_json::value::RawValue;

fn reparse(out: &[u8]) -> Message<'_> {
    match Message::parse(out) {
        Ok(m) => m,
        Err(e) => panic!(
            "what we wrote does not parse: {e}: {}",
            String::from_utf8_lossy(out)
        ),
    }
}

fuzz_target!(|line: &[u8]| {
    let parsed = Message::parse(line);
    // JSON text is UTF-8 (RFC 8259 §8.1); serde's `IgnoredAny` skips strings without checking.
    let is_json = std::str::from_utf8(line).is_ok()
        && serde_json::from_slice::<serde::de::IgnoredAny>(line).is_ok();
    match &parsed {
        Err(MessageError::Parse(e)) => {
            assert!(!is_json, "valid JSON reported as a parse error: {e}")
        }
        other => assert!(is_json, "not JSON, yet classified: {other:?}"),
    }

    // What `parse` reads field by field, or in one pass: UTF-8 that starts with `{`.
    if let Ok(text) = std::str::from_utf8(line)
        && line.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
    {
        assert_eq!(
            format!("{parsed:?}"),
            format!("{:?}", Message::parse_field_by_field(text)),
            "the two readings disagree on {text}"
        );
    }

    let mut out = Vec::new();
    match parsed {
        Ok(Message::Request { id, method, params }) => {
            let null = RawValue::from_string("null".into()).unwrap();
            let params = params.unwrap_or(&null);
            let written: Result<(), serde_json::Error> =
                write_request(&mut out, &id, &method, |out| params.write_to(out));
            written.expect("raw params are written as they are");
            match reparse(&out) {
                Message::Request {
                    id: id2,
                    method: m2,
                    params: p2,
                } => {
                    assert_eq!(id, id2);
                    assert_eq!(method, m2);
                    assert_eq!(params.get(), p2.unwrap().get());
                }
                other => panic!("a request came back as {other:?}"),
            }
        }
        Ok(Message::Notification { method, params }) => {
            if let Some(params) = params {
                write_notification(&mut out, &method, params);
                match reparse(&out) {
                    Message::Notification {
                        method: m2,
                        params: p2,
                    } => {
                        assert_eq!(method, m2);
                        assert_eq!(params.get(), p2.unwrap().get());
                    }
                    other => panic!("a notification came back as {other:?}"),
                }
            }
        }
        Ok(Message::Response { id, result }) => {
            match &result {
                Ok(r) => write_result(&mut out, &id, r),
                Err(e) => write_error(&mut out, Some(&id), e),
            }
            match reparse(&out) {
                Message::Response {
                    id: id2,
                    result: r2,
                } => {
                    assert_eq!(id, id2);
                    match (&result, &r2) {
                        (Ok(a), Ok(b)) => assert_eq!(a.get(), b.get()),
                        (Err(a), Err(b)) => assert_eq!(a, b),
                        _ => panic!("{result:?} came back as {r2:?}"),
                    }
                }
                other => panic!("a response came back as {other:?}"),
            }
        }
        Err(e) => {
            if let Some((id, err)) = e.reply() {
                write_error(&mut out, id.as_ref(), &err);
                match (id, Message::parse(&out)) {
                    (
                        Some(id),
                        Ok(Message::Response {
                            id: id2,
                            result: Err(e2),
                        }),
                    ) => {
                        assert_eq!(id, id2);
                        assert_eq!(err, e2);
                    }
                    (None, Err(MessageError::Orphan(e2))) => assert_eq!(err, e2),
                    (id, other) => panic!(
                        "our answer to {e:?} (id {id:?}) reads back as {other:?}: {}",
                        String::from_utf8_lossy(&out)
                    ),
                }
            }
        }
    }
});
