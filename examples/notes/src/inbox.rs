//! `ingress.poll` for the `notes-inbox` source: notes appended to a JSON-lines file.
//!
//! The file is named by `CONDUIT_NOTES_INBOX`; unset (or missing on disk), the source has
//! nothing new. Each line is one note, a JSON object such as
//! `{"id": "n-1", "thread": "t-42", "author": "ada", "text": "…"}`:
//!
//! - `delivery_id` is the line's `id` (a string or an integer), else `line-<line number>`;
//! - `kind` is the line's `kind`, else `note.posted`;
//! - `payload` is the whole object.
//!
//! The cursor is the number of lines consumed so far, as a decimal string (absent: 0). A poll
//! returns the notes after the cursor, at most `limit`, and the cursor after the last line it
//! consumed. Blank lines and lines that are not JSON objects are skipped (and logged) but
//! consumed, so one bad line never blocks the inbox. A last line without its `\n` is still
//! being written: it is left for the next poll.
//!
//! The whole file is read on each poll, which is fine for an example's inbox; a real source
//! would keep a byte offset in its cursor instead.
//!
//! Invariant: the cursor only moves past lines that were returned or skipped, so polling again
//! from any cursor this source answered never loses a note (and the host deduplicates
//! re-deliveries by `delivery_id`).

use std::path::Path;

use conduit_extension::prelude::*;
use conduit_extension::protocol::methods;
use serde_json::Value;

/// The environment variable naming the inbox file.
pub const ENV: &str = "CONDUIT_NOTES_INBOX";

/// The kind of a note whose line does not say.
pub const DEFAULT_KIND: &str = "note.posted";

/// Answer a poll of the inbox at `path` (`None`: no inbox).
pub async fn poll(
    path: Option<&Path>,
    p: &IngressPollParams,
) -> Result<IngressPollResult, RpcError> {
    let cursor = parse_cursor(p.cursor.as_deref())?;
    let unchanged = || {
        let mut r = IngressPollResult::new(Vec::new());
        r.cursor.clone_from(&p.cursor);
        r
    };
    let Some(path) = path else {
        return Ok(unchanged());
    };
    let content = match tokio::fs::read(path).await {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(unchanged()),
        Err(e) => {
            return Err(RpcError::internal(format!(
                "cannot read the inbox {}: {e}",
                path.display()
            )));
        }
    };
    let (events, next) = read_after(&content, cursor, p.limit as usize);
    let mut r = IngressPollResult::new(events);
    r.cursor = if next == cursor {
        p.cursor.clone()
    } else {
        Some(next.to_string())
    };
    Ok(r)
}

fn parse_cursor(cursor: Option<&str>) -> Result<u64, RpcError> {
    match cursor {
        None => Ok(0),
        Some(c) => c.parse().map_err(|_| {
            RpcError::invalid_params(
                methods::host::INGRESS_POLL,
                format!("cursor `{c}` is not a line number"),
            )
        }),
    }
}

/// The notes in the complete lines after the first `cursor` ones, at most `limit`, and the
/// number of lines consumed afterwards.
pub fn read_after(content: &[u8], cursor: u64, limit: usize) -> (Vec<NewEvent>, u64) {
    let mut events = Vec::new();
    let mut consumed = cursor;
    // `split` yields the text after the last `\n` as a final piece: that line is incomplete.
    let mut lines = content.split(|&b| b == b'\n');
    let complete = content.iter().filter(|&&b| b == b'\n').count() as u64;
    for (n, line) in (0..complete).zip(&mut lines) {
        if n < cursor {
            continue;
        }
        if events.len() >= limit {
            break;
        }
        consumed = n + 1;
        if let Some(e) = note(line, n + 1) {
            events.push(e);
        }
    }
    (events, consumed)
}

