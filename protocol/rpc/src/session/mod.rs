//! The bidirectional JSON-RPC session: one peer over one byte stream pair, used by the host and
//! by the SDK alike.
//!
//! ```text
//!            Peer::call ──┬─ nothing queued: written from the caller's task ──► W (child stdin / our stdout)
//!                         └► [write queue, ≤ 32 MiB] ──► writer task ─────────► W
//!   Handler ◄── handler tasks (≤ 64) ◄── reader task ◄── FrameReader ◄── R (child stdout / our stdin)
//!                              responses ──► pending table ──► Peer::call returns
//! ```
//!
//! - One reader task owns the read half. It classifies each frame and either completes a
//!   pending outgoing call, cancels an incoming one (`$/cancel`), hands a notification to the
//!   handler, or starts a handler task for a request — at most `max_concurrent` at once; the
//!   next is answered `overloaded` without starting anything.
//! - A sender that finds nothing queued and nothing being written writes its frame itself, in
//!   one non-blocking attempt (no wake-up of another task); otherwise, or for the rest of a
//!   frame the pipe did not take at once, the writer task writes it, batching what is queued.
//!   Either way only the holder of the write half writes, and frames go out whole. Frames made
//!   in bursts share a write: the reader writes the answers it made for the requests it read
//!   together at once, before it waits to read again; a call made while others await their
//!   answers is left to the writer task when waking it costs no thread wake-up.
//!   The queue is bounded in bytes: a peer that stops reading makes senders wait (within their
//!   deadlines), never makes this side buffer without bound. What waits is bounded too: the
//!   bytes held for the peer — queued, being written, and built by callers still waiting for
//!   queue room or a call slot — never pass `max_held_bytes`; a call that would pass it fails at
//!   once with `overloaded` ([`CallError::Overloaded`]).
//! - Calls in both directions interleave freely: a handler may call the other side while its
//!   own request is pending, because handlers run in their own tasks and the reader never waits
//!   on a handler.
//!
//! Invariants: nothing the peer sends can panic the session or grow its memory past the frame
//! cap plus the write queue. When the stream ends (EOF or error) every pending outgoing call
//! fails at once with [`CallError::Closed`], and every running handler is cancelled. Every task
//! the session spawns ends when it ends.
//!
//! Not here: the handshake, method meanings, reentrancy rules — those belong to the host and
//! the SDK, which give the session a [`Handler`].
//!
//! Files: `handler.rs` (the [`Handler`] trait and [`Request`]), `peer.rs` ([`Peer`] and the
//! outgoing call path), `reader.rs` (the read loop and the incoming table), `writer.rs` (the write
//! queue, the write loop and the direct write of a sender that finds it idle), `shared.rs` (what they share), `config.rs` and `error.rs` (the
//! public values). This file holds [`Session`], which starts the two tasks and ends them.

mod config;
mod error;
mod handler;
mod peer;
mod reader;
mod shared;
mod writer;

use std::sync::atomic::{AtomicI64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use self::config::{SessionConfig, SessionCounters};
pub use self::error::{CallError, CloseReason};
pub use self::handler::{BoxFuture, Handler, HandlerResult, NoRequests, Request, to_raw};
pub use self::peer::{CallOptions, Peer};
use self::reader::read_loop;
use self::shared::{Out, Shared, Tables};
use self::writer::write_loop;
use crate::codec::FrameReader;

/// A running session. Dropping it ends the session at once; [`Session::close`] ends it
/// gracefully.
#[derive(Debug)]
pub struct Session {
    peer: Peer,
    reader: Option<JoinHandle<()>>,
    writer: Option<JoinHandle<()>>,
    handlers: TaskTracker,
    /// Tells the writer to finish what is queued and shut down the write half.
    finish_writes: CancellationToken,
}

impl Session {
    /// Start a session over `read` and `write`, serving the peer's requests with `handler`.
    /// Must be called inside a tokio runtime; the session's tasks run on it.
    pub fn new<R, W, H>(read: R, write: W, handler: H, config: SessionConfig) -> Session
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
        H: Handler,
    {
        let (queue, queue_rx) = mpsc::unbounded_channel();
        let queue_bytes = config.write_queue_bytes.clamp(1, u32::MAX as usize / 2);
        let shared = Arc::new(Shared {
            name: config.name.clone(),
            max_message_bytes: config.max_message_bytes,
            next_id: AtomicI64::new(1),
            tables: Mutex::new(Tables {
                pending: Default::default(),
                incoming: Default::default(),
                closed: None,
            }),
            queue,
            out: Mutex::new(Out::new(Box::new(write))),
            queue_space: Semaphore::new(queue_bytes),
            queue_total: queue_bytes as u32,
            outgoing_slots: Semaphore::new(config.max_outgoing.max(1)),
            held: AtomicUsize::new(0),
            max_held: config
                .max_held_bytes
                .max(config.max_message_bytes.saturating_add(1)),
            counters: config.counters.clone(),
            ended: CancellationToken::new(),
        });
        let peer = Peer {
            shared: shared.clone(),
        };
        let handlers = TaskTracker::new();
        let finish_writes = CancellationToken::new();
        let writer = tokio::spawn(write_loop(shared.clone(), queue_rx, finish_writes.clone()));
        let reader = tokio::spawn(read_loop(
            shared,
            FrameReader::new(read, config.max_message_bytes),
            Arc::new(handler),
            handlers.clone(),
            config.max_concurrent,
        ));
        Session {
            peer,
            reader: Some(reader),
            writer: Some(writer),
            handlers,
            finish_writes,
        }
    }

    /// The other side.
    pub fn peer(&self) -> Peer {
        self.peer.clone()
    }

    /// Wait until the session ends (the peer closes the stream, or it breaks).
    pub async fn wait(&self) -> CloseReason {
        self.peer.closed().await
    }

    /// End the session gracefully: wait up to `grace` for the requests being served to be
    /// answered, then cancel the rest, fail pending calls, write what is queued and close the
    /// write half (for the host: the child's stdin).
    pub async fn close(mut self, grace: Duration) -> CloseReason {
        self.handlers.close();
        let _ = tokio::time::timeout(grace, self.handlers.wait()).await;
        self.peer.shared.end(CloseReason::Local);
        // Handlers were cancelled; their answers are not sent, but wait for the tasks to end.
        let _ = tokio::time::timeout(Duration::from_secs(1), self.handlers.wait()).await;
        self.finish_writes.cancel();
        if let Some(w) = self.writer.take() {
            // A peer that stopped reading could hold the writer for ever: bound it, then end it.
            let abort = w.abort_handle();
            let wait = grace.max(Duration::from_millis(100));
            if tokio::time::timeout(wait, w).await.is_err() {
                tracing::debug!(peer = %self.peer.shared.name, "writer did not finish in time");
                abort.abort();
            }
        }
        if let Some(r) = self.reader.take() {
            r.abort();
            let _ = r.await;
        }
        self.peer.shared.drop_write_half();
        self.peer.shared.close_reason()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.peer.shared.end(CloseReason::Local);
        self.finish_writes.cancel();
        if let Some(r) = self.reader.take() {
            r.abort();
        }
        if let Some(w) = self.writer.take() {
            w.abort();
        }
        self.peer.shared.drop_write_half();
    }
}
