//! Serving an [`Extension`] over one session: the handshake, dispatch, `shutdown` and EOF.
//!
//! ```text
//!   phase:  New ──initialize ok──► Ready ──shutdown──► Stopping ──answered──► (session closed)
//!            │  any other request: not_initialized      │ new requests: shutting_down
//!            └─ initialize again after a refusal is allowed; after success: invalid_request
//! ```
//!
//! The phase is read and changed in [`Handler::request`], which the session calls on its reader
//! task in the order requests arrive, so a request that follows `initialize` or `shutdown` on the
//! wire always sees the phase they set. Handlers themselves run in the session's tasks.
//!
//! At stdin EOF the session would cancel every running handler at once; [`DrainAtEof`] holds the
//! EOF back for at most [`EOF_DRAIN`] so that requests which arrived before it are still
//! answered, then lets the session end. `shutdown` likewise waits for them (within half of the
//! host's grace) before it is answered.
//!
//! Not here: the framing, the 64-request limit and `$/cancel`, which the session (`conduit-rpc`)
//! applies before a request reaches this dispatcher.
//!
//! Invariant: every request is answered exactly once (by a handler, or by the session when it is
//! cancelled); a handler that panics is answered `internal_error` rather than leaving its
//! request, and its slot among the 64, held forever.

use std::any::Any;
use std::io;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use crate::bulk::BulkPipe;
use conduit_protocol::calls::{
    Empty, IngressPollParams, IngressPollResult, SleepParams, SleepResult,
};
use conduit_protocol::handshake::{self, InitializeParams, InitializeResult, Software};
use conduit_protocol::methods::{
    DependencyFilter, EmitCommit, HostCall, IngressPoll, Initialize, Method, RecurrenceNext,
    WorkKindTrigger,
};
use conduit_protocol::{ErrorCode, RpcError, methods};
use conduit_rpc::{
    BoxFuture, CloseReason, Handler, HandlerResult, Request, Session, SessionConfig, to_raw,
};
use futures::FutureExt as _;
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::ctx::{Ctx, Host};
use crate::extension::{Extension, Handlers};

/// How long the session may take, after `shutdown` was answered, to write what is queued.
const CLOSE_GRACE: Duration = Duration::from_millis(500);

/// At stdin EOF, how long requests that arrived before it may take to finish and be answered
/// before the session sees the EOF and abandons the rest. Short, because EOF means "exit
/// promptly" (§5); long enough for every answer that is only a computation away — which is what
/// lets `printf '<initialize>\n<request>\n' | extension` print both answers.
const EOF_DRAIN: Duration = Duration::from_millis(100);

/// After the session saw EOF, how long queued answers get to reach stdout.
const EOF_GRACE: Duration = Duration::from_millis(100);

/// Why [`Extension::serve`] returned.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExitReason {
    /// The host sent `shutdown`; it was answered and the session closed.
    Shutdown,
    /// The host closed its end (stdin EOF, or stdout's reader went away).
    HostClosed,
    /// Reading or writing failed.
    Broken(String),
}

impl ExitReason {
    /// The process exit code: 0 for a stop the host asked for (both `shutdown` and EOF are the
    /// host's way of saying so), 1 when the streams broke.
    pub fn code(&self) -> i32 {
        match self {
            ExitReason::Shutdown | ExitReason::HostClosed => 0,
            ExitReason::Broken(_) => 1,
        }
    }
}

impl Extension {
    /// Serve this extension over `read` (the host's messages) and `write` (ours) until the host
    /// sends `shutdown` or closes `read`. Must be polled inside a tokio runtime; [`run`](crate::run)
    /// calls it with this process's stdin and stdout.
    pub async fn serve<R, W>(self, read: R, write: W) -> ExitReason
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let name = self.name.clone();
        tracing::info!(extension = %name, version = %self.version, "serving");
        let dispatch = Dispatch::new(self);
        let answered_shutdown = dispatch.answered_shutdown.clone();
        let read = DrainAtEof {
            inner: read,
            tracker: dispatch.tracker.clone(),
            stopping: CancellationToken::clone(&dispatch.stopping),
            answered_shutdown: answered_shutdown.clone(),
            state: Eof::Reading,
        };
        let session = Session::new(read, write, dispatch, SessionConfig::named("host"));
        let ended = tokio::select! {
            reason = session.wait() => Some(reason),
            () = answered_shutdown.cancelled() => None,
        };
        let reason = match ended {
            None => {
                // The shutdown handler has queued its answer; closing waits for it to be
                // written, then closes our stdout so the host sees EOF.
                session.close(CLOSE_GRACE).await;
                ExitReason::Shutdown
            }
            Some(reason) => {
                // The session already failed every pending call and cancelled every handler
                // still running after the drain; answers queued before still get written.
                session.close(EOF_GRACE).await;
                match reason {
                    CloseReason::PeerClosed | CloseReason::Local => ExitReason::HostClosed,
                    CloseReason::Broken(e) => ExitReason::Broken(e),
                }
            }
        };
        tracing::info!(extension = %name, ?reason, "stopped");
        reason
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    New,
    Ready,
    Stopping,
}

