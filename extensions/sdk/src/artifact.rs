//! Writing an artifact to the host as a pipelined stream of chunks (`docs/protocol.md` §8).
//!
//! ```text
//!   open ──► chunk 0 ─┐                        acks arrive in any order; the next chunk
//!            chunk 1 ─┤  at most `window`      goes out as soon as the count of
//!            …        │  unanswered at once    unanswered chunks drops below `window`
//!            chunk k ─┘
//!   (all acked) ──► close {size, sha256?}  ──► {artifact_id: "sha256:…", sha256: "…"}
//! ```
//!
//! Chunks are `chunk_bytes` long (64 KiB by default, never more than the host's
//! `max_chunk_bytes`), except the last. The size is counted as bytes are written, so the
//! content is never held whole.
//!
//! The host computes the SHA-256 of what it received and answers it at close (the open's
//! answer says so with `sha256_optional`), so by default nothing is hashed here: the stored
//! digest is in the answer. Asked to verify end to end ([`Host::with_verified_artifacts`]),
//! the writer hashes the bytes as they are written and sends that digest at close, which the
//! host refuses (`artifact_invalid`, keeping nothing) unless what it received matches; a digest
//! known beforehand goes the same way ([`ArtifactWriter::finish_with_sha256`]). With a host
//! that does not say `sha256_optional` (an older one, which requires the digest) the writer
//! hashes as it always did.
//!
//! [`Host::with_verified_artifacts`]: crate::Host::with_verified_artifacts
//!
//! With the bulk pipe (`docs/protocol.md` §8.1: the host offered it in `initialize` and granted
//! it in the open's answer) the bytes go there instead, as frames written straight from the
//! caller's slices (small writes gathered up to `chunk_bytes`, 256 KiB by default), with no
//! acknowledgement per frame: the pipe's own back-pressure is the flow control. `close` is the
//! same JSON call either way.
//!
//! Invariants: chunks are queued for writing in `seq` order; no more than `window` are
//! unanswered at once; `close` is sent only after every chunk was acknowledged; a writer that
//! fails or is dropped before `finish` aborts the stream, so the host keeps nothing of it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use conduit_protocol::bulk::{DEFAULT_BULK_FRAME_BYTES, MAX_BULK_FRAME_BYTES};
use conduit_protocol::calls::{
    ArtifactAbort, ArtifactClose, ArtifactOpen, ArtifactOpened, ArtifactStored, ChunkAck, Empty,
};
use conduit_protocol::{ErrorCode, JsonText, methods};
use conduit_rpc::{BoxFuture, CallError, CallOptions, Peer};
use futures::FutureExt as _;
use futures::stream::{FuturesUnordered, StreamExt};
use sha2::{Digest, Sha256};

use crate::bulk::BulkPipe;
use crate::error::HostError;

/// Writes at least this long go to the bulk pipe straight from the caller's slice; shorter ones
/// are gathered first.
const BULK_DIRECT_BYTES: usize = 64 * 1024;

/// How long a best-effort `artifact.abort` may take; nobody waits for its answer but the task
/// that sends it.
const ABORT_DEADLINE: Duration = Duration::from_secs(5);

/// Session calls wait for one of 64 outgoing slots, so a wider window would not put more chunks
/// on the wire; it would only make them queue here instead of there.
const MAX_WINDOW: usize = conduit_protocol::MAX_CONCURRENT_REQUESTS;

/// Whether the stream is still open, or how it ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StreamStatus {
    Open,
    /// A chunk or the close failed; the stream was aborted (or the host ended it).
    Failed,
    /// Closed or aborted on purpose.
    Done,
}

/// An open artifact stream. Write bytes with [`write`](Self::write), then
/// [`finish`](Self::finish); see the module docs for the flow control.
///
/// Dropped before `finish` (the handler returned early, failed, or was cancelled), it aborts
/// the stream in a background task.
pub struct ArtifactWriter {
    peer: Peer,
    deadline: Option<Duration>,
    name: String,
    stream_id: String,
    max_chunk_bytes: usize,
    chunk_bytes: usize,
    window: usize,
    /// Bytes written but not yet sent: less than one chunk.
    buf: Vec<u8>,
    seq: u64,
    size: u64,
    /// The bytes' digest so far, when it is computed here: end-to-end verification was asked
    /// for, or the host needs the digest at close (it did not say `sha256_optional`).
    hasher: Option<Sha256>,
    in_flight: FuturesUnordered<BoxFuture<Result<ChunkAck, CallError>>>,
    status: StreamStatus,
    /// The bulk pipe and this stream's tag on it, when the host granted it.
    bulk: Option<(Arc<BulkPipe>, u32)>,
}