/// The note on line `number` (1-based), if it is one.
fn note(line: &[u8], number: u64) -> Option<NewEvent> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    let obj = match serde_json::from_slice::<Value>(line) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => {
            tracing::warn!(line = number, "inbox line is not a JSON object; skipped");
            return None;
        }
        Err(e) => {
            tracing::warn!(line = number, error = %e, "inbox line is not JSON; skipped");
            return None;
        }
    };
    let delivery_id = match obj.get("id") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => format!("line-{number}"),
    };
    let kind = obj
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or(DEFAULT_KIND)
        .to_owned();
    Some(NewEvent::new(delivery_id, kind, obj))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const INBOX: &str = concat!(
        r#"{"id":"n-1","thread":"t-1","author":"ada","text":"first"}"#,
        "\n",
        "\n",
        r#"{"thread":"t-2","kind":"note.edited","text":"second"}"#,
        "\n",
        "not json\n",
        r#"[1,2]"#,
        "\n",
        r#"{"id":7,"text":"third"}"#,
        "\r\n",
        r#"{"id":"n-9","text":"still being writ"#,
    );

    fn ids(events: &[NewEvent]) -> Vec<&str> {
        events.iter().map(|e| e.delivery_id.as_str()).collect()
    }

    #[test]
    fn reads_every_complete_note_and_skips_the_rest() {
        let (events, next) = read_after(INBOX.as_bytes(), 0, 100);
        assert_eq!(ids(&events), ["n-1", "line-3", "7"]);
        assert_eq!(next, 6, "the incomplete last line is left for later");
        assert_eq!(events[0].kind, "note.posted");
        assert_eq!(events[1].kind, "note.edited");
        assert_eq!(events[0].payload["author"], "ada");
    }

    #[test]
    fn limit_and_cursor_page_through_the_inbox() {
        let (events, next) = read_after(INBOX.as_bytes(), 0, 1);
        assert_eq!((ids(&events), next), (vec!["n-1"], 1));
        let (events, next) = read_after(INBOX.as_bytes(), next, 1);
        assert_eq!((ids(&events), next), (vec!["line-3"], 3));
        let (events, next) = read_after(INBOX.as_bytes(), next, 1);
        assert_eq!((ids(&events), next), (vec!["7"], 6));
        let (events, next) = read_after(INBOX.as_bytes(), next, 1);
        assert_eq!((events.len(), next), (0, 6));
    }

    #[test]
    fn a_cursor_past_the_end_returns_nothing_and_stays() {
        assert_eq!(read_after(INBOX.as_bytes(), 50, 10), (vec![], 50));
        assert_eq!(read_after(b"", 0, 10), (vec![], 0));
    }

    #[tokio::test]
    async fn polls_the_file_and_moves_the_cursor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inbox.jsonl");
        let p = |cursor: Option<&str>| {
            IngressPollParams::new("notes-inbox", 2).with_cursor(cursor.map(str::to_owned))
        };

        // No inbox configured, or not created yet: nothing, cursor unchanged.
        assert_eq!(
            poll(None, &p(Some("3"))).await.unwrap().cursor.as_deref(),
            Some("3")
        );
        let r = poll(Some(&path), &p(None)).await.unwrap();
        assert_eq!((r.events.len(), r.cursor), (0, None));

        std::fs::write(&path, INBOX).unwrap();
        let r = poll(Some(&path), &p(None)).await.unwrap();
        assert_eq!(ids(&r.events), ["n-1", "line-3"]);
        assert_eq!(r.cursor.as_deref(), Some("3"));
        let r = poll(Some(&path), &p(r.cursor.as_deref())).await.unwrap();
        assert_eq!(ids(&r.events), ["7"]);
        assert_eq!(r.cursor.as_deref(), Some("6"));
        assert_eq!(r.events[0].payload, json!({ "id": 7, "text": "third" }));

        let err = poll(Some(&path), &p(Some("three"))).await.unwrap_err();
        assert!(err.is(ErrorCode::InvalidParams), "{err}");
    }
}
