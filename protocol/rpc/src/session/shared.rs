//! What the session's tasks and handles share: the pending (outgoing) and incoming tables, the
//! write queue's sending end and its bounds, the write half itself when nobody is writing, and
//! the end of the session.
//!
//! Invariant: the tables and the close reason sit under one lock, and every critical section is
//! a single insert, remove or take, so ending the session fails every pending call and cancels
//! every handler at once. The write half sits under a second lock (`out`), never taken while
//! the first is held. No lock is held across an await.
//!
//! How frames are queued and written is `writer.rs`'s; how the tables fill and empty is `peer.rs`'s
//! (outgoing) and `reader.rs`'s (incoming).

use std::sync::atomic::{AtomicI64, AtomicUsize};
use std::sync::{Arc, Mutex};

use conduit_protocol::{RequestId, RpcError};
use rustc_hash::FxHashMap;
use serde_json::value::RawValue;
use tokio::io::AsyncWrite;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::config::SessionCounters;
use super::error::CloseReason;

pub(super) type PendingTx = oneshot::Sender<Result<Box<RawValue>, Failure>>;

/// How a pending call ends other than with an answer.
#[derive(Debug)]
pub(super) enum Failure {
    Rpc(RpcError),
    TooLarge(usize),
}

/// The session's write half, whatever its type (a child's stdin, our stdout, a duplex).
pub(super) type BoxWrite = Box<dyn AsyncWrite + Send + Unpin>;

/// The write half when nobody is writing, and the frames queued or being written by the
/// writer task.
pub(super) struct Out {
    /// `None` while the writer task writes with it, and for good once a write failed or the
    /// write half was shut down.
    pub(super) io: Option<BoxWrite>,
    /// Frames sent into the queue and not yet written (those in the writer's hands included).
    pub(super) queued: usize,
}

impl Out {
    pub(super) fn new(io: BoxWrite) -> Out {
        Out {
            io: Some(io),
            queued: 0,
        }
    }
}

/// One frame in the write queue, with what it holds until the writer has written it.
pub(super) struct Queued {
    pub(super) bytes: Vec<u8>,
    /// Queue permits held by this frame (0 for `$/cancel`, which never waits).
    pub(super) permits: u32,
    /// Bytes of the held-bytes bound this frame holds until it is written.
    pub(super) held: usize,
}

/// The pending table (our calls awaiting an answer, by id), the incoming table (the peer's
/// requests being served, by id, with their cancellation) and why the session closed, if it
/// has: under one lock, so that ending the session empties both tables at once.
///
/// Both hash with FxHash, not SipHash: every message touches them, and neither can be made to
/// grow by the peer (the incoming table holds at most `max_concurrent` requests, the pending
/// table our own ids), so a peer choosing colliding ids slows at most a few dozen entries.
pub(super) struct Tables {
    pub(super) pending: FxHashMap<i64, PendingTx>,
    pub(super) incoming: FxHashMap<RequestId, CancellationToken>,
    pub(super) closed: Option<CloseReason>,
}

/// One per session, behind an `Arc` held by every `Peer`, the two tasks and the handler tasks.
pub(super) struct Shared {
    pub(super) name: String,
    pub(super) max_message_bytes: usize,
    pub(super) next_id: AtomicI64,
    pub(super) tables: Mutex<Tables>,
    pub(super) queue: mpsc::UnboundedSender<Queued>,
    /// The write half while nobody is writing, and how many frames are queued or being written
    /// by the writer task: a sender that finds none writes its frame itself (`writer.rs`).
    pub(super) out: Mutex<Out>,
    pub(super) queue_space: Semaphore,
    pub(super) queue_total: u32,
    pub(super) outgoing_slots: Semaphore,
    /// Bytes held for the peer now (see [`SessionConfig::max_held_bytes`](super::config::SessionConfig::max_held_bytes)).
    pub(super) held: AtomicUsize,
    pub(super) max_held: usize,
    pub(super) counters: Arc<SessionCounters>,
    /// Cancelled when the session ends, for whatever reason.
    pub(super) ended: CancellationToken,
}

impl Shared {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        // A panic while holding this lock cannot leave the maps inconsistent (every critical
        // section is a single insert/remove), so a poisoned lock is still usable.
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn close_reason(&self) -> CloseReason {
        self.lock().closed.clone().unwrap_or(CloseReason::Local)
    }

    /// End the session: fail every pending call, cancel every handler.
    pub(super) fn end(&self, reason: CloseReason) {
        let (pending, incoming) = {
            let mut st = self.lock();
            if st.closed.is_none() {
                st.closed = Some(reason);
            }
            (
                std::mem::take(&mut st.pending),
                std::mem::take(&mut st.incoming),
            )
        };
        // First the semaphores, so that whoever sees the end below (a failed call, `closed`)
        // and sends again is refused, not queued.
        shared_close_semaphores(self);
        // Dropping the senders wakes every caller; they read the reason from `closed`.
        drop(pending);
        for token in incoming.into_values() {
            token.cancel();
        }
        self.ended.cancel();
    }
}

fn shared_close_semaphores(shared: &Shared) {
    shared.queue_space.close();
    shared.outgoing_slots.close();
}
