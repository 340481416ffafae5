//! The bidirectional JSON-RPC session: one peer over one byte stream pair, used by the host and
//! by the SDK alike.
//!
//! ```text
//!            Peer::call ──► [write queue, ≤ 32 MiB] ──► writer task ──► W (child stdin / our stdout)
//!   Handler ◄── handler tasks (≤ 64) ◄── reader task ◄── FrameReader ◄── R (child stdout / our stdin)
//!                              responses ──► pending table ──► Peer::call returns
//! ```
//!
//! - One reader task owns the read half. It classifies each frame and either completes a
//!   pending outgoing call, cancels an incoming one (`$/cancel`), hands a notification to the
//!   handler, or starts a handler task for a request — at most `max_concurrent` at once; the
//!   next is answered `overloaded` without starting anything.
//! - One writer task owns the write half and writes whole frames, batching what is queued.
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

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conduit_protocol::message::{self, CancelParams};
use conduit_protocol::{ErrorCode, Message, MessageError, RequestId, RpcError, methods};
use futures::FutureExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::codec::{Frame, FrameReader};
use crate::head;

/// A boxed future, as handlers return.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What a handler answers: raw JSON, or an error.
pub type HandlerResult = Result<Box<RawValue>, RpcError>;

/// Limits and names for one session.
#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// Used in logs: the extension's name on the host side, `host` in the SDK.
    pub name: String,
    /// Frame cap, both directions.
    pub max_message_bytes: usize,
    /// Incoming requests served at once; the next is answered `overloaded`.
    pub max_concurrent: usize,
    /// Bytes queued for writing before senders wait.
    pub write_queue_bytes: usize,
    /// Outgoing calls awaiting an answer at once; further calls wait for a slot (within their
    /// deadline) instead of drawing `overloaded` from a peer that applies the same limit.
    pub max_outgoing: usize,
    /// Bytes held for the peer at once: the write queue plus frames whose senders wait for
    /// room or for a call slot. A call or notification that would pass it fails at once with
    /// [`CallError::Overloaded`]; an answer that would is replaced by an `overloaded` error.
    /// At least the frame cap, so one message of the largest size can always be sent.
    pub max_held_bytes: usize,
    /// Where the session counts its traffic. Shared, so one set of counters can outlive a
    /// session (the host keeps one per extension across its restarts).
    pub counters: Arc<SessionCounters>,
}

/// Bytes and refusals of a session, for metrics. Relaxed atomics: one add per frame.
#[derive(Debug, Default)]
pub struct SessionCounters {
    /// Bytes of the messages read from the peer, one newline each (a `\r` or an empty line
    /// is not counted), discarded oversized and truncated messages included.
    pub bytes_in: AtomicU64,
    /// Bytes written to the peer.
    pub bytes_out: AtomicU64,
    /// The peer's requests refused with `overloaded`: over the concurrent-request limit, or
    /// an answer that would pass the held-bytes bound.
    pub refused_overloaded: AtomicU64,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            name: "peer".into(),
            max_message_bytes: conduit_protocol::MAX_MESSAGE_BYTES,
            max_concurrent: conduit_protocol::MAX_CONCURRENT_REQUESTS,
            write_queue_bytes: 2 * conduit_protocol::MAX_MESSAGE_BYTES,
            max_outgoing: conduit_protocol::MAX_CONCURRENT_REQUESTS,
            max_held_bytes: 3 * conduit_protocol::MAX_MESSAGE_BYTES,
            counters: Arc::default(),
        }
    }
}

impl SessionConfig {
    /// The defaults, with a name for logs.
    pub fn named(name: impl Into<String>) -> Self {
        SessionConfig {
            name: name.into(),
            ..SessionConfig::default()
        }
    }
}

