use super::*;

fn decode_all(codec: &mut FrameCodec, input: &[u8]) -> Vec<Frame> {
    let mut buf = BytesMut::from(input);
    let mut out = Vec::new();
    while let Some(f) = codec.decode(&mut buf).unwrap() {
        out.push(f);
    }
    while let Some(f) = codec.decode_eof(&mut buf).unwrap() {
        out.push(f);
    }
    out
}

fn msg(s: &str) -> Frame {
    Frame::Message(BytesMut::from(s.as_bytes()))
}

#[test]
fn splits_lines_and_skips_empty_ones() {
    let mut c = FrameCodec::new_with_max_len(64);
    assert_eq!(
        decode_all(&mut c, b"{\"a\":1}\n\n{\"b\":2}\n"),
        vec![msg("{\"a\":1}"), msg("{\"b\":2}")]
    );
}

#[test]
fn crlf_terminator_is_stripped_but_a_lone_cr_is_kept() {
    let mut c = FrameCodec::new_with_max_len(64);
    assert_eq!(
        decode_all(&mut c, b"ab\r\nc\rd\n"),
        vec![msg("ab"), msg("c\rd")]
    );
}

#[test]
fn exactly_the_cap_passes_and_one_byte_more_is_rejected_then_decoding_resumes() {
    let max = 16;
    let ok = "x".repeat(max);
    let over = "y".repeat(max + 1);
    for terminator in ["\n", "\r\n"] {
        let mut c = FrameCodec::new_with_max_len(max);
        let input = format!("{ok}{terminator}{over}{terminator}next{terminator}");
        let frames = decode_all(&mut c, input.as_bytes());
        assert_eq!(frames.len(), 3, "{terminator:?}: {frames:?}");
        assert_eq!(frames[0], msg(&ok));
        assert!(
            matches!(&frames[1], Frame::Oversized { len, .. } if *len == max + 1),
            "{frames:?}"
        );
        assert_eq!(frames[2], msg("next"));
    }
}

#[test]
fn split_at_every_byte_boundary_decodes_the_same() {
    let input: &[u8] =
        b"{\"id\":1}\r\n\n{\"id\":22,\"x\":\"yy\"}\nzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz\nlast\n";
    let mut whole = FrameCodec::new_with_max_len(24);
    let expect = decode_all(&mut whole, input);
    assert_eq!(expect.len(), 4);
    for i in 0..=input.len() {
        for j in i..=input.len() {
            let mut c = FrameCodec::new_with_max_len(24);
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            for part in [&input[..i], &input[i..j], &input[j..]] {
                buf.extend_from_slice(part);
                while let Some(f) = c.decode(&mut buf).unwrap() {
                    got.push(f);
                }
            }
            while let Some(f) = c.decode_eof(&mut buf).unwrap() {
                got.push(f);
            }
            // An oversized line's head depends on where it was cut; compare lengths for those.
            let norm = |v: &[Frame]| {
                v.iter()
                    .map(|f| match f {
                        Frame::Oversized { len, .. } => format!("oversized {len}"),
                        other => format!("{other:?}"),
                    })
                    .collect::<Vec<_>>()
            };
            assert_eq!(norm(&got), norm(&expect), "split at {i} and {j}");
        }
    }
}

#[test]
fn eof_in_the_middle_of_a_line_is_reported() {
    let mut c = FrameCodec::new_with_max_len(64);
    assert_eq!(
        decode_all(&mut c, b"{\"a\":1}\n{\"b\""),
        vec![msg("{\"a\":1}"), Frame::Truncated { len: 4 }]
    );
    let mut c = FrameCodec::new_with_max_len(4);
    assert_eq!(
        decode_all(&mut c, b"123456789"),
        vec![Frame::Truncated { len: 9 }]
    );
}

#[test]
fn oversized_head_keeps_the_start_of_the_line() {
    let mut c = FrameCodec::new_with_max_len(8);
    let frames = decode_all(&mut c, b"{\"id\":7,\"method\":\"m\"}\n");
    match &frames[0] {
        Frame::Oversized { head, len } => {
            assert_eq!(*len, 21);
            assert_eq!(&head[..], b"{\"id\":7,\"method\":\"m\"}");
        }
        other => panic!("{other:?}"),
    }
}

