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

use std::collections::HashMap;

use conduit_protocol::Capabilities;
use conduit_protocol::calls::{Record, TriggerGroup, TriggerResult};
use conduit_supervisor::State;

/// When a timer's `recurrence.next` fails, it fires again this much later.
pub const RECURRENCE_FALLBACK_MS: i64 = 60_000;

/// The least time from one pass's start to the next one's when a nudge asks for it: under a
/// stream of events a pass routes what came since the last one, in one call per work kind,
/// instead of one pass (and one writer transaction with its in-transaction call) per commit.
pub const MIN_PASS_SPACING: std::time::Duration = std::time::Duration::from_millis(5);

/// How long a nudged pass waits before it starts, `since` the previous pass started: nothing
/// when that was [`MIN_PASS_SPACING`] ago or more (an event after a quiet spell is routed at
/// once), else the rest of it.
pub fn nudged_pass_delay(since: std::time::Duration) -> std::time::Duration {
    MIN_PASS_SPACING.saturating_sub(since)
}

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
    /// Whether the current run is the first since it was started (by the daemon, an install, an
    /// enable or a need) with no failure since.
    pub(super) first_run: bool,
}

impl StartFacts {
    pub(super) fn of(s: &conduit_supervisor::RunBrief) -> Self {
        StartFacts {
            state: s.state,
            first_run: s.first_run,
        }
    }

    /// Whether the pass waits for the extension: it is on a first start (the daemon just
    /// started, it was just installed or enabled, or a need just started it), or idle (on
    /// demand, not started yet or stopped for idleness: a need starts it).
    pub(super) fn settling(&self) -> bool {
        match self.state {
            State::Starting => self.first_run,
            State::Idle => true,
            _ => false,
        }
    }
}

/// The work kinds whose events wait, unrouted, each with the extension it waits for: every
/// kind a `held` extension (settling, idle, or installed but disabled) would own. As in
/// [`owners`], the first name that declares a kind owns it, so a kind a `live` extension owns
/// does not wait for a held one.
pub(super) fn waiting_kinds<'a>(
    live: impl IntoIterator<Item = (&'a str, &'a Capabilities)>,
    held: impl IntoIterator<Item = (&'a str, &'a Capabilities)>,
) -> HashMap<&'a str, &'a str> {
    let mut all: Vec<(&str, &Capabilities, bool)> = live
        .into_iter()
        .map(|(n, c)| (n, c, false))
        .chain(held.into_iter().map(|(n, c)| (n, c, true)))
        .collect();
    all.sort_by(|a, b| a.0.cmp(b.0));
    let mut first: HashMap<&'a str, (&'a str, bool)> = HashMap::new();
    for (name, caps, held) in all {
        for k in &caps.work_kinds {
            first.entry(k.name.as_str()).or_insert((name, held));
        }
    }
    first
        .into_iter()
        .filter(|(_, (_, held))| *held)
        .map(|(kind, (name, _))| (kind, name))
        .collect()
}

/// The extension an unrouted event of kind `event_kind` waits for, if it waits for a held one
/// (the need that starts an idle one).
pub(super) fn waiting_for<'a, E: ?Sized>(
    event_kind: &str,
    owners: &HashMap<&str, (&E, bool)>,
    waiting: &HashMap<&str, &'a str>,
) -> Option<&'a str> {
    let declared = |k: &str| owners.contains_key(k) || waiting.contains_key(k);
    waiting.get(work_kind_of(event_kind, declared)?).copied()
}

/// The extension that owns the events of kind `event_kind` among `all` (every installed
/// extension with its capabilities, in name order): the owner of the longest declared work
/// kind that is `event_kind` or a prefix of it at a dot, the first name winning a kind two
/// declare. What `conduit ext disable` counts as waiting for an extension.
pub fn event_owner<'a>(
    event_kind: &str,
    all: impl IntoIterator<Item = (&'a str, &'a Capabilities)>,
) -> Option<&'a str> {
    let kinds = owners(all);
    let kind = work_kind_of(event_kind, |k| kinds.contains_key(k))?;
    kinds.get(kind).map(|(name, _)| *name)
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
    waiting: &HashMap<&str, &str>,
    callable: impl Fn(&E) -> bool,
) -> Option<&'a str> {
    let declared = |k: &str| owners.contains_key(k) || waiting.contains_key(k);
    let kind = work_kind_of(event_kind, declared).unwrap_or(event_kind);
    if waiting.contains_key(kind) {
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

    #[test]
    fn a_nudged_pass_starts_at_once_after_a_quiet_spell_and_no_sooner_than_the_spacing_in_a_stream()
    {
        use std::time::Duration;
        assert_eq!(nudged_pass_delay(Duration::from_secs(1)), Duration::ZERO);
        assert_eq!(nudged_pass_delay(MIN_PASS_SPACING), Duration::ZERO);
        assert_eq!(
            nudged_pass_delay(MIN_PASS_SPACING - Duration::from_millis(1)),
            Duration::from_millis(1)
        );
        assert_eq!(nudged_pass_delay(Duration::ZERO), MIN_PASS_SPACING);
    }

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

    fn facts(state: State, first_run: bool) -> StartFacts {
        StartFacts { state, first_run }
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
    fn a_first_start_and_an_idle_extension_settle() {
        for (state, first_run, settles) in [
            (State::Starting, true, true),
            (State::Starting, false, false),
            (State::Ready, true, false),
            (State::BackingOff, true, false),
            (State::Idle, false, true),
            (State::Stopping, true, false),
        ] {
            assert_eq!(
                facts(state, first_run).settling(),
                settles,
                "{state} first_run={first_run}"
            );
        }
    }

    #[test]
    fn the_kinds_a_held_extension_owns_wait_for_it() {
        let (a, b, c) = (
            caps(&[("note", true), ("note.x", false)]),
            caps(&[("job", false)]),
            caps(&[("job", true), ("mail", true)]),
        );
        // `a` and `c` are held; `b` sorts before `c`, so `job` is `b`'s and does not wait.
        let got = waiting_kinds([("b", &b)], [("a", &a), ("c", &c)]);
        let mut got: Vec<(&str, &str)> = got.into_iter().collect();
        got.sort_unstable();
        assert_eq!(got, [("mail", "c"), ("note", "a"), ("note.x", "a")]);
        assert!(waiting_kinds([], []).is_empty());
        // A held extension that sorts first holds a kind a live one declares too.
        let got = waiting_kinds([("b", &b)], [("a", &c)]);
        assert_eq!(got.get("job"), Some(&"a"));
    }

    #[test]
    fn an_event_is_owned_by_the_longest_kind_of_the_first_name() {
        let (a, b) = (
            caps(&[("note", true)]),
            caps(&[("note.posted", true), ("note", true)]),
        );
        let all = [("a", &a), ("b", &b)];
        assert_eq!(event_owner("note.posted", all), Some("b"));
        assert_eq!(event_owner("note.edited", all), Some("a"));
        assert_eq!(event_owner("mail", all), None);
    }

    #[test]
    fn a_waiting_event_names_the_extension_it_waits_for() {
        let a = caps(&[("note", true)]);
        let kinds = owners([("a", &a)]);
        let waiting: HashMap<&str, &str> = [("mail", "m")].into();
        assert_eq!(waiting_for("mail.in", &kinds, &waiting), Some("m"));
        assert_eq!(waiting_for("note.x", &kinds, &waiting), None);
        assert_eq!(waiting_for("other", &kinds, &waiting), None);
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
        let waiting: HashMap<&str, &str> = [("mail", "m")].into();
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
        let waiting: HashMap<&str, &str> = [("note.x", "n")].into();
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
