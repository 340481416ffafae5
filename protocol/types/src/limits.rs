//! The limits and deadlines every peer enforces, as constants.
//!
//! The host tells an extension most of these values in `initialize` (`handshake::Limits` and
//! `handshake::Deadlines` default to them); `docs/protocol.md` states each one. The depth limit
//! of a payload lives with its check in `depth`.
//!
//! Invariant: constants only; nothing here depends on another module of this crate.

use std::time::Duration;

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
