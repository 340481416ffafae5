//! conduit's wire protocol, as types.
//!
//! This crate is the vocabulary both sides share: the limits every peer enforces, the method
//! names, the error codes with their fixed numbers, the handshake, and the params and results of
//! every method in both directions. `docs/protocol.md` is the normative description; this crate
//! is its Rust spelling.
//!
//! Invariant: no I/O and no async runtime. Framing and the session live in `conduit-rpc`; the
//! meaning of a call (what the host does with an answer) lives in the host.

pub mod calls;
pub mod depth;
pub mod error;
pub mod handshake;
pub mod message;
pub mod meta;
pub mod methods;
pub mod rules;

pub use depth::{MAX_PAYLOAD_DEPTH, PayloadTooDeep, check_payload_depth, json_depth};
pub use error::{ErrorCode, ErrorObject, RpcError};
pub use handshake::{Capabilities, InitializeParams, InitializeResult};
pub use message::{Message, MessageError, RequestId};
pub use rules::{AnswerError, ErrorClass, check_event_fields, classify, page_limit, parse_params};

use std::time::Duration;

/// The protocol versions this build speaks, newest first. A version is one integer; a change
/// that an existing peer could misread gets a new one (see "Versioning" in `docs/protocol.md`).
pub const PROTOCOL_VERSIONS: &[u32] = &[1];

/// The newest protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = PROTOCOL_VERSIONS[0];

/// The largest message either side sends or accepts, in bytes of JSON, not counting the
/// terminating newline (or `\r\n`).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// How many requests a peer serves at once; the next one is answered `overloaded` at once.
pub const MAX_CONCURRENT_REQUESTS: usize = 64;

/// The deadline of each of the four calls the host makes inside its database transaction.
pub const IN_TRANSACTION_DEADLINE: Duration = Duration::from_millis(250);

/// The deadline of every other host call unless the call says otherwise.
pub const DEFAULT_CALL_DEADLINE: Duration = Duration::from_secs(30);

/// How long an extension has between `shutdown` (or stdin closing) and its exit.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The largest artifact chunk, before base64.
pub const MAX_ARTIFACT_CHUNK_BYTES: usize = 256 * 1024;

/// The chunk size the SDK uses unless told otherwise.
pub const DEFAULT_ARTIFACT_CHUNK_BYTES: usize = 64 * 1024;

/// How many `artifact.chunk` requests a sender keeps unanswered at once.
pub const ARTIFACT_WINDOW: usize = 8;