/// An incoming request, as a handler sees it.
#[derive(Debug)]
pub struct Request {
    pub id: RequestId,
    pub method: String,
    pub params: Option<Box<RawValue>>,
    /// Cancelled when the peer sends `$/cancel` for this request or the session ends. The
    /// session answers `cancelled` itself and drops the handler's future; handlers that hold
    /// resources across awaits can watch it to stop early.
    pub cancel: CancellationToken,
    /// The other side, for callbacks made while this request is pending.
    pub peer: Peer,
}

impl Request {
    /// The params as `T`. A mismatch is `invalid_params`.
    pub fn params<T: DeserializeOwned>(&self) -> Result<T, RpcError> {
        match self.params.as_deref() {
            Some(raw) => serde_json::from_str(raw.get())
                .map_err(|e| RpcError::invalid_params(&self.method, e)),
            // Params may be left out: read that as `null`, or as `{}` for a type of all-optional
            // fields.
            None => serde_json::from_str("null")
                .or_else(|_| serde_json::from_str("{}"))
                .map_err(|e| RpcError::invalid_params(&self.method, e)),
        }
    }
}

/// Serialize a handler's answer.
pub fn to_raw<T: Serialize>(v: &T) -> HandlerResult {
    serde_json::value::to_raw_value(v)
        .map_err(|e| RpcError::internal(format!("result does not serialize: {e}")))
}

/// What serves the other side's requests and notifications.
pub trait Handler: Send + Sync + 'static {
    /// Serve one request. Runs in its own task, concurrently with others.
    fn request(&self, req: Request) -> BoxFuture<HandlerResult>;

    /// A notification other than `$/cancel` (which the session handles). Called on the reader
    /// task: it must not block. Unknown notifications are ignored by default.
    fn notification(&self, method: &str, params: Option<&RawValue>, peer: &Peer) {
        let _ = (method, params, peer);
    }
}

impl<F, Fut> Handler for F
where
    F: Fn(Request) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send + 'static,
{
    fn request(&self, req: Request) -> BoxFuture<HandlerResult> {
        Box::pin(self(req))
    }
}

/// A handler for a side that serves nothing: every request gets `method_not_found`.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoRequests;

impl Handler for NoRequests {
    fn request(&self, req: Request) -> BoxFuture<HandlerResult> {
        let err = RpcError::method_not_found(&req.method);
        Box::pin(async move { Err(err) })
    }
}

/// Why a session ended.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CloseReason {
    /// The peer closed its end (for the host: the extension closed stdout or exited).
    #[error("the peer closed the stream")]
    PeerClosed,
    /// Reading or writing failed.
    #[error("the stream broke: {0}")]
    Broken(String),
    /// This side closed the session.
    #[error("the session was closed")]
    Local,
}

/// Why an outgoing call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The peer answered with an error.
    #[error("`{method}` failed: {error}")]
    Rpc { method: String, error: RpcError },
    /// No answer within the deadline; `$/cancel` was sent.
    #[error("no answer to `{method}` within {deadline:?}")]
    DeadlineExceeded { method: String, deadline: Duration },
    /// The session ended while the call was pending (or before it was made).
    #[error("`{method}` could not complete: {reason}")]
    Closed { method: String, reason: CloseReason },
    /// The request, or the peer's answer, was over the message cap.
    #[error("`{method}`: {detail}")]
    TooLarge { method: String, detail: String },
    /// The answer did not have the expected shape.
    #[error("the answer to `{method}` is malformed: {detail}")]
    BadResult { method: String, detail: String },
    /// Not sent: the bytes already held for the peer (it is not reading fast enough) plus this
    /// message would pass the session's bound.
    #[error(
        "`{method}` was not sent: {held} bytes are already waiting to be written to the peer and this {size}-byte message would pass the {limit}-byte bound; the peer is not reading, retry later"
    )]
    Overloaded {
        method: String,
        size: usize,
        held: usize,
        limit: usize,
    },
}

