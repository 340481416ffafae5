//! The four in-transaction calls the gate makes: realistic params, and the answer each must get.
//!
//! Every call is planned before its timer starts — params built and serialized, the expected
//! answer worked out — so the timed part is only the round trip through the host's adapter.
//! Each plan is new: event ids, timer firings, waits and commit ids never repeat within a run,
//! as the host's never would (a commit id in particular is used once).
//!
//! | method | params | the right answer |
//! |---|---|---|
//! | `work_kind.trigger` | kind `note`, four notes of about 1 KiB of text; two threads, and every other call one note without a thread | one group per thread (`thread:<id>`, ids in batch order, `start` when a note was posted) and `event:<id>` for the note without one: the four inputs exactly |
//! | `recurrence.next` | recurrence `digest`, spec `every 15m` or `30 7 * * *` by turns | the firing plus 15 minutes; the next 07:30 UTC strictly after the firing |
//! | `dependency.filter` | filter `mentions`, subject `ada`, a note of about 1 KiB that mentions `@Ada` or, by turns, only `@adam` and `mail@ada.org` | `satisfied` true, then false |
//! | `emit.commit` | emission `annotation`, a fresh commit id, a note of about 1 KiB as payload | one `annotation` record (about 240 bytes) whose body names the commit id and the Work |
//!
//! The expected answers follow the rules the `notes` example documents in its modules, worked
//! out here independently of its code, so a wrong answer is caught whether the extension, the
//! transport or the session is at fault.
//!
//! The text is readable words, not filler bytes: JSON escapes control characters to six bytes
//! each, and a payload of NUL bytes would measure escaping rather than a realistic note.

use std::collections::BTreeMap;

use conduit_protocol::calls::{
    CommitParams, CommitResult, Event, FilterParams, FilterResult, RecurrenceParams,
    RecurrenceResult, TriggerParams, TriggerResult,
};
use conduit_protocol::methods::host;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use serde_json::value::RawValue;

/// One of the four in-transaction calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Method {
    Trigger,
    Recurrence,
    Filter,
    Commit,
}

impl Method {
    /// All four, in the order the gate runs and reports them.
    pub const ALL: [Method; 4] = [
        Method::Trigger,
        Method::Recurrence,
        Method::Filter,
        Method::Commit,
    ];

    /// The wire name, e.g. `work_kind.trigger`.
    pub fn name(self) -> &'static str {
        match self {
            Method::Trigger => host::WORK_KIND_TRIGGER,
            Method::Recurrence => host::RECURRENCE_NEXT,
            Method::Filter => host::DEPENDENCY_FILTER,
            Method::Commit => host::EMIT_COMMIT,
        }
    }

    /// The method with this wire name, if it is one of the four.
    pub fn from_name(name: &str) -> Option<Method> {
        Method::ALL.into_iter().find(|m| m.name() == name)
    }
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The notes' text target, in bytes.
pub const NOTE_BYTES: usize = 1024;

/// Inputs per `work_kind.trigger` call.
pub const TRIGGER_INPUTS: usize = 4;

/// The subject of every wait the gate asks about.
pub const SUBJECT: &str = "ada";

/// 2026-12-01T00:00:00Z: where the planned clock starts.
const EPOCH_MS: i64 = 1_796_083_200_000;
const MINUTE_MS: i64 = 60_000;
const DAY_MS: i64 = 24 * 60 * MINUTE_MS;

/// One planned call: its params, serialized, and what its answer must be.
#[derive(Debug)]
pub struct Planned {
    pub method: Method,
    pub params: Box<RawValue>,
    expect: Expect,
}

#[derive(Debug)]
enum Expect {
    /// Group key → (event ids in batch order, start).
    Groups(BTreeMap<String, (Vec<i64>, bool)>),
    NextAt(i64),
    Satisfied(bool),
    Record {
        commit_id: String,
        work_id: i64,
    },
}

