//! Fuzz target: the oversized-head scan (`protocol/rpc/src/head.rs`), which reads the id of a
//! message from its first bytes only.
//!
//! Input: `[cut: u16 little-endian][text...]`; the scan sees `text[..cut]`. The full text is also
//! classified by `Message::parse`, the real parser, as the oracle. Checked:
//! - nothing panics, whatever the head;
//! - no false id: if the scan reads an id from any prefix of a valid message, it is that
//!   message's id (so a nested `"id"` or one inside a string is never taken for the top-level
//!   one), and it reads none from a notification;
//! - no false kind: a request is never taken for a response, nor a response for a request;
//! - given the whole of a valid request or response without escapes, the scan finds its id and
//!   its kind (a key spelt with escapes need not be recognised, protocol.md §2).
#![no_main]

use conduit_protocol::message::Message;
use conduit_rpc::fuzzing::peek;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let cut = u16::from_le_bytes([data[0], data[1]]) as usize;
    let text = &data[2..];
    let head = &text[..cut.min(text.len())];
    let seen = peek(head);
    // protocol.md §2: a key spelt with escapes (`"\u0069d"`) need not be recognised, so the
    // scan is only held to finding the id when the text has no escape at all.
    let whole = head.len() == text.len() && !text.contains(&b'\\');
    match Message::parse(text) {
        Ok(Message::Request { id, .. }) => {
            assert!(
                seen.id.is_none() || seen.id.as_ref() == Some(&id),
                "{seen:?} for {id:?}"
            );
            assert!(
                !seen.is_response,
                "a request taken for a response: {seen:?}"
            );
            if whole {
                assert_eq!(seen.id.as_ref(), Some(&id), "whole request, id not found");
                assert!(seen.is_request, "whole request not seen as one: {seen:?}");
            }
        }
        Ok(Message::Response { id, .. }) => {
            assert!(
                seen.id.is_none() || seen.id.as_ref() == Some(&id),
                "{seen:?} for {id:?}"
            );
            assert!(!seen.is_request, "a response taken for a request: {seen:?}");
            if whole {
                assert_eq!(seen.id.as_ref(), Some(&id), "whole response, id not found");
                assert!(seen.is_response, "whole response not seen as one: {seen:?}");
            }
        }
        Ok(Message::Notification { .. }) => {
            assert_eq!(seen.id, None, "an id read from a notification");
            assert!(!seen.is_response, "a notification taken for a response");
        }
        Err(_) => {}
    }
});
