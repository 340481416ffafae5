//! The budget gate against real extension processes: the `notes` example passes it, and the
//! negative controls — the same handlers made slow, wrong or hung (`slow-extension`) — fail it,
//! naming the method.
//!
//! Rounds here are short (the point is the verdict, not the figures) and the budget is this
//! build's, as in `make check`. `conduit-notes` is built first if it is missing or stale, into
//! the folder the test binaries' own executables are in, so a release test run times a release
//! extension.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use conduit_bench::gate::{self, GateConfig, GateReport, Method, Outcome, Percentile, STRIKES};
use conduit_supervisor::process::ChildCommand;
use conduit_supervisor::{ExtensionSpec, State, Supervisor, no_callbacks};

const SLOW: &str = env!("CARGO_BIN_EXE_slow-extension");

/// `conduit-notes` next to this package's binaries, built (or brought up to date) first.
fn notes() -> PathBuf {
    let dir = Path::new(SLOW).parent().unwrap();
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "--quiet", "-p", "conduit-example-notes", "--bin"])
        .arg("conduit-notes");
    match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(profile) => {
            cmd.args(["--profile", profile]);
        }
        None => panic!("no profile folder in {}", dir.display()),
    }
    let status = cmd.status().expect("running cargo");
    assert!(status.success(), "{cmd:?} failed: {status}");
    let path = dir.join("conduit-notes");
    assert!(path.is_file(), "{cmd:?} did not make {}", path.display());
    path
}

/// Run the gate against `program args…` under a fresh supervisor, and return its report and
/// the extension's last stderr lines (for failure messages).
async fn gate(program: &Path, args: &[&str], cfg: GateConfig) -> (GateReport, String) {
    let dir = tempfile::tempdir().unwrap();
    let sup = Supervisor::new(no_callbacks());
    let command = ChildCommand {
        program: program.to_path_buf(),
        args: args.iter().map(Into::into).collect(),
        cwd: dir.path().to_path_buf(),
        env: vec![("CONDUIT_EXTENSION".into(), "notes".into())],
    };
    let spec = ExtensionSpec::new("notes", "0.1.0", command, dir.path().join("notes.log"));
    let ext = sup.start(spec).await;
    let ready = ext
        .wait_for(Duration::from_secs(10), |s| s == State::Ready)
        .await;
    assert_eq!(
        ready,
        Ok(State::Ready),
        "{} {args:?} never became ready: {:?}",
        program.display(),
        ext.status()
    );
    cfg.validate().unwrap();
    let report = gate::run_gate(&ext, &cfg, |_, _| {}).await;
    let stderr = ext.status().stderr_tail.join("\n");
    sup.shutdown().await;
    (report, stderr)
}

fn short(calls_per_round: usize, warmup: usize) -> GateConfig {
    GateConfig {
        warmup,
        calls_per_round,
        rounds: STRIKES,
        ..GateConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_notes_example_passes_the_gate() {
    let (report, stderr) = gate(&notes(), &[], short(50, 20)).await;
    assert_eq!(
        report.outcome,
        Outcome::Passed,
        "{}\nstderr:\n{stderr}",
        report.outcome
    );
    for m in &report.methods {
        assert_eq!(
            (m.rounds.len(), m.total.calls),
            (STRIKES, 150),
            "{}",
            m.method
        );
        // p99 and max are never gated, so only the gated figures must be within budget.
        assert!(m.total.median <= report.budget.median, "{}", m.method);
    }
    let names: Vec<Method> = report.methods.iter().map(|m| m.method).collect();
    assert_eq!(names, Method::ALL);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_call_fails_the_gate_and_is_named() {
    // 30 ms a call: over the median budget of both builds (2 ms release, 10 ms debug), well
    // inside the 250 ms deadline, so it is slow rather than failed.
    let (report, stderr) = gate(Path::new(SLOW), &["dependency.filter", "30"], short(10, 2)).await;
    let Outcome::OverBudget(failures) = &report.outcome else {
        panic!(
            "the slow call was not caught: {:?}\nstderr:\n{stderr}",
            report.outcome
        );
    };
    let failed: Vec<Method> = failures.iter().map(|f| f.method).collect();
    assert_eq!(failed, [Method::Filter], "{}", report.outcome);
    let f = &failures[0];
    let rounds: Vec<usize> = f.rounds.iter().map(|r| r.round).collect();
    assert_eq!(rounds, [1, 2, 3]);
    assert!(
        f.rounds
            .iter()
            .all(|r| r.over.iter().any(|o| o.percentile == Percentile::Median))
    );
    let msg = report.outcome.to_string();
    assert!(
        msg.contains("`dependency.filter`")
            && msg.contains("median")
            && msg.contains("rounds 1, 2, 3"),
        "{msg}"
    );
    // The other three methods ran every round and stayed within budget.
    for m in report.methods.iter().filter(|m| m.method != Method::Filter) {
        assert_eq!(m.rounds.len(), STRIKES, "{}", m.method);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_answer_fails_the_gate_at_once() {
    let (report, _) = gate(Path::new(SLOW), &["recurrence.next", "wrong"], short(10, 5)).await;
    let Outcome::WrongAnswer(w) = &report.outcome else {
        panic!("the wrong answer was not caught: {:?}", report.outcome);
    };
    assert_eq!((w.method, w.round, w.call), (Method::Recurrence, 0, 1));
    assert!(w.detail.contains("next_at_ms"), "{}", w.detail);
    // Nothing was timed after it.
    assert!(report.methods.iter().all(|m| m.rounds.is_empty()));
    assert!(
        report
            .outcome
            .to_string()
            .starts_with("`recurrence.next` answered wrongly")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_the_deadline_is_a_failure_not_a_slow_call() {
    // The host would have given up at 250 ms and applied its fallback.
    let (report, _) = gate(Path::new(SLOW), &["emit.commit", "400"], short(10, 1)).await;
    let Outcome::WrongAnswer(w) = &report.outcome else {
        panic!("the hung call was not caught: {:?}", report.outcome);
    };
    assert_eq!(w.method, Method::Commit);
    assert!(w.detail.contains("the call failed"), "{}", w.detail);
}

#[test]
fn the_gate_binary_exits_1_naming_the_slow_method() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("results.json");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bench-extension"));
    cmd.args([
        "--rounds",
        "3",
        "--calls",
        "10",
        "--warmup",
        "2",
        "--extension",
        SLOW,
    ])
    .args([
        "--extension-arg",
        "dependency.filter",
        "--extension-arg",
        "30",
    ])
    .arg("--json")
    .arg(&json);
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let context = format!("{cmd:?}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(out.status.code(), Some(1), "{context}");
    assert!(
        stderr.contains("`dependency.filter` was over budget in 3 rounds running (rounds 1, 2, 3)")
            && stderr.contains("median"),
        "{context}"
    );
    // Per round and method: median, p95, p99 and max.
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("round 3/3  dependency.filter") && l.contains("max")),
        "{context}"
    );
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(results["passed"], false);
    let filter = &results["methods"]["dependency.filter"];
    assert_eq!(
        (filter["rounds"].as_u64(), filter["calls"].as_u64()),
        (Some(3), Some(30))
    );
    assert!(filter["median_us"].as_u64().unwrap() >= 30_000, "{filter}");
    for key in ["commit", "profile", "machine"] {
        assert!(!results[key].is_null(), "{key} missing: {results}");
    }
}
