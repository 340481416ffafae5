//! The three steps of a pass that each take a page of records: fire due timers
//! (`recurrence.next`), match active waits against new events (`dependency.filter`) and commit
//! planned emissions (`emit.commit`), each call in its own write transaction through
//! `HostLoop::in_tx_call` and `HostLoop::write`, as routing's in `mod.rs`.
//!
//! What this does not do: decide anything itself (`decide.rs` has the fallbacks), or wait for the
//! next page: a pass that read a full page of due timers or planned emissions it could act on
//! sets `PassReport::more`, and the loop starts the next pass at once. Waits are read a page
//! after the last one matched (back to the first after a short page), so every active wait is
//! reached however many there are; a full page with new events to match sets `more` too.
//!
//! Invariant: each step reads at most [`PASS_LIMIT`] records (and [`WAIT_EVENTS`] events per
//! wait), and skips what a settling or degraded extension would be called for.

use conduit_protocol::calls::{CommitParams, FilterParams, RecurrenceParams};
use conduit_protocol::methods::{DependencyFilter, EmitCommit, RecurrenceNext, host};
use conduit_supervisor::now_ms;

use super::decide::{self, Commit};
use super::{Exts, HostLoop, PASS_LIMIT, PassReport, WAIT_EVENTS};

impl HostLoop {
    pub(super) fn fire_timers(
        &self,
        exts: &Exts,
        settling: &Exts,
        r: &mut PassReport,
    ) -> Result<(), conduit_store::StoreError> {
        let now = now_ms();
        let due = self.core.store.read(|rd| rd.due_timers(now, PASS_LIMIT))?;
        // A fired timer is rescheduled past now, so the next page is other timers.
        r.more |= due.len() == PASS_LIMIT as usize
            && due.iter().any(|t| !self.held(settling, &t.extension));
        for t in due {
            if self.shutdown.is_cancelled() {
                return Ok(());
            }
            if self.held(settling, &t.extension) {
                self.demand(settling, &t.extension, || {
                    format!("started by timer {} of recurrence {}", t.id, t.recurrence)
                });
                continue;
            }
            let ext = exts.get(&t.extension).map(|(e, _)| e);
            let mut fell_back = None;
            self.write(|tx| {
                let fired_at = now_ms();
                let params =
                    RecurrenceParams::new(t.recurrence.clone(), t.id, t.spec.clone(), fired_at);
                let (next, why) = self
                    .in_tx_call::<RecurrenceNext, _>(ext, &params, |res| {
                        res.check(fired_at).map_err(|e| e.0)
                    })
                    .or_fallback(|_| decide::recurrence_fallback(fired_at));
                fell_back = why;
                tx.reschedule_timer(t.id, next, fired_at)
            })?;
            if let Some(why) = fell_back {
                self.count_fallback(r, &t.extension, host::RECURRENCE_NEXT, &why);
            }
            r.timers_fired += 1;
        }
        Ok(())
    }

    pub(super) fn match_waits(
        &self,
        exts: &Exts,
        settling: &Exts,
        r: &mut PassReport,
    ) -> Result<(), conduit_store::StoreError> {
        let after = self.waits_after.get();
        let waits = self
            .core
            .store
            .read(|rd| rd.active_waits(Some(after), PASS_LIMIT))?;
        // The next pass takes the next page; after a short one, the first page again.
        let full = waits.len() == PASS_LIMIT as usize;
        self.waits_after.set(if full {
            waits.last().map_or(0, |w| w.id)
        } else {
            0
        });
        let checked_before = r.waits_checked;
        for w in waits {
            if self.shutdown.is_cancelled() {
                return Ok(());
            }
            let events = self
                .core
                .store
                .read(|rd| rd.events_after(w.cursor_event_id, WAIT_EVENTS))?;
            if events.is_empty() {
                continue;
            }
            if self.held(settling, &w.extension) {
                let why = || format!("started by wait {} of filter {}", w.id, w.filter);
                self.demand(settling, &w.extension, why);
                continue;
            }
            r.waits_checked += 1;
            let ext = exts.get(&w.extension).map(|(e, _)| e);
            for ev in events {
                // The extension failed on an earlier event of this wait: the rest waits.
                if !self.callable(&w.extension) {
                    break;
                }
                let ev_id = ev.id;
                let mut fell_back = None;
                let satisfied = self.write(|tx| {
                    let params = FilterParams::new(w.filter.clone(), w.id, w.subject.clone(), ev);
                    let (satisfied, why) = self
                        .in_tx_call::<DependencyFilter, _>(ext, &params, |res| Ok(res.satisfied))
                        .or_fallback(|_| decide::filter_fallback());
                    fell_back = why;
                    if satisfied {
                        tx.satisfy_wait(w.id, ev_id, now_ms())?;
                    } else {
                        tx.advance_wait(w.id, ev_id)?;
                    }
                    Ok(satisfied)
                })?;
                if let Some(why) = fell_back {
                    self.count_fallback(r, &w.extension, host::DEPENDENCY_FILTER, &why);
                }
                if satisfied {
                    r.waits_satisfied += 1;
                    break;
                }
            }
        }
        // A full page that had new events to match: the next page may too.
        r.more |= full && r.waits_checked > checked_before;
        Ok(())
    }

    pub(super) fn commit_emissions(
        &self,
        exts: &Exts,
        settling: &Exts,
        r: &mut PassReport,
    ) -> Result<(), conduit_store::StoreError> {
        let planned = self
            .core
            .store
            .read(|rd| rd.planned_emissions(PASS_LIMIT))?;
        // A committed or failed emission is no longer planned: the next page is others.
        r.more |= planned.len() == PASS_LIMIT as usize
            && planned.iter().any(|em| !self.held(settling, &em.extension));
        for em in planned {
            if self.shutdown.is_cancelled() {
                return Ok(());
            }
            if self.held(settling, &em.extension) {
                self.demand(settling, &em.extension, || {
                    format!("started by emission {} ({}) to commit", em.id, em.emission)
                });
                continue;
            }
            let ext = exts.get(&em.extension).map(|(e, _)| e);
            let mut failed = None;
            self.write(|tx| {
                let params = CommitParams::new(
                    em.emission.clone(),
                    em.commit_id.clone(),
                    em.payload.clone(),
                )
                .with_work_id(em.work_id);
                let (commit, why) = self
                    .in_tx_call::<EmitCommit, _>(ext, &params, |res| {
                        res.check().map_err(|e| e.0)?;
                        Ok(Commit::Records(res.records))
                    })
                    .or_fallback(decide::commit_fallback);
                failed = why;
                match commit {
                    Commit::Records(records) => tx.commit_emission(em.id, &records, now_ms()),
                    Commit::Fail(why) => tx.fail_emission(em.id, &why, now_ms()),
                }
            })?;
            match failed {
                Some(why) => {
                    self.count_fallback(r, &em.extension, host::EMIT_COMMIT, &why);
                    r.emissions_failed += 1;
                }
                None => r.emissions_committed += 1,
            }
        }
        Ok(())
    }
}