impl CallError {
    /// The error code this failure is reported as.
    pub fn code(&self) -> i32 {
        match self {
            CallError::Rpc { error, .. } => error.code,
            CallError::DeadlineExceeded { .. } => ErrorCode::DeadlineExceeded.number(),
            CallError::Closed { .. } => ErrorCode::ExtensionExited.number(),
            CallError::TooLarge { .. } => ErrorCode::MessageTooLarge.number(),
            CallError::BadResult { .. } => ErrorCode::InternalError.number(),
            CallError::Overloaded { .. } => ErrorCode::Overloaded.number(),
        }
    }

    /// Whether the error carries `code`.
    pub fn is(&self, code: ErrorCode) -> bool {
        self.code() == code.number()
    }

    /// How to read the failure (docs/protocol.md §12): an answered error by its code and data
    /// (`conduit_protocol::classify`: a -32000 without `data.limit` is a generic server
    /// error, not an overload), a local one by its code.
    pub fn class(&self) -> conduit_protocol::ErrorClass {
        match self {
            CallError::Rpc { error, .. } => error.class(),
            CallError::Overloaded { .. } => conduit_protocol::ErrorClass::Overloaded,
            other => conduit_protocol::classify(other.code(), None),
        }
    }

    /// As a wire error, for a handler that passes a failed callback on.
    pub fn to_rpc_error(&self) -> RpcError {
        match self {
            CallError::Rpc { error, .. } => error.clone(),
            CallError::Overloaded { limit, .. } => {
                RpcError::new(ErrorCode::Overloaded, self.to_string())
                    .with_data(&serde_json::json!({ "held_bytes_limit": limit }))
            }
            other => RpcError {
                code: other.code(),
                message: other.to_string(),
                data: None,
            },
        }
    }
}

type PendingTx = oneshot::Sender<Result<Box<RawValue>, Failure>>;

/// How a pending call ends other than with an answer.
#[derive(Debug)]
enum Failure {
    Rpc(RpcError),
    TooLarge(usize),
}

struct Queued {
    bytes: Vec<u8>,
    /// Queue permits held by this frame (0 for `$/cancel`, which never waits).
    permits: u32,
    /// Bytes of the held-bytes bound this frame holds until it is written.
    held: usize,
}

/// Why a frame was not queued.
enum SendError {
    Closed(CloseReason),
    /// The held-bytes bound would be passed: (held before, limit).
    Overloaded(usize, usize),
}

/// A reservation against the held-bytes bound, released when dropped unless it was handed to
/// the queue (the writer releases it after writing).
struct Held<'a> {
    shared: &'a Shared,
    bytes: usize,
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

struct State {
    pending: HashMap<i64, PendingTx>,
    incoming: HashMap<RequestId, CancellationToken>,
    closed: Option<CloseReason>,
}

struct Shared {
    name: String,
    max_message_bytes: usize,
    next_id: AtomicI64,
    state: Mutex<State>,
    queue: mpsc::UnboundedSender<Queued>,
    queue_space: Semaphore,
    queue_total: u32,
    outgoing_slots: Semaphore,
    /// Bytes held for the peer now (see [`SessionConfig::max_held_bytes`]).
    held: AtomicUsize,
    max_held: usize,
    counters: Arc<SessionCounters>,
    /// Cancelled when the session ends, for whatever reason.
    ended: CancellationToken,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the maps inconsistent (every critical
        // section is a single insert/remove), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn close_reason(&self) -> CloseReason {
        self.lock().closed.clone().unwrap_or(CloseReason::Local)
    }

    /// Count `bytes` against the held-bytes bound, or refuse them: (held before, limit).
    fn reserve(&self, bytes: usize) -> Result<Held<'_>, (usize, usize)> {
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
    async fn send(&self, bytes: Vec<u8>) -> Result<(), SendError> {
        let held = self
            .reserve(bytes.len())
            .map_err(|(h, l)| SendError::Overloaded(h, l))?;
        self.send_held(bytes, held).await.map_err(SendError::Closed)
    }