impl Planned {
    /// Check the extension's answer; the error says what was wrong with it.
    pub fn check(&self, answer: &RawValue) -> Result<(), String> {
        match &self.expect {
            Expect::Groups(want) => {
                let got: TriggerResult = parse(answer)?;
                let mut by_key = BTreeMap::new();
                for g in &got.groups {
                    if by_key
                        .insert(g.key.clone(), (g.event_ids.clone(), g.start))
                        .is_some()
                    {
                        return Err(format!("group key `{}` appears twice", g.key));
                    }
                }
                if &by_key != want {
                    return Err(format!(
                        "groups {by_key:?} do not cover the inputs as expected: {want:?}"
                    ));
                }
            }
            Expect::NextAt(want) => {
                let got: RecurrenceResult = parse(answer)?;
                if got.next_at_ms != Some(*want) {
                    return Err(format!(
                        "next_at_ms is {:?}, expected {want}",
                        got.next_at_ms
                    ));
                }
            }
            Expect::Satisfied(want) => {
                let got: FilterResult = parse(answer)?;
                if got.satisfied != *want {
                    return Err(format!("satisfied is {}, expected {want}", got.satisfied));
                }
            }
            Expect::Record { commit_id, work_id } => {
                let got: CommitResult = parse(answer)?;
                let [record] = got.records.as_slice() else {
                    return Err(format!(
                        "{} records, expected one annotation",
                        got.records.len()
                    ));
                };
                if record.kind != "annotation"
                    || record.body["commit_id"] != commit_id.as_str()
                    || record.body["work_id"] != *work_id
                {
                    return Err(format!(
                        "the record {record:?} is not the annotation of commit `{commit_id}` \
                         for Work {work_id}"
                    ));
                }
            }
        }
        Ok(())
    }
}

fn parse<T: DeserializeOwned>(answer: &RawValue) -> Result<T, String> {
    serde_json::from_str(answer.get())
        .map_err(|e| format!("the answer {} does not parse: {e}", answer.get()))
}

fn raw(params: &impl Serialize) -> Box<RawValue> {
    // The protocol's params types always serialize; a failure here is a bug in this file.
    serde_json::value::to_raw_value(params).expect("params serialize")
}

/// Plans calls: each one new, deterministic for a given `run` tag.
#[derive(Debug)]
pub struct Planner {
    run: String,
    n: u64,
    next_event_id: i64,
}

impl Planner {
    /// A planner whose commit ids start with `run` (something unique to this run).
    pub fn new(run: impl Into<String>) -> Self {
        Planner {
            run: run.into(),
            n: 0,
            next_event_id: 1,
        }
    }

    /// Plan the next call of `method`.
    pub fn plan(&mut self, method: Method) -> Planned {
        self.n += 1;
        let n = self.n;
        let (params, expect) = match method {
            Method::Trigger => self.trigger(n),
            Method::Recurrence => recurrence(n),
            Method::Filter => self.filter(n),
            Method::Commit => self.commit(n),
        };
        Planned {
            method,
            params,
            expect,
        }
    }

    fn event(&mut self, kind: &str, payload: serde_json::Value) -> Event {
        let id = self.next_event_id;
        self.next_event_id += 1;
        Event::new(
            id,
            "notes-inbox",
            format!("n-{id}"),
            kind,
            payload,
            EPOCH_MS + id * 1_000,
        )
    }

    fn trigger(&mut self, n: u64) -> (Box<RawValue>, Expect) {
        let (a, b) = (format!("t-{n}-a"), format!("t-{n}-b"));
        // Thread a: posted then edited, so its Work starts. Thread b: edits only, so they
        // queue. Every other call the last note has no thread and gets a group of its own.
        let lone = n.is_multiple_of(2);
        let inputs = vec![
            self.event("note.posted", note(Some(&a), "ada", n * 4)),
            self.event("note.edited", note(Some(&b), "grace", n * 4 + 1)),
            self.event("note.edited", note(Some(&a), "linus", n * 4 + 2)),
            self.event(
                "note.edited",
                note((!lone).then_some(b.as_str()), "ken", n * 4 + 3),
            ),
        ];
        let id = |i: usize| inputs[i].id;
        let mut want = BTreeMap::new();
        want.insert(format!("thread:{a}"), (vec![id(0), id(2)], true));
        if lone {
            want.insert(format!("thread:{b}"), (vec![id(1)], false));
            want.insert(format!("event:{}", id(3)), (vec![id(3)], true));
        } else {
            want.insert(format!("thread:{b}"), (vec![id(1), id(3)], false));
        }
        let params = TriggerParams::new("note", inputs);
        (raw(&params), Expect::Groups(want))
    }

