//! Framing and the bidirectional JSON-RPC session that both the host and the SDK use.
//!
//! - [`codec`]: newline framing with a hard cap that never buffers an oversized line.
//! - [`session`]: one peer over one read half and one write half: outgoing calls with
//!   deadlines and `$/cancel`, incoming requests served concurrently up to a limit,
//!   notifications, graceful close.
//! - [`stdio`]: this process's stdin/stdout as epoll-driven pipes (the extension side; the host
//!   uses the child's pipes, which tokio already registers with the reactor).

pub mod codec;
mod head;
pub mod session;
pub mod stdio;
pub mod testing;

pub use session::{
    BoxFuture, CallError, CallOptions, CloseReason, Handler, HandlerResult, NoRequests, Peer,
    Request, Session, SessionConfig, SessionCounters, to_raw,
};

/// Entry points for the fuzz targets in `fuzz/`, compiled only under `--cfg fuzzing` (which
/// `cargo fuzz` sets), so the crate's API stays as it is.
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing {
    use conduit_protocol::RequestId;

    /// What the oversized-head scan read from `head`: the id, and whether it looks like a
    /// request or a response.
    #[derive(Debug)]
    pub struct Peeked {
        pub id: Option<RequestId>,
        pub is_request: bool,
        pub is_response: bool,
    }

    /// Runs the scan the session uses on an oversized message's first bytes.
    pub fn peek(head: &[u8]) -> Peeked {
        let p = crate::head::peek(head);
        Peeked {
            is_request: p.is_request(),
            is_response: p.is_response(),
            id: p.id,
        }
    }
}
