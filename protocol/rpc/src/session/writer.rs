//! The write queue, bounded in bytes, the writer task that drains it, and the fast path that
//! skips both when nothing is waiting.
//!
//! ```text
//!   send_held (a caller: waits for queue room) ─┐
//!   try_send, try_gather_with, flush_gathered   │         nothing queued or being written:
//!     (the reader: never waits) ────────────────┼──► write_or_queue ──► written here, at once
//!   send_cancel ($/cancel: tiny, never waits) ──┘         │ otherwise, or the rest of a
//!                                                         │ frame the pipe did not take, or
//!                                                         │ a frame `WrittenBy::Task`
//!                                                         ▼
//!                                              queue ──► write_loop ──► W
//!                                                   (batches up to 1 MiB per write)
//! ```
//!
//! So a frame goes out by one of three doors, each for a reason: a caller that may wait for
//! room (`send_held`), the reader, which must never wait for the writer (`try_send`, and its
//! gathered answers), and `$/cancel`, which is never held back by a full queue.
//!
//! The write half lives in `Shared::out` while nobody writes. A sender that finds it there
//! with nothing queued or being written (`Out::queued == 0`) writes its frame from its own
//! task, under the lock, in one non-blocking attempt ([`write_now`], a no-op waker: nothing
//! is awaited under the lock) — no wake-up of the writer task. If the pipe takes only part of
//! the frame (or a flush is still due), the rest is queued before the lock is released, so it
//! is the first thing the writer task writes and no other frame can come between its bytes.
//! The writer task takes the write half out of the slot for each batch and puts it back,
//! with the count lowered, when the batch is written.
//!
//! Two ways put several frames in one write, for senders that make many at once:
//! - the reader gathers the answers it makes itself ([`Gathered`]) and writes them together
//!   before it waits to read again: a burst of requests read together costs one write;
//! - a call made while other calls await their answers is queued for the writer task
//!   ([`WrittenBy::Task`]) when waking it costs no thread wake-up: every call made before the
//!   writer runs goes out in its one write. A call made alone is written by its caller.
//!
//! Invariant: a frame holds queue permits (its length) and its bytes of the held-bytes bound
//! from when it is accepted until it is written (`$/cancel` holds neither): a frame written at
//! once gives both back at once, one queued gives them back when the writer has written it,
//! so a peer that stops reading makes senders wait, and the queue never grows past its bound.
//! Only the holder of the write half writes, and frames go out whole and in the order they
//! were accepted.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};

use conduit_protocol::message::{self, CancelParams};
use conduit_protocol::{RequestId, methods};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::error::CloseReason;
use super::shared::{Out, Queued, Shared};

/// What one non-blocking attempt to write a frame did.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Attempt {
    /// All of it written and flushed.
    Done,
    /// This many bytes written; the rest (possibly none but the flush) is left to wait.
    Partial(usize),
}

/// One non-blocking attempt to write `bytes` (a single write, so a caller holding a lock
/// holds it for one system call at most, however large the frame), then a flush, polled with a
/// waker that does nothing: for a caller that holds a lock and may not await. A write half
/// that would block registers that waker and is polled again, with a real one, by the writer
/// task — every `AsyncWrite` wakes the waker of its latest poll.
pub(super) fn write_now<W: AsyncWrite + Unpin + ?Sized>(
    io: &mut W,
    bytes: &[u8],
) -> std::io::Result<Attempt> {
    let mut cx = Context::from_waker(Waker::noop());
    let done = match Pin::new(&mut *io).poll_write(&mut cx, bytes) {
        // What `write_all` makes of a write that takes nothing.
        Poll::Ready(Ok(0)) if !bytes.is_empty() => {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        Poll::Ready(Ok(n)) => n,
        Poll::Ready(Err(e)) => return Err(e),
        Poll::Pending => return Ok(Attempt::Partial(0)),
    };
    if done < bytes.len() {
        return Ok(Attempt::Partial(done));
    }
    match Pin::new(&mut *io).poll_flush(&mut cx) {
        Poll::Ready(Ok(())) => Ok(Attempt::Done),
        Poll::Ready(Err(e)) => Err(e),
        Poll::Pending => Ok(Attempt::Partial(done)),
    }
}

/// How a failed write ends the session: a peer that closed its end (`EPIPE`) closed the
/// stream; anything else broke it.
pub(super) fn close_reason_for(e: &std::io::Error) -> CloseReason {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        CloseReason::PeerClosed
    } else {
        CloseReason::Broken(e.to_string())
    }
}

