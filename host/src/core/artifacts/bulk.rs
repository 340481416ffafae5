//! The host's end of one run's bulk pipe (`docs/protocol.md` §8.1): one task reads the frames
//! and appends each piece to the stream its tag names, straight from the read buffer.
//!
//! ```text
//!   extension fd 3 ══pipe══► reader task ─► Decoder ─► (tag, bytes) ─► Stream::append
//!                                                         tag unknown: dropped
//!   a malformed frame: every stream of the pipe is spoiled; the rest is read and dropped
//! ```
//!
//! Invariants: the reader ends with the session (or at the pipe's end) and marks every stream
//! of the pipe `pipe_done`, so a close waiting for bytes never waits on a pipe that is gone;
//! the pipe is drained to its end even when broken, so a writer never blocks on it forever;
//! the read buffer exists only while a stream is open on the pipe or bytes are coming (a
//! thousand idle pipes hold none).

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};

use conduit_protocol::bulk::Decoder;
use conduit_rpc::Peer;
use tokio::net::unix::pipe;

use super::stream::Tags;

/// Bytes read from the pipe at once.
const READ_BYTES: usize = 256 * 1024;

/// The pipe's buffer while a stream is open on it: with the default 64 KiB the writer and the
/// reader take turns rather than overlap (measured: 651 against 1,272 MiB/s across two CPUs).
/// Given back when the last stream ends, because the kernel counts every pipe's buffer against
/// the user, and past `pipe-user-pages-soft` (64 MiB) it gives new pipes — every extension's
/// stdin and stdout — two pages.
const BUSY_PIPE_BYTES: usize = 1024 * 1024;
const IDLE_PIPE_BYTES: usize = 64 * 1024;

/// One run's bulk pipe, as the streams opened on it see it.
#[derive(Debug)]
pub(super) struct Channel {
    /// The session of the run that has the pipe's other end.
    pub(super) peer: Peer,
    pub(super) tags: Arc<Tags>,
    next_tag: AtomicU32,
    /// Cleared when the pipe breaks or ends: new streams then send JSON chunks.
    usable: AtomicBool,
}

impl Channel {
    pub(super) fn new(peer: Peer) -> Arc<Channel> {
        Arc::new(Channel {
            peer,
            tags: Arc::new(Tags::default()),
            next_tag: AtomicU32::new(0),
            usable: AtomicBool::new(true),
        })
    }

    /// A tag no stream of this pipe has had.
    pub(super) fn next_tag(&self) -> u32 {
        self.next_tag.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether new streams may use the pipe.
    pub(super) fn usable(&self) -> bool {
        self.usable.load(Ordering::Relaxed) && !self.peer.is_closed()
    }

    pub(super) fn weak_tags(&self) -> Weak<Tags> {
        Arc::downgrade(&self.tags)
    }
}

/// Read the pipe until it ends or the session does. `ext` names it in the log.
pub(super) async fn read(ext: String, channel: Arc<Channel>, fd: OwnedFd) {
    let rx = match pipe::Receiver::from_owned_fd(fd) {
        Ok(rx) => rx,
        Err(e) => {
            tracing::warn!(extension = %ext, error = %e, "cannot read the bulk pipe; its artifact streams will fail");
            end_streams(&channel, None).await;
            return;
        }
    };
    let mut decoder = Decoder::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut pieces: Vec<(u32, std::ops::Range<usize>)> = Vec::new();
    let mut big = false;
    let end = loop {
        let want_big = !channel.tags.is_empty();
        if want_big != big {
            let bytes = if want_big {
                BUSY_PIPE_BYTES
            } else {
                IDLE_PIPE_BYTES
            };
            // A refusal (the user's pipe pages are used up, or more is in the pipe than the
            // smaller size holds) leaves the size as it was; it is tried again at the next wake.
            let r =
                conduit_supervisor::process::set_pipe_size(std::os::fd::AsFd::as_fd(&rx), bytes);
            big = if want_big { r.is_ok() } else { r.is_err() };
        }
        tokio::select! {
            r = rx.readable() => if let Err(e) = r { break Some(format!("the bulk pipe failed: {e}")) },
            () = channel.tags.changed.notified() => continue,
            _ = channel.peer.closed() => break None,
        }
        if buf.is_empty() {
            buf = vec![0; READ_BYTES];
        }
        let n = match rx.try_read(&mut buf) {
            Ok(0) => break decoder.finish().err().map(|e| e.to_string()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Nothing more for now. With no stream open the pipe goes quiet: give the buffer
                // back. With one open, more is coming soon: keep it rather than allocate and
                // zero 256 KiB again at the next wake-up.
                if channel.tags.is_empty() {
                    buf = Vec::new();
                }
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => break Some(format!("the bulk pipe failed: {e}")),
        };
        // After a malformed frame the decoder hands out nothing more: the rest is drained.
        pieces.clear();
        let base = buf.as_ptr() as usize;
        let fed = decoder.feed(&buf[..n], |tag, bytes| {
            let at = bytes.as_ptr() as usize - base;
            pieces.push((tag, at..at + bytes.len()));
        });
        for (tag, range) in pieces.drain(..) {
            let stream = channel.tags.get(tag);
            let Some(stream) = stream else {
                tracing::debug!(extension = %ext, tag, bytes = range.len(), "bulk bytes of no open stream dropped");
                continue;
            };
            let mut s = stream.lock().await;
            if s.spoiled.is_some() || s.file.is_none() {
                continue;
            }
            if let Err(e) = s.append(&buf[range]) {
                s.spoiled = Some(e.message.clone());
                s.turn.notify_waiters();
            }
        }
        if let Err(e) = fed {
            let why = format!("{e}; the bulk pipe is unusable for the rest of this run");
            tracing::warn!(extension = %ext, error = %why, "malformed frame on the bulk pipe");
            end_streams(&channel, Some(&why)).await;
        }
    };
    end_streams(&channel, end.as_deref()).await;
}

/// No more bytes will come for the pipe's open streams (it ended, or broke with `why`, which
/// then spoils them), and no new stream may use it.
async fn end_streams(channel: &Channel, why: Option<&str>) {
    channel.usable.store(false, Ordering::Relaxed);
    for stream in channel.tags.all() {
        let mut s = stream.lock().await;
        if let Some(why) = why {
            s.spoiled.get_or_insert_with(|| why.to_owned());
        }
        s.pipe_done = true;
        s.turn.notify_waiters();
    }
}
