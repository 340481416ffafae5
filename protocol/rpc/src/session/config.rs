//! A session's limits and names ([`SessionConfig`]) and the counters it keeps for metrics
//! ([`SessionCounters`]).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// Limits and names for one session.
#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// Used in logs: the extension's name on the host side, `host` in the SDK.
    pub name: String,
    /// Frame cap, both directions.
    pub max_message_bytes: usize,
    /// Incoming requests served at once; the next is answered `overloaded`.
    pub max_concurrent: usize,
    /// Bytes queued for writing before senders wait.
    pub write_queue_bytes: usize,
    /// Outgoing calls awaiting an answer at once; further calls wait for a slot (within their
    /// deadline) instead of drawing `overloaded` from a peer that applies the same limit.
    pub max_outgoing: usize,
    /// Bytes held for the peer at once: the write queue plus frames whose senders wait for
    /// room or for a call slot. A call or notification that would pass it fails at once with
    /// [`CallError::Overloaded`](super::error::CallError::Overloaded); an answer that would is
    /// replaced by an `overloaded` error. At least the frame cap, so one message of the
    /// largest size can always be sent.
    pub max_held_bytes: usize,
    /// Where the session counts its traffic. Shared, so one set of counters can outlive a
    /// session (the host keeps one per extension across its restarts).
    pub counters: Arc<SessionCounters>,
}

/// Bytes and refusals of a session, for metrics. Relaxed atomics: one add per frame.
#[derive(Debug, Default)]
pub struct SessionCounters {
    /// Bytes of the messages read from the peer, one newline each (a `\r` or an empty line
    /// is not counted), discarded oversized and truncated messages included.
    pub bytes_in: AtomicU64,
    /// Bytes written to the peer.
    pub bytes_out: AtomicU64,
    /// The peer's requests refused with `overloaded`: over the concurrent-request limit, or
    /// an answer that would pass the held-bytes bound.
    pub refused_overloaded: AtomicU64,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            name: "peer".into(),
            max_message_bytes: conduit_protocol::MAX_MESSAGE_BYTES,
            max_concurrent: conduit_protocol::MAX_CONCURRENT_REQUESTS,
            write_queue_bytes: 2 * conduit_protocol::MAX_MESSAGE_BYTES,
            max_outgoing: conduit_protocol::MAX_CONCURRENT_REQUESTS,
            max_held_bytes: 3 * conduit_protocol::MAX_MESSAGE_BYTES,
            counters: Arc::default(),
        }
    }
}

impl SessionConfig {
    /// The defaults, with a name for logs.
    pub fn named(name: impl Into<String>) -> Self {
        SessionConfig {
            name: name.into(),
            ..SessionConfig::default()
        }
    }
}