    /// Queue a frame already counted against the held bound, waiting for room.
    async fn send_held(&self, bytes: Vec<u8>, held: Held<'_>) -> Result<(), CloseReason> {
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
    fn try_send(&self, bytes: Vec<u8>) -> Result<(), Vec<u8>> {
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
    fn send_now(&self, bytes: Vec<u8>) {
        let _ = self.queue.send(Queued {
            bytes,
            permits: 0,
            held: 0,
        });
    }

    fn send_cancel(&self, id: i64) {
        let params = serde_json::value::to_raw_value(&CancelParams {
            id: RequestId::num(id),
        })
        .expect("cancel params serialize");
        let mut frame = Vec::with_capacity(64);
        message::write_notification(&mut frame, methods::notify::CANCEL, &params);
        frame.push(b'\n');
        self.send_now(frame);
    }

    /// End the session: fail every pending call, cancel every handler.
    fn end(&self, reason: CloseReason) {
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
        // Dropping the senders wakes every caller; they read the reason from `closed`.
        drop(pending);
        for token in incoming.into_values() {
            token.cancel();
        }
        self.ended.cancel();
        shared_close_semaphores(self);
    }
}

fn shared_close_semaphores(shared: &Shared) {
    shared.queue_space.close();
    shared.outgoing_slots.close();
}

/// The other side of a session: make calls, send notifications. Cheap to clone.
#[derive(Clone)]
pub struct Peer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("name", &self.shared.name)
            .finish_non_exhaustive()
    }
}

/// Removes a pending call and sends `$/cancel` if the call is dropped or times out before its
/// answer arrives.
struct PendingGuard<'a> {
    shared: &'a Shared,
    id: i64,
    armed: bool,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            let was_pending = self.shared.lock().pending.remove(&self.id).is_some();
            if was_pending {
                self.shared.send_cancel(self.id);
            }
        }
    }
}

impl Peer {
    /// Call `method` with raw params; wait at most `deadline` for the answer.
    pub async fn call_raw(
        &self,
        method: &str,
        params: &RawValue,
        deadline: Option<Duration>,
    ) -> Result<Box<RawValue>, CallError> {
        self.call_raw_cancellable(method, params, deadline, None)
            .await
    }

    /// Like [`Peer::call_raw`]; when `cancel` fires, `$/cancel` is sent and the call goes on
    /// waiting for the peer's answer (normally `cancelled`, at once) within the deadline.
    pub async fn call_raw_cancellable(
        &self,
        method: &str,
        params: &RawValue,
        deadline: Option<Duration>,
        cancel: Option<&CancellationToken>,
    ) -> Result<Box<RawValue>, CallError> {
        match deadline {
            None => self.exchange(method, params.get(), cancel).await,
            Some(d) => {
                match tokio::time::timeout(d, self.exchange(method, params.get(), cancel)).await {
                    Ok(r) => r,
                    // The pending guard inside removes the call and sends `$/cancel` as it drops.
                    Err(_) => Err(CallError::DeadlineExceeded {
                        method: method.into(),
                        deadline: d,
                    }),
                }
            }
        }
    }

    /// Call `method` with params given as JSON text the caller built itself and vouches for —
    /// a large payload written straight into one buffer, say — sent as is, without the parse a
    /// [`RawValue`] would cost. Text that is not valid JSON makes the peer answer a parse
    /// error (a call that then waits for its deadline): use it only for params you generate.
    pub async fn call_prebuilt(
        &self,
        method: &str,
        params_json: &str,
        deadline: Option<Duration>,
    ) -> Result<Box<RawValue>, CallError> {
        match deadline {
            None => self.exchange(method, params_json, None).await,
            Some(d) => {
                match tokio::time::timeout(d, self.exchange(method, params_json, None)).await {
                    Ok(r) => r,
                    Err(_) => Err(CallError::DeadlineExceeded {
                        method: method.into(),
                        deadline: d,
                    }),
                }
            }
        }
    }

