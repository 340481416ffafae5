//! The host loop's decisions, as pure functions of the facts a pass gathers.
//!
//! A pass reads facts (the extensions' states and capabilities, the store's rows, the answers
//! of in-transaction calls) and applies outcomes (store writes, counters, log lines); what it
//! does in between is decided here: which extensions settle, which extension owns a work kind,
//! where an event goes, and what value replaces a call that gave no usable answer
//! (`docs/protocol.md` §6). So every rule is tested without a store, a process or a clock,
//! as `conduit_supervisor::backoff` tests the restart policy.
//!
//! Invariant: nothing here does I/O or reads the clock; a time is always an argument.

use std::collections::{BTreeSet, HashMap, HashSet};

use conduit_protocol::Capabilities;
use conduit_protocol::calls::{Record, TriggerGroup, TriggerResult};
use conduit_supervisor::State;

/// When a timer's `recurrence.next` fails, it fires again this much later.
pub const RECURRENCE_FALLBACK_MS: i64 = 60_000;

/// How one in-transaction call ended for the step that made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Outcome<T> {
    /// An answer within the deadline that keeps the method's rules, as the step uses it.
    Answered(T),
    /// No usable answer (not made, late, refused or malformed): the call's fallback applies,
    /// for this reason.
    Fallback { why: String },
}

impl<T> Outcome<T> {
    /// The answer, or the value `fallback` gives for the reason; and the reason, if the
    /// fallback applied (the step counts and logs it after its transaction commits).
    pub(super) fn or_fallback(self, fallback: impl FnOnce(&str) -> T) -> (T, Option<String>) {
        match self {
            Outcome::Answered(v) => (v, None),
            Outcome::Fallback { why } => (fallback(&why), Some(why)),
        }
    }
}

/// What the settling decision needs to know of an extension's run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct StartFacts {
    pub(super) state: State,
    pub(super) restarts: u32,
    /// Whether a handshake has ever chosen a protocol version.
    pub(super) handshaken: bool,
}

impl StartFacts {
    pub(super) fn of(s: &conduit_supervisor::RunBrief) -> Self {
        StartFacts {
            state: s.state,
            restarts: s.restarts,
            handshaken: s.handshaken,
        }
    }

    /// Whether the extension is on its first start (the daemon just started, or it was just
    /// installed or enabled).
    pub(super) fn first_start(&self) -> bool {
        self.state == State::Starting && self.restarts == 0 && !self.handshaken
    }
}

/// The extensions a pass waits for rather than gives fallbacks: those on their first start.
/// Their work stays where it is until their handshake is done or fails, which the start
/// timeout bounds.
pub(super) fn settling<'a>(
    exts: impl IntoIterator<Item = (&'a str, StartFacts)>,
) -> BTreeSet<String> {
    exts.into_iter()
        .filter(|(_, f)| f.first_start())
        .map(|(name, _)| name.to_owned())
        .collect()
}

/// The work kinds the settling extensions declare: their events wait, unrouted.
pub(super) fn waiting_kinds<'a>(
    settling: impl IntoIterator<Item = &'a Capabilities>,
) -> HashSet<&'a str> {
    settling
        .into_iter()
        .flat_map(|c| c.work_kinds.iter().map(|k| k.name.as_str()))
        .collect()
}

/// Work kind → (its owner, whether the owner has a trigger), from the extensions in name
/// order: when two declare one work kind, the one whose name sorts first owns it, every pass
/// alike (`docs/operations.md` §6).
pub(super) fn owners<'a, E: ?Sized>(
    by_name: impl IntoIterator<Item = (&'a E, &'a Capabilities)>,
) -> HashMap<&'a str, (&'a E, bool)> {
    let mut kinds = HashMap::new();
    for (e, caps) in by_name {
        for k in &caps.work_kinds {
            kinds.entry(k.name.as_str()).or_insert((e, k.trigger));
        }
    }
    kinds
}

