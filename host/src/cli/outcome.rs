//! How a command ends: [`CliError`] (the error to print and its exit code) and [`print`], the
//! one way to write to stdout, for which a closed pipe is not an error.
//!
//! A leaf: every subcommand and the shared helpers in `common.rs` use it, and it uses none of
//! them.

/// A failed command: the error to print and the exit code.
#[derive(Debug)]
pub(crate) struct CliError {
    pub(crate) code: u8,
    pub(crate) error: anyhow::Error,
}

impl CliError {
    /// Exit code 2: the input (arguments, a manifest) cannot be used.
    pub(crate) fn usage(error: impl Into<anyhow::Error>) -> Self {
        CliError {
            code: 2,
            error: error.into(),
        }
    }

    /// Exit code 1: the command could not do its work.
    pub(crate) fn failure(error: impl Into<anyhow::Error>) -> Self {
        CliError {
            code: 1,
            error: error.into(),
        }
    }
}

/// Write to stdout; a reader that went away (`| head`) is not an error.
pub(crate) fn print(text: &str) -> Result<(), CliError> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(CliError::failure(
            anyhow::Error::new(e).context("cannot write to stdout"),
        )),
        _ => Ok(()),
    }
}
