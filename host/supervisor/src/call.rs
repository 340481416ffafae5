//! How a call to an extension fails and what is kept of it while it waits: the error a caller
//! gets ([`ExtCallError`]) and the record of a call awaiting its answer ([`InFlight`]). Plain
//! data; the handle in `extension.rs` makes the calls.

use std::time::Instant;

use conduit_protocol::ErrorCode;
use conduit_rpc::CallError;

use crate::status::State;

/// Why a call to an extension failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExtCallError {
    #[error("extension `{ext}` is not running (it is {state}); see `conduit ext status {ext}`")]
    NotRunning { ext: String, state: State },
    #[error("extension `{ext}`: {source}")]
    Call { ext: String, source: CallError },
}

impl ExtCallError {
    /// The error code it is reported as.
    pub fn code(&self) -> i32 {
        match self {
            ExtCallError::NotRunning { .. } => ErrorCode::ExtensionExited.number(),
            ExtCallError::Call { source, .. } => source.code(),
        }
    }

    pub fn is(&self, code: ErrorCode) -> bool {
        self.code() == code.number()
    }

    /// How to read the failure (docs/protocol.md §12; `conduit_protocol::classify`).
    pub fn class(&self) -> conduit_protocol::ErrorClass {
        match self {
            ExtCallError::NotRunning { .. } => conduit_protocol::ErrorClass::Retryable,
            ExtCallError::Call { source, .. } => source.class(),
        }
    }
}

/// A call awaiting an answer.
pub(crate) struct InFlight {
    pub(crate) method: Box<str>,
    pub(crate) since: Instant,
    /// Until when it may wait (its deadline), if it has one.
    pub(crate) until: Option<Instant>,
}
