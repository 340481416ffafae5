//! Receiving artifact streams: chunks written to a temporary file as they arrive and hashed on
//! the way, the size (and the sender's sha256, when it sends one) checked at close, the content
//! then stored under the digest computed here, `<state>/artifacts/sha256/<hex>`, which the
//! answer to `artifact.close` carries (docs/protocol.md §8).
//!
//! ```text
//!   artifact.open ─► tmp/artifact-<id>.part      (one per stream)
//!   artifact.chunk seq 0,1,2… (≤ 256 KiB, up to `window` in flight, written in seq order)
//!   artifact.close {size, sha256?} ─► checked ─► fsync, artifacts/sha256/<hex> (rename, dir fsync)
//!                                                 (already stored: the copy is dropped, no fsync)
//! ```
//!
//! A stream opened with `bulk: true` on a run that has a bulk pipe gets a tag instead of
//! chunks: its bytes arrive on the pipe (`bulk.rs`), and its close waits until `size` bytes
//! have arrived (or the pipe ended) before it checks them. `stream.rs` holds what both paths
//! share: the stream, appending to it, the errors.
//!
//! Invariants: a stream that fails a check, is aborted, or whose session ends (the extension
//! crashed) leaves no file behind; a stored artifact's name is its digest, so its content is
//! what the digest says. Chunks of one stream may be served by concurrent handler tasks; each
//! waits for its turn, so they are written in `seq` order whatever order the tasks run in.

mod bulk;
mod stream;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use conduit_protocol::calls::{
    ArtifactChunk, ArtifactClose, ArtifactOpen, ArtifactOpened, ChunkAck,
};
use conduit_protocol::{ErrorCode, RpcError};
use conduit_rpc::Peer;
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

use self::bulk::Channel;
pub use self::stream::MAX_ARTIFACT_BYTES;
use self::stream::{SharedStream, Stream, invalid, io_error};

/// How many streams one extension may have open at once.
pub const MAX_OPEN_STREAMS: usize = 16;

/// How long a chunk waits for the ones before it, and a bulk stream's close for its next bytes.
const CHUNK_TURN_TIMEOUT: Duration = Duration::from_secs(30);

/// A verified artifact, ready to be recorded.
#[derive(Debug)]
pub struct Finished {
    pub sha256: String,
    pub size: u64,
    pub name: String,
    pub media_type: Option<String>,
    pub ext: String,
}

/// The open streams of every extension.
#[derive(Debug)]
pub struct Artifacts {
    dir: PathBuf,
    tmp: PathBuf,
    /// Stream id → (owner, stream). The owner is kept outside the stream's lock so that the
    /// check never waits on a chunk being written.
    streams: Mutex<HashMap<String, (String, SharedStream)>>,
    /// Each extension's bulk pipe of its current run.
    channels: Mutex<HashMap<String, Arc<Channel>>>,
}

impl Artifacts {
    pub fn new(dir: PathBuf, tmp: PathBuf) -> Self {
        Artifacts {
            dir,
            tmp,
            streams: Mutex::new(HashMap::new()),
            channels: Mutex::new(HashMap::new()),
        }
    }

    /// Where the content of an artifact with this digest lives.
    pub fn content_path(&self, sha256: &str) -> PathBuf {
        self.dir.join("sha256").join(sha256)
    }

