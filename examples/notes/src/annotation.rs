//! `emit.commit` for the `annotation` emission: the record written with the emission.
//!
//! One record per commit:
//!
//! ```text
//! {"kind":"annotation","body":{"work_id":5,"commit_id":"emit-17","thread":"t-42",
//!  "summary":"<the note's first ~120 characters, cut at a word>…","words":171,
//!  "tags":["release","db"]}}
//! ```
//!
//! `thread` and the text come from the planned payload (`{"thread", "text", "tags"?}`, as a
//! note's); `tags` are the payload's `tags` strings followed by the `#hashtags` of the text,
//! lowercased, without repeats, at most [`MAX_TAGS`]. With a note of about 1 KiB the record is
//! about 240 bytes of JSON.
//!
//! Invariant: the record is a function of the params alone, so the same `commit_id` (a commit
//! the host retries) always gets the same record, as §6.4 requires.

use conduit_extension::prelude::*;
use serde_json::{Value, json};

/// The record kind.
pub const KIND: &str = "annotation";

/// The longest summary, in characters, before the ellipsis.
pub const SUMMARY_CHARS: usize = 120;

/// The most tags a record carries.
pub const MAX_TAGS: usize = 5;

/// The record for one commit; see the module docs.
pub fn annotate(p: &CommitParams) -> Record {
    let text = p.payload.get("text").and_then(Value::as_str).unwrap_or("");
    let mut body = json!({
        "work_id": p.work_id,
        "commit_id": p.commit_id,
        "summary": summary(text),
        "words": text.split_whitespace().count(),
        "tags": tags(&p.payload, text),
    });
    if let Some(thread) = p.payload.get("thread").filter(|t| !t.is_null()) {
        body["thread"] = thread.clone();
    }
    Record::new(KIND, body)
}

/// The text with its whitespace collapsed, cut at a word boundary to at most
/// [`SUMMARY_CHARS`] characters, with `…` when something was cut.
pub fn summary(text: &str) -> String {
    let mut out = String::with_capacity(SUMMARY_CHARS + 4);
    let mut chars = 0;
    for word in text.split_whitespace() {
        let n = word.chars().count();
        let sep = usize::from(!out.is_empty());
        if chars + sep + n > SUMMARY_CHARS {
            if out.is_empty() {
                // One word longer than the whole summary: cut inside it.
                out.extend(word.chars().take(SUMMARY_CHARS));
            }
            out.push('…');
            return out;
        }
        if sep == 1 {
            out.push(' ');
        }
        out.push_str(word);
        chars += sep + n;
    }
    out
}

/// The payload's `tags`, then the text's `#hashtags`; lowercased, unique, at most
/// [`MAX_TAGS`].
pub fn tags(payload: &Value, text: &str) -> Vec<String> {
    let given = payload
        .get("tags")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned);
    let mut out: Vec<String> = Vec::new();
    for tag in given.chain(hashtags(text)) {
        let tag = tag.trim().trim_start_matches('#').to_lowercase();
        if !tag.is_empty() && !out.contains(&tag) {
            out.push(tag);
            if out.len() == MAX_TAGS {
                break;
            }
        }
    }
    out
}

/// `#word` tokens: a `#` at the start or after a non-word character, then word characters.
fn hashtags(text: &str) -> impl Iterator<Item = String> + '_ {
    let is_word = |c: char| c.is_alphanumeric() || c == '_' || c == '-';
    text.match_indices('#').filter_map(move |(at, _)| {
        if text[..at].chars().next_back().is_some_and(is_word) {
            return None;
        }
        let rest = &text[at + 1..];
        let end = rest.find(|c: char| !is_word(c)).unwrap_or(rest.len());
        (end > 0).then(|| rest[..end].to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(payload: Value) -> CommitParams {
        CommitParams::new("annotation", "emit-17", payload).with_work_id(Some(5))
    }

    /// About 1 KiB of note text, like the budget gate's.
    fn kib_text() -> String {
        let mut s = String::from("Release notes for #Release 2.3: ");
        while s.len() < 1000 {
            s.push_str("the migration of the #db layer finished without incident and ");
        }
        s
    }

    #[test]
    fn a_note_of_a_kib_gives_a_record_of_about_240_bytes() {
        let r = annotate(&params(
            json!({ "thread": "t-42", "author": "ada", "text": kib_text() }),
        ));
        assert_eq!(r.kind, "annotation");
        let json = serde_json::to_string(&r).unwrap();
        assert!(
            (200..=300).contains(&json.len()),
            "{} bytes: {json}",
            json.len()
        );
        assert_eq!(r.body["work_id"], 5);
        assert_eq!(r.body["commit_id"], "emit-17");
        assert_eq!(r.body["thread"], "t-42");
        assert_eq!(r.body["tags"], json!(["release", "db"]));
        assert_eq!(r.body["words"], kib_text().split_whitespace().count());
        assert!(r.body["summary"].as_str().unwrap().ends_with('…'));
    }

    #[test]
    fn the_same_commit_gets_the_same_record() {
        let p = params(json!({ "thread": "t-1", "text": kib_text() }));
        assert_eq!(annotate(&p), annotate(&p));
    }

    #[test]
    fn a_payload_without_text_still_gets_a_record() {
        let mut p = params(json!(null));
        p.work_id = None;
        let r = annotate(&p);
        assert_eq!(
            r.body,
            json!({ "work_id": null, "commit_id": "emit-17", "summary": "", "words": 0, "tags": [] })
        );
    }

    #[test]
    fn summaries_cut_at_words_and_collapse_whitespace() {
        assert_eq!(summary("  short \n text "), "short text");
        let long = "word ".repeat(40);
        let s = summary(&long);
        assert!(s.ends_with("word…"), "{s}");
        assert!(s.chars().count() <= SUMMARY_CHARS + 1);
        let one = "x".repeat(500);
        assert_eq!(summary(&one).chars().count(), SUMMARY_CHARS + 1);
        // Exactly the limit is not cut.
        let exact = "y".repeat(SUMMARY_CHARS);
        assert_eq!(summary(&exact), exact);
        // Multi-byte characters are counted as characters and never split.
        let wide = "é".repeat(300);
        assert_eq!(summary(&wide).chars().count(), SUMMARY_CHARS + 1);
    }

    #[test]
    fn tags_merge_payload_and_hashtags_without_repeats() {
        let payload = json!({ "tags": ["Ops", "#db", 3] });
        let t = tags(&payload, "#ops #DB #new-thing and#not #a #b #c");
        assert_eq!(t, ["ops", "db", "new-thing", "a", "b"]);
        assert!(tags(&json!({}), "# alone, #, ##").is_empty());
    }
}