/// Who writes a frame that finds nothing queued and nothing being written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WrittenBy {
    /// The sender, from its own task, at once: no other task woken, the fewest wake-ups for a
    /// frame that goes alone.
    Sender,
    /// The writer task, when it next runs, with every frame queued by then in one write: for a
    /// call made while others await their answers, where more calls are likely to follow
    /// before the writer runs (see `Peer`'s call path for when).
    Task,
}

/// A frame to write: owned (queued as is when it must wait) or borrowed (copied only then).
pub(super) enum ToWrite<'a> {
    Owned(Vec<u8>),
    Borrowed(&'a [u8]),
}

impl ToWrite<'_> {
    fn as_slice(&self) -> &[u8] {
        match self {
            ToWrite::Owned(v) => v,
            ToWrite::Borrowed(b) => b,
        }
    }

    /// What is left from byte `from` on, owned, for the queue.
    fn from(self, from: usize) -> Vec<u8> {
        match self {
            ToWrite::Owned(mut v) => {
                v.drain(..from);
                v
            }
            ToWrite::Borrowed(b) => b[from..].to_vec(),
        }
    }
}

/// Answers the reader made while more requests were already read, written together once it has
/// nothing left to read without waiting: one system call, and one wake-up of the peer, for a
/// burst of answers instead of one each. A lone request's answer is written as soon as it is
/// made, as before: the reader flushes before every read that may wait.
///
/// What it holds (the permits and held bytes of its frames) is given back when it is flushed;
/// the reader flushes it before it waits and when it stops.
#[derive(Default)]
pub(super) struct Gathered {
    bytes: Vec<u8>,
    permits: u32,
    held: usize,
}

/// Gathered answers are flushed once they reach this many bytes, and an answer expected to be
/// this large goes from a buffer of its own, after what is gathered.
pub(super) const GATHER_BYTES: usize = 64 * 1024;

/// A reservation against the held-bytes bound, released when dropped unless it was handed to
/// the queue (the writer releases it after writing).
pub(super) struct Held<'a> {
    pub(super) shared: &'a Shared,
    pub(super) bytes: usize,
}

