//! [`Peer`], the cheap handle for calls, and the outgoing call path: an id and the request's
//! frame written once (`request_frame`, params straight into it, `_meta` placed by
//! `conduit_protocol::meta`), the held-bytes reservation, an outgoing slot, an entry of the
//! pending table, the frame sent, the answer awaited (`exchange`). [`Peer::request`] and the
//! typed [`Peer::call`] are the two ways in; both take exactly that path.
//!
//! Invariant: a call that is dropped or times out before its answer removes its pending entry
//! and sends `$/cancel` (`PendingGuard`).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use conduit_protocol::message::{self, RequestParams, Typed};
use conduit_protocol::{RequestId, meta};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::error::{CallError, CloseReason};
use super::shared::{Failure, Shared};
use super::writer::WrittenBy;

/// The other side of a session: make calls, send notifications. Cheap to clone.
#[derive(Clone)]
pub struct Peer {
    pub(super) shared: Arc<Shared>,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("name", &self.shared.name)
            .finish_non_exhaustive()
    }
}

/// A request frame's bytes besides its method's and params' own: the envelope with the
/// method's quotes and the `\n` (46 bytes) and the id (at most 20) — so that a frame's buffer
/// is allocated once, not grown as it is written.
const ENVELOPE_BYTES: usize = 46 + 20;

/// What `_meta` adds to params at most: `{"_meta":{"remaining_ms":N},` with the largest `N`
/// in place of the params' own `{`.
const META_BYTES: usize = 46;

/// How a call is made, besides its method and params: how long to wait, whether that time
/// travels with the request, and what cancels it.
#[derive(Clone, Copy, Debug, Default)]
pub struct CallOptions<'a> {
    deadline: Option<Duration>,
    carry_deadline: bool,
    cancel: Option<&'a CancellationToken>,
}

impl<'a> CallOptions<'a> {
    /// Wait at most `deadline` for the answer (`None`: as long as the caller waits). Past it the
    /// call fails with `deadline_exceeded` and the peer is sent `$/cancel`.
    pub fn within(deadline: Option<Duration>) -> Self {
        CallOptions {
            deadline,
            ..CallOptions::default()
        }
    }

    /// Write the deadline into the params as `_meta.remaining_ms` (docs/protocol.md §11), so the
    /// receiver knows when its answer stops mattering: what the host does on its calls.
    pub fn carrying_deadline(mut self) -> Self {
        self.carry_deadline = true;
        self
    }

    /// When `token` fires, send `$/cancel` and go on waiting for the peer's answer (normally
    /// `cancelled`, at once) within the deadline.
    pub fn cancelled_by(mut self, token: &'a CancellationToken) -> Self {
        self.cancel = Some(token);
        self
    }

    /// The `_meta.remaining_ms` to write, if the deadline is carried.
    fn remaining_ms(&self) -> Option<u64> {
        self.deadline
            .filter(|_| self.carry_deadline)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
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

/// Whether the writer task, when woken from here, runs on this thread as soon as the caller
/// waits: the caller is a task (a woken task goes to its worker's next slot), or runs on a
/// current-thread runtime. A thread blocking on a multi-thread runtime's handle — the host
/// loop's in-transaction calls — would wake a parked worker instead, so it writes itself.
fn writer_wakes_here() -> bool {
    tokio::task::try_id().is_some()
        || tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread)
}

/// The call `call` makes, bounded by `deadline`, if there is one: past it, `deadline_exceeded`
/// (the pending guard inside the call removes it and sends `$/cancel` as it drops). The call's
/// future is made here rather than passed in: a future passed to an async fn and then awaited
/// in a wrapper takes its room twice in the caller's future.
async fn within<F>(
    method: &str,
    deadline: Option<Duration>,
    call: impl FnOnce() -> F,
) -> Result<Box<RawValue>, CallError>
where
    F: Future<Output = Result<Box<RawValue>, CallError>>,
{
    match deadline {
        None => call().await,
        Some(d) => match tokio::time::timeout(d, call()).await {
            Ok(r) => r,
            Err(_) => Err(CallError::DeadlineExceeded {
                method: method.into(),
                deadline: d,
            }),
        },
    }
}

impl Peer {
    /// Call `method` and wait for its answer, as `opts` says: the one call path. The request's
    /// frame is written once, params straight into it (`_meta` placed by
    /// `conduit_protocol::meta::write_params` when the deadline is carried), and sent from this
    /// task when the writer is idle. [`Peer::call`] is the same with typed params and result.
    pub async fn request<P: RequestParams + ?Sized>(
        &self,
        method: &str,
        params: &P,
        opts: CallOptions<'_>,
    ) -> Result<Box<RawValue>, CallError> {
        let (id, frame) = self.request_frame(method, params, opts.remaining_ms())?;
        // The call's future is made inside the deadline's wrapper rather than passed to it (see
        // `within`).
        within(method, opts.deadline, || {
            self.exchange(method, id, frame, opts.cancel)
        })
        .await
    }

