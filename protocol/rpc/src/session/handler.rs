//! What serves the other side: the [`Handler`] trait, the [`Request`] it is given, and what it
//! answers.
//!
//! Not here: how requests are read and answered (`reader.rs`) — a handler sees one request at a
//! time and never the stream.

use std::future::Future;
use std::pin::Pin;

use conduit_protocol::{RequestId, RpcError};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use super::peer::Peer;

/// A boxed future, as handlers return.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What a handler answers: raw JSON, or an error.
pub type HandlerResult = Result<Box<RawValue>, RpcError>;

/// An incoming request, as a handler sees it.
#[derive(Debug)]
#[non_exhaustive]
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
    /// A request as the session hands it to a handler, not yet cancelled: for tests that call
    /// a handler directly.
    pub fn new(
        id: RequestId,
        method: impl Into<String>,
        params: Option<Box<RawValue>>,
        peer: Peer,
    ) -> Self {
        Request {
            id,
            method: method.into(),
            params,
            cancel: CancellationToken::new(),
            peer,
        }
    }

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
