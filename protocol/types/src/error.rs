//! Error codes with fixed numbers, and the one place an error becomes a wire error object.
//!
//! The numbers never change once released: a peer in another language matches on them. The
//! standard JSON-RPC codes keep their numbers; conduit's own codes sit in the range JSON-RPC
//! reserves for implementations (-32000 to -32099).

use serde::Serialize;
use serde_json::value::RawValue;

/// The wire error object (`{"code", "message", "data"?}`), jsonrpsee's own type.
pub type ErrorObject = jsonrpsee_types::ErrorObjectOwned;

macro_rules! codes {
    ($( $(#[$doc:meta])* $variant:ident = $num:literal, $name:literal, $retry:literal; )*) => {
        /// Every error code either side sends, with its fixed number.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum ErrorCode {
            $( $(#[$doc])* $variant, )*
        }

        impl ErrorCode {
            /// Every code, in the order `docs/protocol.md` lists them.
            pub const ALL: &[ErrorCode] = &[$(ErrorCode::$variant),*];

            /// The fixed number on the wire.
            pub const fn number(self) -> i32 {
                match self { $(ErrorCode::$variant => $num,)* }
            }

            /// The snake_case name used in docs, logs and `--json` output.
            pub const fn name(self) -> &'static str {
                match self { $(ErrorCode::$variant => $name,)* }
            }

            /// Whether the same request may succeed if sent again later, unchanged.
            pub const fn is_retryable(self) -> bool {
                match self { $(ErrorCode::$variant => $retry,)* }
            }

            /// The code with this number, if it is one of ours.
            pub const fn from_number(n: i32) -> Option<ErrorCode> {
                match n { $($num => Some(ErrorCode::$variant),)* _ => None }
            }
        }
    };
}

codes! {
    /// The line was not valid JSON (or not UTF-8).
    ParseError = -32700, "parse_error", false;
    /// Valid JSON, but not a JSON-RPC 2.0 message.
    InvalidRequest = -32600, "invalid_request", false;
    /// The receiver does not serve this method.
    MethodNotFound = -32601, "method_not_found", false;
    /// The params do not have the shape the method needs.
    InvalidParams = -32602, "invalid_params", false;
    /// The handler failed; `message` says how.
    InternalError = -32603, "internal_error", false;
    /// The receiver already serves 64 requests; try again shortly.
    Overloaded = -32000, "overloaded", true;
    /// The request was cancelled by `$/cancel` before it finished.
    Cancelled = -32001, "cancelled", false;
    /// The caller's deadline passed before the answer came.
    DeadlineExceeded = -32002, "deadline_exceeded", true;
    /// No protocol version both sides speak; `data` names both sides' versions.
    VersionMismatch = -32003, "version_mismatch", false;
    /// The message was over 16 MiB and was discarded unread.
    MessageTooLarge = -32004, "message_too_large", false;
    /// The extension exited (or closed its stdout) while the request was pending.
    ExtensionExited = -32005, "extension_exited", true;
    /// A callback that writes was refused because the host is inside a transaction waiting for
    /// this same extension.
    ReentrantWrite = -32006, "reentrant_write", false;
    /// A request other than `initialize` came before the handshake finished.
    NotInitialized = -32007, "not_initialized", false;
    /// The receiver is shutting down and takes no new requests.
    ShuttingDown = -32008, "shutting_down", true;
    /// An artifact stream failed its checks (unknown stream, chunk too big or out of order,
    /// size or sha256 different from what `artifact.close` claimed).
    ArtifactInvalid = -32009, "artifact_invalid", false;
    /// The thing a callback asked for does not exist.
    NotFound = -32010, "not_found", false;
    /// The host's disk is full: the write was not made. Retry later; the host accepts writes
    /// again by itself once space is freed.
    StorageFull = -32011, "storage_full", true;
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.number())
    }
}

/// An error a handler returns, or a call receives: a code, a message for people, optional data.
///
/// This is the only type that turns into a wire [`ErrorObject`]; every other error in conduit
/// becomes one of these first.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{message} [{}]", self.code_name())]
pub struct RpcError {
    /// The wire number; usually one of [`ErrorCode`], but a peer may send any integer.
    pub code: i32,
    /// What went wrong, for a person.
    pub message: String,
    /// Structured detail, as raw JSON.
    pub data: Option<Box<RawValue>>,
}