impl Held<'_> {
    fn into_queued(self) -> usize {
        let n = self.bytes;
        std::mem::forget(self);
        n
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.shared.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

impl Shared {
    /// Count `bytes` against the held-bytes bound, or refuse them: (held before, limit).
    pub(super) fn reserve(&self, bytes: usize) -> Result<Held<'_>, (usize, usize)> {
        let before = self.held.fetch_add(bytes, Ordering::AcqRel);
        if before + bytes > self.max_held {
            self.held.fetch_sub(bytes, Ordering::AcqRel);
            return Err((before, self.max_held));
        }
        Ok(Held {
            shared: self,
            bytes,
        })
    }

    /// Send a frame (with its `\n`) already counted against the held bound, waiting for queue
    /// room; `by` says who writes it when nothing is queued or being written. `accepted` is
    /// called once there is room and before the frame can reach the peer (an answer frees its
    /// request's id there, since a peer may reuse an id as soon as it has the answer); not called
    /// if the session ends first. The one way a sender that may wait sends.
    pub(super) async fn send_held(
        &self,
        bytes: Vec<u8>,
        held: Held<'_>,
        by: WrittenBy,
        accepted: impl FnOnce(),
    ) -> Result<(), CloseReason> {
        let permits = self.acquire_room(bytes.len()).await?;
        accepted();
        self.write_or_queue(ToWrite::Owned(bytes), permits, held.into_queued(), by)
    }

    /// Wait for the queue permits a frame of `len` bytes takes, or for the session's end.
    async fn acquire_room(&self, len: usize) -> Result<u32, CloseReason> {
        let permits = self.permits_for(len);
        tokio::select! {
            biased;
            p = self.queue_space.acquire_many(permits) => p.map_err(|_| self.close_reason())?.forget(),
            () = self.ended.cancelled() => return Err(self.close_reason()),
        }
        Ok(permits)
    }

    /// Queue permits a frame of `len` bytes takes: its length (a frame larger than the whole
    /// queue — never, with the defaults — takes all of it).
    fn permits_for(&self, len: usize) -> u32 {
        u32::try_from(len).unwrap_or(u32::MAX).min(self.queue_total)
    }

    /// Take the queue permits and held bytes a frame of `len` bytes needs, if there is room
    /// now: `(permits, held bytes)`, both the frame's until it is written.
    fn try_room(&self, len: usize) -> Option<(u32, usize)> {
        let permits = self.permits_for(len);
        // Dropped, and so given back, if the queue has no room.
        let held = self.reserve(len).ok()?;
        self.queue_space.try_acquire_many(permits).ok()?.forget();
        Some((permits, held.into_queued()))
    }

    /// Queue a frame if there is room now; otherwise hand it back. The reader task uses this:
    /// it must never wait for the writer, or two sessions whose queues are both full (each
    /// waiting for the other to read) would stop reading for good.
    pub(super) fn try_send(&self, bytes: Vec<u8>) -> Result<(), Vec<u8>> {
        let Some((permits, held)) = self.try_room(bytes.len()) else {
            return Err(bytes);
        };
        // Past here the frame is the session's: if the session ended, nobody waits.
        let _ = self.write_or_queue(ToWrite::Owned(bytes), permits, held, WrittenBy::Sender);
        Ok(())
    }

    /// Gather an answer the reader makes, written by `write` straight into `g`'s buffer, to be
    /// written with the others it makes before it next waits to read
    /// ([`Shared::flush_gathered`]); like [`Shared::try_send`], it never waits, and a frame it
    /// hands back found no room. A gathered frame holds its permits and held bytes from here, as
    /// a queued one does. `size` is about how large the frame will be: one of [`GATHER_BYTES`]
    /// or more is written into a buffer of its own and goes after what is gathered, as
    /// `try_send` sends it.
    pub(super) fn try_gather_with(
        &self,
        g: &mut Gathered,
        size: usize,
        write: impl FnOnce(&mut Vec<u8>),
    ) -> Result<(), Vec<u8>> {
        if size >= GATHER_BYTES {
            let mut frame = Vec::new();
            write(&mut frame);
            self.flush_gathered(g);
            return self.try_send(frame);
        }
        let start = g.bytes.len();
        write(&mut g.bytes);
        let len = g.bytes.len() - start;
        if !self.gather_room(g, len) {
            if start == 0 {
                return Err(std::mem::take(&mut g.bytes));
            }
            // Writing what is gathered may free the room this frame needs.
            let frame = g.bytes.split_off(start);
            self.flush_gathered(g);
            g.bytes.extend_from_slice(&frame);
            if !self.gather_room(g, len) {
                return Err(std::mem::take(&mut g.bytes));
            }
        }
        if g.bytes.len() >= GATHER_BYTES {
            self.flush_gathered(g);
        }
        Ok(())
    }

    /// Take the held bytes and queue permits a gathered frame of `len` bytes holds, if there is
    /// room now.
    fn gather_room(&self, g: &mut Gathered, len: usize) -> bool {
        let Some((permits, held)) = self.try_room(len) else {
            return false;
        };
        g.permits += permits;
        g.held += held;
        true
    }

    /// Write (or queue) what `g` gathered, as one frame of many lines, in one system call when
    /// the pipe takes it. The buffer is kept for the next answers: it is copied only when the
    /// pipe does not take it all at once.
    pub(super) fn flush_gathered(&self, g: &mut Gathered) {
        if g.bytes.is_empty() {
            return;
        }
        let permits = std::mem::take(&mut g.permits);
        let held = std::mem::take(&mut g.held);
        // Past here the frames are the session's: if the session ended, nobody waits.
        let _ = self.write_or_queue(
            ToWrite::Borrowed(&g.bytes),
            permits,
            held,
            WrittenBy::Sender,
        );
        g.bytes.clear();
        if g.bytes.capacity() > 2 * GATHER_BYTES {
            g.bytes = Vec::new(); // an answer larger than its size said grew it
        }
    }

    /// Send `$/cancel` for the call `id` without waiting and without counting it against the
    /// queue: it is tiny and at most one per call, so it cannot grow the queue without bound.
    pub(super) fn send_cancel(&self, id: i64) {
        let params = serde_json::value::to_raw_value(&CancelParams {
            id: RequestId::num(id),
        })
        .expect("cancel params serialize");
        let mut frame = Vec::with_capacity(64);
        message::write_notification(&mut frame, methods::notify::CANCEL, &params);
        frame.push(b'\n');
        let _ = self.write_or_queue(ToWrite::Owned(frame), 0, 0, WrittenBy::Sender);
    }

    fn out(&self) -> std::sync::MutexGuard<'_, Out> {
        // Every critical section leaves `Out` whole (a take, a put back, a count), so a
        // poisoned lock is still usable.
        self.out.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A frame accepted (its `permits` and `held` bytes taken): if nothing is queued or being
    /// written, write it now from this task; queue what the pipe did not take, or the whole
    /// frame when the writer task is busy. Fails only if the writer task is gone.
    fn write_or_queue(
        &self,
        bytes: ToWrite<'_>,
        permits: u32,
        held: usize,
        by: WrittenBy,
    ) -> Result<(), CloseReason> {
        let mut out = self.out();
        let mut from = 0;
        if by == WrittenBy::Sender
            && out.queued == 0
            && let Some(io) = out.io.as_mut()
        {
            match write_now(io, bytes.as_slice()) {
                Ok(Attempt::Done) => {
                    drop(out);
                    self.written(bytes.as_slice().len(), permits, held);
                    return Ok(());
                }
                Ok(Attempt::Partial(n)) => {
                    // The rest goes first in the queue: nothing else is queued, and nobody can
                    // queue or write before this lock is released.
                    self.counters
                        .bytes_out
                        .fetch_add(n as u64, Ordering::Relaxed);
                    from = n;
                }
                Err(e) => {
                    // As when the writer task's write fails: the session ends, and the frame
                    // is lost with it (a call learns it from its pending entry, failed by
                    // `end`). The write half is done for: nobody writes with it again.
                    out.io = None;
                    drop(out);
                    self.queue_space.add_permits(permits as usize);
                    self.held.fetch_sub(held, Ordering::AcqRel);
                    tracing::debug!(peer = %self.name, error = %e, "write failed; ending the session");
                    self.end(close_reason_for(&e));
                    return Ok(());
                }
            }
        }
        out.queued += 1;
        let sent = self.queue.send(Queued {
            bytes: bytes.from(from),
            permits,
            held,
        });
        if let Err(e) = sent {
            // The writer is gone: nobody will release what the frame held.
            out.queued -= 1;
            drop(out);
            self.held.fetch_sub(e.0.held, Ordering::AcqRel);
            return Err(self.close_reason());
        }
        Ok(())
    }

    /// Drop the write half if it is in its slot (the writer task drops it when it ends with
    /// it): a session that is dropped closes its write half at once, as when the writer task
    /// owned it, though peers and handler tasks may still hold the shared state.
    pub(super) fn drop_write_half(&self) {
        let io = self.out().io.take();
        drop(io);
    }

    /// `len` bytes written: give back what they held, count them.
    fn written(&self, len: usize, permits: u32, held: usize) {
        self.queue_space.add_permits(permits as usize);
        self.held.fetch_sub(held, Ordering::AcqRel);
        self.counters
            .bytes_out
            .fetch_add(len as u64, Ordering::Relaxed);
    }
}