    fn filter(&mut self, n: u64) -> (Box<RawValue>, Expect) {
        let satisfied = n % 2 == 1;
        let mut payload = note(Some(&format!("t-{n}")), "grace", n);
        let text = payload["text"].as_str().unwrap_or_default();
        // The mention goes in the middle of the note, so the whole text is searched; the
        // decoys are another handle and an address, which the whole-word rule excludes.
        let middle = text[..text.len() / 2].rfind(' ').unwrap_or(0);
        let insert = if satisfied {
            " thanks @Ada! "
        } else {
            " ask @adam or write to mail@ada.org "
        };
        payload["text"] = format!("{}{insert}{}", &text[..middle], &text[middle..]).into();
        let event = self.event("note.posted", payload);
        let params = FilterParams::new("mentions", n as i64, SUBJECT, event);
        (raw(&params), Expect::Satisfied(satisfied))
    }

    fn commit(&mut self, n: u64) -> (Box<RawValue>, Expect) {
        let commit_id = format!("{}-{n}", self.run);
        let work_id = n as i64;
        let mut payload = note(Some(&format!("t-{n}")), "linus", n);
        payload["tags"] = json!(["digest"]);
        let params =
            CommitParams::new("annotation", commit_id.clone(), payload).with_work_id(Some(work_id));
        (raw(&params), Expect::Record { commit_id, work_id })
    }
}

fn recurrence(n: u64) -> (Box<RawValue>, Expect) {
    // Firings walk forward by an odd amount so both sides of 07:30 come up.
    let fired_at_ms = EPOCH_MS + n as i64 * 37 * MINUTE_MS + (n as i64 % 1_000);
    let (spec, next) = if n % 2 == 1 {
        ("every 15m", fired_at_ms + 15 * MINUTE_MS)
    } else {
        let at = fired_at_ms.div_euclid(DAY_MS) * DAY_MS + (7 * 60 + 30) * MINUTE_MS;
        (
            "30 7 * * *",
            if at > fired_at_ms { at } else { at + DAY_MS },
        )
    };
    let params = RecurrenceParams::new("digest", n as i64, spec, fired_at_ms);
    (raw(&params), Expect::NextAt(next))
}

/// A note's payload: `{"thread"?, "author", "text"}` with about [`NOTE_BYTES`] of text.
fn note(thread: Option<&str>, author: &str, seed: u64) -> serde_json::Value {
    let mut v = json!({ "author": author, "text": text(seed, NOTE_BYTES) });
    if let Some(t) = thread {
        v["thread"] = t.into();
    }
    v
}

const WORDS: &[&str] = &[
    "the",
    "migration",
    "of",
    "database",
    "layer",
    "finished",
    "without",
    "incident",
    "after",
    "review",
    "rollout",
    "schedule",
    "queue",
    "worker",
    "latency",
    "budget",
    "thread",
    "reply",
    "draft",
    "release",
    "deploy",
    "index",
    "cache",
    "retry",
    "window",
    "we",
    "should",
    "move",
    "tomorrow",
    "morning",
    "because",
    "nobody",
    "objected",
    "and",
    "tests",
    "pass",
    "on",
    "every",
    "branch",
    "except",
    "one",
    "flaky",
    "check",
    "that",
    "times",
    "out",
    "under",
    "load",
];