impl RpcError {
    /// An error with one of conduit's codes.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        RpcError {
            code: code.number(),
            message: message.into(),
            data: None,
        }
    }

    /// Attach structured data (serialization failure leaves `data` empty).
    pub fn with_data(mut self, data: &impl Serialize) -> Self {
        self.data = serde_json::value::to_raw_value(data).ok();
        self
    }

    /// The code, if it is one conduit knows.
    pub fn error_code(&self) -> Option<ErrorCode> {
        ErrorCode::from_number(self.code)
    }

    /// Whether this error carries `code`.
    pub fn is(&self, code: ErrorCode) -> bool {
        self.code == code.number()
    }

    fn code_name(&self) -> String {
        match self.error_code() {
            Some(c) => c.to_string(),
            None => self.code.to_string(),
        }
    }

    /// `method_not_found` naming the method.
    pub fn method_not_found(method: &str) -> Self {
        RpcError::new(
            ErrorCode::MethodNotFound,
            format!("method `{method}` is not served here"),
        )
    }

    /// `invalid_params` naming the method and what serde said.
    pub fn invalid_params(method: &str, err: impl std::fmt::Display) -> Self {
        RpcError::new(
            ErrorCode::InvalidParams,
            format!("invalid params for `{method}`: {err}"),
        )
    }

    /// `cancelled`.
    pub fn cancelled() -> Self {
        RpcError::new(ErrorCode::Cancelled, "the request was cancelled")
    }

    /// `overloaded`, naming the limit.
    pub fn overloaded(limit: usize) -> Self {
        RpcError::new(
            ErrorCode::Overloaded,
            format!("already serving {limit} requests; retry after one finishes"),
        )
        .with_data(&serde_json::json!({ "limit": limit }))
    }

    /// `internal_error` with the handler's message.
    pub fn internal(message: impl Into<String>) -> Self {
        RpcError::new(ErrorCode::InternalError, message)
    }

    /// The wire object.
    pub fn to_object(&self) -> ErrorObject {
        ErrorObject::owned(self.code, self.message.clone(), self.data.as_deref())
    }
}

impl PartialEq for RpcError {
    fn eq(&self, other: &Self) -> bool {
        self.code == other.code
            && self.message == other.message
            && self.data.as_ref().map(|d| d.get()) == other.data.as_ref().map(|d| d.get())
    }
}

impl Eq for RpcError {}

impl From<ErrorObject> for RpcError {
    fn from(obj: ErrorObject) -> Self {
        RpcError {
            code: obj.code(),
            message: obj.message().to_owned(),
            data: obj.data().map(|d| d.to_owned()),
        }
    }
}

impl Serialize for RpcError {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_object().serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for RpcError {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        ErrorObject::deserialize(d).map(RpcError::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_unique_and_round_trip() {
        let mut seen = std::collections::HashSet::new();
        for &c in ErrorCode::ALL {
            assert!(seen.insert(c.number()), "{c} reuses a number");
            assert_eq!(ErrorCode::from_number(c.number()), Some(c));
        }
    }

    #[test]
    fn fixed_numbers_do_not_move() {
        // These numbers are public: extensions in other languages match on them.
        assert_eq!(ErrorCode::Overloaded.number(), -32000);
        assert_eq!(ErrorCode::Cancelled.number(), -32001);
        assert_eq!(ErrorCode::DeadlineExceeded.number(), -32002);
        assert_eq!(ErrorCode::VersionMismatch.number(), -32003);
        assert_eq!(ErrorCode::MessageTooLarge.number(), -32004);
        assert_eq!(ErrorCode::ExtensionExited.number(), -32005);
        assert_eq!(ErrorCode::ReentrantWrite.number(), -32006);
        assert_eq!(ErrorCode::ParseError.number(), -32700);
    }

    #[test]
    fn error_object_round_trips_through_json() {
        let e = RpcError::overloaded(64);
        let json = serde_json::to_string(&e).unwrap();
        assert_eq!(
            json,
            r#"{"code":-32000,"message":"already serving 64 requests; retry after one finishes","data":{"limit":64}}"#
        );
        let back: RpcError = serde_json::from_str(&json).unwrap();
        assert_eq!(back, e);
    }
}
