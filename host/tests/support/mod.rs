//! Shared by the binary-level tests: running `conduit`, staging the example packages,
//! and printing everything a person needs when an assertion fails.

#![allow(dead_code, unreachable_pub)] // each test binary uses its own part of this module

pub mod browser;
pub mod drill;
pub mod fixture;
pub mod http;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

/// How long a test waits for a condition before it gives up. Only a failing test ever waits
/// this long, so it is generous: the suite runs on busy two-core machines, where starting a
/// Python extension can take seconds. A bound that is the feature under test (a deadline, a
/// start timeout) is asserted on its own, never through this ceiling.
pub const PATIENCE: Duration = Duration::from_secs(30);

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// What one run of the binary produced.
pub struct Run {
    pub cmd: String,
    pub out: Output,
}

impl Run {
    pub fn code(&self) -> Option<i32> {
        self.out.status.code()
    }

    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }

    /// Everything a person needs when an assertion fails.
    pub fn context(&self) -> String {
        format!(
            "\n$ {}\nexit: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.cmd,
            self.out.status,
            self.stdout(),
            self.stderr()
        )
    }

    #[track_caller]
    pub fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(self.code(), Some(code), "{}", self.context());
        self
    }

    /// The `--json` report.
    #[track_caller]
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.out.stdout)
            .unwrap_or_else(|e| panic!("--json output does not parse: {e}{}", self.context()))
    }
}

/// `target/<profile>/`, where this test's own binary and the examples' binaries are built.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap(); // target/<profile>/deps/ext_check-<hash>
    exe.parent().unwrap().parent().unwrap().to_owned()
}

/// Copies a Rust example's manifest and built binary into a fresh package folder. An example
/// without a manifest is not a package yet (said on stderr); a manifest without its binary
/// fails, saying how to build it.
pub fn stage_rust_example(example: &str, into: &Path) -> Option<PathBuf> {
    let src = workspace_root().join("examples").join(example);
    let manifest = src.join("conduit-extension.toml");
    if !manifest.exists() {
        eprintln!("examples/{example} has no conduit-extension.toml yet; it is not checked");
        return None;
    }
    let text = std::fs::read_to_string(&manifest).unwrap();
    let table: toml::Table = text.parse().unwrap();
    let program = table["command"][0].as_str().unwrap().to_owned();
    let name = Path::new(&program).file_name().unwrap();
    let bin = profile_dir().join(name);
    assert!(
        bin.is_file(),
        "examples/{example} has a manifest but its binary {} is not built: run `cargo build --workspace` (or `cargo build -p <the example's package>`) before this test",
        bin.display()
    );
    let pkg = into.join(example);
    let dest = pkg.join(&program);
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    std::fs::copy(&manifest, pkg.join("conduit-extension.toml")).unwrap();
    std::fs::copy(&bin, &dest).unwrap(); // keeps the execute bit
    Some(pkg)
}

/// Stage `examples/NAME` into `into` with `scripts/stage-examples.sh`, the way `make stage` does
/// (a Python or Node example gets its SDK beside it there: the repository keeps no copy), and
/// return the staged package folder.
pub fn stage_example(example: &str, into: &Path) -> PathBuf {
    let out = std::process::Command::new(workspace_root().join("scripts/stage-examples.sh"))
        .arg("dev")
        .arg(into)
        .arg(example)
        .output()
        .expect("scripts/stage-examples.sh runs");
    assert!(
        out.status.success(),
        "scripts/stage-examples.sh dev {} {example} failed:\n{}{}",
        into.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    into.join(example)
}

/// Stage the Python test package `host/tests/packages/NAME` — its manifest beside the one
/// `serve.py` all of them share — into a fresh folder under this test target's scratch folder
/// (fresh each call: tests run in parallel processes, and one must not rewrite a script another
/// is running), and return it.
pub fn python_package(name: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/packages");
    let dest = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("packages-{}-{n}", std::process::id()))
        .join(name);
    std::fs::create_dir_all(&dest).unwrap();
    std::fs::copy(
        src.join(name).join("conduit-extension.toml"),
        dest.join("conduit-extension.toml"),
    )
    .unwrap();
    std::fs::copy(src.join("serve.py"), dest.join("serve.py")).unwrap();
    dest
}
