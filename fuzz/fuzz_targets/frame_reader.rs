//! Fuzz target: the frame reader (`conduit_rpc::codec::FrameReader` driving `FrameCodec`).
//!
//! Input: `[cap][chunking × 8][stream...]`. `cap` picks the frame cap (small caps make the
//! oversized paths reachable with small inputs; 4096 and 4100 sit at the head size). The eight
//! chunking bytes, cycled, say how each read returns: a chunk of that many bytes (times 64 when
//! the cap byte's top bit is set), or — for 0 — `Pending` once, or — for 255 — `Interrupted`.
//!
//! Checked against a model that reads the whole stream at once:
//! - the frames are the same whatever the chunking: each complete line, one `\r` before its
//!   `\n` stripped, empty lines skipped, is a `Message` of exactly its bytes when it fits the cap
//!   and an `Oversized` of exactly its length when it does not; a partial line at the end is one
//!   `Truncated` of its length;
//! - an oversized frame's head is a prefix of its line, at most `HEAD_BYTES` long;
//! - the reader's buffer never grows past `cap + READ_CHUNK + 2` bytes;
//! - nothing panics.
#![no_main]

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use conduit_rpc::codec::{Frame, FrameReader, HEAD_BYTES, READ_CHUNK};
use libfuzzer_sys::fuzz_target;

/// A stream that hands out its bytes in the chunks the input chose.
struct Chunked<'a> {
    data: &'a [u8],
    plan: [u8; 8],
    scale: usize,
    step: usize,
}

impl tokio::io::AsyncRead for Chunked<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let b = self.plan[self.step % 8];
        self.step += 1;
        match b {
            0 => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            255 => Poll::Ready(Err(io::ErrorKind::Interrupted.into())),
            n => {
                let n = (n as usize * self.scale)
                    .min(self.data.len())
                    .min(buf.remaining());
                buf.put_slice(&self.data[..n]);
                self.data = &self.data[n..];
                Poll::Ready(Ok(()))
            }
        }
    }
}

/// What the model expects: `(kind, length, bytes of a message or the whole oversized line)`.
#[derive(Debug, PartialEq)]
enum Want<'a> {
    Message(&'a [u8]),
    Oversized(&'a [u8]),
    Truncated(usize),
}

fn model(stream: &[u8], cap: usize) -> Vec<Want<'_>> {
    let mut out = Vec::new();
    let mut rest = stream;
    while let Some(i) = rest.iter().position(|&b| b == b'\n') {
        let mut line = &rest[..i];
        rest = &rest[i + 1..];
        if line.last() == Some(&b'\r') {
            line = &line[..line.len() - 1];
        }
        if line.is_empty() {
            continue;
        }
        out.push(if line.len() > cap {
            Want::Oversized(line)
        } else {
            Want::Message(line)
        });
    }
    if !rest.is_empty() {
        out.push(Want::Truncated(rest.len()));
    }
    out
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 9 {
        return;
    }
    let cap = match data[0] & 0x7f {
        c @ 0..=63 => c as usize + 1,
        64..=95 => 4096,
        96..=111 => 4100,
        _ => 1000,
    };
    let scale = if data[0] & 0x80 != 0 { 64 } else { 1 };
    let mut plan = [0u8; 8];
    plan.copy_from_slice(&data[1..9]);
    if plan.iter().all(|&b| b == 0 || b == 255) {
        plan[0] = 1; // a reader that never returns data would never end
    }
    let stream = &data[9..];
    let want = model(stream, cap);

    let reader = Chunked {
        data: stream,
        plan,
        scale,
        step: 0,
    };
    let mut frames = FrameReader::new(reader, cap);
    let bound = cap + READ_CHUNK + 2;
    let mut got = Vec::new();
    futures::executor::block_on(async {
        while let Some(frame) = frames.next().await {
            let frame = frame.expect("the stream never fails");
            assert!(
                frames.buffer_capacity() <= bound,
                "buffer of {} bytes is over the bound {bound}",
                frames.buffer_capacity()
            );
            got.push(frame);
            assert!(got.len() <= want.len(), "more frames than lines: {got:?}");
        }
    });

    assert_eq!(got.len(), want.len(), "frames {got:?}, lines {want:?}");
    for (g, w) in got.iter().zip(&want) {
        match (g, w) {
            (Frame::Message(m), Want::Message(line)) => {
                assert!(m.len() <= cap);
                assert_eq!(&m[..], *line);
            }
            (Frame::Oversized { head, len }, Want::Oversized(line)) => {
                assert_eq!(*len, line.len(), "oversized length of {line:?}");
                assert!(head.len() <= HEAD_BYTES);
                assert!(
                    line.starts_with(head),
                    "head {head:?} is not a prefix of its line"
                );
            }
            (Frame::Truncated { len }, Want::Truncated(n)) => assert_eq!(len, n),
            _ => panic!("frame {g:?} where the line is {w:?}"),
        }
    }
});