impl fmt::Debug for ArtifactWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArtifactWriter")
            .field("name", &self.name)
            .field("stream_id", &self.stream_id)
            .field("chunk_bytes", &self.chunk_bytes)
            .field("window", &self.window)
            .field("seq", &self.seq)
            .field("size", &self.size)
            .field("hashing", &self.hasher.is_some())
            .field("in_flight", &self.in_flight.len())
            .field("status", &self.status)
            .field("bulk_tag", &self.bulk.as_ref().map(|(_, t)| *t))
            .finish()
    }
}

impl ArtifactWriter {
    /// Open a stream with `artifact.open`; every call of the stream is made with `deadline`
    /// (the [`Host`](crate::Host)'s). `verify`: hash the bytes here and send the digest at
    /// close, whatever the host offers.
    pub(crate) async fn open(
        peer: &Peer,
        pipe: Option<Arc<BulkPipe>>,
        deadline: Option<Duration>,
        verify: bool,
        mut open: ArtifactOpen,
    ) -> Result<Self, HostError> {
        let name = open.name.clone();
        open.bulk = pipe.is_some();
        let opened: ArtifactOpened = peer
            .call(methods::ext::ARTIFACT_OPEN, &open, deadline)
            .await?;
        let bulk = match (pipe, opened.bulk_tag) {
            (Some(p), Some(tag)) => Some((p, tag)),
            _ => None,
        };
        let (max_chunk_bytes, chunk_bytes) = match bulk {
            Some(_) => (MAX_BULK_FRAME_BYTES, DEFAULT_BULK_FRAME_BYTES),
            None => {
                let max = opened
                    .max_chunk_bytes
                    .min(conduit_protocol::MAX_ARTIFACT_CHUNK_BYTES);
                (max, conduit_protocol::DEFAULT_ARTIFACT_CHUNK_BYTES.min(max))
            }
        };
        let mut w = ArtifactWriter {
            peer: peer.clone(),
            deadline,
            name,
            stream_id: opened.stream_id,
            max_chunk_bytes,
            chunk_bytes,
            window: opened.window.clamp(1, MAX_WINDOW),
            buf: Vec::new(),
            seq: 0,
            size: 0,
            hasher: (verify || !opened.sha256_optional).then(Sha256::new),
            in_flight: FuturesUnordered::new(),
            status: StreamStatus::Open,
            bulk,
        };
        if max_chunk_bytes == 0 {
            // Nothing could ever be sent; give the stream back rather than hold it open.
            let detail = "the host answered `max_chunk_bytes` 0".to_owned();
            w.abort_now().await;
            return Err(HostError::Artifact {
                name: w.name.clone(),
                detail,
            });
        }
        Ok(w)
    }

    /// Use chunks of `n` bytes from now on (clamped to 1 ..= the host's `max_chunk_bytes`, or
    /// to 1 ..= 1 MiB for frames on the bulk pipe). Bytes already buffered go out in chunks of
    /// the new size.
    pub fn set_chunk_bytes(&mut self, n: usize) {
        self.chunk_bytes = n.clamp(1, self.max_chunk_bytes);
    }