/// Found by the `frame_reader` fuzz target: an oversized line whose `\r\n` was split between
/// two reads was reported one byte longer, its head ending in the `\r`.
#[test]
fn an_oversized_line_reads_the_same_when_its_crlf_is_split_across_reads() {
    let line = b"abcd\r\nnext\n";
    let whole = decode_all(&mut FrameCodec::new_with_max_len(3), line);
    for cut in 1..line.len() {
        let mut c = FrameCodec::new_with_max_len(3);
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for part in [&line[..cut], &line[cut..]] {
            buf.extend_from_slice(part);
            while let Some(f) = c.decode(&mut buf).unwrap() {
                got.push(f);
            }
        }
        while let Some(f) = c.decode_eof(&mut buf).unwrap() {
            got.push(f);
        }
        match &got[0] {
            Frame::Oversized { head, len } => {
                assert_eq!(*len, 4, "cut at {cut}");
                assert!(b"abcd".starts_with(head), "cut at {cut}: head {head:?}");
            }
            other => panic!("cut at {cut}: {other:?}"),
        }
        assert_eq!(got[1..], whole[1..], "cut at {cut}");
    }
}

#[test]
fn encoder_refuses_oversized_and_multiline_messages() {
    let mut c = FrameCodec::new_with_max_len(4);
    let mut dst = BytesMut::new();
    c.encode(&b"abcd"[..], &mut dst).unwrap();
    assert_eq!(&dst[..], b"abcd\n");
    assert!(c.encode(&b"abcde"[..], &mut dst).is_err());
    assert!(c.encode(&b"a\nb"[..], &mut dst).is_err());
    assert_eq!(&dst[..], b"abcd\n", "a refused message writes nothing");
}

/// A reader that yields `total` bytes of `fill`, then `tail`, in reads of `chunk` bytes.
struct Generated {
    fill: u8,
    left: usize,
    tail: Vec<u8>,
    chunk: usize,
}

impl AsyncRead for Generated {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let n = self.chunk.min(buf.remaining());
        if self.left > 0 {
            let k = n.min(self.left);
            buf.put_slice(&vec![self.fill; k]);
            self.left -= k;
        } else if !self.tail.is_empty() {
            let k = n.min(self.tail.len());
            let rest = self.tail.split_off(k);
            buf.put_slice(&self.tail);
            self.tail = rest;
        }
        std::task::Poll::Ready(Ok(()))
    }
}

#[tokio::test]
async fn a_message_of_exactly_16_mib_passes_and_one_byte_more_never_grows_the_buffer() {
    let max = conduit_protocol::MAX_MESSAGE_BYTES;
    let bound = max + 2 + READ_CHUNK;

    let mut r = FrameReader::new(
        Generated {
            fill: b'a',
            left: max,
            tail: b"\nnext\n".to_vec(),
            chunk: 1 << 20,
        },
        max,
    );
    match r.next().await.unwrap().unwrap() {
        Frame::Message(m) => assert_eq!(m.len(), max),
        other => panic!("{other:?}"),
    }
    assert_eq!(r.next().await.unwrap().unwrap(), msg("next"));
    assert!(r.buffer_capacity() <= bound);

    // 16 MiB + 1 byte, then 48 MiB more of the same line: the buffer stays within the bound.
    let mut r = FrameReader::new(
        Generated {
            fill: b'b',
            left: 64 << 20,
            tail: b"\n{\"ok\":1}\n".to_vec(),
            chunk: 1 << 20,
        },
        max,
    );
    match r.next().await.unwrap().unwrap() {
        Frame::Oversized { len, head } => {
            assert_eq!(len, 64 << 20);
            assert_eq!(head.len(), HEAD_BYTES);
        }
        other => panic!("{other:?}"),
    }
    // Once the line has ended, the buffer it grew to is given back.
    assert!(
        r.buffer_capacity() <= RETAINED_AFTER_OVERSIZED,
        "capacity {} kept after the oversized line",
        r.buffer_capacity()
    );
    assert_eq!(r.next().await.unwrap().unwrap(), msg("{\"ok\":1}"));
    assert!(r.next().await.is_none());
}

/// Hands out one queued piece per read (as much of it as fits).
struct Reads(std::collections::VecDeque<Vec<u8>>);

