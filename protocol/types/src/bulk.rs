//! The bulk pipe: artifact bytes outside JSON (`docs/protocol.md` §8.1).
//!
//! A host that offers it starts the extension with one more descriptor, the write end of a
//! pipe, as descriptor [`BULK_FD`] (3), and says so in `initialize` (`bulk: {fd: 3}`). An
//! extension that opens an artifact with `bulk: true` gets a `bulk_tag` in the answer, and
//! writes the stream's bytes to that descriptor as frames:
//!
//! ```text
//!   ┌──────────── header, 8 bytes ────────────┐
//!   │ tag: u32 little-endian │ len: u32 LE    │ len bytes of content
//!   └─────────────────────────┴────────────────┘
//! ```
//!
//! `len` is 1 ..= [`MAX_BULK_FRAME_BYTES`]. Frames of one stream carry its bytes in order;
//! frames of different streams may alternate, whole. Flow control is the pipe's: a writer
//! blocks while the pipe is full, so there is no acknowledgement per frame. `artifact.close`
//! (JSON, on stdout) carries size and SHA-256 as for a JSON stream; the host answers it once it
//! has read `size` bytes of the stream from the pipe.
//!
//! [`Decoder`] is the one reader of the format, used by every host; [`header`] the one writer.
//! Invariant: the decoder never buffers content — it hands back slices of what it was fed,
//! so a frame split across reads costs no copy.

/// The descriptor the bulk pipe's write end has in the extension.
pub const BULK_FD: i32 = 3;

/// Bytes of a frame header.
pub const BULK_HEADER_BYTES: usize = 8;

/// Largest frame content (1 MiB). Larger writes are cut into several frames.
pub const MAX_BULK_FRAME_BYTES: usize = 1024 * 1024;

/// Frame content the Rust SDK writes at once unless told otherwise (256 KiB).
pub const DEFAULT_BULK_FRAME_BYTES: usize = 256 * 1024;

/// The header of a frame of `len` bytes for stream `tag`.
///
/// # Panics
/// If `len` is 0 or over [`MAX_BULK_FRAME_BYTES`]: a frame the receiver would refuse.
pub fn header(tag: u32, len: usize) -> [u8; BULK_HEADER_BYTES] {
    assert!(
        (1..=MAX_BULK_FRAME_BYTES).contains(&len),
        "a bulk frame holds 1 to {MAX_BULK_FRAME_BYTES} bytes, not {len}"
    );
    let mut h = [0u8; BULK_HEADER_BYTES];
    h[..4].copy_from_slice(&tag.to_le_bytes());
    h[4..].copy_from_slice(&(len as u32).to_le_bytes());
    h
}

/// A frame the pipe cannot have carried: the stream of frames is broken from here on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BulkError {
    #[error("a bulk frame of stream tag {tag} claims {len} bytes; a frame holds 1 to {max}")]
    BadLength { tag: u32, len: u32, max: usize },
    #[error("the bulk pipe ended inside a frame ({missing} bytes missing)")]
    Truncated { missing: usize },
}

/// Reads frames from the bytes of the pipe as they come, in any split.
#[derive(Clone, Debug, Default)]
pub struct Decoder {
    header: [u8; BULK_HEADER_BYTES],
    /// Header bytes collected so far (while `left` is 0).
    have: usize,
    tag: u32,
    /// Content bytes of the current frame still to come.
    left: usize,
    broken: bool,
}

impl Decoder {
    pub fn new() -> Self {
        Decoder::default()
    }

    /// Feed `buf`; `content(tag, bytes)` is called with each piece of content in order (a
    /// frame may come in several pieces). After an error the decoder takes nothing more.
    pub fn feed(
        &mut self,
        mut buf: &[u8],
        mut content: impl FnMut(u32, &[u8]),
    ) -> Result<(), BulkError> {
        if self.broken {
            return Ok(());
        }
        while !buf.is_empty() {
            if self.left > 0 {
                let n = self.left.min(buf.len());
                content(self.tag, &buf[..n]);
                self.left -= n;
                buf = &buf[n..];
                continue;
            }
            let n = (BULK_HEADER_BYTES - self.have).min(buf.len());
            self.header[self.have..self.have + n].copy_from_slice(&buf[..n]);
            self.have += n;
            buf = &buf[n..];
            if self.have == BULK_HEADER_BYTES {
                self.have = 0;
                let tag = u32::from_le_bytes(self.header[..4].try_into().expect("4 bytes"));
                let len = u32::from_le_bytes(self.header[4..].try_into().expect("4 bytes"));
                if len == 0 || len as usize > MAX_BULK_FRAME_BYTES {
                    self.broken = true;
                    return Err(BulkError::BadLength {
                        tag,
                        len,
                        max: MAX_BULK_FRAME_BYTES,
                    });
                }
                self.tag = tag;
                self.left = len as usize;
            }
        }
        Ok(())
    }

