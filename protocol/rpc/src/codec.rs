//! Line framing for extension stdio.
//!
//! ```text
//!   {"jsonrpc":"2.0","id":1,"method":"echo","params":{...}}\n
//!   |<------------ at most max_len bytes of JSON ------------>|
//!                                        optional "\r" before "\n" is stripped
//! ```
//!
//! One frame is one JSON-RPC message terminated by `\n`. This module knows nothing of JSON-RPC;
//! `session` gives frames meaning. Empty lines are skipped.
//!
//! Invariant: no frame exceeds `max_len`, and no oversized line is ever held in memory whole.
//! As soon as a line is known to be too long, its bytes are dropped as they arrive; the frame
//! reported for it ([`Frame::Oversized`]) carries only its first [`HEAD_BYTES`] bytes (so the
//! session can try to read its id) and its length. Decoding resumes after its `\n`.
//! [`FrameReader`] drives the codec with a buffer that never grows past
//! `max_len + READ_CHUNK + 2` bytes, whatever the peer sends, and that shrinks back to at most
//! 1 MiB once an oversized line has ended. The room it offers each read starts at
//! [`FIRST_READ_CHUNK`], doubles (to [`READ_CHUNK`]) while reads fill it or bring at least that
//! much, and halves back while they use under a quarter of it.

use std::io;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_util::codec::{Decoder, Encoder};

/// How much of an oversized message is kept to look for its id.
pub const HEAD_BYTES: usize = 4096;

/// The most free space [`FrameReader`] asks for before a read, once reads fill what it offers.
pub const READ_CHUNK: usize = 64 * 1024;

/// What a [`FrameReader`] offers its first reads, and goes back to while messages are small: a
/// thousand idle sessions then hold a few KiB each rather than 64 KiB.
pub const FIRST_READ_CHUNK: usize = 4 * 1024;

/// A decoded frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// One message, without its terminator.
    Message(BytesMut),
    /// A line longer than the cap, discarded. `head` is its first bytes; `len` its full length
    /// in bytes, not counting the terminator.
    Oversized { head: Bytes, len: usize },
    /// The stream ended in the middle of a line; the partial line (`len` bytes) is dropped.
    Truncated { len: usize },
}

#[derive(Debug)]
struct Discard {
    head: Bytes,
    len: usize,
    /// Whether the last byte dropped was `\r`: if the next read starts with `\n`, that `\r` was
    /// the terminator's, not the line's.
    ends_cr: bool,
}

/// Newline framing with a hard cap on the line length.
#[derive(Debug)]
pub struct FrameCodec {
    max_len: usize,
    /// Where the search for `\n` resumes in the buffer, so each byte is scanned once.
    next_index: usize,
    discarding: Option<Discard>,
}

impl FrameCodec {
    /// A codec for lines of at most `max_len` bytes (terminator not counted).
    pub fn new_with_max_len(max_len: usize) -> Self {
        FrameCodec {
            max_len,
            next_index: 0,
            discarding: None,
        }
    }

    /// The cap.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    fn discard_all(&mut self, buf: &mut BytesMut) {
        let len = buf.len();
        let ends_cr = buf.last() == Some(&b'\r');
        match &mut self.discarding {
            Some(_) if len == 0 => {}
            Some(d) => {
                d.len += len;
                d.ends_cr = ends_cr;
            }
            None => {
                let head = Bytes::copy_from_slice(&buf[..len.min(HEAD_BYTES)]);
                self.discarding = Some(Discard { head, len, ends_cr });
            }
        }
        buf.clear();
        self.next_index = 0;
    }
}

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> io::Result<Option<Frame>> {
        loop {
            if let Some(d) = &mut self.discarding {
                match memchr(b'\n', buf) {
                    Some(i) => {
                        // A `\r` right before the `\n` is part of the terminator.
                        let body = if i > 0 && buf[i - 1] == b'\r' {
                            i - 1
                        } else {
                            i
                        };
                        let mut len = d.len + body;
                        let mut head = std::mem::take(&mut d.head);
                        if i == 0 && d.ends_cr {
                            // The `\r` ended an earlier read and was counted (and perhaps kept
                            // in the head) as part of the line: take it back, so the frame is
                            // the same however the stream was cut.
                            len -= 1;
                            head.truncate(len);
                        }
                        buf.advance(i + 1);
                        self.discarding = None;
                        self.next_index = 0;
                        return Ok(Some(Frame::Oversized { head, len }));
                    }
                    None => {
                        self.discard_all(buf);
                        return Ok(None);
                    }
                }
            }
            match memchr(b'\n', &buf[self.next_index..]) {
                Some(off) => {
                    let end = self.next_index + off;
                    self.next_index = 0;
                    let mut line = buf.split_to(end + 1);
                    line.truncate(end);
                    if line.last() == Some(&b'\r') {
                        line.truncate(end - 1);
                    }
                    if line.is_empty() {
                        continue;
                    }
                    if line.len() > self.max_len {
                        let head = Bytes::copy_from_slice(&line[..HEAD_BYTES.min(line.len())]);
                        return Ok(Some(Frame::Oversized {
                            head,
                            len: line.len(),
                        }));
                    }
                    return Ok(Some(Frame::Message(line)));
                }
                None => {
                    // Without a `\n` yet: `max_len` bytes plus a possible `\r` may still be a
                    // valid line; one byte more cannot be.
                    let n = buf.len();
                    let over =
                        n > self.max_len + 1 || (n == self.max_len + 1 && buf[n - 1] != b'\r');
                    if over {
                        self.discard_all(buf);
                    } else {
                        self.next_index = n;
                    }
                    return Ok(None);
                }
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> io::Result<Option<Frame>> {
        if let Some(frame) = self.decode(buf)? {
            return Ok(Some(frame));
        }
        let partial = buf.len() + self.discarding.take().map_or(0, |d| d.len);
        buf.clear();
        self.next_index = 0;
        if partial == 0 {
            Ok(None)
        } else {
            Ok(Some(Frame::Truncated { len: partial }))
        }
    }
}

impl Encoder<&[u8]> for FrameCodec {
    type Error = io::Error;

    /// Appends `msg` and its `\n`. Refuses a message over the cap or one that contains a
    /// newline (compact JSON never does; a newline would split the message in two).
    fn encode(&mut self, msg: &[u8], dst: &mut BytesMut) -> io::Result<()> {
        check_outgoing(msg, self.max_len)?;
        dst.reserve(msg.len() + 1);
        dst.extend_from_slice(msg);
        dst.extend_from_slice(b"\n");
        Ok(())
    }
}

/// The checks [`FrameCodec::encode`] makes, for writers that frame in place.
pub fn check_outgoing(msg: &[u8], max_len: usize) -> io::Result<()> {
    if msg.len() > max_len {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "message of {} bytes is over the {max_len}-byte cap",
                msg.len()
            ),
        ));
    }
    if memchr(b'\n', msg).is_some() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "message contains a raw newline",
        ));
    }
    Ok(())
}

