//! Store failures as callers see them: the one mapping of a [`StoreError`]'s [`Fault`] to a
//! wire error for callbacks, the message for a full disk, the log that says once when
//! writes start and stop failing for want of space, and the text of a panic in store work.
//!
//! This module classifies and reports; it does not retry or decide anything about the store.

use std::sync::atomic::{AtomicI64, Ordering};

use conduit_protocol::{ErrorCode, RpcError};
use conduit_store::{Fault, StoreError};
use conduit_supervisor::now_ms;

/// A store failure as a wire error for a callback, by [`StoreError::fault`], the classification
/// the management API's answers follow too. (`RpcError` and `StoreError` are both foreign here,
/// so this is a function, not a `From`.)
pub(crate) fn store_fault(e: StoreError) -> RpcError {
    match e.fault() {
        Fault::DiskFull => RpcError::new(ErrorCode::StorageFull, disk_full_message(&e)),
        Fault::NotFound => RpcError::new(ErrorCode::NotFound, e.to_string()),
        Fault::Invalid => RpcError::new(ErrorCode::InvalidParams, e.to_string()),
        Fault::Store => RpcError::internal(format!("the host's store failed: {e}")),
        Fault::Host => RpcError::internal(format!("the host failed: {e}")),
    }
}

/// What a caller is told when a write was refused because the disk is full.
pub fn disk_full_message(e: &StoreError) -> String {
    format!(
        "the disk holding the state directory is full, so nothing was written ({e}); reads still work, \
         and writes are accepted again by themselves once space is freed"
    )
}

/// Logs a full disk once when writes start failing for that reason (then at most once a
/// minute while it lasts), and once when a write succeeds again.
#[derive(Debug, Default)]
pub struct DiskFullLog {
    /// When the last "disk full" line was logged, in Unix ms; 0 while writes succeed.
    since_logged_ms: AtomicI64,
}

impl DiskFullLog {
    const REPEAT_MS: i64 = 60_000;

    /// Note the outcome of a write.
    pub fn note<T>(&self, res: &Result<T, StoreError>) {
        match res {
            Err(e) if e.is_disk_full() => {
                let now = now_ms();
                let last = self.since_logged_ms.load(Ordering::Relaxed);
                if (last == 0 || now - last >= Self::REPEAT_MS)
                    && self
                        .since_logged_ms
                        .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok()
                {
                    tracing::error!(error = %e, "the disk holding the state directory is full: writes are refused (reads still work) until space is freed");
                }
            }
            Ok(_) if self.since_logged_ms.swap(0, Ordering::Relaxed) != 0 => {
                tracing::info!(
                    "writes succeed again: the disk holding the state directory has room"
                );
            }
            _ => {}
        }
    }
}

/// A panic's message, when it has one that is text (the reason of a
/// [`StoreError::Panicked`]).
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}