    async fn exchange(
        &self,
        method: &str,
        params: &str,
        cancel: Option<&CancellationToken>,
    ) -> Result<Box<RawValue>, CallError> {
        let shared = &*self.shared;
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        // The id on the caller's span (the host's `extension.call` declares `request_id`); a
        // static level check first, so with spans off this costs nothing.
        if tracing::level_enabled!(tracing::Level::DEBUG) {
            tracing::Span::current().record("request_id", id);
        }
        let mut frame = Vec::with_capacity(48 + method.len() + params.len());
        message::write_request_json(&mut frame, &RequestId::num(id), method, params);
        if frame.len() > shared.max_message_bytes {
            return Err(CallError::TooLarge {
                method: method.into(),
                detail: format!(
                    "the request is {} bytes, over the {}-byte message cap",
                    frame.len(),
                    shared.max_message_bytes
                ),
            });
        }
        frame.push(b'\n');

        let closed = |reason| CallError::Closed {
            method: method.into(),
            reason,
        };
        // Counted from here: a caller waiting for a slot holds its frame too.
        let held = shared
            .reserve(frame.len())
            .map_err(|(held, limit)| CallError::Overloaded {
                method: method.into(),
                size: frame.len(),
                held,
                limit,
            })?;
        let _slot = tokio::select! {
            biased;
            p = shared.outgoing_slots.acquire() => p.map_err(|_| closed(shared.close_reason()))?,
            () = shared.ended.cancelled() => return Err(closed(shared.close_reason())),
        };
        let (tx, rx) = oneshot::channel();
        {
            let mut st = shared.lock();
            if let Some(reason) = &st.closed {
                return Err(CallError::Closed {
                    method: method.into(),
                    reason: reason.clone(),
                });
            }
            st.pending.insert(id, tx);
        }
        let mut guard = PendingGuard {
            shared,
            id,
            armed: true,
        };
        shared.send_held(frame, held).await.map_err(closed)?;
        let mut rx = rx;
        let answer = match cancel {
            None => (&mut rx).await,
            Some(token) => tokio::select! {
                biased;
                a = &mut rx => a,
                () = token.cancelled() => {
                    shared.send_cancel(id);
                    rx.await
                }
            },
        };
        guard.armed = false;
        let answer = answer.map_err(|_| closed(shared.close_reason()))?;
        match answer {
            Ok(raw) => Ok(raw),
            Err(Failure::Rpc(error)) => Err(CallError::Rpc {
                method: method.into(),
                error,
            }),
            Err(Failure::TooLarge(len)) => Err(CallError::TooLarge {
                method: method.into(),
                detail: format!(
                    "the answer was {len} bytes, over the {}-byte message cap",
                    shared.max_message_bytes
                ),
            }),
        }
    }

    /// Call `method` with typed params and result.
    pub async fn call<P: Serialize + ?Sized, R: DeserializeOwned>(
        &self,
        method: &str,
        params: &P,
        deadline: Option<Duration>,
    ) -> Result<R, CallError> {
        let params = serde_json::value::to_raw_value(params).map_err(|e| CallError::BadResult {
            method: method.into(),
            detail: format!("params do not serialize: {e}"),
        })?;
        let raw = self.call_raw(method, &params, deadline).await?;
        serde_json::from_str(raw.get()).map_err(|e| CallError::BadResult {
            method: method.into(),
            detail: e.to_string(),
        })
    }

    /// Send a notification.
    pub async fn notify<P: Serialize + ?Sized>(
        &self,
        method: &str,
        params: &P,
    ) -> Result<(), CallError> {
        let params = serde_json::value::to_raw_value(params).map_err(|e| CallError::BadResult {
            method: method.into(),
            detail: format!("params do not serialize: {e}"),
        })?;
        let mut frame = Vec::with_capacity(32 + method.len() + params.get().len());
        message::write_notification(&mut frame, method, &params);
        if frame.len() > self.shared.max_message_bytes {
            return Err(CallError::TooLarge {
                method: method.into(),
                detail: format!("{} bytes", frame.len()),
            });
        }
        frame.push(b'\n');
        let size = frame.len();
        self.shared.send(frame).await.map_err(|e| match e {
            SendError::Closed(reason) => CallError::Closed {
                method: method.into(),
                reason,
            },
            SendError::Overloaded(held, limit) => CallError::Overloaded {
                method: method.into(),
                size,
                held,
                limit,
            },
        })
    }