/// Where the session is in its life, and what the host sent in `initialize` once it was
/// answered.
struct Lifecycle {
    phase: Phase,
    init: Option<Arc<InitializeParams>>,
    /// The bulk pipe, when the host offered one that is usable here.
    bulk: Option<Arc<BulkPipe>>,
}

/// The session's handler: the handshake, then routing by method and name.
struct Dispatch {
    ext: Extension,
    lifecycle: Mutex<Lifecycle>,
    /// Tracks every request being answered (except `shutdown` itself), so that `shutdown` and
    /// stdin EOF can wait for them.
    tracker: TaskTracker,
    /// Cancelled when `shutdown` arrives (handlers see it as [`Ctx::shutdown_token`]).
    /// This one and the next are shared with every request behind an `Arc`: a token's own
    /// clone takes a lock, twice per request.
    stopping: Arc<CancellationToken>,
    /// Cancelled when `shutdown` stops waiting: the handlers still running answer `cancelled`.
    cancel_all: Arc<CancellationToken>,
    /// Cancelled when `shutdown` is about to be answered: [`Extension::serve`] closes the session.
    answered_shutdown: CancellationToken,
}

impl Dispatch {
    fn new(ext: Extension) -> Self {
        Dispatch {
            ext,
            lifecycle: Mutex::new(Lifecycle {
                phase: Phase::New,
                init: None,
                bulk: None,
            }),
            tracker: TaskTracker::new(),
            stopping: Arc::default(),
            cancel_all: Arc::default(),
            answered_shutdown: CancellationToken::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lifecycle> {
        // Every critical section is a plain read or assignment, so a poisoned lock still holds
        // a consistent state.
        self.lifecycle.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn initialize(&self, req: &Request) -> HandlerResult {
        // A second `initialize` is refused before its params are looked at (protocol.md §3.4).
        if self.lock().phase != Phase::New {
            return Err(already_initialized());
        }
        let params = Initialize::parse_params(req.params.as_deref().map(RawValue::get))?;
        let mut st = self.lock();
        if st.phase != Phase::New {
            return Err(already_initialized());
        }
        let version = match handshake::negotiate(
            &params.protocol_versions,
            &self.ext.protocol_versions,
        ) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(host_versions = ?params.protocol_versions, ours = ?self.ext.protocol_versions, "no protocol version in common");
                return Err(e);
            }
        };
        tracing::info!(host = %params.host.name, host_version = %params.host.version, protocol = version, "initialized");
        st.phase = Phase::Ready;
        st.bulk = params.bulk.as_ref().and_then(BulkPipe::take);
        st.init = Some(Arc::new(params));
        to_raw(&InitializeResult::new(
            version,
            Software::new(self.ext.name.clone(), self.ext.version.clone()),
            self.ext.capabilities(),
        ))
    }

    /// Stop taking requests, let the running ones finish within half the grace the host gives,
    /// cancel the rest, then answer.
    fn shutdown(&self, init: &InitializeParams) -> BoxFuture<HandlerResult> {
        self.lock().phase = Phase::Stopping;
        self.stopping.cancel();
        tracing::info!("shutdown requested");
        // The host allows `shutdown_grace_ms` from `shutdown` to exit; give running requests
        // half of it, which leaves ample time to cancel the rest, answer, and exit.
        let wait = Duration::from_millis(init.deadlines.shutdown_grace_ms / 2);
        let tracker = self.tracker.clone();
        let cancel_all = self.cancel_all.clone();
        let answered = self.answered_shutdown.clone();
        Box::pin(async move {
            tracker.close();
            if tokio::time::timeout(wait, tracker.wait()).await.is_err() {
                tracing::warn!(
                    running = tracker.len(),
                    "cancelling requests still running at shutdown"
                );
                cancel_all.cancel();
                let _ = tokio::time::timeout(Duration::from_millis(100), tracker.wait()).await;
            }
            answered.cancel();
            to_raw(&Empty {})
        })
    }

    /// Route a request of the ready phase to its handler.
    fn route(
        &self,
        req: Request,
        init: Arc<InitializeParams>,
        bulk: Option<Arc<BulkPipe>>,
    ) -> impl Future<Output = HandlerResult> + Send + 'static {
        // `_meta` is the protocol's, not the handler's (docs/protocol.md §11): strip it and
        // keep the deadline it carries.
        let stripped = req
            .params
            .as_deref()
            .and_then(|p| conduit_protocol::meta::strip(p.get()));
        let deadline = stripped
            .as_ref()
            .and_then(|s| s.remaining_ms)
            .and_then(|ms| Instant::now().checked_add(Duration::from_millis(ms)));
        let cx = Ctx {
            host: Host {
                peer: req.peer.clone(),
                init,
                bulk,
                deadline: None,
                verify_artifacts: false,
            },
            cancel: req.cancel.clone(),
            shutdown: self.stopping.clone(),
            deadline,
        };
        // The stripped text came from a params object the session already read whole, so it
        // is not validated again; handlers parse it anyway.
        let params = match &stripped {
            Some(s) => Some(s.params.as_str()),
            None => req.params.as_deref().map(RawValue::get),
        };
        let ext = &self.ext;
        // Through the method table: a protocol method's params are read by its row, and every
        // method the SDK serves has its arm (a method added to the table fails to compile here
        // until it does); anything else is a custom method.
        let started = match HostCall::parse(&req.method, params) {
            None => match ext.methods.get(req.method.as_str()) {
                Some(handler) => Ok(handler(cx, params)),
                None => Err(RpcError::method_not_found(&req.method)),
            },
            Some(Err(e)) => Err(e),
            Some(Ok(call)) => match call {
                // Answered by `request` before a request is routed; here only for the table's sake.
                HostCall::Initialize(_) => Err(already_initialized()),
                HostCall::Shutdown(_) => Err(RpcError::new(
                    ErrorCode::ShuttingDown,
                    "the extension is shutting down and takes no new requests",
                )),
                HostCall::WorkKindTrigger(p) => by_name::<WorkKindTrigger>(p, &ext.triggers, cx),
                HostCall::RecurrenceNext(p) => by_name::<RecurrenceNext>(p, &ext.recurrences, cx),
                HostCall::DependencyFilter(p) => by_name::<DependencyFilter>(p, &ext.filters, cx),
                HostCall::EmitCommit(p) => by_name::<EmitCommit>(p, &ext.emissions, cx),
                HostCall::IngressPoll(p) => self.poll(p, cx),
                HostCall::CheckSleep(p) => Ok(check_sleep(p, cx)),
            },
        };
        let method = req.method;
        let cancel = req.cancel;
        let cancel_all = self.cancel_all.clone();
        // Not boxed here: `request` boxes it once, with its tracking.
        async move {
            let fut = started?;
            tokio::select! {
                biased;
                res = AssertUnwindSafe(fut).catch_unwind() => res.unwrap_or_else(|panic| {
                    let what = panic_message(&*panic);
                    tracing::error!(%method, panic = %what, "handler panicked");
                    Err(RpcError::internal(format!("the handler of `{method}` panicked: {what}")))
                }),
                () = cancel_all.cancelled() => {
                    // Let tasks the handler spawned see the cancellation too.
                    cancel.cancel();
                    Err(RpcError::cancelled())
                }
            }
        }
    }