    /// Call `method` with typed params and result, waiting at most `deadline`: [`Peer::request`]
    /// with the params serialized straight into the frame and the answer read as `R`.
    pub async fn call<P: Serialize + ?Sized, R: DeserializeOwned>(
        &self,
        method: &str,
        params: &P,
        deadline: Option<Duration>,
    ) -> Result<R, CallError> {
        // Not through `request`: an async fn awaited inside another makes every call's future
        // larger (docs/perf-log/2026-12-04-method-table.md).
        let (id, frame) = self.request_frame(method, &Typed(params), None)?;
        let raw = within(method, deadline, || self.exchange(method, id, frame, None)).await?;
        serde_json::from_str(raw.get()).map_err(|e| CallError::BadResult {
            method: method.into(),
            detail: e.to_string(),
        })
    }

    /// A new id, and the request's frame (with its `\n`), its params written by
    /// `meta::write_params`: refused past the message cap.
    fn request_frame<P: RequestParams + ?Sized>(
        &self,
        method: &str,
        params: &P,
        remaining_ms: Option<u64>,
    ) -> Result<(i64, Vec<u8>), CallError> {
        let shared = &*self.shared;
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let meta = if remaining_ms.is_some() {
            META_BYTES
        } else {
            0
        };
        let mut frame =
            Vec::with_capacity(ENVELOPE_BYTES + method.len() + meta + params.size_hint());
        message::write_request(&mut frame, &RequestId::num(id), method, |out| {
            meta::write_params(out, params, remaining_ms)
        })
        .map_err(|e| CallError::BadResult {
            method: method.into(),
            detail: format!("params do not serialize: {e}"),
        })?;
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
        Ok((id, frame))
    }

    /// Send the request `frame` (call `id`) and wait for its answer.
    async fn exchange(
        &self,
        method: &str,
        id: i64,
        frame: Vec<u8>,
        cancel: Option<&CancellationToken>,
    ) -> Result<Box<RawValue>, CallError> {
        let shared = &*self.shared;
        // The id on the caller's span (the host's `extension.call` declares `request_id`); a
        // static level check first, so with spans off this costs nothing.
        if tracing::level_enabled!(tracing::Level::DEBUG) {
            tracing::Span::current().record("request_id", id);
        }

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
        let others_waiting = {
            let mut st = shared.lock();
            if let Some(reason) = &st.closed {
                return Err(CallError::Closed {
                    method: method.into(),
                    reason: reason.clone(),
                });
            }
            st.pending.insert(id, tx);
            st.pending.len() > 1
        };
        let mut guard = PendingGuard {
            shared,
            id,
            armed: true,
        };
        // A call made alone is written at once from here; one made while others await their
        // answers is left to the writer task when waking it costs no thread wake-up, so that
        // the calls made meanwhile (a caller keeping many in flight makes one as each answer
        // comes) go out in one write.
        let by = if others_waiting && writer_wakes_here() {
            WrittenBy::Task
        } else {
            WrittenBy::Sender
        };
        shared
            .send_held(frame, held, by, || {})
            .await
            .map_err(closed)?;
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
        let held = self
            .shared
            .reserve(size)
            .map_err(|(held, limit)| CallError::Overloaded {
                method: method.into(),
                size,
                held,
                limit,
            })?;
        self.shared
            .send_held(frame, held, WrittenBy::Sender, || {})
            .await
            .map_err(|reason| CallError::Closed {
                method: method.into(),
                reason,
            })
    }

    /// Whether `other` is a handle of the same session (not merely of the same extension).
    pub fn same_session(&self, other: &Peer) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
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

    /// How many incoming requests are being served now: those whose handlers did not answer
    /// as soon as they were called (a request answered then never waits for anything).
    pub fn incoming_in_flight(&self) -> usize {
        self.shared.lock().incoming.len()
    }

    /// How many outgoing calls await an answer now.
    pub fn outgoing_in_flight(&self) -> usize {
        self.shared.lock().pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_envelope_fits_the_room_kept_for_it() {
        let mut frame = Vec::new();
        message::write_request(&mut frame, &RequestId::num(i64::MIN), "", |out| {
            out.extend_from_slice(b"{}");
            Ok::<_, serde_json::Error>(())
        })
        .unwrap();
        frame.push(b'\n');
        assert_eq!(frame.len() - "{}".len(), ENVELOPE_BYTES);
    }
}
