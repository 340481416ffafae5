//! The write queue, bounded in bytes, and the writer task that drains it.
//!
//! ```text
//!   send / send_held ──(waits for queue room)──┐
//!   try_send (the reader: never waits) ────────┼──► queue ──► write_loop ──► W
//!   send_now ($/cancel: tiny, never waits) ────┘        (batches up to 1 MiB per write)
//! ```
//!
//! Invariant: a frame holds queue permits (its length) and its bytes of the held-bytes bound
//! from when it is queued until it is written (`$/cancel` holds neither); the writer gives both
//! back after each write, so a peer that stops reading makes senders wait, and the queue never
//! grows past its bound.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use conduit_protocol::message::{self, CancelParams};
use conduit_protocol::{RequestId, methods};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::error::CloseReason;
use super::shared::{Queued, Shared};

/// Why a frame was not queued.
pub(super) enum SendError {
    Closed(CloseReason),
    /// The held-bytes bound would be passed: (held before, limit).
    Overloaded(usize, usize),
}

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

    /// Queue a frame (with its `\n`), waiting for room; refused at once past the held bound.
    pub(super) async fn send(&self, bytes: Vec<u8>) -> Result<(), SendError> {
        let held = self
            .reserve(bytes.len())
            .map_err(|(h, l)| SendError::Overloaded(h, l))?;
        self.send_held(bytes, held).await.map_err(SendError::Closed)
    }

    /// Queue a frame already counted against the held bound, waiting for room.
    pub(super) async fn send_held(
        &self,
        bytes: Vec<u8>,
        held: Held<'_>,
    ) -> Result<(), CloseReason> {
        // A frame larger than the whole queue (never, with the defaults) takes all of it.
        let permits = u32::try_from(bytes.len())
            .unwrap_or(u32::MAX)
            .min(self.queue_total);
        tokio::select! {
            biased;
            p = self.queue_space.acquire_many(permits) => p.map_err(|_| self.close_reason())?.forget(),
            () = self.ended.cancelled() => return Err(self.close_reason()),
        }
        let held = held.into_queued();
        self.queue
            .send(Queued {
                bytes,
                permits,
                held,
            })
            .map_err(|e| {
                // The writer is gone: nobody will release what the frame held.
                self.held.fetch_sub(e.0.held, Ordering::AcqRel);
                self.close_reason()
            })
    }

    /// Queue a frame if there is room now; otherwise hand it back. The reader task uses this:
    /// it must never wait for the writer, or two sessions whose queues are both full (each
    /// waiting for the other to read) would stop reading for good.
    pub(super) fn try_send(&self, bytes: Vec<u8>) -> Result<(), Vec<u8>> {
        let permits = u32::try_from(bytes.len())
            .unwrap_or(u32::MAX)
            .min(self.queue_total);
        let Ok(held) = self.reserve(bytes.len()) else {
            return Err(bytes);
        };
        match self.queue_space.try_acquire_many(permits) {
            Ok(p) => {
                p.forget();
                let held = held.into_queued();
                if let Err(e) = self.queue.send(Queued {
                    bytes,
                    permits,
                    held,
                }) {
                    self.held.fetch_sub(e.0.held, Ordering::AcqRel);
                }
                Ok(())
            }
            Err(_) => Err(bytes),
        }
    }

    /// Queue a frame without waiting: only for `$/cancel`, which is tiny and at most one per
    /// call, so it cannot grow the queue without bound.
    pub(super) fn send_now(&self, bytes: Vec<u8>) {
        let _ = self.queue.send(Queued {
            bytes,
            permits: 0,
            held: 0,
        });
    }

    pub(super) fn send_cancel(&self, id: i64) {
        let params = serde_json::value::to_raw_value(&CancelParams {
            id: RequestId::num(id),
        })
        .expect("cancel params serialize");
        let mut frame = Vec::with_capacity(64);
        message::write_notification(&mut frame, methods::notify::CANCEL, &params);
        frame.push(b'\n');
        self.send_now(frame);
    }
}

pub(super) async fn write_loop<W: AsyncWrite + Unpin>(
    shared: Arc<Shared>,
    mut write: W,
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
        // Batch whatever else is already queued into one write, up to 1 MiB.
        let mut permits = first.permits;
        let mut held = first.held;
        let mut written = first.bytes.len();
        let res = if let Ok(next) = queue.try_recv() {
            batch.clear();
            batch.extend_from_slice(&first.bytes);
            batch.extend_from_slice(&next.bytes);
            permits += next.permits;
            held += next.held;
            while batch.len() < (1 << 20) {
                match queue.try_recv() {
                    Ok(q) => {
                        batch.extend_from_slice(&q.bytes);
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
        if res.is_ok() {
            shared
                .counters
                .bytes_out
                .fetch_add(written as u64, Ordering::Relaxed);
        }
        if let Err(e) = res {
            tracing::debug!(peer = %shared.name, error = %e, "write failed; ending the session");
            let reason = if e.kind() == std::io::ErrorKind::BrokenPipe {
                CloseReason::PeerClosed
            } else {
                CloseReason::Broken(e.to_string())
            };
            shared.end(reason);
            return;
        }
        if batch.capacity() > (4 << 20) {
            batch = Vec::new(); // do not keep a huge buffer after a burst
        }
    }
    let _ = write.shutdown().await;
}

async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, bytes: &[u8]) -> std::io::Result<()> {
    w.write_all(bytes).await?;
    w.flush().await
}
