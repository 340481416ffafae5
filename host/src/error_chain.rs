//! Printing an error with its causes, each once.
//!
//! anyhow's `{:#}` joins every cause with `: `; an error type whose message already includes
//! its source's text (a common `thiserror` habit: `"cannot read {path}: {source}"` with
//! `#[source]`) then prints that text twice. [`chain`] skips a cause whose text the line
//! already holds, so every error prints its chain once whatever its types do.

/// `e` and its causes, outermost first, joined with `: `, each cause's text at most once.
pub fn chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read x: {source}")]
    struct Repeats {
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn a_cause_already_in_the_message_is_printed_once() {
        let io = std::io::Error::other("no space left");
        let e = anyhow::Error::new(Repeats { source: io }).context("cannot start");
        assert_eq!(chain(&e), "cannot start: cannot read x: no space left");
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(chain(&plain), "outer: inner");
    }
}