/// About `len` bytes of plain words (at least `len`, at most one word more), with a hashtag
/// now and then as notes have. Deterministic in `seed`.
pub fn text(seed: u64, len: usize) -> String {
    let mut s = String::with_capacity(len + 16);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut words = 0;
    while s.len() < len {
        // xorshift64: cheap, and deterministic across platforms.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if !s.is_empty() {
            s.push_str(if words % 13 == 0 { ". " } else { " " });
        }
        if words % 29 == 7 {
            s.push('#');
        }
        s.push_str(WORDS[(x % WORDS.len() as u64) as usize]);
        words += 1;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(v: serde_json::Value) -> Box<RawValue> {
        raw(&v)
    }

    #[test]
    fn notes_are_about_a_kib_of_readable_text() {
        for seed in 0..50 {
            let t = text(seed, NOTE_BYTES);
            assert!(
                (NOTE_BYTES..NOTE_BYTES + 16).contains(&t.len()),
                "{}",
                t.len()
            );
            // Printable ASCII only: JSON carries it unescaped, byte for byte.
            assert!(t.bytes().all(|b| (0x20..0x7f).contains(&b)));
            assert_eq!(serde_json::to_string(&t).unwrap().len(), t.len() + 2);
        }
        assert_ne!(text(1, 100), text(2, 100));
    }

    #[test]
    fn a_trigger_carries_four_notes_of_a_kib() {
        let mut p = Planner::new("run");
        let planned = p.plan(Method::Trigger);
        let params: TriggerParams = serde_json::from_str(planned.params.get()).unwrap();
        assert_eq!(params.inputs.len(), TRIGGER_INPUTS);
        let len = planned.params.get().len();
        assert!((4 * NOTE_BYTES..5 * NOTE_BYTES).contains(&len), "{len}");
    }

    #[test]
    fn trigger_answers_are_checked_against_the_grouping_rules() {
        let mut p = Planner::new("run");
        // Call 1: two threads of two notes each.
        let one = p.plan(Method::Trigger);
        let right = answer(json!({ "groups": [
            { "key": "thread:t-1-a", "event_ids": [1, 3], "start": true },
            { "key": "thread:t-1-b", "event_ids": [2, 4], "start": false },
        ]}));
        assert_eq!(one.check(&right), Ok(()));
        // Call 2: the last note has no thread.
        let two = p.plan(Method::Trigger);
        let right = answer(json!({ "groups": [
            { "key": "thread:t-2-a", "event_ids": [5, 7], "start": true },
            { "key": "thread:t-2-b", "event_ids": [6], "start": false },
            { "key": "event:8", "event_ids": [8], "start": true },
        ]}));
        assert_eq!(two.check(&right), Ok(()));
        // One per note (the host's fallback), a lost input, a wrong start: all wrong.
        for wrong in [
            json!({ "groups": [
                { "key": "event:1", "event_ids": [1] }, { "key": "event:2", "event_ids": [2] },
                { "key": "event:3", "event_ids": [3] }, { "key": "event:4", "event_ids": [4] },
            ]}),
            json!({ "groups": [{ "key": "thread:t-1-a", "event_ids": [1, 3], "start": true }]}),
            json!({ "groups": [
                { "key": "thread:t-1-a", "event_ids": [1, 3], "start": true },
                { "key": "thread:t-1-b", "event_ids": [2, 4], "start": true },
            ]}),
            json!({ "nope": 1 }),
        ] {
            assert!(one.check(&answer(wrong.clone())).is_err(), "{wrong}");
        }
    }

    #[test]
    fn recurrence_expects_the_next_firing_of_its_spec() {
        let mut p = Planner::new("run");
        let every = p.plan(Method::Recurrence);
        let params: RecurrenceParams = serde_json::from_str(every.params.get()).unwrap();
        assert_eq!(params.spec, "every 15m");
        let next = params.fired_at_ms + 15 * MINUTE_MS;
        assert_eq!(every.check(&answer(json!({ "next_at_ms": next }))), Ok(()));
        assert!(
            every
                .check(&answer(json!({ "next_at_ms": next + 1 })))
                .is_err()
        );
        assert!(every.check(&answer(json!({ "next_at_ms": null }))).is_err());

        // Daily: before 07:30 it is today's, at or after it tomorrow's.
        for n in 1..200 {
            let planned = p.plan(Method::Recurrence);
            let params: RecurrenceParams = serde_json::from_str(planned.params.get()).unwrap();
            if params.spec != "30 7 * * *" {
                continue;
            }
            let Expect::NextAt(at) = planned.expect else {
                unreachable!()
            };
            assert!(
                at > params.fired_at_ms && at - params.fired_at_ms <= DAY_MS,
                "{n}"
            );
            assert_eq!(at.rem_euclid(DAY_MS), (7 * 60 + 30) * MINUTE_MS);
        }
    }

    #[test]
    fn filter_notes_mention_the_subject_by_turns() {
        let mut p = Planner::new("run");
        let yes = p.plan(Method::Filter);
        let no = p.plan(Method::Filter);
        let text = |pl: &Planned| {
            let params: FilterParams = serde_json::from_str(pl.params.get()).unwrap();
            params.event.payload["text"].as_str().unwrap().to_owned()
        };
        assert!(text(&yes).contains("@Ada!"));
        assert!(text(&no).contains("@adam") && !text(&no).contains("@Ada"));
        assert_eq!(yes.check(&answer(json!({ "satisfied": true }))), Ok(()));
        assert!(yes.check(&answer(json!({ "satisfied": false }))).is_err());
        assert_eq!(no.check(&answer(json!({ "satisfied": false }))), Ok(()));
    }

    #[test]
    fn every_commit_gets_a_fresh_id_and_one_record_naming_it() {
        let mut p = Planner::new("gate-7");
        let ids: Vec<String> = (0..3)
            .map(|_| {
                let pl = p.plan(Method::Commit);
                let params: CommitParams = serde_json::from_str(pl.params.get()).unwrap();
                params.commit_id
            })
            .collect();
        assert_eq!(ids, ["gate-7-1", "gate-7-2", "gate-7-3"]);

        let pl = p.plan(Method::Commit);
        let record = |commit: &str, work: i64| json!({ "kind": "annotation", "body": { "commit_id": commit, "work_id": work } });
        let right = answer(json!({ "records": [record("gate-7-4", 4)] }));
        assert_eq!(pl.check(&right), Ok(()));
        for wrong in [
            json!({ "records": [] }),
            json!({ "records": [record("gate-7-4", 4), record("gate-7-4", 4)] }),
            json!({ "records": [record("gate-7-3", 4)] }),
            json!({ "records": [record("gate-7-4", 3)] }),
        ] {
            assert!(pl.check(&answer(wrong.clone())).is_err(), "{wrong}");
        }
    }

    #[test]
    fn the_answers_of_the_notes_example_are_right() {
        // The same rules from the other side: the example's handlers, called directly.
        use conduit_example_notes::{annotation, mentions, recurrence as rec, trigger};
        let mut p = Planner::new("run");
        for _ in 0..40 {
            for m in Method::ALL {
                let pl = p.plan(m);
                let got = match m {
                    Method::Trigger => {
                        let params: TriggerParams = serde_json::from_str(pl.params.get()).unwrap();
                        raw(&trigger::group(&params.inputs))
                    }
                    Method::Recurrence => {
                        let params: RecurrenceParams =
                            serde_json::from_str(pl.params.get()).unwrap();
                        let next = rec::Spec::parse(&params.spec)
                            .unwrap()
                            .next_after(params.fired_at_ms);
                        raw(&RecurrenceResult::new(next))
                    }
                    Method::Filter => {
                        let params: FilterParams = serde_json::from_str(pl.params.get()).unwrap();
                        let text = params.event.payload["text"].as_str().unwrap();
                        raw(&FilterResult::new(mentions::mentions(
                            text,
                            &params.subject,
                        )))
                    }
                    Method::Commit => {
                        let params: CommitParams = serde_json::from_str(pl.params.get()).unwrap();
                        let record = annotation::annotate(&params);
                        let len = serde_json::to_string(&record).unwrap().len();
                        assert!((200..=300).contains(&len), "a {len}-byte annotation");
                        raw(&CommitResult::new(vec![record]))
                    }
                };
                assert_eq!(pl.check(&got), Ok(()), "{m}");
            }
        }
    }
}
