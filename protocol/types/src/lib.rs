//! conduit's wire protocol, as types.
//!
//! This crate is the vocabulary both sides share: the limits every peer enforces, the method
//! table (every method's name, types, direction and permissions, `methods`), the error codes
//! with their fixed numbers, the handshake, and the params and results of every method in both
//! directions. `docs/protocol.md` is the normative description; this crate
//! is its Rust spelling.
//!
//! Invariant: no I/O and no async runtime. Framing and the session live in `conduit-rpc`; the
//! meaning of a call (what the host does with an answer) lives in the host.

pub mod artifact_id;
pub mod bulk;
pub mod calls;
pub mod depth;
pub mod error;
pub mod handshake;
pub mod limits;
pub mod message;
pub mod meta;
pub mod methods;
pub mod rules;

pub use depth::{
    CheckedPayload, MAX_PAYLOAD_DEPTH, PayloadTooDeep, check_payload_depth, json_depth,
};
pub use error::{ErrorCode, ErrorObject, RpcError};
pub use handshake::{
    Capabilities, Capability, InitializeParams, InitializeResult, PROTOCOL_VERSION,
    PROTOCOL_VERSIONS,
};
pub use limits::{
    ARTIFACT_WINDOW, DEFAULT_ARTIFACT_CHUNK_BYTES, DEFAULT_CALL_DEADLINE, IN_TRANSACTION_DEADLINE,
    MAX_ARTIFACT_CHUNK_BYTES, MAX_CONCURRENT_REQUESTS, MAX_MESSAGE_BYTES, SHUTDOWN_GRACE,
};
pub use message::{JsonText, Message, MessageError, RequestId, RequestParams, Typed};
pub use methods::{Callback, HostCall, Method};
pub use rules::{
    AnswerError, ErrorClass, check_event_fields, classify, page_limit, parse_params,
    parse_params_with_payload,
};