pub(super) async fn write_loop(
    shared: Arc<Shared>,
    mut queue: mpsc::UnboundedReceiver<Queued>,
    finish: CancellationToken,
) {
    let mut batch: Vec<u8> = Vec::new();
    loop {
        let first = tokio::select! {
            biased;
            q = queue.recv() => match q { Some(q) => q, None => break },
            () = finish.cancelled() => match queue.try_recv() { Ok(q) => q, Err(_) => break },
        };
        // While frames are queued nobody else writes, and a sender writing at once holds the
        // lock for its whole attempt: the write half is in its slot, unless it is gone.
        let Some(mut write) = shared.out().io.take() else {
            // A write failed (the session has ended): what is queued will never be written.
            shared.queue_space.add_permits(first.permits as usize);
            shared.held.fetch_sub(first.held, Ordering::AcqRel);
            return;
        };
        // Batch whatever else is already queued into one write, up to 1 MiB.
        let mut frames = 1;
        let mut permits = first.permits;
        let mut held = first.held;
        let mut written = first.bytes.len();
        let res = if let Ok(next) = queue.try_recv() {
            batch.clear();
            batch.extend_from_slice(&first.bytes);
            batch.extend_from_slice(&next.bytes);
            frames += 1;
            permits += next.permits;
            held += next.held;
            while batch.len() < (1 << 20) {
                match queue.try_recv() {
                    Ok(q) => {
                        batch.extend_from_slice(&q.bytes);
                        frames += 1;
                        permits += q.permits;
                        held += q.held;
                    }
                    Err(_) => break,
                }
            }
            written = batch.len();
            write_frame(&mut write, &batch).await
        } else {
            write_frame(&mut write, &first.bytes).await
        };
        shared.queue_space.add_permits(permits as usize);
        shared.held.fetch_sub(held, Ordering::AcqRel);
        if let Err(e) = res {
            tracing::debug!(peer = %shared.name, error = %e, "write failed; ending the session");
            shared.end(close_reason_for(&e));
            return;
        }
        shared
            .counters
            .bytes_out
            .fetch_add(written as u64, Ordering::Relaxed);
        {
            let mut out = shared.out();
            out.io = Some(write);
            out.queued -= frames;
        }
        if batch.capacity() > (4 << 20) {
            batch = Vec::new(); // do not keep a huge buffer after a burst
        }
    }
    let write = shared.out().io.take();
    if let Some(mut write) = write {
        let _ = write.shutdown().await;
    }
}

