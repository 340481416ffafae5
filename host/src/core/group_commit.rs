//! Group commit for ingress: the events of concurrent callers (`POST /v1/events`, the
//! `ingress.push` callbacks, ingress polls) share one write transaction and one fsync, and each
//! caller is answered only after the commit that holds its events.
//!
//! ```text
//!   caller ─┐  enqueue    ┌──────────── the committer (at most one, on the blocking pool) ───────────┐
//!   caller ─┼──► queue ──►│ BEGIN IMMEDIATE; take the queue's head (≤ 1,000 events, ≤ 8 MiB);      │
//!   caller ─┘             │ each submission in its own SAVEPOINT (RELEASE, or ROLLBACK TO on failure)│
//!                         │ COMMIT ──► answer each caller ──► stamp the new events, nudge the loop   │
//!                         └───────────────── again while the queue holds anything ───────────────────┘
//! ```
//!
//! No fixed wait: the first caller to find no committer running starts one, which begins at
//! once, so an event alone is not delayed. Callers that arrive while a commit runs wait in the
//! queue and form the next batch. The batch is taken after `BEGIN IMMEDIATE` succeeded, so
//! callers that arrive while another write (the host loop's) holds the writer join it too.
//!
//! What this does not do: check events (the protocol's rules are checked by each caller before
//! it queues, so a malformed or too-deep event never reaches a batch), nudge the host loop or
//! time anything (the committer's caller does that after each commit, `ops.rs`), or bound the
//! queue: every caller is already bounded (the API's connection cap, 64 callbacks per extension,
//! one poll per source), and each holds its request in memory either way.
//!
//! Invariants:
//! A caller's events with the poll cursor to move with them are one [`Submission`].
//!
//! - A caller is answered after the `COMMIT` that holds its events returned, or with why its
//!   submission (or the whole transaction) failed; never before, and exactly once.
//! - Submissions are written in the order they were queued, each one's events in its order:
//!   event ids follow arrival, and a caller that was answered before another queued sees its
//!   events before the other's. A delivery (`source`, `delivery_id`) pushed twice in one batch
//!   is accepted once: the second finds the first's row inside the same transaction and is a
//!   duplicate, as it would be in the next transaction.
//! - One submission's failure rolls back its savepoint only (its events and its cursor); a
//!   failure of the transaction (`BEGIN`, `COMMIT`, SQLite rolling the whole back, a panic)
//!   answers every caller of the batch with it, and nothing of the batch is written.
//! - At most one committer runs; it stops only with the queue empty, under the queue's lock, so
//!   a submission is never left queued without a committer.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, MutexGuard};

use conduit_protocol::CheckedPayload;
use conduit_store::{Accepted, Store, StoreError, WriteTx};
use tokio::sync::oneshot;

use super::fault::panic_text;

/// The most events one group commit takes (unless a single submission holds more).
pub const MAX_BATCH_EVENTS: usize = 1_000;

/// The most bytes (payloads, delivery ids and kinds) one group commit takes (unless a single
/// submission holds more).
pub const MAX_BATCH_BYTES: usize = 8 * 1024 * 1024;

/// An event to accept, its fields and payload depth already checked by the protocol's rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incoming {
    pub delivery_id: String,
    pub kind: String,
    pub payload: CheckedPayload,
}

impl Incoming {
    /// What the event weighs in a batch.
    fn bytes(&self) -> usize {
        self.delivery_id.len() + self.kind.len() + self.payload.as_str().len()
    }
}

/// Where an ingress poll got to, written with the events it returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IngressCursor {
    pub extension: String,
    pub cursor: String,
}

/// One caller's share of a batch: events from one source, and the cursor of the poll that
/// returned them (written with them, or not at all).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submission {
    pub source: String,
    pub events: Vec<Incoming>,
    pub cursor: Option<IngressCursor>,
}

impl Submission {
    /// (events, bytes): what the submission counts against a batch's bounds.
    pub fn weight(&self) -> (usize, usize) {
        let bytes = self.source.len() + self.events.iter().map(Incoming::bytes).sum::<usize>();
        (self.events.len(), bytes)
    }
}

/// How many of the queued submissions, given as their weights oldest first, the next commit
/// takes: the oldest always (one larger than a batch is committed alone), then each next one
/// while the batch stays within both bounds. Stops at the first that does not fit, so the
/// order of arrival is kept.
pub fn batch_len(
    weights: impl IntoIterator<Item = (usize, usize)>,
    max_events: usize,
    max_bytes: usize,
) -> usize {
    let (mut n, mut events, mut bytes) = (0, 0usize, 0usize);
    for (e, b) in weights {
        let (e2, b2) = (events.saturating_add(e), bytes.saturating_add(b));
        if n > 0 && (e2 > max_events || b2 > max_bytes) {
            break;
        }
        (n, events, bytes) = (n + 1, e2, b2);
    }
    n
}

/// What each caller of a batch is answered: one [`Accepted`] per event, in order, or why its
/// submission was refused.
pub type Answer = Result<Vec<Accepted>, StoreError>;

