//! Receiving artifact streams: chunks written to a temporary file as they arrive, size and
//! sha256 checked at close, the content then stored by digest under `<state>/artifacts/`.
//!
//! ```text
//!   artifact.open ─► tmp/artifact-<id>.part      (one per stream)
//!   artifact.chunk seq 0,1,2… (≤ 256 KiB, up to `window` in flight, written in seq order)
//!   artifact.close {size, sha256} ─► checked ─► artifacts/sha256/<hex>   (rename, fsync)
//! ```
//!
//! Invariants: a stream that fails a check, is aborted, or whose session ends (the extension
//! crashed) leaves no file behind; a stored artifact's name is its digest, so its content is
//! what the digest says. Chunks of one stream may be served by concurrent handler tasks; each
//! waits for its turn, so they are written in `seq` order whatever order the tasks run in.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use conduit_protocol::calls::{
    ArtifactChunk, ArtifactClose, ArtifactOpen, ArtifactOpened, ChunkAck,
};
use conduit_protocol::{ErrorCode, RpcError};
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

/// The largest artifact accepted.
pub const MAX_ARTIFACT_BYTES: u64 = 4 * 1024 * 1024 * 1024;

/// How many streams one extension may have open at once.
pub const MAX_OPEN_STREAMS: usize = 16;

/// How long a chunk waits for the ones before it.
const CHUNK_TURN_TIMEOUT: Duration = Duration::from_secs(30);

struct Stream {
    ext: String,
    name: String,
    media_type: Option<String>,
    path: PathBuf,
    file: Option<std::fs::File>,
    hasher: Sha256,
    received: u64,
    next_seq: u64,
    /// Told when `next_seq` moves or the stream ends, so waiting chunks re-check.
    turn: Arc<Notify>,
    /// Ends the task that removes the stream when the session ends.
    watcher: tokio_util::sync::CancellationToken,
}

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
}

type SharedStream = Arc<tokio::sync::Mutex<Stream>>;

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("ext", &self.ext)
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

fn invalid(msg: impl Into<String>) -> RpcError {
    RpcError::new(ErrorCode::ArtifactInvalid, msg)
}

/// A file error while receiving an artifact: `storage_full` (retryable) when the disk is full,
/// `internal_error` otherwise.
fn io_error(what: String, e: &std::io::Error) -> RpcError {
    if e.kind() == std::io::ErrorKind::StorageFull {
        RpcError::new(
            ErrorCode::StorageFull,
            format!(
                "{what}: {e}; the disk holding the state directory is full, retry once space is freed"
            ),
        )
    } else {
        RpcError::internal(format!("{what}: {e}"))
    }
}

impl Artifacts {
    pub fn new(dir: PathBuf, tmp: PathBuf) -> Self {
        Artifacts {
            dir,
            tmp,
            streams: Mutex::new(HashMap::new()),
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

    /// Open a stream for `ext`; it is removed (and its file deleted) when `session_end` fires.
    pub fn open(
        self: &Arc<Self>,
        ext: &str,
        p: ArtifactOpen,
        session_end: impl std::future::Future<Output = ()> + Send + 'static,
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
        let stream = Stream {
            ext: ext.to_owned(),
            name: p.name,
            media_type: p.media_type,
            path,
            file: Some(file),
            hasher: Sha256::new(),
            received: 0,
            next_seq: 0,
            turn: Arc::new(Notify::new()),
            watcher: watcher.clone(),
        };
        self.lock().insert(
            id.clone(),
            (ext.to_owned(), Arc::new(tokio::sync::Mutex::new(stream))),
        );
        // A stream cut by a crash leaves nothing behind.
        let me = self.clone();
        let sid = id.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = session_end => me.discard(&sid).await,
                () = watcher.cancelled() => {}
            }
        });
        Ok(ArtifactOpened {
            stream_id: id,
            max_chunk_bytes: conduit_protocol::MAX_ARTIFACT_CHUNK_BYTES,
            window: conduit_protocol::ARTIFACT_WINDOW,
        })
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
                if s.received + data.len() as u64 > MAX_ARTIFACT_BYTES {
                    drop(s);
                    self.fail(&c.stream_id).await;
                    return Err(invalid(format!(
                        "the artifact grew past {MAX_ARTIFACT_BYTES} bytes; the stream was discarded"
                    )));
                }
                s.hasher.update(&data);
                let res = s.file.as_mut().map(|f| f.write_all(&data));
                if let Some(Err(e)) = res {
                    drop(s);
                    self.fail(&c.stream_id).await;
                    return Err(io_error("cannot write the artifact".into(), &e));
                }
                s.received += data.len() as u64;
                s.next_seq += 1;
                s.turn.notify_waiters();
                return Ok(ChunkAck {
                    received: s.received,
                });
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
        self.lock().remove(&c.stream_id);
        let mut s = stream.lock().await;
        s.watcher.cancel();
        let Some(mut file) = s.file.take() else {
            return Err(invalid("the stream was discarded"));
        };
        let digest = hex::encode(std::mem::take(&mut s.hasher).finalize());
        let path = s.path.clone();
        if s.received != c.size || digest != c.sha256.to_ascii_lowercase() {
            drop(file);
            let _ = std::fs::remove_file(&path);
            return Err(invalid(format!(
                "the artifact does not match its close: received {} bytes with sha256 {digest}, close says {} bytes with sha256 {}; nothing was kept",
                s.received, c.size, c.sha256
            )));
        }
        let dest = self.content_path(&digest);
        // fsync and rename can take a while on a large file: off the runtime's workers.
        let (tmp_path, dest_path) = (path.clone(), dest.clone());
        let res = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            file.flush()?;
            file.sync_all()?;
            drop(file);
            std::fs::create_dir_all(dest_path.parent().unwrap_or(Path::new(".")))?;
            if dest_path.exists() {
                std::fs::remove_file(&tmp_path)?; // same digest, same content: keep the one stored
            } else {
                std::fs::rename(&tmp_path, &dest_path)?;
                if let Some(dir) = dest_path.parent() {
                    std::fs::File::open(dir)?.sync_all()?;
                }
            }
            Ok(())
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
        let mut s = stream.lock().await;
        s.watcher.cancel();
        s.file = None;
        let _ = std::fs::remove_file(&s.path);
        s.turn.notify_waiters();
    }

    /// How many streams are open (tests).
    pub fn open_streams(&self) -> usize {
        self.lock().len()
    }
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