/// The work kind an event of kind `event_kind` is an input of: the longest declared work kind
/// that is `event_kind` itself or a prefix of it ending just before a dot (`a.b.c` → `a.b.c`,
/// else `a.b`, else `a`). `None` if no such kind is declared.
pub fn work_kind_of(event_kind: &str, declared: impl Fn(&str) -> bool) -> Option<&str> {
    let mut candidate = event_kind;
    loop {
        if declared(candidate) {
            return Some(candidate);
        }
        candidate = &candidate[..candidate.rfind('.')?];
    }
}

/// The batch an unrouted event joins this pass, named by its work kind (its own kind when no
/// one declares it: such a batch is marked routed to no Work); `None` if it waits, behind a
/// settling owner or a trigger owner that `callable` says this pass does not call.
pub(super) fn batch_of<'a, E: ?Sized>(
    event_kind: &'a str,
    owners: &HashMap<&str, (&E, bool)>,
    waiting: &HashSet<&str>,
    callable: impl Fn(&E) -> bool,
) -> Option<&'a str> {
    let declared = |k: &str| owners.contains_key(k) || waiting.contains(k);
    let kind = work_kind_of(event_kind, declared).unwrap_or(event_kind);
    if waiting.contains(kind) {
        return None;
    }
    match owners.get(kind) {
        Some((e, true)) if !callable(e) => None,
        _ => Some(kind),
    }
}

/// The trigger's fallback: each input to a Work of its own, keyed `event:<id>`, started.
pub fn fallback_groups(ids: &[i64]) -> Vec<TriggerGroup> {
    ids.iter()
        .map(|id| TriggerGroup::new(format!("event:{id}"), vec![*id]))
        .collect()
}

/// Whether the loop uses a trigger answer for a batch of `ids`: the protocol's rule
/// (`TriggerResult::check`), the one `conduit ext check` applies too; `Err` says why the
/// fallback applies.
pub fn trigger_verdict(res: &TriggerResult, ids: &[i64]) -> Result<(), String> {
    res.check(ids).map_err(|e| e.0)
}

/// The recurrence's fallback: a timer fired at `fired_at` (Unix ms) fires again
/// [`RECURRENCE_FALLBACK_MS`] later.
pub(super) fn recurrence_fallback(fired_at: i64) -> Option<i64> {
    Some(fired_at + RECURRENCE_FALLBACK_MS)
}

/// The filter's fallback: the wait is not satisfied by the event (its cursor moves past it).
pub(super) fn filter_fallback() -> bool {
    false
}

/// What becomes of a planned emission.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Commit {
    /// Committed with the records the extension answered.
    Records(Vec<Record>),
    /// Failed, with this reason on the emission.
    Fail(String),
}

/// The commit's fallback: the emission fails, with why the call gave no usable answer.
pub(super) fn commit_fallback(why: &str) -> Commit {
    Commit::Fail(why.to_owned())
}

#[cfg(test)]
mod tests {
    use conduit_protocol::handshake::WorkKind;

    use super::*;

    fn group(key: &str, ids: &[i64]) -> TriggerGroup {
        TriggerGroup::new(key, ids.to_vec())
    }

    fn caps(kinds: &[(&str, bool)]) -> Capabilities {
        let mut caps = Capabilities::default();
        caps.work_kinds = kinds
            .iter()
            .map(|(name, trigger)| WorkKind::new(*name, *trigger))
            .collect();
        caps
    }

    fn facts(state: State, restarts: u32, handshaken: bool) -> StartFacts {
        StartFacts {
            state,
            restarts,
            handshaken,
        }
    }

    #[test]
    fn an_event_kind_goes_to_the_longest_declared_kind_at_a_dot_boundary() {
        let declared = |k: &str| ["a", "a.b", "note"].contains(&k);
        for (kind, want) in [
            ("a", Some("a")),
            ("a.x", Some("a")),
            ("a.b", Some("a.b")),
            ("a.b.c", Some("a.b")),
            ("a.bc", Some("a")),
            ("note.posted", Some("note")),
            ("notes", None),
            ("b.a", None),
            ("", None),
        ] {
            assert_eq!(work_kind_of(kind, declared), want, "{kind}");
        }
    }

