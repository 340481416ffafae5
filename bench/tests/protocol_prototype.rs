//! The transport comparison still runs end to end: both extension children start, pass every
//! step of the workload (each answer, digest and cancellation is checked by the benchmark
//! itself), and the JSON has the shape `docs/performance.md` and scripts read.
//!
//! The run is tiny (the point is that it works, not the figures): idle only, one placement,
//! one round, a 256 KiB artifact (on both paths, and through a daemon in the same placement).

use std::process::Command;

use serde_json::Value;

const FLOORS: [&str; 7] = [
    "pipe_rtt_p50_us",
    "pipe_rtt_p99_us",
    "spawn_us",
    "pipe_mib_s",
    "kill_to_eof_us",
    "pipe_cpu_us",
    "pipe_msgs_s",
];

const FIGURES: [&str; 12] = [
    "cold_start_us",
    "warm_restart_us",
    "version_refusal_us",
    "echo_p50_us",
    "echo_p99_us",
    "callback_p50_us",
    "artifact_mib_s",
    "cancel_seen_us",
    "crash_detected_us",
    "echo_cpu_us",
    "pipelined_calls_s",
    "binary_bytes",
];

#[test]
fn both_transports_run_the_workload_and_the_json_has_its_shape() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("results.json");
    let out = Command::new(env!("CARGO_BIN_EXE_protocol-prototype"))
        .args([
            "--regime",
            "idle",
            "--placement",
            "same",
            "--rounds",
            "1",
            "--warmup",
            "5",
            "--calls",
            "20",
            "--callbacks",
            "10",
            "--pipelined",
            "200",
            "--in-flight",
            "8",
            "--starts",
            "1",
            "--cancels",
            "2",
            "--artifacts",
            "1",
            "--artifact-bytes",
            "262144",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "protocol-prototype failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("echo p50"), "no table printed:\n{stdout}");

    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(report["commit"].is_string());
    assert!(report["machine"]["cpus"].as_u64().unwrap() >= 1);
    let idle = &report["regimes"]["idle"];
    for key in FLOORS {
        let v = idle["floors"][key].as_f64();
        assert!(
            v.is_some_and(|v| v > 0.0),
            "floor {key}: {}",
            idle["floors"]
        );
    }
    for t in ["jsonrpc-stdio", "grpc-uds"] {
        let figures = &idle["transports"][t];
        for key in FIGURES {
            let v = figures[key].as_f64();
            assert!(v.is_some_and(|v| v > 0.0), "{t} {key}: {figures}");
        }
        assert!(figures["echo_p99_us"].as_f64() >= figures["echo_p50_us"].as_f64());
        // The crash restated: the transport's own child's exit in the same round, and what
        // the host adds to it (a difference of medians, so any sign).
        assert!(
            figures["child_kill_to_eof_us"]
                .as_f64()
                .is_some_and(|v| v > 0.0),
            "{t}: {figures}"
        );
        assert!(figures["crash_host_added_us"].is_f64(), "{t}: {figures}");
    }
    // Every target says whether it is gated in this regime and placement; the restated ones
    // are there.
    let targets = idle["targets"].as_array().unwrap();
    assert!(
        targets
            .iter()
            .all(|t| t["gated"].is_boolean() && t["met"].is_boolean())
    );
    for want in [
        "crash: the host adds ≤ 50 µs",
        "artifact faster than gRPC",
        "cold start ≤ the spawn floor + 1 ms",
        "pipelined ≥ 50%",
        "artifact through the daemon ≥ 60% of the bench host's rate",
        "daemon CPU per MiB ≤ 1.5× the bench host's",
    ] {
        assert!(
            targets
                .iter()
                .any(|t| t["target"].as_str().is_some_and(|s| s.starts_with(want))),
            "no target `{want}`: {targets:?}"
        );
    }
    assert!(report["placements"]["same-cpu"]["idle"].is_object());
    // JSON-RPC's second artifact path, base64 chunks beside the bulk pipe.
    let json_chunks = idle["transports"]["jsonrpc-stdio"]["artifact_json_mib_s"].as_f64();
    assert!(
        json_chunks.is_some_and(|v| v > 0.0),
        "{}",
        idle["transports"]
    );
    // `conduit` is built beside this binary by `make build`, so the daemon path runs too, in
    // the placement of the rounds beside it.
    let daemon = &report["through_daemon"]["idle"];
    assert_eq!(
        daemon,
        &report["placements"]["same-cpu"]["idle"]["through_daemon"]
    );
    for key in ["daemon_artifact_mib_s", "daemon_artifact_json_mib_s"] {
        assert!(
            daemon[key].as_f64().is_some_and(|v| v > 0.0),
            "{key}: {daemon} (no figure: is `conduit` built beside the benchmark? `make build`)"
        );
    }
}
