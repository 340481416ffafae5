//! The work that waits for one extension — unrouted events of the kinds it owns, its active
//! timers and waits, its planned emissions — counted for `conduit ext disable` and
//! `conduit ext remove`, and dropped for their `--drop-pending`.
//!
//! The one home of the rule "what waits for an extension": the daemon's API and the CLI (when
//! no daemon runs, on the store directly) both call [`count`] and [`drop_pending`]. Which
//! extension owns an event's kind is the host loop's own rule (`host_loop::event_owner`), over
//! every installed extension's capabilities, disabled ones included.
//!
//! Invariant: dropping erases nothing; events are routed to no Work, timers deleted and waits
//! cancelled as by hand (kept, with when), emissions failed with [`DROPPED`] as the reason, in
//! one transaction.

use std::sync::atomic::{AtomicU64, Ordering};

use conduit_protocol::Capabilities;
use conduit_store::{ReadTx, StoreError, WriteTx};
use serde::{Deserialize, Serialize};

use super::host_loop::decide::event_owner;

/// The error a dropped emission fails with.
pub const DROPPED: &str =
    "dropped by the operator with its extension's pending work (--drop-pending)";

/// How much work waits for one extension (or was dropped).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    /// Unrouted events of the kinds it owns.
    pub events: u64,
    /// Its active timers.
    pub timers: u64,
    /// Its active waits.
    pub waits: u64,
    /// Its planned emissions.
    pub emissions: u64,
}

impl Pending {
    pub fn total(&self) -> u64 {
        self.events + self.timers + self.waits + self.emissions
    }

    /// `2 events and 1 timer`; `nothing` when none.
    pub fn describe(&self) -> String {
        self.sentence(false)
    }

    /// The log line of a drop, once it is committed: one wording and one set of fields for the
    /// daemon's API and the CLI without a daemon.
    pub fn log_dropped(&self, extension: &str) {
        tracing::warn!(
            extension,
            events = self.events,
            timers = self.timers,
            waits = self.waits,
            emissions = self.emissions,
            "dropped the work that waited for a disabled extension, as the operator asked (--drop-pending)"
        );
    }

    /// What dropping did to each: `2 events (routed to no Work) and 1 timer (deleted)`.
    pub fn describe_dropped(&self) -> String {
        self.sentence(true)
    }

    fn sentence(&self, dropped: bool) -> String {
        let parts: Vec<String> = [
            (self.events, "event", "routed to no Work"),
            (self.timers, "timer", "deleted"),
            (self.waits, "wait", "cancelled"),
            (self.emissions, "emission", "failed"),
        ]
        .iter()
        .filter(|(n, _, _)| *n > 0)
        .map(|(n, what, how)| {
            let plural = if *n == 1 { "" } else { "s" };
            match dropped {
                true => format!("{n} {what}{plural} ({how})"),
                false => format!("{n} {what}{plural}"),
            }
        })
        .collect();
        match parts.as_slice() {
            [] => "nothing".to_owned(),
            [one] => one.clone(),
            [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
        }
    }
}

/// The event kinds, among those waiting, whose events `ext` owns, given every installed
/// extension's capabilities in name order.
fn owned_kinds(
    unrouted: &[(String, u64)],
    ext: &str,
    owners: &[(String, Capabilities)],
) -> Vec<(String, u64)> {
    unrouted
        .iter()
        .filter(|(kind, _)| {
            event_owner(kind, owners.iter().map(|(n, c)| (n.as_str(), c))) == Some(ext)
        })
        .cloned()
        .collect()
}

/// What waits for `ext`, given every installed extension's capabilities (`owners`, in name
/// order; `ext` among them).
pub fn count(
    rd: &ReadTx<'_>,
    ext: &str,
    owners: &[(String, Capabilities)],
) -> Result<Pending, StoreError> {
    let events = owned_kinds(&rd.unrouted_kinds()?, ext, owners)
        .iter()
        .map(|(_, n)| n)
        .sum();
    let owned = rd.owned_pending(ext)?;
    Ok(Pending {
        events,
        timers: owned.timers,
        waits: owned.waits,
        emissions: owned.emissions,
    })
}

/// Drop what waits for `ext` (see the module's invariant); what was dropped.
pub fn drop_pending(
    tx: &mut WriteTx<'_>,
    ext: &str,
    owners: &[(String, Capabilities)],
    now: i64,
) -> Result<Pending, StoreError> {
    let mut events = 0;
    for (kind, _) in owned_kinds(&tx.unrouted_kinds()?, ext, owners) {
        events += tx.route_kind_to_nothing(&kind, now)?;
    }
    Ok(Pending {
        events,
        timers: tx.delete_timers_of(ext, now)?,
        waits: tx.cancel_waits_of(ext, now)?,
        emissions: tx.fail_emissions_of(ext, DROPPED, now)?,
    })
}

/// Pending work operators dropped since the daemon started, for the metrics.
#[derive(Debug, Default)]
pub struct DroppedCounts {
    events: AtomicU64,
    timers: AtomicU64,
    waits: AtomicU64,
    emissions: AtomicU64,
}

impl DroppedCounts {
    pub fn add(&self, p: &Pending) {
        self.events.fetch_add(p.events, Ordering::Relaxed);
        self.timers.fetch_add(p.timers, Ordering::Relaxed);
        self.waits.fetch_add(p.waits, Ordering::Relaxed);
        self.emissions.fetch_add(p.emissions, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> Pending {
        Pending {
            events: self.events.load(Ordering::Relaxed),
            timers: self.timers.load(Ordering::Relaxed),
            waits: self.waits.load(Ordering::Relaxed),
            emissions: self.emissions.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use conduit_protocol::handshake::WorkKind;

    use super::*;

    fn caps(kinds: &[&str]) -> Capabilities {
        let mut c = Capabilities::default();
        c.work_kinds = kinds.iter().map(|k| WorkKind::new(*k, true)).collect();
        c
    }

    #[test]
    fn pending_work_reads_as_a_sentence() {
        let p = |events, timers, waits, emissions| Pending {
            events,
            timers,
            waits,
            emissions,
        };
        assert_eq!(p(0, 0, 0, 0).describe(), "nothing");
        assert_eq!(p(2, 0, 0, 0).describe(), "2 events");
        assert_eq!(p(1, 1, 0, 0).describe(), "1 event and 1 timer");
        assert_eq!(p(2, 0, 3, 1).describe(), "2 events, 3 waits and 1 emission");
        assert_eq!(p(2, 0, 3, 1).total(), 6);
        assert_eq!(
            p(2, 1, 0, 0).describe_dropped(),
            "2 events (routed to no Work) and 1 timer (deleted)"
        );
    }

    #[test]
    fn an_extension_owns_the_waiting_kinds_the_host_loop_would_route_to_it() {
        let owners = vec![
            ("a".to_owned(), caps(&["note"])),
            ("b".to_owned(), caps(&["note.posted", "job"])),
        ];
        let unrouted = vec![
            ("job".to_owned(), 1),
            ("mail".to_owned(), 4),
            ("note.edited".to_owned(), 2),
            ("note.posted".to_owned(), 3),
        ];
        assert_eq!(
            owned_kinds(&unrouted, "a", &owners),
            vec![("note.edited".to_owned(), 2)]
        );
        assert_eq!(
            owned_kinds(&unrouted, "b", &owners),
            vec![("job".to_owned(), 1), ("note.posted".to_owned(), 3)]
        );
        assert!(owned_kinds(&unrouted, "c", &owners).is_empty());
    }
}
