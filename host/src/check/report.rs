//! What a check reports: each rule's [`RuleResult`] and the whole [`Report`], plain data the CLI
//! prints (as text or `--json`) and turns into an exit code; and the [`CheckOptions`] a check
//! runs with.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use super::rules::ids::section;

/// How a rule came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Fail,
    Skip,
}

/// One rule's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct RuleResult {
    /// The rule's stable id (one of [`RULES`](super::rules::ids::RULES)).
    pub id: &'static str,
    pub status: Status,
    /// What was seen: on a failure, what is wrong; on a skip, why it did not run.
    pub detail: String,
    /// On a failure, what the package's author should change.
    pub fix: Option<String>,
    /// The section of `docs/protocol.md` the rule enforces.
    pub section: &'static str,
    /// Things worth knowing that do not fail the rule (a slow answer, an accepted error).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl RuleResult {
    pub(crate) fn pass(id: &'static str, detail: impl Into<String>) -> Self {
        RuleResult {
            id,
            status: Status::Pass,
            detail: detail.into(),
            fix: None,
            section: section(id),
            notes: Vec::new(),
        }
    }

    pub(crate) fn fail(
        id: &'static str,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        RuleResult {
            id,
            status: Status::Fail,
            detail: detail.into(),
            fix: Some(fix.into()),
            section: section(id),
            notes: Vec::new(),
        }
    }

    pub(crate) fn skip(id: &'static str, why: impl Into<String>) -> Self {
        RuleResult {
            id,
            status: Status::Skip,
            detail: why.into(),
            fix: None,
            section: section(id),
            notes: Vec::new(),
        }
    }

    pub(crate) fn with_notes(mut self, notes: Vec<String>) -> Self {
        self.notes.extend(notes);
        self
    }
}

/// The package, as the report names it.
#[derive(Clone, Debug, Serialize)]
pub struct PackageInfo {
    pub name: String,
    pub version: String,
    pub path: PathBuf,
    pub protocol: Vec<u32>,
    pub command: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// The limits and sandbox the package was checked under: those the daemon would give it with
/// no operator settings.
#[derive(Clone, Debug, Serialize)]
pub struct RunUnder {
    pub limits: conduit_supervisor::limits::Limits,
    /// One line (`Landlock (ABI 7): …`, `none: …`); absent when no instance started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// Asks of the package an operator would have to grant.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// The outcome of a whole check.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub run_under: RunUnder,
    pub package: PackageInfo,
    /// True when no rule failed (skips do not count against it).
    pub passed: bool,
    /// Every rule of [`RULES`](super::rules::ids::RULES), in that order.
    pub rules: Vec<RuleResult>,
    /// The end of each instance's stderr, by instance (`main`, `version`, `overload`); only
    /// instances that wrote something.
    pub stderr: BTreeMap<String, String>,
    pub elapsed_ms: u64,
}

impl Report {
    /// How many rules came out with `status`.
    pub fn count(&self, status: Status) -> usize {
        self.rules.iter().filter(|r| r.status == status).count()
    }
}

/// Knobs of a check.
#[derive(Clone, Debug)]
pub struct CheckOptions {
    /// How long to wait for each answer that may take work: the handshake, each declared
    /// method. Answers the protocol wants "at once" have their own, shorter waits.
    pub timeout: Duration,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            // The host's start timeout.
            timeout: Duration::from_secs(10),
        }
    }
}