impl AsyncRead for Reads {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        if let Some(mut piece) = self.0.pop_front() {
            let k = piece.len().min(buf.remaining());
            buf.put_slice(&piece[..k]);
            if k < piece.len() {
                self.0.push_front(piece.split_off(k));
            }
        }
        std::task::Poll::Ready(Ok(()))
    }
}

#[tokio::test]
async fn small_messages_keep_a_small_buffer_and_reads_that_fill_it_grow_the_offer() {
    let small = |i: usize| format!("{{\"jsonrpc\":\"2.0\",\"id\":{i}}}\n").into_bytes();
    let mut pieces: std::collections::VecDeque<Vec<u8>> = (0..200).map(small).collect();
    // Then a stream of 64 KiB reads of one long line: the offer doubles up to READ_CHUNK.
    let long = (1 << 20) - 1;
    let mut line = vec![b'x'; long];
    line.push(b'\n');
    pieces.extend(line.chunks(READ_CHUNK).map(<[u8]>::to_vec));
    let mut r = FrameReader::new(Reads(pieces), conduit_protocol::MAX_MESSAGE_BYTES);
    for i in 0..200 {
        let want = String::from_utf8(small(i)).unwrap();
        assert_eq!(r.next().await.unwrap().unwrap(), msg(want.trim_end()));
        assert!(
            r.buffer_capacity() <= 2 * FIRST_READ_CHUNK,
            "capacity {} after small message {i}",
            r.buffer_capacity()
        );
    }
    match r.next().await.unwrap().unwrap() {
        Frame::Message(m) => assert_eq!(m.len(), long),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        r.chunk, READ_CHUNK,
        "reads that filled the room grew the offer"
    );
}

#[test]
fn the_offer_doubles_on_full_reads_halves_on_sparse_ones_and_stays_in_bounds() {
    assert_eq!(
        next_chunk(FIRST_READ_CHUNK, 4096, 4096),
        2 * FIRST_READ_CHUNK
    );
    assert_eq!(next_chunk(READ_CHUNK, READ_CHUNK, READ_CHUNK), READ_CHUNK);
    assert_eq!(next_chunk(READ_CHUNK, 100, READ_CHUNK), READ_CHUNK / 2);
    assert_eq!(next_chunk(FIRST_READ_CHUNK, 1, 4096), FIRST_READ_CHUNK);
    // A read that brings the offer's worth into a larger spare grows it too.
    assert_eq!(next_chunk(4096, 5000, 60_000), 8192);
    // A read that uses a fair share of the room leaves the offer as it is.
    assert_eq!(next_chunk(16 * 1024, 8 * 1024, 40 * 1024), 16 * 1024);
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

        /// Any bytes, cut anywhere: no panic, no frame over the cap, the buffer within its
        /// bound, and every byte accounted for.
        #[test]
        fn decoder_survives_any_input(
            data in proptest::collection::vec(prop_oneof![Just(b'\n'), Just(b'\r'), any::<u8>()], 0..512),
            cuts in proptest::collection::vec(0usize..512, 0..8),
            max in 1usize..40,
        ) {
            let mut c = FrameCodec::new_with_max_len(max);
            let mut buf = BytesMut::new();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|x| x.min(data.len())).collect();
            cuts.push(0);
            cuts.push(data.len());
            cuts.sort_unstable();
            let mut frames = Vec::new();
            for w in cuts.windows(2) {
                buf.extend_from_slice(&data[w[0]..w[1]]);
                while let Some(f) = c.decode(&mut buf).unwrap() {
                    frames.push(f);
                }
                prop_assert!(buf.len() <= max + 1, "buffered {} with cap {max}", buf.len());
            }
            while let Some(f) = c.decode_eof(&mut buf).unwrap() {
                frames.push(f);
            }
            for f in &frames {
                match f {
                    Frame::Message(m) => {
                        prop_assert!(m.len() <= max && !m.is_empty());
                        prop_assert!(!m.contains(&b'\n'));
                    }
                    Frame::Oversized { len, head } => {
                        prop_assert!(*len > max);
                        prop_assert!(head.len() <= HEAD_BYTES);
                    }
                    Frame::Truncated { len } => prop_assert!(*len > 0),
                }
            }
        }
    }
}
