//! The last calls made to one extension, each with its method, latency and outcome, kept only
//! when the daemon asks (development installs, for `conduit ext dev`): the
//! `GET /v1/extensions/{name}/calls` endpoint reads it.
//!
//! Not a log and not telemetry: a bounded ring of [`JOURNAL_CAPACITY`] entries in memory,
//! gone with the daemon. An extension that is not journaled pays one relaxed atomic load per
//! call.
//!
//! Invariant: sequence numbers come from one counter for the whole process, so they only grow,
//! also across the restarts of a package (each run of the supervisor makes a new handle): a
//! reader that asks for what came after the last number it saw never misses or repeats an
//! entry, and learns how many fell off the ring in between.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use conduit_rpc::CallError;
use serde::{Deserialize, Serialize};

use crate::status::now_ms;

/// How many calls a journal keeps; older ones are dropped (and counted as missed by a reader
/// that asks for them).
pub const JOURNAL_CAPACITY: usize = 1024;

/// The next entry's sequence number, for every journal of the process.
static NEXT_SEQ: AtomicU64 = AtomicU64::new(1);

/// One call, as the host made it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallEntry {
    /// Grows by one per journaled call across the daemon (see the module invariant).
    pub seq: u64,
    /// When the call ended, in Unix milliseconds.
    pub at_ms: i64,
    pub method: String,
    /// From the request written to the answer read, in microseconds.
    pub took_us: u64,
    /// `ok`, or `error` with the code and message below.
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The entries after a sequence number ([`Journal::after`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalPage {
    pub calls: Vec<CallEntry>,
    /// Calls after the asked number that fell off the ring before they were read.
    pub missed: u64,
    /// The number to ask after next time: the last entry's, or the one asked after.
    pub next: u64,
}

/// One extension's journal: off until [`Journal::enable`].
#[derive(Debug, Default)]
pub struct Journal {
    on: AtomicBool,
    entries: Mutex<VecDeque<CallEntry>>,
}

impl Journal {
    /// Keep every call from now on.
    pub fn enable(&self) {
        self.on.store(true, Ordering::Relaxed);
    }

    pub fn is_enabled(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Keep one call, if enabled. `error` is how it failed.
    pub(crate) fn record(&self, method: &str, took: Duration, error: Option<&CallError>) {
        if !self.is_enabled() {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        // Numbered under the lock, so the ring stays in order.
        let seq = NEXT_SEQ.fetch_add(1, Ordering::Relaxed);
        if entries.len() == JOURNAL_CAPACITY {
            entries.pop_front();
        }
        entries.push_back(CallEntry {
            seq,
            at_ms: now_ms(),
            method: method.to_owned(),
            took_us: took.as_micros() as u64,
            outcome: if error.is_some() { "error" } else { "ok" }.to_owned(),
            error_code: error.map(CallError::code),
            error: error.map(ToString::to_string),
        });
    }

    /// The calls after sequence number `after` (0: every one kept), at most `limit`, oldest
    /// first.
    pub fn after(&self, after: u64, limit: usize) -> JournalPage {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        page(&entries, after, limit)
    }
}

/// What [`Journal::after`] answers, over the kept entries.
fn page(entries: &VecDeque<CallEntry>, after: u64, limit: usize) -> JournalPage {
    let calls: Vec<CallEntry> = entries
        .iter()
        .filter(|e| e.seq > after)
        .take(limit)
        .cloned()
        .collect();
    // Numbers are shared by every journal of the process, so a gap is only a miss when this
    // journal's oldest kept entry was itself pushed out: the ring is full.
    let missed = match entries.front() {
        Some(first) if after > 0 && entries.len() == JOURNAL_CAPACITY && first.seq > after + 1 => {
            // At least one of ours fell off; how many of the numbers in between were ours is
            // not known, so this is an upper bound.
            first.seq - after - 1
        }
        _ => 0,
    };
    let next = calls.last().map_or(after, |c| c.seq);
    JournalPage {
        calls,
        missed,
        next,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_until_enabled_then_bounded_and_read_after_a_number() {
        let j = Journal::default();
        j.record("echo", Duration::from_micros(5), None);
        assert!(j.after(0, 100).calls.is_empty(), "off: nothing kept");
        j.enable();
        let closed = CallError::DeadlineExceeded {
            method: "work_kind.trigger".into(),
            deadline: Duration::from_millis(250),
        };
        j.record("echo", Duration::from_micros(7), None);
        j.record("work_kind.trigger", Duration::from_millis(3), Some(&closed));
        let all = j.after(0, 100);
        assert_eq!(all.calls.len(), 2);
        assert_eq!(all.calls[0].outcome, "ok");
        assert_eq!(all.calls[1].outcome, "error");
        assert_eq!(all.calls[1].took_us, 3000);
        assert_eq!(all.calls[1].error_code, Some(closed.code()));
        assert_eq!(all.missed, 0);
        let rest = j.after(all.calls[0].seq, 100);
        assert_eq!(rest.calls.len(), 1);
        assert_eq!(rest.next, all.calls[1].seq);
        assert_eq!(j.after(all.next, 100).calls.len(), 0);
        assert_eq!(j.after(all.next, 100).next, all.next);
        // At capacity the oldest goes; a reader behind it learns how many it missed.
        let first = all.calls[0].seq;
        for _ in 0..JOURNAL_CAPACITY {
            j.record("echo", Duration::from_micros(1), None);
        }
        let page = j.after(first, 10);
        assert_eq!(page.calls.len(), 10);
        assert!(page.missed >= 1, "{page:?}");
        assert_eq!(j.after(0, usize::MAX).calls.len(), JOURNAL_CAPACITY);
    }
}
