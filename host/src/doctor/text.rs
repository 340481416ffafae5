//! How the checks write paths and sizes into their lines and commands. A leaf.

use std::path::Path;

/// `path` as one shell word: bare when it is made of characters no shell treats specially,
/// else in single quotes (a `'` inside written `'\''`), so a fix can be pasted as printed.
pub(super) fn sh(path: &Path) -> String {
    let s = path.to_string_lossy();
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:@,".contains(c));
    if plain {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// A size as people read it (`1.5 GiB`).
pub(super) fn bytes(n: u64) -> String {
    conduit_supervisor::limits::format_bytes(n)
}

/// `text`, cut to about `max` characters with `…` when longer.
pub(super) fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut s: String = text.chars().take(max).collect();
    s.push('…');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_quoted_only_when_a_shell_needs_it() {
        assert_eq!(
            sh(Path::new("/home/u/.local/state/conduit")),
            "/home/u/.local/state/conduit"
        );
        assert_eq!(sh(Path::new("/a b/it's")), r"'/a b/it'\''s'");
        assert_eq!(sh(Path::new("/x/$HOME")), "'/x/$HOME'");
        assert_eq!(cut("abcdef", 3), "abc…");
        assert_eq!(cut("abc", 3), "abc");
    }
}