/// A submission waiting for its commit, with the caller's answer slot.
struct Waiting {
    submission: Submission,
    reply: oneshot::Sender<Answer>,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiting>,
    /// A committer runs (it clears this itself, under the lock, when it finds nothing queued).
    committing: bool,
}

/// What one commit did, for the caller of [`GroupCommit::run`] (stamps, nudge, counters).
#[derive(Debug)]
pub struct Committed<'a> {
    /// The transaction's outcome: `Err` when it failed as a whole.
    pub result: Result<(), &'a StoreError>,
    /// Each submission's answer, in the batch's order (all `Err` when the transaction failed).
    pub answers: &'a [Answer],
    /// How many events each submission held, in the same order.
    pub sizes: &'a [usize],
    /// The ids of the new events the transaction wrote before `COMMIT` (handed to `written`):
    /// in the store when `result` is `Ok`, rolled back with it otherwise.
    pub written: &'a [i64],
}

/// A commit's events by outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Events this commit created.
    pub new: usize,
    /// Events accepted before (this commit wrote nothing for them).
    pub duplicate: usize,
    /// Events of submissions refused (on their own, or with their whole transaction).
    pub refused: usize,
}

/// The ids of the events these answers created (not the duplicates).
fn fresh(answers: &[Answer]) -> impl Iterator<Item = i64> + '_ {
    answers
        .iter()
        .filter_map(|a| a.as_ref().ok())
        .flatten()
        .filter(|a| !a.duplicate)
        .map(|a| a.event_id)
}

impl Committed<'_> {
    /// The commit's events by outcome.
    pub fn tally(&self) -> Tally {
        let mut t = Tally::default();
        for (a, n) in self.answers.iter().zip(self.sizes) {
            match a {
                Ok(accepted) => {
                    let dup = accepted.iter().filter(|a| a.duplicate).count();
                    t.duplicate += dup;
                    t.new += accepted.len() - dup;
                }
                Err(_) => t.refused += n,
            }
        }
        t
    }
}

/// The ingress queue and its committer.
#[derive(Default)]
pub struct GroupCommit {
    queue: Mutex<Queue>,
}

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let q = self.lock();
        f.debug_struct("GroupCommit")
            .field("waiting", &q.waiting.len())
            .field("committing", &q.committing)
            .finish()
    }
}

impl GroupCommit {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many submissions wait for a commit (not counting the batch being committed).
    pub fn queued(&self) -> usize {
        self.lock().waiting.len()
    }

    /// Queue a submission. The receiver gets its answer after its commit. `true` when no
    /// committer runs: the caller must start one ([`GroupCommit::run`]), at once.
    pub fn enqueue(&self, submission: Submission) -> (oneshot::Receiver<Answer>, bool) {
        let (reply, answer) = oneshot::channel();
        let mut q = self.lock();
        q.waiting.push_back(Waiting { submission, reply });
        let start = !q.committing;
        q.committing = true;
        (answer, start)
    }

    /// The committer: commits batches while submissions wait and answers their callers.
    /// `written` sees the ids of each batch's new events inside its transaction, before
    /// `COMMIT` (the writer held: keep it short); `after` sees each commit's outcome after
    /// `COMMIT` returned, before the callers are answered. Blocking; returns when the queue is
    /// empty. Run it only when [`GroupCommit::enqueue`] said so.
    pub fn run(
        &self,
        store: &Store,
        now_ms: impl Fn() -> i64,
        written: impl Fn(&[i64]),
        after: impl Fn(&Committed<'_>),
    ) {
        // Should anything below unwind, no caller is left waiting and the next one starts a
        // committer again.
        let guard = Stopping(self);
        while self.more() {
            let (mut batch, mut new) = (Vec::new(), Vec::new());
            let res = catch_unwind(AssertUnwindSafe(|| {
                store.write(|tx| {
                    batch = self.take();
                    let answers = write_batch(tx, &batch, now_ms())?;
                    new = fresh(&answers).collect();
                    written(&new);
                    Ok(answers)
                })
            }))
            .unwrap_or_else(|panic| {
                Err(StoreError::Panicked {
                    what: "group commit",
                    reason: panic_text(panic.as_ref()),
                })
            });
            if batch.is_empty() {
                // `BEGIN` failed before the batch was taken: the callers at the head are
                // answered with why, rather than retried here without end.
                batch = self.take();
            }
            let (result, answers) = match res {
                Ok(answers) => (Ok(()), answers),
                Err(e) => {
                    let answers = batch.iter().map(|_| Err(e.shared())).collect();
                    (Err(e), answers)
                }
            };
            let sizes: Vec<usize> = batch.iter().map(|w| w.submission.events.len()).collect();
            let outcome = Committed {
                result: result.as_ref().map(|_| ()),
                answers: &answers,
                sizes: &sizes,
                written: &new,
            };
            // The stamps and counters first: a caller answered may look at them at once.
            after(&outcome);
            for (w, a) in batch.into_iter().zip(answers) {
                // A caller that gave up (its connection closed) is not waited for.
                let _ = w.reply.send(a);
            }
        }
        std::mem::forget(guard);
    }

    /// Whether anything waits; when nothing does, the committer stops (under the same lock, so
    /// a submission queued after this starts the next one).
    fn more(&self) -> bool {
        let mut q = self.lock();
        if q.waiting.is_empty() {
            q.committing = false;
            return false;
        }
        true
    }

    /// The next batch from the queue's head (see [`batch_len`]).
    fn take(&self) -> Vec<Waiting> {
        let mut q = self.lock();
        let n = batch_len(
            q.waiting.iter().map(|w| w.submission.weight()),
            MAX_BATCH_EVENTS,
            MAX_BATCH_BYTES,
        );
        q.waiting.drain(..n).collect()
    }
}

/// Fails every caller still queued and lets the next caller start a committer, if the
/// committer unwinds (a bug: the transaction's own panic is caught and answered).
struct Stopping<'a>(&'a GroupCommit);

