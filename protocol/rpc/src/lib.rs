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
    BoxFuture, CallError, CloseReason, Handler, HandlerResult, NoRequests, Peer, Request, Session,
    SessionConfig, to_raw,
};
