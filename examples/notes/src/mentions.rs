//! `dependency.filter` for the `mentions` filter: does a note mention the wait's subject?
//!
//! A wait created with subject `ada` (or `@ada`) is satisfied by a note whose text contains
//! `@ada` as a whole word, in any letter case: `Thanks @Ada!` and `(@ada)` mention her;
//! `@adam`, `@ada_l`, `@ada-l` and `mail@ada.org`'s `@ada` do not — the first three are other
//! handles, and an `@` with a word character right before it is part of an address.
//!
//! Word characters are letters, digits, `_` and `-` (handles may contain the last two). Letter
//! case is compared after Unicode lowercasing of both sides.
//!
//! Invariant: an empty subject mentions nobody.

/// Whether `text` mentions `@subject` as a whole word; see the module docs.
pub fn mentions(text: &str, subject: &str) -> bool {
    let subject = subject.trim();
    let subject = subject.strip_prefix('@').unwrap_or(subject);
    if subject.is_empty() {
        return false;
    }
    let needle = format!("@{}", subject.to_lowercase());
    // Lowercase the text once; the boundary checks below look at the lowercased text, so
    // lengths that change under lowercasing cannot misalign them.
    let text = text.to_lowercase();
    text.match_indices(&needle).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + needle.len()..].chars().next();
        !before.is_some_and(is_word) && !after.is_some_and(is_word)
    })
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '-'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_word_mentions_match() {
        for text in [
            "@ada",
            "hello @ada",
            "@ada, can you look?",
            "Thanks @Ada!",
            "(@ADA)",
            "cc:@ada.",
            "line one\n@ada's turn",
            "first @adam then @ada",
        ] {
            assert!(mentions(text, "ada"), "{text:?}");
        }
    }

    #[test]
    fn other_handles_addresses_and_bare_names_do_not() {
        for text in [
            "@adam",
            "@ada_l",
            "@ada-l",
            "mail ada@ada.org",
            "x@ada",
            "ada without an at",
            "@ ada",
            "",
        ] {
            assert!(!mentions(text, "ada"), "{text:?}");
        }
    }

    #[test]
    fn the_subject_may_carry_its_at_sign_and_spaces() {
        assert!(mentions("ping @ada", "@ada"));
        assert!(mentions("ping @ada", "  Ada "));
    }

    #[test]
    fn an_empty_subject_mentions_nobody() {
        assert!(!mentions("@ hello @", ""));
        assert!(!mentions("@ hello @", "@"));
    }

    #[test]
    fn unicode_letters_and_case() {
        assert!(mentions("merci @Zoë!", "zoë"));
        assert!(mentions("merci @ZOË", "Zoë"));
        // A letter after the handle, even a non-ASCII one, makes it a different handle.
        assert!(!mentions("@zoëlle", "zoë"));
        assert!(!mentions("é@zoë", "zoë"));
    }

    #[test]
    fn a_later_occurrence_counts_when_the_first_is_part_of_a_word() {
        assert!(mentions("a@ada then @ada", "ada"));
    }
}
