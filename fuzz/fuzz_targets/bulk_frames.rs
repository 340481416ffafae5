//! Fuzz target: the bulk pipe's frame decoder (`protocol/types/src/bulk.rs`).
//!
//! Input: `[split: u8][bytes...]`; the bytes are fed in pieces whose sizes cycle through
//! `1 ..= split + 1`. A model reads the same bytes whole: header, content, header, … Checked:
//! - nothing panics, whatever the bytes;
//! - the content handed out, by tag and in order, is the model's, **whatever the split**;
//! - a header claiming 0 or more than `MAX_BULK_FRAME_BYTES` is an error, at the model's
//!   offset, and nothing after it is handed out; a stream that ends inside a frame is
//!   `Truncated` with the model's count of missing bytes.
#![no_main]

use conduit_protocol::bulk::{BULK_HEADER_BYTES, BulkError, Decoder, MAX_BULK_FRAME_BYTES};
use libfuzzer_sys::fuzz_target;

/// What a whole-stream reader makes of `bytes`: pieces by tag, then how it ended.
fn model(bytes: &[u8]) -> (Vec<(u32, Vec<u8>)>, Result<(), BulkError>) {
    let mut out: Vec<(u32, Vec<u8>)> = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        if bytes.len() - at < BULK_HEADER_BYTES {
            let missing = BULK_HEADER_BYTES - (bytes.len() - at);
            return (out, Err(BulkError::Truncated { missing }));
        }
        let tag = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap());
        at += BULK_HEADER_BYTES;
        if len == 0 || len as usize > MAX_BULK_FRAME_BYTES {
            let e = BulkError::BadLength { tag, len, max: MAX_BULK_FRAME_BYTES };
            return (out, Err(e));
        }
        let take = (len as usize).min(bytes.len() - at);
        push(&mut out, tag, &bytes[at..at + take]);
        at += take;
        if take < len as usize {
            let missing = len as usize - take;
            return (out, Err(BulkError::Truncated { missing }));
        }
    }
    (out, Ok(()))
}

fn push(out: &mut Vec<(u32, Vec<u8>)>, tag: u32, b: &[u8]) {
    if b.is_empty() {
        return;
    }
    match out.last_mut() {
        Some((t, v)) if *t == tag => v.extend_from_slice(b),
        _ => out.push((tag, b.to_vec())),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&split, bytes)) = data.split_first() else {
        return;
    };
    let mut d = Decoder::new();
    let mut got: Vec<(u32, Vec<u8>)> = Vec::new();
    let mut end = Ok(());
    let (mut at, mut step) = (0, 1);
    while at < bytes.len() {
        let n = step.min(bytes.len() - at);
        if let Err(e) = d.feed(&bytes[at..at + n], |tag, b| push(&mut got, tag, b)) {
            end = Err(e);
            break;
        }
        at += n;
        step = step % (split as usize + 1) + 1;
    }
    if end.is_ok() {
        end = d.finish();
    }
    let (want, want_end) = model(bytes);
    assert_eq!(got, want, "content differs from the model");
    assert_eq!(end, want_end, "the ending differs from the model");
});
