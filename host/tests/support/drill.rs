//! The drill suite's report: each drill (a test in a `host/tests/drill_*.rs` target) ends by
//! recording one line — its name, the bound it holds and what it measured — which `make drill`
//! prints as a table after the run (`scripts/drill-report.sh`).
//!
//! A drill still asserts its bound itself; the report only makes the figures visible. Lines go
//! to `$CARGO_TARGET_TMPDIR/drills/<name>.txt`, one file per drill, so drills running in
//! parallel processes never write the same file.

use std::path::PathBuf;

/// Where drill lines are written.
pub fn report_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("drills")
}

/// Record one drill's outcome: `bound` is what must hold ("routed within 1.5 s, p99"),
/// `measured` what this run saw ("p99 0.41 s over 200 pushes"), `ok` whether it held.
pub fn report(name: &str, bound: &str, measured: &str, ok: bool) {
    let dir = report_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let verdict = if ok { "ok" } else { "FAILED" };
    let line = format!("{name}\t{bound}\t{measured}\t{verdict}\n");
    std::fs::write(dir.join(format!("{name}.txt")), line).unwrap();
    eprintln!("drill {name}: {bound}; measured {measured}: {verdict}");
}

/// How many rounds a drill of rounds runs: `CONDUIT_DRILL_ROUNDS` (`make drill` sets 20), else 5.
pub fn rounds() -> usize {
    std::env::var("CONDUIT_DRILL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
}
