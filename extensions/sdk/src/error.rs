//! Why a callback to the host failed: [`HostError`], the one error of the SDK's calls to the
//! host (the typed callbacks and artifact streams alike).
//!
//! A leaf: `ctx.rs` and `artifact.rs` both return it, and it knows neither.

use conduit_protocol::{ErrorCode, RpcError};
use conduit_rpc::CallError;

/// Why a callback to the host failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// The call itself failed: the host answered an error (for example `not_found`,
    /// `reentrant_write`, `artifact_invalid`), the deadline passed, or the session ended.
    #[error(transparent)]
    Call(#[from] CallError),
    /// An artifact stream failed on this side: the host's `artifact.open` answer was unusable,
    /// or the stream was used after it failed.
    #[error("artifact `{name}`: {detail}")]
    Artifact { name: String, detail: String },
}

impl HostError {
    /// The error code this failure is reported as (the host's own code when it answered one).
    pub fn code(&self) -> i32 {
        match self {
            HostError::Call(e) => e.code(),
            HostError::Artifact { .. } => ErrorCode::InternalError.number(),
        }
    }

    /// Whether the failure carries `code`.
    pub fn is(&self, code: ErrorCode) -> bool {
        self.code() == code.number()
    }

    /// Whether sending the same call again later may succeed (docs/protocol.md §12): the
    /// protocol's one classification, so a -32000 without `data.limit` (a generic server
    /// error) is not retryable, while conduit's `overloaded`, which always names its limit, is.
    pub fn is_retryable(&self) -> bool {
        self.class().is_retryable()
    }

    /// How to read the failure: see `conduit_protocol::classify`.
    pub fn class(&self) -> conduit_protocol::ErrorClass {
        match self {
            HostError::Call(e) => e.class(),
            HostError::Artifact { .. } => conduit_protocol::ErrorClass::Permanent,
        }
    }

    /// As a wire error, to answer the handler's own request with: the host's error unchanged,
    /// a local failure as its code with this error's message.
    pub fn to_rpc_error(&self) -> RpcError {
        match self {
            HostError::Call(e) => e.to_rpc_error(),
            HostError::Artifact { .. } => RpcError::internal(self.to_string()),
        }
    }
}

/// Lets a handler pass a failed callback on with `?`.
impl From<HostError> for RpcError {
    fn from(e: HostError) -> Self {
        e.to_rpc_error()
    }
}
