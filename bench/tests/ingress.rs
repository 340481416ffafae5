//! `bench-ingress` still runs end to end against a real daemon (the debug build beside it,
//! with `notes`), and its results file has exactly the keys other tools read.
//!
//! The run is tiny (the point is that it works, not the figures): a fraction of a second per
//! phase, a low fixed rate.

use std::process::Command;

use conduit_bench::ingress::{CLIENTS, check_shape};
use serde_json::Value;

#[test]
fn every_phase_runs_and_the_results_have_their_shape() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("results.json");
    let out = Command::new(env!("CARGO_BIN_EXE_bench-ingress"))
        .args([
            "--seconds",
            "0.3",
            "--warmup",
            "0.1",
            "--rate",
            "100",
            "--fixed-seconds",
            "0.5",
            "--fixed-conns",
            "4",
            "--reads-seconds",
            "0.3",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let text = || {
        format!(
            "{}\nstdout:\n{}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    assert!(out.status.success(), "bench-ingress failed: {}", text());
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    check_shape(&v).unwrap_or_else(|e| panic!("{e}: {v:#}"));
    for n in CLIENTS {
        let c = &v["clients"][n.to_string()];
        assert!(c["events_per_s"].as_f64().unwrap() > 0.0, "{c}");
        assert!(c["ack_p99_ms"].as_f64().unwrap() >= c["ack_p50_ms"].as_f64().unwrap());
        assert!(v["floor"][n.to_string()]["events_per_s"].as_f64().unwrap() > 0.0);
    }
    // This build exports the writer's and routing's histograms: no figure is missing.
    let f = &v["fixed_rate"];
    assert_eq!(f["offered_per_s"], 100.0);
    for k in [
        "ack_to_route_p50_ms",
        "ack_to_route_p99_ms",
        "writer_wait_p99_ms",
        "writer_hold_p99_ms",
    ] {
        assert!(f[k].as_f64().unwrap() >= 0.0, "{k}: {f}");
    }
    assert_eq!(v["fixed_rate_extra"]["ack_to_route_source"], "metrics");
    assert!(v["reads"]["list_p99_ms_idle"].as_f64().unwrap() > 0.0);
    assert!(v["reads"]["list_p99_ms_pushing"].as_f64().unwrap() > 0.0);
    assert!(v["commit"].is_string() && v["machine"]["cpus"].as_u64().unwrap() >= 1);
}
