//! The extension's end of the bulk pipe (`docs/protocol.md` §8.1): frames of artifact bytes
//! written to the descriptor the host announced in `initialize`.
//!
//! One pipe serves every stream of the process. A frame is written whole under one lock, so
//! frames of concurrent streams never interleave. A write cancelled part-way through a frame
//! (its future dropped) would leave the pipe inside that frame: the lock's state remembers how
//! much of it is owed, and the next writer first completes it (the rest of its header, then
//! zeros), which the host files under the torn frame's stream — aborted by then, because the
//! cancelled writer aborts its stream when dropped.

use std::io;
use std::os::fd::{BorrowedFd, FromRawFd as _, OwnedFd};
use std::sync::Arc;

use conduit_protocol::bulk::{BULK_HEADER_BYTES, header};
use conduit_protocol::handshake::BulkOffer;
use tokio::io::AsyncWriteExt as _;
use tokio::net::unix::pipe;

/// The write end of the bulk pipe, shared by every artifact stream of the process.
#[derive(Debug)]
pub(crate) struct BulkPipe {
    state: tokio::sync::Mutex<Writer>,
}

#[derive(Debug)]
struct Writer {
    tx: pipe::Sender,
    /// A frame whose write was cancelled: its header, and how many of its bytes (header
    /// included) are already in the pipe out of how many.
    torn: Option<Torn>,
}

#[derive(Clone, Copy, Debug)]
struct Torn {
    header: [u8; BULK_HEADER_BYTES],
    written: usize,
    total: usize,
}

impl BulkPipe {
    /// Take the descriptor the host offered, if it is a pipe this process can write: the
    /// offer's descriptor is replaced by a close-on-exec copy, so programs the extension runs
    /// do not inherit it. `None` (and a log line) when it is not usable; artifacts then go as
    /// JSON chunks.
    pub(crate) fn take(offer: &BulkOffer) -> Option<Arc<BulkPipe>> {
        static TAKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if offer.fd < 3 || TAKEN.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return None;
        }
        // SAFETY: only duplicated here; an fd that is not open fails the dup with EBADF.
        let dup = match unsafe { BorrowedFd::borrow_raw(offer.fd) }.try_clone_to_owned() {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(fd = offer.fd, error = %e, "the host's bulk pipe is not open here; artifacts go as JSON chunks");
                return None;
            }
        };
        let file = std::fs::File::from(dup);
        let is_fifo = file.metadata().is_ok_and(|m| {
            use std::os::unix::fs::FileTypeExt as _;
            m.file_type().is_fifo()
        });
        if !is_fifo {
            tracing::warn!(
                fd = offer.fd,
                "the host's bulk descriptor is not a pipe; artifacts go as JSON chunks"
            );
            return None;
        }
        // SAFETY: the host gave this process the descriptor for this use alone, and this is the
        // one place that takes it (`TAKEN`); the copy above is what is kept.
        drop(unsafe { OwnedFd::from_raw_fd(offer.fd) });
        match pipe::Sender::from_owned_fd(OwnedFd::from(file)) {
            Ok(tx) => Some(Arc::new(BulkPipe {
                state: tokio::sync::Mutex::new(Writer { tx, torn: None }),
            })),
            Err(e) => {
                tracing::warn!(error = %e, "cannot use the host's bulk pipe; artifacts go as JSON chunks");
                None
            }
        }
    }

    /// Write one frame of `data` (1 ..= `MAX_BULK_FRAME_BYTES` bytes) for stream `tag`.
    /// Waits while the pipe is full: that is the flow control.
    pub(crate) async fn frame(&self, tag: u32, data: &[u8]) -> io::Result<()> {
        let mut w = self.state.lock().await;
        if let Some(t) = w.torn {
            w.complete(t).await?;
        }
        let h = header(tag, data.len());
        let total = BULK_HEADER_BYTES + data.len();
        w.torn = Some(Torn {
            header: h,
            written: 0,
            total,
        });
        w.put_frame(&h, data).await?;
        w.torn = None;
        Ok(())
    }
}

impl Writer {
    /// Write `bytes` whole, counting them into the frame being written.
    async fn put(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let n = self.tx.write(bytes).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            if let Some(t) = self.torn.as_mut() {
                t.written += n;
            }
            bytes = &bytes[n..];
        }
        Ok(())
    }

    /// Write a frame's `header` and `data` whole, counting them into the frame being written:
    /// one `writev` while the header is not all out (one system call, and one wake-up of the
    /// reader, where two writes made two), plain writes for the rest.
    async fn put_frame(&mut self, header: &[u8], data: &[u8]) -> io::Result<()> {
        let total = header.len() + data.len();
        let mut done = 0;
        while done < total {
            let n = if done < header.len() {
                let bufs = [io::IoSlice::new(&header[done..]), io::IoSlice::new(data)];
                self.tx.write_vectored(&bufs).await?
            } else {
                self.tx.write(&data[done - header.len()..]).await?
            };
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            if let Some(t) = self.torn.as_mut() {
                t.written += n;
            }
            done += n;
        }
        Ok(())
    }

    /// Finish a frame a cancelled write left: the rest of its header, then zeros.
    async fn complete(&mut self, t: Torn) -> io::Result<()> {
        if t.written < BULK_HEADER_BYTES {
            self.put(&t.header[t.written..]).await?;
        }
        const ZEROS: [u8; 8192] = [0; 8192];
        loop {
            let done = self.torn.map_or(t.total, |t| t.written);
            let left = t.total - done;
            if left == 0 {
                break;
            }
            self.put(&ZEROS[..left.min(ZEROS.len())]).await?;
        }
        self.torn = None;
        Ok(())
    }
}