    /// Whether the session has ended.
    pub fn is_closed(&self) -> bool {
        self.shared.ended.is_cancelled()
    }

    /// Resolves when the session ends.
    pub async fn closed(&self) -> CloseReason {
        self.shared.ended.cancelled().await;
        self.shared.close_reason()
    }

    /// How many incoming requests are being served now.
    pub fn incoming_in_flight(&self) -> usize {
        self.shared.lock().incoming.len()
    }

    /// How many outgoing calls await an answer now.
    pub fn outgoing_in_flight(&self) -> usize {
        self.shared.lock().pending.len()
    }
}

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
            state: Mutex::new(State {
                pending: HashMap::new(),
                incoming: HashMap::new(),
                closed: None,
            }),
            queue,
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
        let writer = tokio::spawn(write_loop(
            shared.clone(),
            write,
            queue_rx,
            finish_writes.clone(),
        ));
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
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
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

async fn read_loop<R: AsyncRead + Unpin>(
    shared: Arc<Shared>,
    mut frames: FrameReader<R>,
    handler: Arc<dyn Handler>,
    handlers: TaskTracker,
    max_concurrent: usize,
) {
    let peer = Peer {
        shared: shared.clone(),
    };
    // However the loop ends — even by a panic — the session ends with it, so no caller waits
    // on a reader that is gone.
    struct EndOnDrop(Arc<Shared>);
    impl Drop for EndOnDrop {
        fn drop(&mut self) {
            self.0
                .end(CloseReason::Broken("the session's reader stopped".into()));
        }
    }
    let _end = EndOnDrop(shared.clone());
    let reason = loop {
        let frame = tokio::select! {
            biased;
            () = shared.ended.cancelled() => break shared.close_reason(),
            f = frames.next() => f,
        };
        match frame {
            None => break CloseReason::PeerClosed,
            Some(Err(e)) => break CloseReason::Broken(e.to_string()),
            Some(Ok(Frame::Message(line))) => {
                shared
                    .counters
                    .bytes_in
                    .fetch_add(line.len() as u64 + 1, Ordering::Relaxed);
                on_message(&shared, &peer, &line, &handler, &handlers, max_concurrent).await;
            }
            Some(Ok(Frame::Oversized { head, len })) => {
                shared
                    .counters
                    .bytes_in
                    .fetch_add(len as u64, Ordering::Relaxed);
                on_oversized(&shared, &head, len).await
            }
            Some(Ok(Frame::Truncated { len })) => {
                shared
                    .counters
                    .bytes_in
                    .fetch_add(len as u64, Ordering::Relaxed);
                tracing::warn!(peer = %shared.name, bytes = len, "the stream ended in the middle of a message; dropped it");
            }
        }
    };
    shared.end(reason);
}

