//! The reader task: reads frames, classifies each, and completes a pending call, cancels or
//! starts an incoming request (the incoming table), or hands a notification to the handler;
//! then how requests are answered.
//!
//! Invariant: the reader never waits for the writer or for a handler. A handler that answers at
//! once is polled here and its answer gathered if there is room; every other wait happens in a
//! task of the handlers' tracker. Refusals the reader makes are dropped when the queue is full.
//! What the reader gathered (its answers and refusals) is written before it waits to read
//! again, so an answer waits at most for the requests that were read with it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use conduit_protocol::message::{self, CancelParams};
use conduit_protocol::{ErrorCode, Message, MessageError, RequestId, RpcError, methods};
use futures::FutureExt;
use tokio::io::AsyncRead;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::error::CloseReason;
use super::handler::{Handler, HandlerResult, Request};
use super::peer::Peer;
use super::shared::{Failure, Shared};
use super::writer::{Gathered, Held, WrittenBy};
use crate::codec::{Frame, FrameReader};
use crate::head;

pub(super) async fn read_loop<R: AsyncRead + Unpin>(
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
    let mut gathered = Gathered::default();
    let reason = loop {
        let frame = match frames.next_buffered() {
            // A session that has ended reads no more, as below.
            Some(_) if shared.ended.is_cancelled() => break shared.close_reason(),
            Some(f) => Some(f),
            None => {
                // Nothing more to serve without waiting: write the answers made meanwhile.
                shared.flush_gathered(&mut gathered);
                tokio::select! {
                    biased;
                    () = shared.ended.cancelled() => break shared.close_reason(),
                    f = frames.next() => f,
                }
            }
        };
        match frame {
            None => break CloseReason::PeerClosed,
            Some(Err(e)) => break CloseReason::Broken(e.to_string()),
            Some(Ok(Frame::Message(line))) => {
                shared
                    .counters
                    .bytes_in
                    .fetch_add(line.len() as u64 + 1, Ordering::Relaxed);
                on_message(
                    &shared,
                    &peer,
                    &line,
                    &handler,
                    &handlers,
                    max_concurrent,
                    &mut gathered,
                )
                .await;
            }
            Some(Ok(Frame::Oversized { head, len })) => {
                shared
                    .counters
                    .bytes_in
                    .fetch_add(len as u64, Ordering::Relaxed);
                on_oversized(&shared, &head, len, &mut gathered)
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
    shared.flush_gathered(&mut gathered);
    shared.end(reason);
}

async fn on_message(
    shared: &Arc<Shared>,
    peer: &Peer,
    line: &[u8],
    handler: &Arc<dyn Handler>,
    handlers: &TaskTracker,
    max_concurrent: usize,
    gathered: &mut Gathered,
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
            let refusal = {
                let st = shared.lock();
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
                    None
                }
            };
            if let Some(err) = refusal {
                refuse(shared, Some(&id), err, gathered);
                return;
            }
            // The request enters the incoming table only if its handler does not answer when
            // first polled below: until then this task reads nothing else (no `$/cancel`, no
            // request reusing the id), so the table would be written and cleared for nothing.
            let req = Request {
                id: id.clone(),
                method: method.into_owned(),
                params: params.map(|p| p.to_owned()),
                cancel: CancellationToken::new(),
                peer: peer.clone(),
            };
            let cancel = req.cancel.clone();
            // A handler that panics still answers (and frees its slot) — whether it panics while
            // making its future or while it runs.
            let made =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler.request(req)));
            let Ok(fut) = made else {
                refuse(
                    shared,
                    Some(&id),
                    RpcError::internal("the handler panicked"),
                    gathered,
                );
                return;
            };
            // Already boxed, so `Unpin`: wrapped without another box.
            let mut fut = std::panic::AssertUnwindSafe(fut).catch_unwind();
            // Poll it once here: a handler that can answer at once (most can) is answered
            // without a task of its own — one spawn and two wake-ups fewer per request. One
            // that cannot goes on in its own task, where the reader never waits for it.
            if let std::task::Poll::Ready(r) = futures::poll!(&mut fut) {
                let res = r.unwrap_or_else(|_| Err(RpcError::internal("the handler panicked")));
                // Gathered (written with the answers to the requests already read, before the
                // reader waits) and its id freed before this task reads the next request: a
                // peer may reuse an id once it has the answer, and it cannot have it before.
                let sent = shared.try_gather_with(gathered, reply_size(&res), |out| {
                    write_reply(shared, out, Some(&id), &res)
                });
                let frame = match sent {
                    Ok(()) => return,
                    Err(frame) => frame,
                };
                // No room to write the answer now: a task waits for room, holding the
                // request's slot (so at most 64 such answers wait) — never the reader. The
                // reader goes on meanwhile, so the id is freed once there is room and before
                // the answer can reach the peer (it may be written at once): a peer may reuse
                // an id as soon as it has the answer.
                if !enter(shared, &id, cancel) {
                    return;
                }
                let shared = shared.clone();
                handlers.spawn(async move {
                    send_answer(&shared, Some(&id), frame, || {
                        shared.lock().incoming.remove(&id);
                    })
                    .await;
                    // Also when the session ended before there was room.
                    shared.lock().incoming.remove(&id);
                });
                return;
            }
            // The session ended meanwhile: nobody is answered.
            if !enter(shared, &id, cancel.clone()) {
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
                refuse(shared, id.as_ref(), err, gathered);
            }
        }
    }
}

