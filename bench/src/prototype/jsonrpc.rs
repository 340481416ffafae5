//! The workload over conduit's JSON-RPC: method names and the params and results the host and
//! `proto-jsonrpc-child` exchange. Everything else (framing, the handshake, cancellation,
//! artifact streams) is conduit's own protocol, spoken by `conduit-rpc` and the SDK.

use serde::{Deserialize, Serialize};

/// `echo`: [`Echo`] → the same [`Echo`].
pub const ECHO: &str = "echo";
/// `callback`: [`CallbackParams`] → [`CallbackResult`].
pub const CALLBACK: &str = "callback";
/// `sleep`: `{ms}` (the protocol's `SleepParams`) → `{slept_ms}`, or `cancelled`.
pub const SLEEP: &str = "sleep";
/// `cancel_seen`: `{}` → [`CancelSeen`].
pub const CANCEL_SEEN: &str = "cancel_seen";
/// `artifact`: [`ArtifactParams`] → the protocol's `ArtifactStored`.
pub const ARTIFACT: &str = "artifact";
/// The host's callback: [`Echo`] → the same [`Echo`].
pub const PING: &str = "bench.ping";
/// The host's callback `{}` → `{}`, made by `sleep` as it starts: the host cancels (or kills)
/// on receiving it, so that the cancellation meets an extension that is running, not one
/// that has sat idle for a while.
pub const SLEEPING: &str = "bench.sleeping";

/// Text answered unchanged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Echo {
    pub text: String,
}

/// Make `n` sequential `bench.ping` callbacks with `text`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CallbackParams {
    pub n: u32,
    pub text: String,
}

/// Each callback's round trip as the extension timed it, in ns.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CallbackResult {
    pub nanos: Vec<u64>,
}

/// When the last `sleep` started and saw its cancellation, on `CLOCK_MONOTONIC` (0: never).
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct CancelSeen {
    pub started_ns: u64,
    pub seen_ns: u64,
}

/// Stream `bytes` bytes to the host in writes of `chunk_bytes`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct ArtifactParams {
    pub bytes: u64,
    pub chunk_bytes: usize,
    /// Send `artifact.chunk` calls even when the host offers the bulk pipe.
    #[serde(default)]
    pub json_chunks: bool,
    /// When not 0, the content's first 8 bytes are this (little-endian; [`super::salted`]): a
    /// daemon keeps one copy per digest and does not write a copy it already has again, so
    /// each transfer through the daemon sends content it has not seen.
    #[serde(default)]
    pub salt: u64,
}