    /// Remove what streams of an earlier daemon left in the temporary folder.
    pub fn sweep_partial(&self) -> usize {
        let Ok(rd) = std::fs::read_dir(&self.tmp) else {
            return 0;
        };
        rd.flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("artifact-"))
            .filter(|e| std::fs::remove_file(e.path()).is_ok())
            .count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, SharedStream)>> {
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self, ext: &str, id: &str) -> Result<Arc<tokio::sync::Mutex<Stream>>, RpcError> {
        match self.lock().get(id) {
            Some((owner, s)) if owner == ext => Ok(s.clone()),
            Some(_) => Err(invalid(format!(
                "artifact stream `{id}` belongs to another extension"
            ))),
            None => Err(invalid(format!("no open artifact stream `{id}`"))),
        }
    }

    /// What the supervisor hands each run's bulk pipe to: a reader task for the run of `ext`,
    /// whose streams then may take their bytes from it.
    pub fn bulk_sink(self: &Arc<Self>, ext: &str) -> conduit_supervisor::BulkSink {
        let me = Arc::downgrade(self);
        let ext = ext.to_owned();
        Arc::new(move |peer: &Peer, fd: std::os::fd::OwnedFd| {
            let Some(me) = me.upgrade() else { return };
            let channel = Channel::new(peer.clone());
            me.lock_channels().insert(ext.clone(), channel.clone());
            let ext = ext.clone();
            tokio::spawn(async move {
                bulk::read(ext.clone(), channel.clone(), fd).await;
                let mut channels = me.lock_channels();
                if channels.get(&ext).is_some_and(|c| Arc::ptr_eq(c, &channel)) {
                    channels.remove(&ext);
                }
            });
        })
    }

    fn lock_channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Channel>>> {
        self.channels.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The bulk pipe of the run `peer` belongs to, if it has one that can take a stream.
    fn channel(&self, ext: &str, peer: &Peer) -> Option<Arc<Channel>> {
        self.lock_channels()
            .get(ext)
            .filter(|c| c.peer.same_session(peer) && c.usable())
            .cloned()
    }

    /// Open a stream for `ext`, from the session of `peer`; it is removed (and its file
    /// deleted) when that session ends.
    pub fn open(
        self: &Arc<Self>,
        ext: &str,
        p: ArtifactOpen,
        peer: &Peer,
    ) -> Result<ArtifactOpened, RpcError> {
        if p.size.is_some_and(|s| s > MAX_ARTIFACT_BYTES) {
            return Err(invalid(format!(
                "an artifact may be at most {MAX_ARTIFACT_BYTES} bytes"
            )));
        }
        if p.name.is_empty() || p.name.len() > 255 {
            return Err(RpcError::new(
                ErrorCode::InvalidParams,
                "`name` must be 1 to 255 bytes",
            ));
        }
        let open_now = self
            .lock()
            .values()
            .filter(|(owner, _)| owner == ext)
            .count();
        if open_now >= MAX_OPEN_STREAMS {
            return Err(invalid(format!(
                "this extension already has {MAX_OPEN_STREAMS} artifact streams open; close or abort one first"
            )));
        }
        let id = random_id();
        std::fs::create_dir_all(&self.tmp).map_err(|e| {
            RpcError::internal(format!("cannot create {}: {e}", self.tmp.display()))
        })?;
        let path = self.tmp.join(format!("artifact-{id}.part"));
        let file = std::fs::File::create(&path)
            .map_err(|e| io_error(format!("cannot create {}", path.display()), &e))?;
        let watcher = tokio_util::sync::CancellationToken::new();
        let channel = if p.bulk {
            self.channel(ext, peer)
        } else {
            None
        };
        let tag = channel.as_ref().map(|c| c.next_tag());
        let stream = Stream {
            ext: ext.to_owned(),
            name: p.name,
            media_type: p.media_type,
            path,
            file: Some(file),
            hasher: Sha256::new(),
            received: 0,
            written_back: 0,
            next_seq: 0,
            turn: Arc::new(Notify::new()),
            watcher: watcher.clone(),
            bulk: channel.as_ref().zip(tag).map(|(c, t)| (c.weak_tags(), t)),
            spoiled: None,
            pipe_done: false,
        };
        let stream: SharedStream = Arc::new(tokio::sync::Mutex::new(stream));
        // Registered before anyone can know the tag, so no frame of it can come first.
        if let (Some(c), Some(tag)) = (&channel, tag) {
            c.tags.insert(tag, stream.clone());
        }
        self.lock().insert(id.clone(), (ext.to_owned(), stream));
        // A stream cut by a crash leaves nothing behind.
        let me = self.clone();
        let sid = id.clone();
        let peer = peer.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = peer.closed() => me.discard(&sid).await,
                () = watcher.cancelled() => {}
            }
        });
        let mut opened = ArtifactOpened::new(
            id,
            conduit_protocol::MAX_ARTIFACT_CHUNK_BYTES,
            conduit_protocol::ARTIFACT_WINDOW,
        )
        .with_sha256_optional(true);
        opened.bulk_tag = tag;
        Ok(opened)
    }

    /// Write one chunk, in its turn.
    pub async fn chunk(&self, ext: &str, c: ArtifactChunk) -> Result<ChunkAck, RpcError> {
        let stream = self.get(ext, &c.stream_id)?;
        let data = base64::engine::general_purpose::STANDARD
            .decode(c.data.as_bytes())
            .map_err(|e| invalid(format!("chunk {} is not valid base64: {e}", c.seq)))?;
        if data.len() > conduit_protocol::MAX_ARTIFACT_CHUNK_BYTES {
            self.fail(&c.stream_id).await;
            return Err(invalid(format!(
                "chunk {} is {} bytes, over the {}-byte chunk limit; the stream was discarded",
                c.seq,
                data.len(),
                conduit_protocol::MAX_ARTIFACT_CHUNK_BYTES
            )));
        }
        let deadline = tokio::time::Instant::now() + CHUNK_TURN_TIMEOUT;
        loop {
            let mut s = stream.lock().await;
            if s.file.is_none() {
                return Err(invalid("the stream was discarded"));
            }
            if s.bulk.is_some() {
                drop(s);
                self.fail(&c.stream_id).await;
                return Err(invalid(format!(
                    "stream `{}` was opened for the bulk pipe and takes no `artifact.chunk`; the stream was discarded",
                    c.stream_id
                )));
            }
            let window = conduit_protocol::ARTIFACT_WINDOW as u64;
            if c.seq < s.next_seq || c.seq >= s.next_seq + window {
                drop(s);
                self.fail(&c.stream_id).await;
                return Err(invalid(format!(
                    "chunk {} is out of order or outside the window; the stream was discarded",
                    c.seq
                )));
            }
            if c.seq == s.next_seq {
                if let Err(e) = s.append(&data) {
                    drop(s);
                    self.fail(&c.stream_id).await;
                    return Err(e);
                }
                s.next_seq += 1;
                return Ok(ChunkAck::new(s.received));
            }
            // Not our turn yet: wait for the chunk before us.
            let turn = s.turn.clone();
            let notified = turn.notified();
            drop(s);
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                self.fail(&c.stream_id).await;
                return Err(invalid(format!(
                    "chunk {} waited {CHUNK_TURN_TIMEOUT:?} for the chunks before it; the stream was discarded",
                    c.seq
                )));
            }
        }
    }

    /// Check size and digest; on success move the content into place and return it.
    pub async fn close(&self, ext: &str, c: ArtifactClose) -> Result<Finished, RpcError> {
        let stream = self.get(ext, &c.stream_id)?;
        if let Err(e) = Self::bulk_arrived(&stream, c.size).await {
            self.discard(&c.stream_id).await;
            return Err(e);
        }
        self.lock().remove(&c.stream_id);
        let mut s = stream.lock().await;
        s.watcher.cancel();
        let Some(file) = s.file.take() else {
            return Err(invalid("the stream was discarded"));
        };
        s.drop_content();
        let digest = hex::encode(std::mem::take(&mut s.hasher).finalize());
        let path = s.path.clone();
        if let Err(why) = matches_close(s.received, &digest, &c) {
            drop(file);
            let _ = std::fs::remove_file(&path);
            return Err(invalid(why));
        }
        let dest = self.content_path(&digest);
        // fsync and rename can take a while on a large file: off the runtime's workers.
        let (tmp_path, dest_path) = (path.clone(), dest.clone());
        let res = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            let dir = dest_path.parent().unwrap_or(Path::new("."));
            std::fs::create_dir_all(dir)?;
            if dest_path.exists() {
                // Same digest, same content, already stored durably (a file gets its name only
                // after its fsync): the copy just received is not needed, nor its fsync.
                drop(file);
                return std::fs::remove_file(&tmp_path);
            }
            // The file's one fsync; most of it was already written out as it arrived.
            file.sync_all()?;
            drop(file);
            std::fs::rename(&tmp_path, &dest_path)?;
            std::fs::File::open(dir)?.sync_all()
        })
        .await
        .unwrap_or_else(|e| {
            Err(std::io::Error::other(format!(
                "storing the artifact panicked: {e}"
            )))
        });
        if let Err(e) = res {
            let _ = std::fs::remove_file(&path);
            return Err(io_error("cannot store the artifact".into(), &e));
        }
        Ok(Finished {
            sha256: digest,
            size: s.received,
            name: s.name.clone(),
            media_type: s.media_type.clone(),
            ext: s.ext.clone(),
        })
    }

    /// For a bulk stream: wait until `size` bytes have come on the pipe, the pipe ended, or no
    /// byte came for [`CHUNK_TURN_TIMEOUT`]. `Err` when the stream cannot be stored.
    async fn bulk_arrived(stream: &SharedStream, size: u64) -> Result<(), RpcError> {
        loop {
            let s = stream.lock().await;
            if s.bulk.is_none() && s.spoiled.is_none() && !s.pipe_done {
                return Ok(()); // a JSON stream, or discarded: close says which
            }
            if let Some(why) = &s.spoiled {
                return Err(invalid(format!("{why}; nothing was kept")));
            }
            if s.received >= size {
                return Ok(());
            }
            if s.pipe_done {
                return Err(invalid(format!(
                    "the bulk pipe ended after {} of the {size} bytes close claims; nothing was kept",
                    s.received
                )));
            }
            let (received, turn) = (s.received, s.turn.clone());
            let notified = turn.notified();
            drop(s);
            if tokio::time::timeout(CHUNK_TURN_TIMEOUT, notified)
                .await
                .is_err()
            {
                return Err(invalid(format!(
                    "no byte came on the bulk pipe for {CHUNK_TURN_TIMEOUT:?} with {received} of the {size} bytes close claims received; nothing was kept"
                )));
            }
        }
    }

    /// Give up on a stream at the extension's request.
    pub async fn abort(&self, ext: &str, id: &str) -> Result<(), RpcError> {
        self.get(ext, id)?;
        self.discard(id).await;
        Ok(())
    }

    async fn fail(&self, id: &str) {
        self.discard(id).await;
    }

    async fn discard(&self, id: &str) {
        let Some((_, stream)) = self.lock().remove(id) else {
            return;
        };
        stream.lock().await.drop_content();
    }

    /// How many streams are open (tests).
    pub fn open_streams(&self) -> usize {
        self.lock().len()
    }
}

/// Whether what arrived (`received` bytes whose SHA-256 is `digest`) is what `close` says: its
/// size always, its `sha256` when the sender gave one (any case). `Err` says how they differ.
fn matches_close(received: u64, digest: &str, close: &ArtifactClose) -> Result<(), String> {
    let claim = close.sha256.as_deref();
    if received == close.size && claim.is_none_or(|c| c.eq_ignore_ascii_case(digest)) {
        return Ok(());
    }
    let claimed = match claim {
        Some(c) => format!("{} bytes with sha256 {c}", close.size),
        None => format!("{} bytes", close.size),
    };
    Err(format!(
        "the artifact does not match its close: received {received} bytes with sha256 {digest}, close says {claimed}; nothing was kept"
    ))
}

fn random_id() -> String {
    let mut b = [0u8; 12];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .is_err()
    {
        let t = conduit_supervisor::now_ms() as u64 ^ (std::process::id() as u64) << 32;
        b[..8].copy_from_slice(&t.to_le_bytes());
    }
    hex::encode(b)
}