/// Enter a request that goes on after its handler was first polled into the incoming table,
/// where `$/cancel` and the session's end find its token. `false` (and the token cancelled, for
/// the tasks the handler may have spawned) if the session has ended meanwhile.
fn enter(shared: &Shared, id: &RequestId, cancel: CancellationToken) -> bool {
    let mut st = shared.lock();
    if st.closed.is_some() {
        drop(st);
        cancel.cancel();
        return false;
    }
    st.incoming.insert(id.clone(), cancel);
    true
}

fn on_oversized(shared: &Arc<Shared>, head: &[u8], len: usize, gathered: &mut Gathered) {
    let peek = head::peek(head);
    tracing::warn!(peer = %shared.name, bytes = len, id = peek.id.as_ref().map(tracing::field::display), "discarded a message over the size cap");
    let Some(id) = peek.id.clone() else { return };
    if peek.is_request() {
        let err = RpcError::new(
            ErrorCode::MessageTooLarge,
            format!("the request was {len} bytes, over the {}-byte message cap; it was discarded unread", shared.max_message_bytes),
        )
        .with_data(&serde_json::json!({ "limit": shared.max_message_bytes, "size": len }));
        refuse(shared, Some(&id), err, gathered);
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
    send_answer(shared, id, frame, || {}).await;
}

/// Queue an answer, waiting for room. One that would pass the held-bytes bound is replaced by
/// a small `overloaded` error (held outside the bound, like `$/cancel`: at most one per
/// request slot), so the peer's caller is still answered.
async fn send_answer(
    shared: &Shared,
    id: Option<&RequestId>,
    frame: Vec<u8>,
    accepted: impl FnOnce(),
) {
    let size = frame.len();
    match shared.reserve(size) {
        Ok(held) => {
            let _ = shared
                .send_held(frame, held, WrittenBy::Sender, accepted)
                .await;
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
            let _ = shared
                .send_held(small, held, WrittenBy::Sender, accepted)
                .await;
        }
    }
}

/// A refusal or error answer the reader makes itself (overloaded, parse error, …): queued if
/// there is room now, dropped otherwise — a peer that does not read its answers cannot make
/// the reader wait, nor make refusals pile up. The refused request's caller still gets its
/// own deadline.
fn refuse(shared: &Shared, id: Option<&RequestId>, err: RpcError, gathered: &mut Gathered) {
    let res = Err(err);
    if shared
        .try_gather_with(gathered, reply_size(&res), |out| {
            write_reply(shared, out, id, &res)
        })
        .is_err()
    {
        tracing::debug!(peer = %shared.name, "the write queue is full; dropped a refusal");
    }
}

/// The frame (with its `\n`) answering a request.
fn reply_frame(shared: &Shared, id: Option<&RequestId>, res: &HandlerResult) -> Vec<u8> {
    let mut frame = Vec::new();
    write_reply(shared, &mut frame, id, res);
    frame
}

/// About how large the frame answering with `res` is: what it carries, without the envelope.
fn reply_size(res: &HandlerResult) -> usize {
    match res {
        Ok(raw) => raw.get().len(),
        Err(e) => e.message.len() + e.data.as_ref().map_or(0, |d| d.get().len()),
    }
}

/// Append the frame (with its `\n`) answering a request to `out`. A result over the cap is
/// replaced by `message_too_large`.
fn write_reply(shared: &Shared, out: &mut Vec<u8>, id: Option<&RequestId>, res: &HandlerResult) {
    let start = out.len();
    match res {
        Ok(raw) => {
            out.reserve(40 + raw.get().len());
            message::write_result(out, id.expect("a result always has an id"), raw);
            if out.len() - start > shared.max_message_bytes {
                let len = out.len() - start;
                out.truncate(start);
                let err = RpcError::new(
                    ErrorCode::MessageTooLarge,
                    format!(
                        "the answer would be {len} bytes, over the {}-byte message cap",
                        shared.max_message_bytes
                    ),
                );
                message::write_error(out, id, &err);
            }
        }
        Err(err) => message::write_error(out, id, err),
    }
    out.push(b'\n');
}