impl Drop for Stopping<'_> {
    fn drop(&mut self) {
        let mut q = self.0.lock();
        q.committing = false;
        for w in q.waiting.drain(..) {
            let _ = w.reply.send(Err(StoreError::Panicked {
                what: "group commit",
                reason: "the committer stopped".into(),
            }));
        }
    }
}

/// Each submission of a batch in its own savepoint. The outer `Err` is the transaction lost;
/// each inner answer is one submission's.
fn write_batch(
    tx: &mut WriteTx<'_>,
    batch: &[Waiting],
    now: i64,
) -> Result<Vec<Answer>, StoreError> {
    batch
        .iter()
        .map(|w| tx.isolated(|tx| write_submission(tx, &w.submission, now)))
        .collect()
}

/// One submission: its events, then its cursor, in the transaction they commit in.
pub fn write_submission(tx: &mut WriteTx<'_>, d: &Submission, now: i64) -> Answer {
    let accepted = d
        .events
        .iter()
        .map(|e| tx.accept_checked(&d.source, &e.delivery_id, &e.kind, &e.payload, now))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(c) = &d.cursor {
        tx.set_ingress_cursor(&c.extension, &d.source, &c.cursor, now)?;
    }
    Ok(accepted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_takes_the_oldest_always_then_what_fits_in_both_bounds() {
        // Nothing queued: nothing taken.
        assert_eq!(batch_len([], 10, 100), 0);
        // Everything fits.
        assert_eq!(batch_len([(1, 10), (1, 10), (1, 10)], 10, 100), 3);
        // At the event bound exactly, and one past it.
        assert_eq!(batch_len([(4, 1), (6, 1), (1, 1)], 10, 100), 2);
        // At the byte bound exactly, and one past it.
        assert_eq!(batch_len([(1, 60), (1, 40), (1, 1)], 10, 100), 2);
        // A submission larger than a batch goes alone, first or next.
        assert_eq!(batch_len([(50, 1), (1, 1)], 10, 100), 1);
        assert_eq!(batch_len([(1, 1), (1, 500), (1, 1)], 10, 100), 1);
        // Order is kept: a small one behind one that does not fit waits too.
        assert_eq!(batch_len([(9, 1), (2, 1), (1, 1)], 10, 100), 1);
    }

    #[test]
    fn a_commit_tallies_its_events_by_outcome() {
        let accepted = |event_id, duplicate| Accepted {
            event_id,
            duplicate,
        };
        let answers = vec![
            Ok(vec![accepted(1, false), accepted(1, true)]),
            Err(StoreError::Invalid {
                field: "payload",
                reason: "refused".into(),
            }),
            Ok(vec![accepted(2, false)]),
            Ok(vec![]),
        ];
        let c = Committed {
            result: Ok(()),
            answers: &answers,
            sizes: &[2, 3, 1, 0],
            written: &[1, 2],
        };
        assert_eq!(
            c.tally(),
            Tally {
                new: 2,
                duplicate: 1,
                refused: 3
            }
        );
        assert_eq!(fresh(c.answers).collect::<Vec<_>>(), c.written);
    }

    #[test]
    fn the_bounds_are_a_thousand_events_or_eight_mib() {
        let one = (1, 200);
        assert_eq!(
            batch_len(
                std::iter::repeat_n(one, 5_000),
                MAX_BATCH_EVENTS,
                MAX_BATCH_BYTES
            ),
            1_000
        );
        let mib = (1, 1024 * 1024);
        assert_eq!(
            batch_len(
                std::iter::repeat_n(mib, 20),
                MAX_BATCH_EVENTS,
                MAX_BATCH_BYTES
            ),
            8
        );
    }

    #[test]
    fn a_submission_weighs_its_events_and_their_bytes() {
        let raw = serde_json::value::RawValue::from_string(r#"{"a":1}"#.into()).unwrap();
        let e = Incoming {
            delivery_id: "d-1".into(),
            kind: "note".into(),
            payload: CheckedPayload::check(raw).unwrap(),
        };
        let d = Submission {
            source: "inbox".into(),
            events: vec![e.clone(), e],
            cursor: None,
        };
        assert_eq!(d.weight(), (2, 5 + 2 * (3 + 4 + 7)));
    }
}
