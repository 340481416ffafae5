//! What every rule may look at while a check runs ([`Ctx`]): the manifest, the options, the
//! checker's side of the callbacks and how each instance is launched.

use std::time::Duration;

use super::callbacks::CheckHost;
use super::report::CheckOptions;
use crate::manifest::Manifest;

/// What every rule may look at.
pub(crate) struct Ctx<'a> {
    pub(crate) manifest: &'a Manifest,
    pub(crate) opts: &'a CheckOptions,
    pub(crate) host: CheckHost,
    pub(crate) now_ms: i64,
    pub(crate) source: String,
    /// How every instance is started: as the daemon would start the package (see
    /// `packages::launch`), with scratch data and temporary folders.
    pub(crate) launch: conduit_supervisor::process::PackageLaunch,
    /// The sandbox the first instance ran in.
    pub(crate) sandbox: std::sync::Mutex<Option<conduit_supervisor::sandbox::SandboxStatus>>,
}

/// A launch for unit tests of rules that never start a package.
#[cfg(test)]
pub(crate) fn test_launch() -> conduit_supervisor::process::PackageLaunch {
    conduit_supervisor::process::PackageLaunch {
        name: "test".into(),
        dir: "/nonexistent".into(),
        program: "/nonexistent/x".into(),
        args: Vec::new(),
        data_dir: "/nonexistent/data".into(),
        tmp_dir: "/nonexistent/tmp".into(),
        limits: conduit_supervisor::limits::Limits::DEFAULT,
        sandbox: None,
        cgroup: None,
    }
}

impl Ctx<'_> {
    /// For answers the protocol wants at once (a parse error, `overloaded` …): generous enough
    /// for a loaded machine, short enough that a package that never answers costs little.
    pub(crate) fn prompt(&self) -> Duration {
        self.opts.timeout.min(Duration::from_secs(5))
    }
}
