//! The scripted host's answers to the extension's callbacks (docs/protocol.md §7): from a
//! table the test fills, or from a function of the params; every callback recorded in order.
//!
//! Artifact callbacks go to the store (`artifacts.rs`). The writes of §7.6 (`operation.emit`,
//! `ingress.push`, `artifact.close`) are refused with `reentrant_write` while an in-transaction
//! call to the extension is pending, as conduit refuses them, so a handler that writes from
//! inside a trigger fails here as it would in the daemon.
//!
//! Invariant: every callback is answered: from the script, by the store, or with
//! `method_not_found` naming what to script when the test scripted nothing for it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conduit_protocol::{ErrorCode, RpcError};
use conduit_rpc::{BoxFuture, Handler, HandlerResult, Request, to_raw};
use serde_json::Value;

use crate::artifacts::Store;

/// A function answering a callback from its params.
pub type AnswerFn = Arc<dyn Fn(&Value) -> Result<Value, RpcError> + Send + Sync>;

/// How the scripted host answers one callback method.
#[derive(Clone)]
pub(crate) enum Answer {
    Fixed(Result<Value, RpcError>),
    With(AnswerFn),
}

/// A callback the extension made: its method and params as they came.
#[derive(Clone, Debug, PartialEq)]
pub struct Callback {
    pub method: String,
    pub params: Value,
}

/// The callbacks that write to the host's database (docs/protocol.md §7.6).
const WRITES: [&str; 3] = ["operation.emit", "ingress.push", "artifact.close"];

pub(crate) struct HostSide {
    pub(crate) answers: HashMap<String, Answer>,
    pub(crate) delays: HashMap<String, Duration>,
    pub(crate) calls: Mutex<Vec<Callback>>,
    /// In-transaction calls to the extension now pending.
    pub(crate) in_transaction: AtomicUsize,
    pub(crate) store: Store,
}

/// The session's handler on the host side: a shared [`HostSide`].
pub(crate) struct Serve(pub(crate) Arc<HostSide>);

impl Handler for Serve {
    fn request(&self, req: Request) -> BoxFuture<HandlerResult> {
        let host = self.0.clone();
        Box::pin(async move {
            let params = match req.params.as_deref() {
                Some(raw) => serde_json::from_str(raw.get())
                    .map_err(|e| RpcError::invalid_params(&req.method, e))?,
                None => Value::Null,
            };
            host.calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Callback {
                    method: req.method.clone(),
                    params: params.clone(),
                });
            let answer = host.answer(&req.method, &params).await?;
            to_raw(&answer)
        })
    }
}

impl HostSide {
    async fn answer(&self, method: &str, params: &Value) -> Result<Value, RpcError> {
        if WRITES.contains(&method) && self.in_transaction.load(Ordering::SeqCst) > 0 {
            return Err(RpcError::new(
                ErrorCode::ReentrantWrite,
                format!(
                    "`{method}` refused: the host is inside a transaction waiting for this extension (docs/protocol.md §7.6)"
                ),
            ));
        }
        if let Some(d) = self.delays.get(method) {
            tokio::time::sleep(*d).await;
        }
        match self.answers.get(method) {
            Some(Answer::Fixed(a)) => a.clone(),
            Some(Answer::With(f)) => f(params),
            None if method.starts_with("artifact.") => self.store.serve(method, params).await,
            None => Err(RpcError::new(
                ErrorCode::MethodNotFound,
                format!(
                    "the scripted host has no answer for `{method}`: give it one with HostBuilder::answer or answer_with"
                ),
            )),
        }
    }
}