    #[test]
    fn only_a_first_start_settles() {
        let exts = [
            ("fresh", facts(State::Starting, 0, false)),
            ("restarting", facts(State::Starting, 1, false)),
            ("handshaken-before", facts(State::Starting, 0, true)),
            ("ready", facts(State::Ready, 0, true)),
            ("backing-off", facts(State::BackingOff, 0, false)),
            ("also-fresh", facts(State::Starting, 0, false)),
        ];
        let got: Vec<String> = settling(exts).into_iter().collect();
        assert_eq!(got, ["also-fresh", "fresh"]);
    }

    #[test]
    fn the_settling_extensions_kinds_wait() {
        let (a, b) = (
            caps(&[("note", true), ("note.x", false)]),
            caps(&[("job", false)]),
        );
        let mut got: Vec<&str> = waiting_kinds([&a, &b]).into_iter().collect();
        got.sort_unstable();
        assert_eq!(got, ["job", "note", "note.x"]);
        assert!(waiting_kinds([]).is_empty());
    }

    #[test]
    fn the_first_name_owns_a_kind_two_declare() {
        let (a, b) = (
            caps(&[("note", false)]),
            caps(&[("note", true), ("job", true)]),
        );
        let kinds = owners([("a", &a), ("b", &b)]);
        assert_eq!(kinds.get("note"), Some(&("a", false)));
        assert_eq!(kinds.get("job"), Some(&("b", true)));
        assert_eq!(kinds.len(), 2);
    }

    #[test]
    fn an_event_waits_behind_a_settling_or_uncallable_trigger_owner() {
        let (a, b) = (caps(&[("note", true)]), caps(&[("job", false)]));
        let kinds = owners([("a", &a), ("b", &b)]);
        let waiting: HashSet<&str> = ["mail"].into();
        let everyone = |_: &str| true;
        assert_eq!(
            batch_of("note.posted", &kinds, &waiting, everyone),
            Some("note")
        );
        assert_eq!(batch_of("job", &kinds, &waiting, everyone), Some("job"));
        // No one declares it: a batch of its own kind, routed to no Work.
        assert_eq!(
            batch_of("other.x", &kinds, &waiting, everyone),
            Some("other.x")
        );
        // Its owner is settling.
        assert_eq!(batch_of("mail.in", &kinds, &waiting, everyone), None);
        // Its owner is degraded: a trigger owner's events wait, the rest go on (they need no
        // call).
        let not_a_nor_b = |e: &str| e != "a" && e != "b";
        assert_eq!(batch_of("note", &kinds, &waiting, not_a_nor_b), None);
        assert_eq!(batch_of("job", &kinds, &waiting, not_a_nor_b), Some("job"));
    }

    #[test]
    fn a_settling_kind_is_declared_for_the_longest_match() {
        // `note.x` waits for its settling owner even though a live one declares `note`.
        let a = caps(&[("note", false)]);
        let kinds = owners([("a", &a)]);
        let waiting: HashSet<&str> = ["note.x"].into();
        assert_eq!(batch_of("note.x.y", &kinds, &waiting, |_: &str| true), None);
        assert_eq!(
            batch_of("note.y", &kinds, &waiting, |_: &str| true),
            Some("note")
        );
    }

    #[test]
    fn the_fallback_gives_each_input_its_own_started_work() {
        assert_eq!(
            fallback_groups(&[7, 9]),
            vec![group("event:7", &[7]), group("event:9", &[9])]
        );
        assert!(fallback_groups(&[]).is_empty());
    }

    #[test]
    fn each_call_has_its_fallback_value() {
        assert_eq!(recurrence_fallback(1_000), Some(61_000));
        assert!(!filter_fallback());
        assert_eq!(
            commit_fallback("no answer within 250ms"),
            Commit::Fail("no answer within 250ms".into())
        );
    }

    #[test]
    fn an_outcome_gives_the_answer_or_the_fallback_and_its_reason() {
        assert_eq!(Outcome::Answered(3).or_fallback(|_| 0), (3, None));
        let fell = Outcome::<Commit>::Fallback {
            why: "malformed answer: x".into(),
        };
        assert_eq!(
            fell.or_fallback(commit_fallback),
            (
                Commit::Fail("malformed answer: x".into()),
                Some("malformed answer: x".into())
            )
        );
    }
}
