//! One open artifact stream on the host: its temporary file, digest so far and bytes received,
//! whichever way its bytes arrive (JSON chunks or bulk-pipe frames), and the errors both paths
//! answer.
//!
//! The digest is computed here, as the bytes are appended, whatever the sender sends at close
//! (docs/protocol.md §8). Every [`WRITEBACK_BYTES`] appended, the kernel is asked to start
//! writing the file out (`sync_file_range`, Linux), so that the one fsync at close waits only
//! for the tail rather than for the whole artifact: on this kind of disk 16 MiB took 25–65 ms to
//! fsync from scratch, as long as the transfer itself. That is no durability promise; the fsync
//! at close is.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};

use conduit_protocol::{ErrorCode, RpcError};
use sha2::{Digest as _, Sha256};
use tokio::sync::Notify;

/// The largest artifact accepted.
pub const MAX_ARTIFACT_BYTES: u64 = 4 * 1024 * 1024 * 1024;

/// Appended bytes after which the file's writeback is started (see the module docs).
const WRITEBACK_BYTES: u64 = 1024 * 1024;

pub(super) type SharedStream = Arc<tokio::sync::Mutex<Stream>>;

/// A bulk pipe's open streams by tag; `changed` is told when one is added or removed.
#[derive(Debug, Default)]
pub(super) struct Tags {
    map: Mutex<HashMap<u32, SharedStream>>,
    pub(super) changed: Notify,
}

impl Tags {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, SharedStream>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn insert(&self, tag: u32, stream: SharedStream) {
        self.lock().insert(tag, stream);
        self.changed.notify_one();
    }

    pub(super) fn remove(&self, tag: u32) {
        self.lock().remove(&tag);
        self.changed.notify_one();
    }

    pub(super) fn get(&self, tag: u32) -> Option<SharedStream> {
        self.lock().get(&tag).cloned()
    }

    pub(super) fn all(&self) -> Vec<SharedStream> {
        self.lock().values().cloned().collect()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

pub(super) struct Stream {
    pub(super) ext: String,
    pub(super) name: String,
    pub(super) media_type: Option<String>,
    pub(super) path: PathBuf,
    /// `None` once the stream was discarded.
    pub(super) file: Option<std::fs::File>,
    pub(super) hasher: Sha256,
    pub(super) received: u64,
    /// Bytes whose writeback has been started.
    pub(super) written_back: u64,
    pub(super) next_seq: u64,
    /// Told when bytes arrive, `next_seq` moves or the stream ends, so waiters re-check.
    pub(super) turn: Arc<Notify>,
    /// Ends the task that removes the stream when the session ends.
    pub(super) watcher: tokio_util::sync::CancellationToken,
    /// Its bulk pipe's tag table and its tag, when its bytes come that way.
    pub(super) bulk: Option<(Weak<Tags>, u32)>,
    /// Why the stream can no longer be stored, found while its bytes arrived (set by the bulk
    /// pipe's reader, answered at close).
    pub(super) spoiled: Option<String>,
    /// The bulk pipe ended (or broke): no more bytes will come.
    pub(super) pipe_done: bool,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("ext", &self.ext)
            .field("received", &self.received)
            .field("bulk_tag", &self.bulk.as_ref().map(|(_, t)| *t))
            .finish_non_exhaustive()
    }
}

impl Stream {
    /// Append `data` to the content: the size cap, the digest, the file. `Err` says why the
    /// stream must be discarded.
    pub(super) fn append(&mut self, data: &[u8]) -> Result<(), RpcError> {
        if self.received + data.len() as u64 > MAX_ARTIFACT_BYTES {
            return Err(invalid(format!(
                "the artifact grew past {MAX_ARTIFACT_BYTES} bytes; the stream was discarded"
            )));
        }
        let Some(file) = self.file.as_mut() else {
            return Err(invalid("the stream was discarded"));
        };
        if let Err(e) = file.write_all(data) {
            return Err(io_error("cannot write the artifact".into(), &e));
        }
        self.hasher.update(data);
        self.received += data.len() as u64;
        if self.received - self.written_back >= WRITEBACK_BYTES {
            start_writeback(file, self.written_back, self.received - self.written_back);
            self.written_back = self.received;
        }
        self.turn.notify_waiters();
        Ok(())
    }

    /// Give up on the content: the file goes, waiters are told. Idempotent.
    pub(super) fn drop_content(&mut self) {
        self.watcher.cancel();
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
        if let Some((tags, tag)) = self.bulk.take()
            && let Some(tags) = tags.upgrade()
        {
            tags.remove(tag);
        }
        self.turn.notify_waiters();
    }
}

/// Ask the kernel to start writing `len` bytes of `file` from `offset` to disk, without waiting
/// for it. Best effort: a failure only leaves more for the fsync at close.
fn start_writeback(file: &std::fs::File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd as _;
        let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
            return;
        };
        // SAFETY: sync_file_range on a descriptor `file` holds open; it reads no memory of ours.
        let r = unsafe {
            nix::libc::sync_file_range(
                file.as_raw_fd(),
                offset,
                len,
                nix::libc::SYNC_FILE_RANGE_WRITE,
            )
        };
        if r != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "sync_file_range failed; the fsync at close will write it all");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

pub(super) fn invalid(msg: impl Into<String>) -> RpcError {
    RpcError::new(ErrorCode::ArtifactInvalid, msg)
}

/// A file error while receiving an artifact: `storage_full` (retryable) when the disk is full,
/// `internal_error` otherwise.
pub(super) fn io_error(what: String, e: &std::io::Error) -> RpcError {
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
