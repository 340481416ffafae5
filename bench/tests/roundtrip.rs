//! The round-trip benchmark still runs end to end: every workload's child starts, answers
//! correctly (the benchmark checks each echo) and exits, and the JSON has the shape
//! `docs/performance.md` and scripts read.
//!
//! The run is tiny (the point is that it works, not the figures) and idle only: the awake
//! regime would keep both CPUs busy for the length of the test.

use std::process::Command;

use serde_json::Value;

#[test]
fn every_workload_runs_and_the_json_has_its_shape() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("results.json");
    let out = Command::new(env!("CARGO_BIN_EXE_roundtrip"))
        .args([
            "--regime", "idle", "--calls", "40", "--warmup", "5", "--rounds", "2",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "roundtrip failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(report["commit"].is_string());
    assert!(report["machine"]["cpus"].as_u64().unwrap() >= 1);
    let idle = &report["regimes"]["idle"];
    for key in [
        "floor",
        "tokio-inline",
        "conduit",
        "session-host",
        "jsonrpsee-dispatch",
        "jsonrpsee-client",
    ] {
        let w = &idle[key];
        assert_eq!(w["calls"], 40, "{key}: {w}");
        assert!(w["p50_us"].as_f64().unwrap() > 0.0, "{key}: {w}");
        assert!(w["p99_us"].as_f64().unwrap() >= w["p50_us"].as_f64().unwrap());
        assert!(w["cpu_us_per_call"].as_f64().unwrap() > 0.0, "{key}: {w}");
        assert_eq!(w["p50_by_round_us"].as_array().unwrap().len(), 2);
    }
    assert_eq!(idle["floor"]["p50_ratio"], 1.0);
    // Every placement asked for (by default all three; two CPUs are needed to split) is there.
    let placements = report["placements"].as_object().unwrap();
    assert!(placements.contains_key("same-cpu") && placements.contains_key("free"));
}