async fn on_message(
    shared: &Arc<Shared>,
    peer: &Peer,
    line: &[u8],
    handler: &Arc<dyn Handler>,
    handlers: &TaskTracker,
    max_concurrent: usize,
) {
    match Message::parse(line) {
        Ok(Message::Response { id, result }) => {
            let Some(n) = id.as_num() else {
                tracing::debug!(peer = %shared.name, %id, "response to an id we never used; ignored");
                return;
            };
            let tx = shared.lock().pending.remove(&n);
            match tx {
                Some(tx) => {
                    let _ = tx.send(result.map(|r| r.to_owned()).map_err(Failure::Rpc));
                }
                None => {
                    tracing::debug!(peer = %shared.name, id = n, "late or unknown response ignored")
                }
            }
        }
        Ok(Message::Request { id, method, params }) => {
            let cancel = CancellationToken::new();
            let refusal = {
                let mut st = shared.lock();
                if st.closed.is_some() {
                    return;
                }
                if st.incoming.contains_key(&id) {
                    Some(RpcError::new(
                        ErrorCode::InvalidRequest,
                        format!("id {id} is already in use by a running request"),
                    ))
                } else if st.incoming.len() >= max_concurrent {
                    shared
                        .counters
                        .refused_overloaded
                        .fetch_add(1, Ordering::Relaxed);
                    Some(RpcError::overloaded(max_concurrent))
                } else if handlers.is_closed() {
                    Some(RpcError::new(
                        ErrorCode::ShuttingDown,
                        "the session is closing",
                    ))
                } else {
                    st.incoming.insert(id.clone(), cancel.clone());
                    None
                }
            };
            if let Some(err) = refusal {
                refuse(shared, Some(&id), err);
                return;
            }
            let req = Request {
                id: id.clone(),
                method: method.into_owned(),
                params: params.map(|p| p.to_owned()),
                cancel: cancel.clone(),
                peer: peer.clone(),
            };
            // A handler that panics still answers (and frees its slot) — whether it panics while
            // making its future or while it runs.
            let made =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler.request(req)));
            let Ok(fut) = made else {
                shared.lock().incoming.remove(&id);
                refuse(
                    shared,
                    Some(&id),
                    RpcError::internal("the handler panicked"),
                );
                return;
            };
            let mut fut = Box::pin(std::panic::AssertUnwindSafe(fut).catch_unwind());
            // Poll it once here: a handler that can answer at once (most can) is answered
            // without a task of its own — one spawn and two wake-ups fewer per request. One
            // that cannot goes on in its own task, where the reader never waits for it.
            if let std::task::Poll::Ready(r) = futures::poll!(fut.as_mut()) {
                let res = r.unwrap_or_else(|_| Err(RpcError::internal("the handler panicked")));
                let frame = reply_frame(shared, Some(&id), &res);
                let frame = match shared.try_send(frame) {
                    Ok(()) => {
                        shared.lock().incoming.remove(&id);
                        return;
                    }
                    Err(frame) => frame,
                };
                // No room to write the answer now: a task waits for room, keeping the
                // request's slot (so at most 64 such answers wait) — never the reader.
                let shared = shared.clone();
                handlers.spawn(async move {
                    send_answer(&shared, Some(&id), frame).await;
                    shared.lock().incoming.remove(&id);
                });
                return;
            }
            let shared = shared.clone();
            handlers.spawn(async move {
                let res = tokio::select! {
                    biased;
                    r = fut => r.unwrap_or_else(|_| Err(RpcError::internal("the handler panicked"))),
                    () = cancel.cancelled() => Err(RpcError::cancelled()),
                };
                let still_ours = shared.lock().incoming.remove(&id).is_some();
                if still_ours {
                    reply(&shared, Some(&id), res).await;
                }
            });
        }
        Ok(Message::Notification { method, params }) => {
            if method == methods::notify::CANCEL {
                match params.map(|p| serde_json::from_str::<CancelParams>(p.get())) {
                    Some(Ok(c)) => {
                        let token = shared.lock().incoming.get(&c.id).cloned();
                        if let Some(t) = token {
                            t.cancel();
                        }
                    }
                    _ => tracing::debug!(peer = %shared.name, "malformed $/cancel ignored"),
                }
            } else {
                handler.notification(&method, params, peer);
            }
        }
        Err(MessageError::BadResponse {
            id: Some(id),
            reason,
        }) => {
            tracing::debug!(peer = %shared.name, %id, %reason, "malformed response from peer");
            let tx = id.as_num().and_then(|n| shared.lock().pending.remove(&n));
            if let Some(tx) = tx {
                let err = RpcError::new(
                    ErrorCode::InvalidRequest,
                    format!("the peer's answer was malformed: {reason}"),
                );
                let _ = tx.send(Err(Failure::Rpc(err)));
            }
        }
        Err(e) => {
            tracing::debug!(peer = %shared.name, error = %e, "bad message from peer");
            if let Some((id, err)) = e.reply() {
                refuse(shared, id.as_ref(), err);
            }
        }
    }
}

