//! The host loop's counters, for the health endpoint and the metrics.
//!
//! Plain atomics the loop bumps and readers load with `Relaxed`: a snapshot is a set of
//! counters read one by one, never a consistent cut across them.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of the host loop, for the health endpoint.
#[derive(Debug, Default)]
pub struct LoopStats {
    pub passes: AtomicU64,
    pub last_pass_us: AtomicU64,
    /// The passes' durations added up, for the mean pass.
    pub pass_us_total: AtomicU64,
    pub in_transaction_calls: AtomicU64,
    pub fallbacks: AtomicU64,
    /// Passes that panicked (a bug; the loop goes on).
    pub panics: AtomicU64,
}

impl LoopStats {
    pub fn snapshot(&self) -> serde_json::Value {
        serde_json::json!({
            "passes": self.passes.load(Ordering::Relaxed),
            "last_pass_us": self.last_pass_us.load(Ordering::Relaxed),
            "pass_us_total": self.pass_us_total.load(Ordering::Relaxed),
            "in_transaction_calls": self.in_transaction_calls.load(Ordering::Relaxed),
            "fallbacks": self.fallbacks.load(Ordering::Relaxed),
            "panics": self.panics.load(Ordering::Relaxed),
        })
    }
}
