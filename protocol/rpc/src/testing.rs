//! A handler for tests and benchmarks of the session itself, and the `rpc-test-peer` binary
//! that serves it over stdio.
//!
//! Methods: `echo` (answers its params), `hold` (waits until cancelled, counts the cancel it
//! saw), `sleep` (`{"ms"}`), `callback` (calls the other side's `echo` with its params and
//! answers with that), `stats` (`{"cancels_seen", "holds_started"}`), `big` (`{"bytes"}`: answers a string of
//! that many bytes), `panic` (panics), `panic-early` (panics before returning its future), `exit` (`{"code"}`: the process exits at once, without
//! answering).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use conduit_protocol::RpcError;
use serde_json::json;

use crate::session::{BoxFuture, Handler, HandlerResult, Request, to_raw};

/// See the module docs.
#[derive(Clone, Debug, Default)]
pub struct TestHandler {
    cancels_seen: Arc<AtomicUsize>,
    /// How many `hold` requests have started: a test waits for this instead of sleeping.
    holds_started: Arc<AtomicUsize>,
}

impl TestHandler {
    /// How many `hold` requests saw their cancellation.
    pub fn cancels_seen(&self) -> usize {
        self.cancels_seen.load(Ordering::SeqCst)
    }
}

impl Handler for TestHandler {
    fn request(&self, req: Request) -> BoxFuture<HandlerResult> {
        if req.method == "panic-early" {
            // Panics while making its future, not while it runs (quietly, as `panic` does).
            std::panic::resume_unwind(Box::new("the test handler was asked to panic early"));
        }
        let cancels = self.cancels_seen.clone();
        let holds = self.holds_started.clone();
        Box::pin(async move {
            match req.method.as_str() {
                "echo" => Ok(req.params.unwrap_or_else(|| to_raw(&()).unwrap())),
                "hold" => {
                    holds.fetch_add(1, Ordering::SeqCst);
                    req.cancel.cancelled().await;
                    cancels.fetch_add(1, Ordering::SeqCst);
                    Err(RpcError::cancelled())
                }
                "sleep" => {
                    let p: serde_json::Value = req.params()?;
                    let ms = p["ms"].as_u64().unwrap_or(0);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    to_raw(&json!({ "slept_ms": ms }))
                }
                "callback" => {
                    let p: serde_json::Value = req.params()?;
                    req.peer
                        .call("echo", &p, Some(Duration::from_secs(10)))
                        .await
                        .map_err(|e| e.to_rpc_error())
                }
                "stats" => to_raw(&json!({
                    "cancels_seen": cancels.load(Ordering::SeqCst),
                    "holds_started": holds.load(Ordering::SeqCst),
                })),
                "big" => {
                    let p: serde_json::Value = req.params()?;
                    let n = p["bytes"].as_u64().unwrap_or(0) as usize;
                    to_raw(&"x".repeat(n))
                }
                // `resume_unwind` unwinds without the panic hook, so the tests stay quiet.
                "panic" => {
                    std::panic::resume_unwind(Box::new("the test handler was asked to panic"))
                }
                "exit" => {
                    let p: serde_json::Value = req.params()?;
                    std::process::exit(p["code"].as_i64().unwrap_or(3) as i32);
                }
                other => Err(RpcError::method_not_found(other)),
            }
        })
    }
}