    /// The chunk size in use.
    pub fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }

    /// Whether the bytes go on the bulk pipe (the host offered and granted it) rather than as
    /// `artifact.chunk` calls.
    pub fn is_bulk(&self) -> bool {
        self.bulk.is_some()
    }

    /// How many chunks may be unanswered at once (the host's `window`).
    pub fn window(&self) -> usize {
        self.window
    }

    /// The stream's id, as the host named it.
    pub fn stream_id(&self) -> &str {
        &self.stream_id
    }

    /// Bytes written so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether the bytes are hashed here, to be sent at close: end-to-end verification was
    /// asked for ([`Host::with_verified_artifacts`](crate::Host::with_verified_artifacts)), or
    /// the host needs the digest (an older host, whose open answer lacks `sha256_optional`).
    pub fn is_hashing(&self) -> bool {
        self.hasher.is_some()
    }

    /// Append `data`. Whole chunks are sent at once, waiting only when `window` chunks are
    /// already unanswered; the rest is kept until more is written or the stream is finished.
    ///
    /// Not cancel-safe: `data` is counted in the size and digest before the wait for the
    /// window, so a `write` dropped while waiting (in a `select!` or a timeout) must end the
    /// stream — call [`ArtifactWriter::abort`] or drop the writer — rather than write on.
    pub async fn write(&mut self, mut data: &[u8]) -> Result<(), HostError> {
        self.check_open()?;
        if let Some(h) = &mut self.hasher {
            h.update(data);
        }
        self.size += data.len() as u64;
        if self.bulk.is_some() {
            return self.write_bulk(data).await;
        }
        if !self.buf.is_empty() {
            let take = (self.chunk_bytes.saturating_sub(self.buf.len())).min(data.len());
            self.buf.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.buf.len() >= self.chunk_bytes {
                let chunk = std::mem::take(&mut self.buf);
                self.send_chunk(&chunk).await?;
            }
        }
        while data.len() >= self.chunk_bytes {
            let (chunk, rest) = data.split_at(self.chunk_bytes);
            self.send_chunk(chunk).await?;
            data = rest;
        }
        self.buf.extend_from_slice(data);
        Ok(())
    }

    /// Send what is buffered, wait for every chunk's ack, and close the stream with its size
    /// (and its SHA-256 when it was hashed here, see [`is_hashing`](Self::is_hashing)). The
    /// host checks them against what it received and answers the stored artifact: its id, its
    /// size and the SHA-256 the host computed (`sha256`, filled in from `artifact_id` when an
    /// older host leaves it out).
    pub async fn finish(self) -> Result<ArtifactStored, HostError> {
        self.finish_inner(None).await
    }

    /// [`finish`](Self::finish) with the content's SHA-256 (hex) already known, e.g. of a file
    /// hashed earlier: it is sent at close and the host refuses the stream
    /// (`artifact_invalid`, keeping nothing) unless the bytes it received have that digest.
    /// Where the writer hashed the bytes itself too, a digest that differs from its own aborts
    /// the stream here instead, naming both.
    pub async fn finish_with_sha256(self, sha256: &str) -> Result<ArtifactStored, HostError> {
        self.finish_inner(Some(sha256.to_owned())).await
    }

    async fn finish_inner(mut self, known: Option<String>) -> Result<ArtifactStored, HostError> {
        self.check_open()?;
        if !self.buf.is_empty() {
            let chunk = std::mem::take(&mut self.buf);
            if self.bulk.is_some() {
                self.send_frames(&chunk).await?;
            } else {
                // A buffer left from a larger chunk size is cut to the current one.
                for piece in chunk.chunks(self.chunk_bytes) {
                    self.send_chunk(piece).await?;
                }
            }
        }
        while let Some(ack) = self.in_flight.next().await {
            self.on_ack(ack).await?;
        }
        let own = self.hasher.take().map(|h| hex::encode(h.finalize()));
        if let (Some(own), Some(known)) = (&own, &known)
            && !own.eq_ignore_ascii_case(known)
        {
            self.abort_now().await;
            return Err(HostError::Artifact {
                name: self.name.clone(),
                detail: format!(
                    "the {} bytes written have sha256 {own}, not the {known} given to finish; the stream was aborted",
                    self.size
                ),
            });
        }
        let sent = known.or(own);
        let mut close = ArtifactClose::new(self.stream_id.clone(), self.size);
        close.sha256 = sent.clone();
        let mut stored: ArtifactStored = match self
            .peer
            .call(methods::ext::ARTIFACT_CLOSE, &close, self.deadline)
            .await
        {
            Ok(stored) => stored,
            Err(e) => return Err(self.fail(e).await),
        };
        self.status = StreamStatus::Done;
        if stored.sha256.is_empty() {
            stored.sha256 = stored.digest().unwrap_or_default().to_owned();
        }
        // The host checked the digest sent; an answer naming another is not what was stored.
        if let Some(sent) = sent
            && !stored.sha256.eq_ignore_ascii_case(&sent)
        {
            return Err(HostError::Artifact {
                name: self.name.clone(),
                detail: format!(
                    "the host accepted sha256 {sent} but answered {}",
                    stored.sha256
                ),
            });
        }
        Ok(stored)
    }

    /// Give up on the stream: the host discards what it received.
    pub async fn abort(mut self) -> Result<(), HostError> {
        if self.status != StreamStatus::Open {
            return Ok(());
        }
        self.status = StreamStatus::Done;
        self.in_flight.clear();
        let _: Empty = self
            .peer
            .call(
                methods::ext::ARTIFACT_ABORT,
                &ArtifactAbort::new(self.stream_id.clone()),
                self.deadline,
            )
            .await?;
        Ok(())
    }

    fn check_open(&self) -> Result<(), HostError> {
        match self.status {
            StreamStatus::Open => Ok(()),
            StreamStatus::Failed | StreamStatus::Done => Err(HostError::Artifact {
                name: self.name.clone(),
                detail: "the stream has already failed or ended".into(),
            }),
        }
    }

    /// [`write`](Self::write) on the bulk pipe: top up what is gathered, send whole frames
    /// straight from `data`, gather the rest.
    async fn write_bulk(&mut self, mut data: &[u8]) -> Result<(), HostError> {
        if !self.buf.is_empty() {
            let take = (self.chunk_bytes.saturating_sub(self.buf.len())).min(data.len());
            self.buf.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.buf.len() >= self.chunk_bytes {
                let gathered = std::mem::take(&mut self.buf);
                self.send_frames(&gathered).await?;
                self.buf = gathered;
                self.buf.clear();
            }
        }
        let direct = BULK_DIRECT_BYTES.min(self.chunk_bytes);
        if data.len() >= direct {
            let whole = data.len() - data.len() % direct;
            let (now, rest) = data.split_at(whole);
            self.send_frames(now).await?;
            data = rest;
        }
        self.buf.extend_from_slice(data);
        Ok(())
    }

    /// Write `bytes` to the bulk pipe in frames of at most `chunk_bytes`.
    async fn send_frames(&mut self, bytes: &[u8]) -> Result<(), HostError> {
        let Some((pipe, tag)) = self.bulk.clone() else {
            unreachable!("frames are sent only on a bulk stream");
        };
        for frame in bytes.chunks(self.chunk_bytes) {
            if let Err(e) = pipe.frame(tag, frame).await {
                self.status = StreamStatus::Failed;
                self.abort_now().await;
                return Err(HostError::Artifact {
                    name: self.name.clone(),
                    detail: format!("cannot write to the bulk pipe: {e}; the stream was aborted"),
                });
            }
        }
        Ok(())
    }

    async fn send_chunk(&mut self, bytes: &[u8]) -> Result<(), HostError> {
        while self.in_flight.len() >= self.window {
            let ack = self
                .in_flight
                .next()
                .await
                .expect("a full window is not empty");
            self.on_ack(ack).await?;
        }
        // The params (`ArtifactChunk`) are written by hand, the base64 straight into the
        // buffer: serializing the 87 KiB string through serde would scan every byte for
        // characters to escape, which base64 never has (a quarter of the sender's CPU, measured).
        let params = chunk_params(&self.stream_id, self.seq, bytes);
        self.seq += 1;
        let peer = self.peer.clone();
        let deadline = self.deadline;
        self.in_flight.push(Box::pin(async move {
            let raw = peer
                .request(
                    methods::ext::ARTIFACT_CHUNK,
                    &JsonText(&params),
                    CallOptions::within(deadline),
                )
                .await?;
            serde_json::from_str::<ChunkAck>(raw.get()).map_err(|e| CallError::BadResult {
                method: methods::ext::ARTIFACT_CHUNK.into(),
                detail: e.to_string(),
            })
        }));
        // Poll the new call once now, so that it is written at once rather than when the
        // window next needs draining. Its first poll queues the frame: the session's send path
        // takes its two semaphores (outgoing slots, write-queue bytes), both FIFO-fair, and
        // `FuturesUnordered` first polls futures in the order they were pushed, so frames are
        // queued in `seq` order even when a call has to wait for room. Acks that are already
        // in are taken on the way.
        while let Some(Some(ack)) = self.in_flight.next().now_or_never() {
            self.on_ack(ack).await?;
        }
        Ok(())
    }

    async fn on_ack(&mut self, ack: Result<ChunkAck, CallError>) -> Result<(), HostError> {
        match ack {
            Ok(_) => Ok(()),
            Err(e) => Err(self.fail(e).await),
        }
    }

    /// The stream failed with `e`: drop the chunks in flight (each is sent `$/cancel`), abort
    /// the stream unless the host already ended it, and hand back the error.
    async fn fail(&mut self, e: CallError) -> HostError {
        tracing::debug!(artifact = %self.name, stream = %self.stream_id, error = %e, "artifact stream failed");
        self.status = StreamStatus::Failed;
        self.in_flight.clear();
        // `artifact_invalid` ends the stream on the host (§8); an abort would only draw another.
        if !e.is(ErrorCode::ArtifactInvalid) {
            self.abort_now().await;
        }
        HostError::Call(e)
    }

    async fn abort_now(&mut self) {
        self.status = StreamStatus::Failed;
        let abort = ArtifactAbort::new(self.stream_id.clone());
        let res: Result<Empty, _> = self
            .peer
            .call(methods::ext::ARTIFACT_ABORT, &abort, Some(ABORT_DEADLINE))
            .await;
        if let Err(e) = res {
            tracing::debug!(artifact = %self.name, error = %e, "artifact.abort failed");
        }
    }
}

