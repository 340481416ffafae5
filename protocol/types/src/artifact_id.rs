//! Artifact ids: `sha256:` and the 64 lower-case hex digits of the content's SHA-256
//! (docs/protocol.md §8), read in one place by everyone who takes one.
//!
//! Two readers: [`parse`] takes an id someone typed or sent (the API, the CLI), and
//! [`find_in`] finds every id mentioned anywhere in a text (a payload as stored), which is how
//! the host learns which records mention which artifact.
//!
//! Invariant: both accept exactly the ids [`format`] writes (upper-case hex is read as the same
//! digest, lower-cased); [`find_in`] never reports a digest that is part of a longer run of hex
//! digits, so a 65-digit string is not taken for an id.

/// What every artifact id starts with.
pub const PREFIX: &str = "sha256:";

/// The number of hex digits of a SHA-256 digest.
pub const DIGEST_HEX_LEN: usize = 64;

/// The id of the content whose digest is `hex` (lower-case hex, as stored).
pub fn format(hex: &str) -> String {
    format!("{PREFIX}{hex}")
}

/// The digest (64 lower-case hex digits) of an id given as `sha256:<hex>` or as the bare
/// digits; `None` for anything else.
pub fn parse(id: &str) -> Option<String> {
    let hex = id.strip_prefix(PREFIX).unwrap_or(id);
    (hex.len() == DIGEST_HEX_LEN && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| hex.to_ascii_lowercase())
}

/// Every artifact id mentioned in `text` (`sha256:` then exactly 64 hex digits, not followed
/// by another hex digit), as lower-case digests, each once, in the order first seen.
///
/// A scan for the prefix (a substring search, not a JSON parse), so a payload costs about one
/// pass over its bytes; ids inside JSON strings are found as they appear in the stored text.
pub fn find_in(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let bytes = text.as_bytes();
    let mut from = 0;
    while let Some(at) = text[from..].find(PREFIX) {
        let start = from + at + PREFIX.len();
        from = start;
        let Some(digits) = bytes.get(start..start + DIGEST_HEX_LEN) else {
            break;
        };
        if !digits.iter().all(u8::is_ascii_hexdigit) {
            continue;
        }
        if bytes
            .get(start + DIGEST_HEX_LEN)
            .is_some_and(u8::is_ascii_hexdigit)
        {
            continue;
        }
        let hex = String::from_utf8_lossy(digits).to_ascii_lowercase();
        if !out.contains(&hex) {
            out.push(hex);
        }
        from = start + DIGEST_HEX_LEN;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_takes_the_prefixed_and_the_bare_digest_and_nothing_else() {
        let hex = "ab".repeat(32);
        assert_eq!(parse(&format(&hex)).as_deref(), Some(hex.as_str()));
        assert_eq!(parse(&hex).as_deref(), Some(hex.as_str()));
        assert_eq!(
            parse(&format!("sha256:{}", "AB".repeat(32))).as_deref(),
            Some(hex.as_str())
        );
        for bad in [
            "",
            "sha256:",
            "xyz",
            &"ab".repeat(31),
            &format!("{}0", "ab".repeat(32)),
            &"zz".repeat(32),
            &format!("md5:{hex}"),
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn find_in_reports_each_mentioned_id_once_and_no_longer_runs_of_digits() {
        let (a, b) = ("0a".repeat(32), "f1".repeat(32));
        let text = format!(
            r#"{{"report":"sha256:{a}","also":["sha256:{b}","see sha256:{a} again"],"upper":"sha256:{}"}}"#,
            b.to_ascii_uppercase()
        );
        assert_eq!(find_in(&text), vec![a.clone(), b.clone()]);
        // Too short, too long, not hex, cut off at the end: none is an id.
        let near = format!(
            "sha256:{} sha256:{a}0 sha256:{}zz sha256:{}",
            "0a".repeat(31),
            "0a".repeat(31),
            &b[..10]
        );
        assert!(find_in(&near).is_empty(), "{:?}", find_in(&near));
        // A prefix inside a longer id's digits does not hide the id after it.
        assert_eq!(find_in(&format!("sha256:sha256:{a}")), vec![a.clone()]);
        assert!(find_in("").is_empty());
        // Multi-byte text around an id is fine.
        assert_eq!(find_in(&format!("é sha256:{b}—")), vec![b]);
    }
}