async fn on_oversized(shared: &Arc<Shared>, head: &[u8], len: usize) {
    let peek = head::peek(head);
    tracing::warn!(peer = %shared.name, bytes = len, id = peek.id.as_ref().map(tracing::field::display), "discarded a message over the size cap");
    let Some(id) = peek.id.clone() else { return };
    if peek.is_request() {
        let err = RpcError::new(
            ErrorCode::MessageTooLarge,
            format!("the request was {len} bytes, over the {}-byte message cap; it was discarded unread", shared.max_message_bytes),
        )
        .with_data(&serde_json::json!({ "limit": shared.max_message_bytes, "size": len }));
        refuse(shared, Some(&id), err);
    } else if let Some(n) = id.as_num().filter(|_| peek.is_response()) {
        let tx = shared.lock().pending.remove(&n);
        if let Some(tx) = tx {
            let _ = tx.send(Err(Failure::TooLarge(len)));
        }
    }
    // Neither for sure (the head shows only the id): logged above, nothing else — answering a
    // response, or failing one of our calls for a peer's request, would both be wrong.
}

/// Answer a request. A result over the cap is replaced by `message_too_large`.
async fn reply(shared: &Shared, id: Option<&RequestId>, res: HandlerResult) {
    let frame = reply_frame(shared, id, &res);
    send_answer(shared, id, frame).await;
}

/// Queue an answer, waiting for room. One that would pass the held-bytes bound is replaced by
/// a small `overloaded` error (held outside the bound, like `$/cancel`: at most one per
/// request slot), so the peer's caller is still answered.
async fn send_answer(shared: &Shared, id: Option<&RequestId>, frame: Vec<u8>) {
    let size = frame.len();
    match shared.reserve(size) {
        Ok(held) => {
            let _ = shared.send_held(frame, held).await;
        }
        Err((held, limit)) => {
            drop(frame);
            shared
                .counters
                .refused_overloaded
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(peer = %shared.name, size, held, limit, "an answer would pass the held-bytes bound; answering overloaded");
            let err = RpcError::new(
                ErrorCode::Overloaded,
                format!("the {size}-byte answer was not sent: {held} bytes are already waiting to be written to this peer (bound {limit}); read faster or retry"),
            )
            .with_data(&serde_json::json!({ "held_bytes_limit": limit }));
            let small = reply_frame(shared, id, &Err(err));
            let held = Held { shared, bytes: 0 };
            let _ = shared.send_held(small, held).await;
        }
    }
}

/// A refusal or error answer the reader makes itself (overloaded, parse error, …): queued if
/// there is room now, dropped otherwise — a peer that does not read its answers cannot make
/// the reader wait, nor make refusals pile up. The refused request's caller still gets its
/// own deadline.
fn refuse(shared: &Shared, id: Option<&RequestId>, err: RpcError) {
    let frame = reply_frame(shared, id, &Err(err));
    if shared.try_send(frame).is_err() {
        tracing::debug!(peer = %shared.name, "the write queue is full; dropped a refusal");
    }
}

/// The frame (with its `\n`) answering a request.
fn reply_frame(shared: &Shared, id: Option<&RequestId>, res: &HandlerResult) -> Vec<u8> {
    let mut frame = Vec::new();
    match res {
        Ok(raw) => {
            frame.reserve(40 + raw.get().len());
            message::write_result(&mut frame, id.expect("a result always has an id"), raw);
            if frame.len() > shared.max_message_bytes {
                let len = frame.len();
                frame.clear();
                let err = RpcError::new(
                    ErrorCode::MessageTooLarge,
                    format!(
                        "the answer would be {len} bytes, over the {}-byte message cap",
                        shared.max_message_bytes
                    ),
                );
                message::write_error(&mut frame, id, &err);
            }
        }
        Err(err) => message::write_error(&mut frame, id, err),
    }
    frame.push(b'\n');
    frame
}

#[cfg(test)]
mod tests;
