//! Why a session ended ([`CloseReason`]) and why an outgoing call failed ([`CallError`]).
//!
//! A leaf: these are values the rest of the session hands out, and they know nothing of it.

use std::time::Duration;

use conduit_protocol::{ErrorCode, RpcError};

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