async fn write_frame<W: AsyncWrite + Unpin + ?Sized>(
    w: &mut W,
    bytes: &[u8],
) -> std::io::Result<()> {
    w.write_all(bytes).await?;
    w.flush().await
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::io;

    use super::*;

    /// A write half that answers each poll from a script: `Some(n)` takes up to `n` bytes,
    /// `None` would block. Past the script it takes everything. Flushes answer from their own.
    #[derive(Default)]
    struct Scripted {
        writes: VecDeque<Option<usize>>,
        flushes: VecDeque<Poll<io::Result<()>>>,
        error: Option<io::ErrorKind>,
        got: Vec<u8>,
    }

    impl AsyncWrite for Scripted {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            if let Some(kind) = self.error {
                return Poll::Ready(Err(io::Error::new(kind, "scripted failure")));
            }
            match self.writes.pop_front() {
                Some(None) => Poll::Pending,
                Some(Some(n)) => {
                    let n = n.min(buf.len());
                    self.got.extend_from_slice(&buf[..n]);
                    Poll::Ready(Ok(n))
                }
                None => {
                    self.got.extend_from_slice(buf);
                    Poll::Ready(Ok(buf.len()))
                }
            }
        }

        fn poll_flush(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.flushes.pop_front().unwrap_or(Poll::Ready(Ok(())))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[test]
    fn a_frame_the_pipe_takes_whole_is_done() {
        let mut w = Scripted::default();
        assert_eq!(write_now(&mut w, b"frame\n").unwrap(), Attempt::Done);
        assert_eq!(w.got, b"frame\n");
    }

    #[test]
    fn a_short_write_leaves_the_rest_after_one_attempt() {
        let mut w = Scripted {
            writes: [Some(3), Some(10)].into(),
            ..Scripted::default()
        };
        assert_eq!(write_now(&mut w, b"frame\n").unwrap(), Attempt::Partial(3));
        assert_eq!(w.got, b"fra", "one write, however much the next would take");
    }

    #[test]
    fn a_write_that_would_block_leaves_it_all() {
        let mut w = Scripted {
            writes: [None].into(),
            ..Scripted::default()
        };
        assert_eq!(write_now(&mut w, b"frame\n").unwrap(), Attempt::Partial(0));
        assert!(w.got.is_empty());
    }

    #[test]
    fn a_flush_that_would_block_leaves_only_the_flush() {
        let mut w = Scripted {
            flushes: [Poll::Pending].into(),
            ..Scripted::default()
        };
        assert_eq!(write_now(&mut w, b"frame\n").unwrap(), Attempt::Partial(6));
        assert_eq!(w.got, b"frame\n");
    }

    #[test]
    fn failures_are_errors_and_a_write_of_nothing_is_one() {
        let mut w = Scripted {
            error: Some(io::ErrorKind::BrokenPipe),
            ..Scripted::default()
        };
        let e = write_now(&mut w, b"frame\n").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
        let mut w = Scripted {
            writes: [Some(0)].into(),
            ..Scripted::default()
        };
        let e = write_now(&mut w, b"frame\n").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WriteZero);
        let mut w = Scripted {
            flushes: [Poll::Ready(Err(io::Error::other("flush failed")))].into(),
            ..Scripted::default()
        };
        assert!(write_now(&mut w, b"frame\n").is_err());
    }

    #[test]
    fn a_broken_pipe_is_the_peer_closing_anything_else_a_break() {
        let epipe = io::Error::from(io::ErrorKind::BrokenPipe);
        assert_eq!(close_reason_for(&epipe), CloseReason::PeerClosed);
        let other = io::Error::other("disk on fire");
        assert_eq!(
            close_reason_for(&other),
            CloseReason::Broken("disk on fire".into())
        );
    }
}
