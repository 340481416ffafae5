//! The bookkeeping of one ingress source's polls, and the pure decision whether it is polled
//! now ([`PollState::due`]) over it and an injected `now`; `ingress.rs` gathers the facts,
//! starts the polls and applies the outcome.
//!
//! Invariant: at most one poll of an (extension, source) is outstanding, and polls of it begin
//! at most once per [`INGRESS_INTERVAL`].

use std::time::{Duration, Instant};

/// How often each ingress source is polled, at most.
pub const INGRESS_INTERVAL: Duration = Duration::from_secs(1);
/// The poll bookkeeping of one (extension, source).
#[derive(Debug, Default)]
pub(crate) struct PollState {
    outstanding: bool,
    last: Option<Instant>,
    /// The pid of an extension run that answered `method_not_found`: not polled again until it
    /// restarts.
    declined_by: Option<u32>,
}

impl PollState {
    /// Whether the source is polled at `now` by the run `pid`: none outstanding, the last
    /// begun at least [`INGRESS_INTERVAL`] ago, and not declined by this run.
    pub(crate) fn due(&self, now: Instant, pid: Option<u32>) -> bool {
        let recent = self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < INGRESS_INTERVAL);
        let declined = self.declined_by.is_some() && self.declined_by == pid;
        !(self.outstanding || recent || declined)
    }

    /// A poll begins at `now`.
    pub(super) fn begin(&mut self, now: Instant) {
        self.outstanding = true;
        self.last = Some(now);
    }

    /// The outstanding poll of run `pid` ended; `declined` if it answered `method_not_found`.
    pub(super) fn end(&mut self, declined: bool, pid: Option<u32>) {
        self.outstanding = false;
        if declined {
            self.declined_by = pid;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_polled_once_per_interval_and_one_at_a_time() {
        let t0 = Instant::now();
        let mut st = PollState::default();
        assert!(st.due(t0, Some(7)));
        st.begin(t0);
        // Outstanding: not again, however long it takes.
        assert!(!st.due(t0 + INGRESS_INTERVAL * 5, Some(7)));
        st.end(false, Some(7));
        // Answered at once: the next waits for the interval from the last begin.
        assert!(!st.due(t0 + INGRESS_INTERVAL / 2, Some(7)));
        assert!(st.due(t0 + INGRESS_INTERVAL, Some(7)));
        // A clock read before the last begin counts as no time passed.
        assert!(!st.due(t0, Some(7)));
    }

    #[test]
    fn a_run_that_declines_is_not_polled_until_it_restarts() {
        let t0 = Instant::now();
        let later = t0 + INGRESS_INTERVAL * 2;
        let mut st = PollState::default();
        st.begin(t0);
        st.end(true, Some(7));
        assert!(!st.due(later, Some(7)));
        assert!(st.due(later, Some(8)));
        // Not running now (no pid): a decline by a run says nothing about the next.
        assert!(st.due(later, None));
    }

    #[test]
    fn a_decline_with_no_pid_declines_nothing() {
        let t0 = Instant::now();
        let mut st = PollState::default();
        st.begin(t0);
        st.end(true, None);
        assert!(st.due(t0 + INGRESS_INTERVAL, None));
    }
}