    fn poll(&self, p: IngressPollParams, cx: Ctx) -> Result<BoxFuture<HandlerResult>, RpcError> {
        match self.ext.ingress.get(&p.source) {
            Some(Some(handler)) => {
                let fut = handler(cx, p);
                Ok(Box::pin(async move { to_raw(&fut.await?) }))
            }
            // A push-only source has nothing to poll (§6.5).
            Some(None) => Ok(Box::pin(std::future::ready(to_raw(
                &IngressPollResult::default(),
            )))),
            None => Err(undeclared::<IngressPoll>(&p.source)),
        }
    }
}

impl Handler for Dispatch {
    fn request(&self, req: Request) -> BoxFuture<HandlerResult> {
        let answer: BoxFuture<HandlerResult> = if req.method == methods::host::INITIALIZE {
            Box::pin(std::future::ready(self.initialize(&req)))
        } else {
            let (phase, init, bulk) = {
                let st = self.lock();
                (st.phase, st.init.clone(), st.bulk.clone())
            };
            match (phase, init) {
                (Phase::New, _) | (_, None) => ready_err(RpcError::new(
                    ErrorCode::NotInitialized,
                    format!("`{}` came before `initialize`", req.method),
                )),
                (Phase::Stopping, _) => ready_err(RpcError::new(
                    ErrorCode::ShuttingDown,
                    "the extension is shutting down and takes no new requests",
                )),
                // Not tracked: it waits for everything that is.
                (Phase::Ready, Some(init)) if req.method == methods::host::SHUTDOWN => {
                    return self.shutdown(&init);
                }
                (Phase::Ready, Some(init)) => {
                    return Box::pin(self.tracker.track_future(self.route(req, init, bulk)));
                }
            }
        };
        // Even answers that are ready at once are tracked: the session writes them from a task
        // of its own, and `shutdown` and EOF must not overtake them.
        Box::pin(self.tracker.track_future(answer))
    }
}