    /// The pipe ended: an error if it ended inside a frame.
    pub fn finish(&self) -> Result<(), BulkError> {
        if self.broken {
            return Ok(());
        }
        let missing = if self.left > 0 {
            self.left
        } else if self.have > 0 {
            BULK_HEADER_BYTES - self.have
        } else {
            0
        };
        if missing > 0 {
            Err(BulkError::Truncated { missing })
        } else {
            Ok(())
        }
    }

    /// Whether a frame's content is still expected (`true` between a header and its last byte).
    pub fn in_frame(&self) -> bool {
        self.left > 0 || self.have > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(parts: &[(u32, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (tag, data) in parts {
            out.extend_from_slice(&header(*tag, data.len()));
            out.extend_from_slice(data);
        }
        out
    }

    /// Content by stream, in arrival order of the streams' runs.
    type Decoded = Vec<(u32, Vec<u8>)>;

    fn decode_in_pieces(bytes: &[u8], piece: usize) -> (Decoded, Result<(), BulkError>) {
        let mut d = Decoder::new();
        let mut got: Decoded = Vec::new();
        for chunk in bytes.chunks(piece.max(1)) {
            let r = d.feed(chunk, |tag, b| match got.last_mut() {
                Some((t, v)) if *t == tag => v.extend_from_slice(b),
                _ => got.push((tag, b.to_vec())),
            });
            if r.is_err() {
                return (got, r);
            }
        }
        (got, d.finish())
    }

    #[test]
    fn frames_read_back_whatever_the_split() {
        let bytes = frames(&[(1, b"hello"), (2, b"world!"), (1, b"again")]);
        for piece in [1, 2, 3, 7, 8, 9, 13, bytes.len()] {
            let (got, r) = decode_in_pieces(&bytes, piece);
            assert_eq!(r, Ok(()), "piece {piece}");
            assert_eq!(
                got,
                vec![
                    (1, b"hello".to_vec()),
                    (2, b"world!".to_vec()),
                    (1, b"again".to_vec())
                ],
                "piece {piece}"
            );
        }
    }

    #[test]
    fn a_frame_at_the_limit_is_taken_and_one_past_it_breaks_the_pipe() {
        let big = vec![7u8; MAX_BULK_FRAME_BYTES];
        let (got, r) = decode_in_pieces(&frames(&[(4, &big)]), 65536);
        assert_eq!(r, Ok(()));
        assert_eq!(got[0].1.len(), MAX_BULK_FRAME_BYTES);

        let mut over = Vec::new();
        over.extend_from_slice(&4u32.to_le_bytes());
        over.extend_from_slice(&(MAX_BULK_FRAME_BYTES as u32 + 1).to_le_bytes());
        over.extend_from_slice(b"xx");
        let (got, r) = decode_in_pieces(&over, 64);
        assert!(got.is_empty());
        assert_eq!(
            r,
            Err(BulkError::BadLength {
                tag: 4,
                len: MAX_BULK_FRAME_BYTES as u32 + 1,
                max: MAX_BULK_FRAME_BYTES
            })
        );
    }

    #[test]
    fn an_empty_frame_is_refused() {
        let mut zero = Vec::new();
        zero.extend_from_slice(&9u32.to_le_bytes());
        zero.extend_from_slice(&0u32.to_le_bytes());
        let (_, r) = decode_in_pieces(&zero, 8);
        assert!(matches!(r, Err(BulkError::BadLength { len: 0, .. })));
    }

    #[test]
    fn a_pipe_that_ends_inside_a_frame_says_how_much_is_missing() {
        let bytes = frames(&[(1, b"hello")]);
        let (_, r) = decode_in_pieces(&bytes[..bytes.len() - 2], 4);
        assert_eq!(r, Err(BulkError::Truncated { missing: 2 }));
        let (_, r) = decode_in_pieces(&bytes[..3], 4);
        assert_eq!(r, Err(BulkError::Truncated { missing: 5 }));
    }

    #[test]
    #[should_panic(expected = "a bulk frame holds")]
    fn the_writer_refuses_to_frame_nothing() {
        let _ = header(1, 0);
    }
}
