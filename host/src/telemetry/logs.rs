//! The log format: `text` (for people; colours only on a terminal and never with `NO_COLOR`)
//! or `json` (one JSON object a line, with the fields of the spans it happened in), chosen by
//! `--log-format` or `CONDUIT_LOG_FORMAT`.

use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl LogFormat {
    /// The value of `CONDUIT_LOG_FORMAT`, if set; an unknown value is an error naming the
    /// accepted ones.
    pub fn from_env() -> Result<Option<LogFormat>, String> {
        match std::env::var("CONDUIT_LOG_FORMAT") {
            Err(_) => Ok(None),
            Ok(v) if v.is_empty() => Ok(None),
            Ok(v) => match v.to_ascii_lowercase().as_str() {
                "text" => Ok(Some(LogFormat::Text)),
                "json" => Ok(Some(LogFormat::Json)),
                _ => Err(format!(
                    "CONDUIT_LOG_FORMAT is `{v}`; it must be `text` or `json`"
                )),
            },
        }
    }
}

/// Whether text logs are coloured: only on a terminal, and never when `NO_COLOR` is set to
/// anything but the empty string (no-color.org).
fn colours(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// The stderr layer for `format`.
pub(crate) fn layer<S>(format: LogFormat) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    // Under systemd, stderr is the journal (it sets JOURNAL_STREAM), which stamps every line
    // itself: a second timestamp would only crowd `journalctl`.
    let journal = std::env::var_os("JOURNAL_STREAM").is_some();
    match format {
        LogFormat::Text => {
            let ansi = colours(
                std::io::IsTerminal::is_terminal(&std::io::stderr()),
                std::env::var_os("NO_COLOR").as_deref(),
            );
            let l = tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(ansi)
                .with_target(false);
            if journal {
                l.without_time().boxed()
            } else {
                l.boxed()
            }
        }
        // JSON is for machines, which want the timestamp even from the journal.
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .with_current_span(true)
            .with_span_list(true)
            .boxed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_color_turns_colours_off_even_on_a_terminal() {
        use std::ffi::OsStr;
        assert!(colours(true, None));
        assert!(!colours(true, Some(OsStr::new("1"))));
        assert!(!colours(true, Some(OsStr::new("0"))), "any value counts");
        assert!(
            colours(true, Some(OsStr::new(""))),
            "an empty value does not"
        );
        assert!(!colours(false, None), "never into a file or a pipe");
    }
}