impl Drop for ArtifactWriter {
    fn drop(&mut self) {
        if self.status != StreamStatus::Open {
            return;
        }
        // Dropped unfinished: the chunks in flight are cancelled as their calls drop; tell the
        // host to discard the stream. Drop cannot wait, so a task sends it; outside a runtime
        // (the process is ending) there is no session left to tell.
        self.in_flight.clear();
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let peer = self.peer.clone();
        let abort = ArtifactAbort::new(std::mem::take(&mut self.stream_id));
        let name = std::mem::take(&mut self.name);
        rt.spawn(async move {
            let res: Result<Empty, _> = peer
                .call(methods::ext::ARTIFACT_ABORT, &abort, Some(ABORT_DEADLINE))
                .await;
            match res {
                Ok(_) => tracing::debug!(artifact = %name, "unfinished artifact stream aborted"),
                Err(e) => tracing::debug!(artifact = %name, error = %e, "artifact.abort failed"),
            }
        });
    }
}

/// `ArtifactChunk` as JSON text, the data base64-encoded in place.
fn chunk_params(stream_id: &str, seq: u64, bytes: &[u8]) -> String {
    let mut out = String::with_capacity(48 + stream_id.len() + bytes.len().div_ceil(3) * 4);
    out.push_str(r#"{"stream_id":"#);
    // The id came from the host: escape it like any string.
    out.push_str(&serde_json::to_string(stream_id).expect("a string serializes"));
    out.push_str(r#","seq":"#);
    out.push_str(&seq.to_string());
    out.push_str(r#","data":""#);
    base64::engine::general_purpose::STANDARD.encode_string(bytes, &mut out);
    out.push_str(r#""}"#);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use conduit_protocol::calls::ArtifactChunk;

    #[test]
    fn hand_written_chunk_params_are_the_chunk_serde_would_write() {
        for (id, seq, bytes) in [
            ("abc123", 0u64, &b""[..]),
            ("a\"b", 7, &b"hello, artifact"[..]),
            ("s", 99, &[0u8, 255, 10, 13][..]),
        ] {
            let ours: ArtifactChunk = serde_json::from_str(&chunk_params(id, seq, bytes)).unwrap();
            let want = ArtifactChunk::new(
                id,
                seq,
                base64::engine::general_purpose::STANDARD.encode(bytes),
            );
            assert_eq!(ours, want);
        }
    }
}
