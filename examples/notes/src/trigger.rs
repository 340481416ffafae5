//! `work_kind.trigger` for the `note` kind: one Work per thread.
//!
//! Grouping rules (the answer the host gets for a batch of pending notes):
//!
//! - A note whose payload has a `thread` (a non-empty string, or an integer) joins the group
//!   `thread:<thread>`; notes of one thread in one batch share that group.
//! - A note without a thread gets its own group `event:<event id>` — the key the host's own
//!   fallback would give it, so a note lands in the same Work whether this call answers or
//!   times out.
//! - `start` of a `thread:` group is true when any of its notes has the kind `note.posted`: a
//!   new post makes the thread's Work ready, while edits, reactions and the like only queue on
//!   it until the next post. An `event:` group always starts: nothing else can ever join its
//!   Work, so queueing would strand the note.
//!
//! Groups come in the order of their first note in the batch, event ids in batch order. An
//! empty batch gets no groups. An event id repeated in the batch (which the host never sends)
//! is placed once, so the answer stays valid.
//!
//! Invariant: every input id appears in exactly one group, and keys are distinct (§6.1).

use std::collections::{HashMap, HashSet};

use conduit_extension::prelude::*;
use serde_json::Value;

/// The kind of a new note; any other kind only queues on its thread's Work.
pub const POSTED: &str = "note.posted";

/// Group a batch of notes; see the module docs.
pub fn group(inputs: &[Event]) -> TriggerResult {
    let mut groups: Vec<TriggerGroup> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::with_capacity(inputs.len());
    let mut seen: HashSet<i64> = HashSet::with_capacity(inputs.len());
    for e in inputs {
        if !seen.insert(e.id) {
            continue;
        }
        let posted = e.kind == POSTED;
        let Some(thread) = thread_of(&e.payload) else {
            index.insert(format!("event:{}", e.id), groups.len());
            groups.push(TriggerGroup::new(format!("event:{}", e.id), vec![e.id]));
            continue;
        };
        let key = format!("thread:{thread}");
        match index.get(&key) {
            Some(&i) => {
                let g = &mut groups[i];
                g.event_ids.push(e.id);
                g.start |= posted;
            }
            None => {
                index.insert(key.clone(), groups.len());
                let mut group = TriggerGroup::new(key, vec![e.id]);
                group.start = posted;
                groups.push(group);
            }
        }
    }
    TriggerResult::new(groups)
}

/// The thread a note belongs to, if it names one.
fn thread_of(payload: &Value) -> Option<String> {
    match payload.get("thread")? {
        Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_owned()),
        Value::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn note(id: i64, kind: &str, payload: Value) -> Event {
        Event::new(id, "notes-inbox", format!("n-{id}"), kind, payload, 0)
    }

    fn keys(r: &TriggerResult) -> Vec<(&str, &[i64], bool)> {
        r.groups
            .iter()
            .map(|g| (g.key.as_str(), g.event_ids.as_slice(), g.start))
            .collect()
    }

    #[test]
    fn an_empty_batch_has_no_groups() {
        assert_eq!(group(&[]), TriggerResult::new(vec![]));
    }

    #[test]
    fn notes_of_one_thread_share_a_group_in_batch_order() {
        let r = group(&[
            note(1, POSTED, json!({ "thread": "t-42", "text": "a" })),
            note(2, POSTED, json!({ "thread": "t-7", "text": "b" })),
            note(3, "note.edited", json!({ "thread": "t-42", "text": "c" })),
            note(4, "note.edited", json!({ "thread": "t-9", "text": "d" })),
        ]);
        assert_eq!(
            keys(&r),
            [
                ("thread:t-42", &[1, 3][..], true),
                ("thread:t-7", &[2][..], true),
                ("thread:t-9", &[4][..], false),
            ]
        );
    }

    #[test]
    fn a_post_anywhere_in_the_group_starts_it() {
        let r = group(&[
            note(1, "note.reaction", json!({ "thread": "t" })),
            note(2, POSTED, json!({ "thread": "t" })),
        ]);
        assert_eq!(keys(&r), [("thread:t", &[1, 2][..], true)]);
    }

    #[test]
    fn notes_without_a_thread_each_get_their_own_started_group() {
        let r = group(&[
            note(5, "note.edited", json!({ "text": "no thread" })),
            note(6, POSTED, json!({ "thread": "" })),
            note(7, POSTED, json!({ "thread": ["not", "a", "string"] })),
            note(8, POSTED, json!("not even an object")),
        ]);
        assert_eq!(
            keys(&r),
            [
                ("event:5", &[5][..], true),
                ("event:6", &[6][..], true),
                ("event:7", &[7][..], true),
                ("event:8", &[8][..], true),
            ]
        );
    }

    #[test]
    fn integer_threads_and_padded_strings_are_the_same_thread() {
        let r = group(&[
            note(1, POSTED, json!({ "thread": 42 })),
            note(2, POSTED, json!({ "thread": " 42 " })),
        ]);
        assert_eq!(keys(&r), [("thread:42", &[1, 2][..], true)]);
    }

    #[test]
    fn a_repeated_event_id_is_placed_once() {
        let r = group(&[
            note(1, POSTED, json!({ "thread": "t" })),
            note(1, POSTED, json!({ "thread": "t" })),
            note(2, POSTED, json!({})),
            note(2, POSTED, json!({})),
        ]);
        assert_eq!(
            keys(&r),
            [("thread:t", &[1][..], true), ("event:2", &[2][..], true)]
        );
    }
}
