//! [`ManifestError`]: why a manifest could not be used, each variant naming the file and the
//! field, so the message alone tells an author where to look.

use std::path::PathBuf;

use super::types::MAX_MANIFEST_BYTES;

/// Why a manifest could not be used. Each variant names the file, and the field where there is
/// one, so the message alone tells an author where to look.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// The file could not be read (most often: it does not exist).
    #[error("cannot read {}: {source}; {hint}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
        hint: &'static str,
    },
    /// Larger than [`MAX_MANIFEST_BYTES`].
    #[error(
        "{} is larger than {} ({MAX_MANIFEST_BYTES} bytes), the limit for a manifest; a manifest holds only the package's name, version, command and capabilities, so keep other data in files of the package",
        path.display(), human_kib(MAX_MANIFEST_BYTES)
    )]
    TooLarge { path: PathBuf },
    /// Not valid TOML (or not UTF-8).
    #[error("{} is not valid TOML: {message}", path.display())]
    Syntax { path: PathBuf, message: String },
    /// A key the manifest does not know (often a misspelling).
    #[error(
        "{}: unknown key `{key}`{}; the known keys are {}. Check the spelling, or remove it",
        path.display(), in_table(table), known.join(", ")
    )]
    UnknownKey {
        path: PathBuf,
        key: String,
        /// Where the key is (`""` for the top level, `capabilities`, `capabilities.work_kinds[0]`).
        table: String,
        known: &'static [&'static str],
    },
    /// A required field is absent.
    #[error("{}: `{field}` is required: {fix}", path.display())]
    Missing {
        path: PathBuf,
        field: &'static str,
        fix: &'static str,
    },
    /// A field is present but breaks its rule.
    #[error("{}: `{field}` {problem}; {fix}", path.display())]
    Invalid {
        path: PathBuf,
        field: String,
        problem: String,
        fix: String,
    },
    /// `command`'s program cannot be used.
    #[error("{}: `command` program `{program}` {problem}; {fix}", path.display())]
    Command {
        path: PathBuf,
        program: String,
        problem: String,
        fix: String,
    },
}

fn human_kib(n: usize) -> String {
    format!("{} KiB", n / 1024)
}

fn in_table(table: &str) -> String {
    if table.is_empty() {
        String::new()
    } else {
        format!(" in `{table}`")
    }
}

impl ManifestError {
    /// The field the error is about, if it is about one (for `--json` output and tests).
    pub fn field(&self) -> Option<String> {
        match self {
            ManifestError::UnknownKey { key, table, .. } if table.is_empty() => Some(key.clone()),
            ManifestError::UnknownKey { key, table, .. } => Some(format!("{table}.{key}")),
            ManifestError::Missing { field, .. } => Some((*field).to_owned()),
            ManifestError::Invalid { field, .. } => Some(field.clone()),
            ManifestError::Command { .. } => Some("command".to_owned()),
            ManifestError::Read { .. }
            | ManifestError::Syntax { .. }
            | ManifestError::TooLarge { .. } => None,
        }
    }
}