fn ready_err(e: RpcError) -> BoxFuture<HandlerResult> {
    Box::pin(std::future::ready(Err(e)))
}

/// The host's stream, with its end held back for at most [`EOF_DRAIN`] while the requests that
/// arrived before it (a `shutdown` among them) are answered.
///
/// The session ends at EOF by cancelling every running handler, which is right for a host that
/// went away, but would also drop answers that were about to be written — including all of them
/// when the whole input arrives at once, as when an extension is tried by hand from a pipe.
struct DrainAtEof<R> {
    inner: R,
    tracker: TaskTracker,
    stopping: CancellationToken,
    answered_shutdown: CancellationToken,
    state: Eof,
}

enum Eof {
    Reading,
    Draining(Pin<Box<dyn Future<Output = ()> + Send>>),
    Reached,
}

impl<R: AsyncRead + Unpin> AsyncRead for DrainAtEof<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            match &mut this.state {
                Eof::Reading => {
                    let before = buf.filled().len();
                    ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
                    if buf.filled().len() > before || buf.remaining() == 0 {
                        return Poll::Ready(Ok(()));
                    }
                    tracing::debug!("stdin closed; answering what is running before stopping");
                    // Nothing can arrive after EOF, so the tracker can close: `wait` then ends
                    // when the last running request is answered.
                    let tracker = this.tracker.clone();
                    tracker.close();
                    let stopping = this.stopping.clone();
                    let answered = this.answered_shutdown.clone();
                    this.state = Eof::Draining(Box::pin(async move {
                        let drained = async {
                            tracker.wait().await;
                            // A `shutdown` is answered once the others are; it is not tracked.
                            if stopping.is_cancelled() {
                                answered.cancelled().await;
                            }
                        };
                        let _ = tokio::time::timeout(EOF_DRAIN, drained).await;
                    }));
                }
                Eof::Draining(drain) => {
                    ready!(drain.as_mut().poll(cx));
                    this.state = Eof::Reached;
                }
                Eof::Reached => return Poll::Ready(Ok(())),
            }
        }
    }
}

/// A call naming something this extension did not register: `invalid_params` naming the
/// method, and the capability list the name would be in.
fn undeclared<M: Method>(name: &str) -> RpcError {
    let what = M::PERMIT.capability().map_or("name", |c| c.noun());
    RpcError::invalid_params(
        M::NAME,
        format!("{what} `{name}` is not declared by this extension"),
    )
}

/// `initialize` a second time (§3.4).
fn already_initialized() -> RpcError {
    RpcError::new(
        ErrorCode::InvalidRequest,
        "`initialize` was already answered in this session",
    )
}

/// Find the handler registered under the name the params of `M` carry, and start it.
fn by_name<M: Method>(
    p: M::Params,
    handlers: &Handlers<M>,
    cx: Ctx,
) -> Result<BoxFuture<HandlerResult>, RpcError> {
    let name = M::declared_name(&p).unwrap_or_default();
    let Some(handler) = handlers.get(name) else {
        return Err(undeclared::<M>(name));
    };
    let fut = handler(cx, p);
    Ok(Box::pin(async move { to_raw(&fut.await?) }))
}

/// `check.sleep`: hold for `ms`, or until cancelled (the session answers `cancelled`) or the
/// extension is asked to shut down — a conformance probe is not work worth finishing.
fn check_sleep(p: SleepParams, cx: Ctx) -> BoxFuture<HandlerResult> {
    Box::pin(async move {
        let held = std::time::Instant::now();
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(p.ms)) => {}
            () = cx.shutdown.cancelled() => return Err(RpcError::cancelled()),
        }
        // The time actually held, as protocol.md §6.7 says.
        to_raw(&SleepResult::new(held.elapsed().as_millis() as u64))
    })
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_owned()
    }
}
