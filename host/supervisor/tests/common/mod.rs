//! What the supervisor's integration tests share: the Python interpreter, the fixtures folder,
//! an `ExtensionSpec` for a fixture script with fast restarts, and one ceiling for waits.

#![allow(dead_code, unreachable_pub)] // each test binary uses its own part of this module

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use conduit_supervisor::backoff::RestartPolicy;
use conduit_supervisor::process::ChildCommand;
use conduit_supervisor::{ExtCallError, Extension, ExtensionSpec};

/// How long a test waits for a condition before it gives up. Only a failing test waits this
/// long; the suite runs on busy two-core machines.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The Python interpreter itself: `python3` on PATH may be a shim script that adds variables of
/// its own to the environment, which would blur what the supervisor passes.
pub fn python() -> PathBuf {
    static PY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PY.get_or_init(|| {
        let out = std::process::Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("python3 runs");
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
    .clone()
}

/// `host/supervisor/tests/fixtures`.
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// An extension running `fixtures/SCRIPT MODE`, logging to `DIR/NAME.log`, with restarts fast
/// enough for tests to see several (the policy itself is tested with a fake clock).
pub fn fixture_spec(dir: &Path, name: &str, script: &str, mode: &str) -> ExtensionSpec {
    let command = ChildCommand {
        program: python(),
        args: vec![fixtures().join(script).into(), mode.into()],
        cwd: fixtures(),
        env: vec![("CONDUIT_EXTENSION".into(), name.into())],
    };
    let mut s = ExtensionSpec::new(name, "0.0.1", command, dir.join(format!("{name}.log")));
    s.policy = RestartPolicy {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(200),
        ..RestartPolicy::default()
    };
    s.stop_grace = Duration::from_secs(2);
    s.start_timeout = Duration::from_secs(10);
    s
}

/// Polls `f` until it holds; panics with `what` after [`PATIENCE`].
pub async fn until(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < PATIENCE, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Call a fixture's custom method with JSON params, its answer read as `R`.
pub async fn call<R: serde::de::DeserializeOwned>(
    ext: &Extension,
    method: &str,
    params: serde_json::Value,
    deadline: Option<Duration>,
) -> Result<R, ExtCallError> {
    let params = serde_json::value::to_raw_value(&params).unwrap();
    let raw = ext.call_raw(method, &params, deadline).await?;
    Ok(serde_json::from_str(raw.get()).expect("the fixture answers what the test reads"))
}