use memchr::memchr;

/// Reads frames from `R` with a buffer whose size is bounded by the cap, not by the peer.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    buf: BytesMut,
    codec: FrameCodec,
    eof: bool,
    /// The room offered to the next read (see the module docs).
    chunk: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader for lines of at most `max_len` bytes.
    pub fn new(inner: R, max_len: usize) -> Self {
        FrameReader {
            inner,
            buf: BytesMut::new(),
            codec: FrameCodec::new_with_max_len(max_len),
            eof: false,
            chunk: FIRST_READ_CHUNK,
        }
    }

    /// The next frame; `None` at a clean end of stream. An I/O error ends the stream.
    pub async fn next(&mut self) -> Option<io::Result<Frame>> {
        loop {
            if self.eof {
                return self.codec.decode_eof(&mut self.buf).transpose();
            }
            if let Some(frame) = self.next_buffered() {
                return Some(frame);
            }
            let room = self.make_room();
            match self.inner.read_buf(&mut self.buf).await {
                Ok(0) => self.eof = true,
                Ok(n) => self.chunk = next_chunk(self.chunk, n, room),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// The next frame if the bytes already read hold it whole; never reads. `None` when
    /// [`FrameReader::next`] would have to read (or report the end of the stream) first: a
    /// reader that gathers what it writes flushes it then, before it may wait.
    pub fn next_buffered(&mut self) -> Option<io::Result<Frame>> {
        if self.eof {
            return None;
        }
        match self.codec.decode(&mut self.buf) {
            Ok(Some(frame)) => {
                if matches!(frame, Frame::Oversized { .. }) {
                    self.release_spare();
                }
                Some(Ok(frame))
            }
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// The buffer's current capacity (for tests of the memory bound).
    pub fn buffer_capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Make sure the next read has room, growing the buffer by doubling up to the bound and
    /// never past it. `BytesMut::reserve` could double a buffer of `max_len` bytes; this copies
    /// into one of exactly the size wanted instead.
    ///
    /// Asking for a whole `READ_CHUNK` of free space before every read would allocate a fresh
    /// buffer for nearly every message (each frame split off the front takes some of the
    /// capacity with it); a small minimum keeps one allocation serving many messages.
    /// Discarding a line over the cap reuses the buffer it grew to (up to the bound); once that
    /// line has ended, keeping that capacity would cost the session 16 MiB of resident memory
    /// for the rest of its life, for one bad line. Give it back.
    fn release_spare(&mut self) {
        if self.buf.capacity() > RETAINED_AFTER_OVERSIZED {
            let mut small = BytesMut::with_capacity(self.buf.len().max(READ_CHUNK));
            small.extend_from_slice(&self.buf);
            self.buf = small;
        }
    }

    /// The free space offered to the next read.
    fn make_room(&mut self) -> usize {
        let len = self.buf.len();
        let spare = self.buf.capacity() - len;
        if spare >= MIN_SPARE.min(self.chunk).min(self.codec.max_len + 2) {
            return spare;
        }
        let bound = self.codec.max_len + 2 + READ_CHUNK;
        let want = (len * 2).max(len + self.chunk).min(bound);
        let mut grown = BytesMut::with_capacity(want);
        grown.extend_from_slice(&self.buf);
        self.buf = grown;
        self.buf.capacity() - len
    }
}

/// The room to offer after a read of `n` bytes into `room`: more while reads fill it or bring a
/// whole offer's worth, less while they use little of it, within [`FIRST_READ_CHUNK`] ..=
/// [`READ_CHUNK`].
fn next_chunk(chunk: usize, n: usize, room: usize) -> usize {
    if n >= room || n >= chunk {
        (chunk * 2).min(READ_CHUNK)
    } else if n < chunk / 4 {
        (chunk / 2).max(FIRST_READ_CHUNK)
    } else {
        chunk
    }
}

/// What [`FrameReader`] keeps of its buffer after a line over the cap (see `release_spare`).
const RETAINED_AFTER_OVERSIZED: usize = 1024 * 1024;

/// The least free space [`FrameReader`] wants before a read.
const MIN_SPARE: usize = 4 * 1024;

#[cfg(test)]
mod tests;
