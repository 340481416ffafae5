//! What `conduit doctor` reports: one [`Check`] per line (ok, warn or fail, what was found,
//! the command that fixes it) and the [`Report`] of them all.
//!
//! The JSON shape is an interface other tools read, so it is fixed here and nowhere else:
//!
//! ```text
//! {"checks": [{"name": "store", "status": "ok"|"warn"|"fail", "found": "…", "fix": "…"|null}, …],
//!  "status": "ok"|"warn"|"fail"}
//! ```
//!
//! `fix` is `null` on an ok line; on a warn or fail line it is the exact command (or, where no
//! one command can, the command that shows what to do). A leaf: the checks build these, the
//! CLI and the web view print them.

use serde::{Deserialize, Serialize};

/// How one check (or the whole report) came out, the worst last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    /// Which check: `state-dir`, `daemon`, `store`, `disk`, `wal`, `service`, `sandbox`,
    /// `cgroups`, `packages`, `package NAME`, `processes`, `extensions`, `extension NAME`.
    pub name: String,
    pub status: Status,
    /// What was found, in one line.
    pub found: String,
    /// The command that fixes it; `None` (JSON `null`) when the check is ok.
    pub fix: Option<String>,
}

impl Check {
    pub fn ok(name: impl Into<String>, found: impl Into<String>) -> Self {
        Check {
            name: name.into(),
            status: Status::Ok,
            found: found.into(),
            fix: None,
        }
    }

    pub fn warn(name: impl Into<String>, found: impl Into<String>, fix: impl Into<String>) -> Self {
        Check {
            name: name.into(),
            status: Status::Warn,
            found: found.into(),
            fix: Some(fix.into()),
        }
    }

    pub fn fail(name: impl Into<String>, found: impl Into<String>, fix: impl Into<String>) -> Self {
        Check {
            name: name.into(),
            status: Status::Fail,
            found: found.into(),
            fix: Some(fix.into()),
        }
    }
}

/// Every check, in the order they ran, and the worst status among them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub checks: Vec<Check>,
    pub status: Status,
}

impl Report {
    pub fn new(checks: Vec<Check>) -> Self {
        let status = checks.iter().map(|c| c.status).max().unwrap_or(Status::Ok);
        Report { checks, status }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_has_exactly_the_promised_shape() {
        let r = Report::new(vec![
            Check::ok("store", "quick_check ok"),
            Check::warn("daemon", "not running", "conduit daemon run"),
        ]);
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            serde_json::json!({
                "checks": [
                    {"name": "store", "status": "ok", "found": "quick_check ok", "fix": null},
                    {"name": "daemon", "status": "warn", "found": "not running", "fix": "conduit daemon run"},
                ],
                "status": "warn",
            })
        );
        assert_eq!(Report::new(vec![]).status, Status::Ok);
        let failed = Report::new(vec![Check::fail("a", "x", "y"), Check::warn("b", "x", "y")]);
        assert_eq!(failed.status, Status::Fail);
    }
}
