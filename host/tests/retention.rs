//! Retention end to end: the real daemon and a Python extension that stores artifacts
//! (`fixtures/core_ext.py`), driven through the `conduit` binary — `config`, `gc`, `artifacts
//! list|show|get`, the API and the metrics — over real SQLite files and real content files.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::Value;
use support::PATIENCE;
use support::fixture::Fixture;

/// `ext call art make-artifact {"size": N}`: the content's id (the content is a function of its
/// size, so each size is its own artifact).
fn make_artifact(f: &Fixture, size: u64) -> String {
    let run = f.conduit(&[
        "ext",
        "call",
        "art",
        "make-artifact",
        &format!(r#"{{"size":{size},"chunk":65536}}"#),
        "--timeout-ms",
        "120000",
    ]);
    assert_eq!(run.code(), Some(0), "{}{}", run.context(), f.context());
    let v: Value = serde_json::from_slice(&run.out.stdout).unwrap();
    v["artifact_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no artifact_id: {v:#}"))
        .to_owned()
}

fn content_file(f: &Fixture, id: &str) -> PathBuf {
    f.state()
        .join("artifacts/sha256")
        .join(id.strip_prefix("sha256:").unwrap())
}

fn socket(f: &Fixture) -> PathBuf {
    f.state().join("run/conduit.sock")
}

/// The artifact ids a sweep report removed (or would remove), in its order.
fn removed_ids(report: &Value) -> Vec<String> {
    report["artifacts"]["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["artifact_id"].as_str().unwrap().to_owned())
        .collect()
}

/// The value of one sample of `conduit metrics` (`name{labels}`), if present.
fn metric(f: &Fixture, sample: &str) -> Option<f64> {
    let run = f.conduit(&["metrics"]);
    assert_eq!(run.code(), Some(0), "{}", run.context());
    run.stdout()
        .lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
}

/// A daemon running `art`, its first periodic sweep a day away (a test knob) so that what a
/// test checks is its own `gc`'s doing.
fn started_with_art() -> Fixture {
    let mut f = Fixture::new();
    f.install(&f.core_ext("art", "ok"));
    f.start_daemon_with(&[(
        "CONDUIT_TEST_FIRST_SWEEP_DELAY_MS",
        std::ffi::OsStr::new("86400000"),
    )]);
    f.wait_state("art", "ready", PATIENCE);
    f
}

#[test]
fn over_the_budget_the_oldest_unneeded_content_goes_and_what_a_live_record_needs_stays() {
    let f = started_with_art();
    let mut ids = vec![make_artifact(&f, 100_000)];
    // An Event mentions the oldest (which counts as touched then, so the others are stored
    // after it); it is routed to a Work that is not done: live.
    let pushed = f.push(
        "feed",
        "r-1",
        "job.report",
        &format!(r#"{{"group":"g","report":"{}"}}"#, ids[0]),
    );
    let event_id = pushed["event_id"].as_i64().unwrap();
    f.wait_until("the event to be routed to a Work", || {
        support::http::event(&socket(&f), event_id).filter(|e| e["work_id"].is_i64())
    });
    ids.extend(
        [200_000, 300_000, 50_000]
            .iter()
            .map(|&n| make_artifact(&f, n)),
    );

    let set = f.conduit(&[
        "config",
        "set",
        "retention.artifacts.max_bytes=400000",
        "retention.artifacts.grace=0s",
    ]);
    assert_eq!(set.code(), Some(0), "{}", set.context());
    assert!(
        set.stdout()
            .contains("retention.artifacts.max_bytes  400000"),
        "{}",
        set.context()
    );

    // A dry run lists what would go and removes nothing: 650,000 bytes against 400,000, the
    // oldest is live, so the next two go (450,000, then 150,000).
    let dry = f.json(&["gc", "--dry-run", "--json"]);
    assert_eq!(
        removed_ids(&dry),
        vec![ids[1].clone(), ids[2].clone()],
        "{dry:#}"
    );
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["artifacts"]["kept_live"], 1);
    assert!(
        ids.iter().all(|id| content_file(&f, id).exists()),
        "a dry run deletes nothing"
    );
    let text = f.conduit(&["gc", "--dry-run"]);
    assert!(
        text.stdout()
            .starts_with("would remove 2 artifact contents (488.3 KiB)")
            && text.stdout().contains(&ids[1])
            && text.stdout().contains("over max_bytes"),
        "{}",
        text.context()
    );

    let done = f.json(&["gc", "--json"]);
    assert_eq!(removed_ids(&done), removed_ids(&dry));
    assert_eq!(done["artifacts"]["retained_bytes"], 150_000);
    assert!(content_file(&f, &ids[0]).exists() && content_file(&f, &ids[3]).exists());
    assert!(!content_file(&f, &ids[1]).exists() && !content_file(&f, &ids[2]).exists());
    assert!(
        !f.state().join("artifacts/trash").exists(),
        "what was set aside is deleted after the commit, and the trash folder with it"
    );

    // The list and one artifact's answer say what happened and why the first stays.
    let list = f.json(&["artifacts", "list", "--json"]);
    let states: Vec<(&str, bool)> = list["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["state"].as_str().unwrap(), a["live"].as_bool().unwrap()))
        .collect();
    assert_eq!(
        states,
        [
            ("kept", true),
            ("removed", false),
            ("removed", false),
            ("kept", false)
        ]
    );
    let one = f.json(&["artifacts", "show", &ids[0], "--json"]);
    assert_eq!(one["extension"], "art", "its creator");
    assert_eq!(one["size"], 100_000);
    assert_eq!(
        one["references"],
        serde_json::json!([{"record": "event", "id": event_id, "live": true}])
    );
    let page = f.json(&[
        "artifacts",
        "list",
        "--limit",
        "2",
        "--after",
        "1",
        "--json",
    ]);
    assert_eq!(page["artifacts"].as_array().unwrap().len(), 2);
    assert_eq!(page["next_after"], 3);
    // The same list newest first (the web view's order), and one cursor at a time.
    let (code, newest) = support::http::request(&socket(&f), "GET", "/v1/artifacts?limit=2", None);
    assert_eq!(code, 200, "{newest}");
    let newest_ids: Vec<i64> = newest["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_i64().unwrap())
        .collect();
    assert_eq!(newest_ids, [4, 3]);
    assert_eq!(newest["next_before"], 3);
    let (code, v) =
        support::http::request(&socket(&f), "GET", "/v1/artifacts?after=1&before=3", None);
    assert_eq!(code, 400, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("not both"),
        "{v}"
    );

    // Reading removed content says so; kept content is served from its own route.
    let get = f.conduit(&["artifacts", "get", &ids[1], "-o", "/dev/null"]);
    assert_eq!(get.code(), Some(2), "{}", get.context());
    assert!(
        get.stderr().contains("was removed by retention at"),
        "{}",
        get.context()
    );
    let (code, v) = support::http::request(
        &socket(&f),
        "GET",
        &format!("/v1/artifacts/{}/content", ids[2]),
        None,
    );
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (410, Some("removed")),
        "{v}"
    );
    let kept = f.command(&["artifacts", "get", &ids[0]]).output().unwrap();
    assert_eq!(kept.stdout.len(), 100_000);

    // The metrics count what went and what is kept.
    let m = |s: &str| metric(&f, s).unwrap_or_else(|| panic!("no {s}{}", f.context()));
    assert_eq!(m("conduit_retention_sweeps_total"), 1.0);
    assert_eq!(
        m("conduit_retention_removed_total{kind=\"artifacts\"}"),
        2.0
    );
    assert_eq!(
        m("conduit_retention_removed_bytes_total{kind=\"artifacts\"}"),
        500_000.0
    );
    assert_eq!(m("conduit_retention_retained{kind=\"artifacts\"}"), 2.0);
    assert_eq!(
        m("conduit_retention_retained_bytes{kind=\"artifacts\"}"),
        150_000.0
    );
    assert_eq!(m("conduit_storage_bytes{part=\"artifacts\"}"), 150_000.0);
    assert!(m("conduit_storage_bytes{part=\"database\"}") > 0.0);
    assert!(metric(&f, "conduit_storage_bytes{part=\"logs\"}").is_some());

    // The same content sent again is kept again.
    assert_eq!(make_artifact(&f, 200_000), ids[1]);
    let back = f.json(&["artifacts", "show", &ids[1], "--json"]);
    assert_eq!(back["state"], "kept", "{back:#}");
    assert!(content_file(&f, &ids[1]).exists());
}

/// Sets a file's modification time to `age` ago.
fn age(path: &Path, age: Duration) {
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(SystemTime::now() - age).unwrap();
}

#[test]
fn logs_of_earlier_runs_go_by_age_and_budget_and_current_logs_stay_without_a_daemon() {
    let f = Fixture::new();
    f.install(&f.core_ext("art", "ok"));
    let logs = f.state().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let day = Duration::from_secs(86_400);
    for (name, size, days) in [
        ("art.log", 50_000, 90), // the current log of an installed package: stays
        ("art.log.1", 300_000, 2),
        ("gone.log", 200_000, 1), // a removed package's log
        ("gone.log.1", 100_000, 40),
        ("daemon.log", 10_000, 99), // launchd's: not conduit's to remove
    ] {
        let p = logs.join(name);
        std::fs::write(&p, vec![b'l'; size]).unwrap();
        age(&p, day * days);
    }
    let set = f.conduit(&["config", "set", "retention.logs.max_bytes=300000"]);
    assert_eq!(set.code(), Some(0), "{}", set.context());
    assert!(
        set.stderr().contains("no daemon is running"),
        "{}",
        set.context()
    );

    // 660,000 bytes: gone.log.1 goes for its age (40 days), then the oldest earlier run while
    // over 300,000: art.log.1 (260,000 left). gone.log stays.
    let dry = f.json(&["gc", "--dry-run", "--json"]);
    let listed: Vec<(&str, &str)> = dry["logs"]["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["file"].as_str().unwrap(), l["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(
        listed,
        [("gone.log.1", "age"), ("art.log.1", "budget")],
        "{dry:#}"
    );
    assert!(logs.join("gone.log.1").exists() && logs.join("art.log.1").exists());

    let done = f.json(&["gc", "--json"]);
    assert_eq!(done["logs"]["removed"], dry["logs"]["removed"]);
    assert_eq!(done["logs"]["retained_bytes"], 260_000);
    let left: std::collections::BTreeSet<String> = std::fs::read_dir(&logs)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        left.into_iter().collect::<Vec<_>>(),
        ["art.log", "daemon.log", "gone.log"]
    );

    // A budget the kept files alone exceed: everything removable goes, the rest is reported.
    f.conduit(&["config", "set", "retention.logs.max_bytes=1000"])
        .expect_code(0);
    let text = f.conduit(&["gc"]);
    assert_eq!(text.code(), Some(0), "{}", text.context());
    assert!(
        text.stdout().contains("removed 1 log file of earlier runs")
            && text.stdout().contains("current logs of installed packages"),
        "{}",
        text.context()
    );
    assert!(!logs.join("gone.log").exists() && logs.join("art.log").exists());
}

#[test]
fn the_wal_is_truncated_by_a_sweep_when_the_daemon_is_idle() {
    let f = started_with_art();
    let wal = f.state().join("conduit.db-wal");
    let filler = "w".repeat(8_000);
    let mut last = 0;
    for i in 0..400 {
        last = support::http::push(
            &socket(&f),
            "cli",
            &format!("w-{i}"),
            "nobody.routes.this",
            serde_json::json!({ "filler": filler }),
        );
    }
    f.wait_until("every event to be routed", || {
        support::http::event(&socket(&f), last).filter(|e| e["routed_at_ms"].is_i64())
    });
    let before = std::fs::metadata(&wal).unwrap().len();
    assert!(before > 1 << 20, "the WAL grew to {before} bytes");
    // Idle now; a request that arrives meanwhile (none here) would only make the checkpoint
    // passive for one sweep, so poll rather than trust a single sweep.
    let report = f.wait_until("a sweep to truncate the WAL", || {
        let r = f.json(&["gc", "--json"]);
        (r["wal"]["truncated"] == true).then_some(r)
    });
    let after = std::fs::metadata(&wal).unwrap().len();
    assert_eq!(after, 0, "{report:#}");
    let m = metric(&f, "conduit_storage_bytes{part=\"wal\"}").unwrap();
    assert_eq!(m, 0.0);
    // Nothing committed was lost.
    assert!(support::http::event(&socket(&f), last).is_some());
}

#[test]
fn a_running_daemon_sweeps_by_itself_under_settings_changed_while_it_runs() {
    let mut f = Fixture::new();
    f.install(&f.core_ext("art", "ok"));
    f.start_daemon();
    f.wait_state("art", "ready", PATIENCE);
    let id = make_artifact(&f, 4_096);
    assert!(content_file(&f, &id).exists());
    // No restart: the change reaches the daemon through its reload, and the sweep every
    // second takes the content (nothing needs it, no grace, no budget).
    f.conduit(&[
        "config",
        "set",
        "retention.interval=1s",
        "retention.artifacts.max_bytes=0",
        "retention.artifacts.grace=0s",
    ])
    .expect_code(0);
    f.wait_until("a periodic sweep to remove the content", || {
        let a = f.json(&["artifacts", "show", &id, "--json"]);
        (a["state"] == "removed" && !content_file(&f, &id).exists()).then_some(())
    });
    // The sweep counts itself once it has finished (after its WAL checkpoint).
    f.wait_until("the sweep to be counted", || {
        metric(&f, "conduit_retention_sweeps_total").filter(|n| *n >= 1.0)
    });
    assert!(metric(&f, "conduit_retention_removed_total{kind=\"artifacts\"}").unwrap() >= 1.0);
}

#[test]
fn bad_settings_are_refused_with_the_key_the_form_and_an_example() {
    let mut f = Fixture::new();
    f.install(&f.core_ext("art", "ok"));
    let settings = f.state().join("settings.toml");
    let before = std::fs::read_to_string(&settings).ok();
    for (args, says) in [
        (
            vec!["config", "set", "retention.artifacts.max_age=30x"],
            "`retention.artifacts.max_age` cannot be \"30x\": a whole number and a unit (s, m, h, d or w), 1s to 36500d; e.g. `conduit config set retention.artifacts.max_age=30d`",
        ),
        (
            vec!["config", "set", "retention.interval=0s"],
            "out of range",
        ),
        (
            vec![
                "config",
                "set",
                "retention.artifacts.max_bytes=2GiB",
                "retention.logs.max_bytes=lots",
            ],
            "`retention.logs.max_bytes` cannot be \"lots\"",
        ),
        (
            vec!["config", "set", "retention.keep=1d"],
            "unknown setting `retention.keep`; the settings are retention.interval",
        ),
        (
            vec!["config", "set", "retention.interval"],
            "is not KEY=VALUE",
        ),
        (
            vec!["config", "get", "interval"],
            "unknown setting `interval`",
        ),
    ] {
        let run = f.conduit(&args);
        assert_eq!(run.code(), Some(2), "{}", run.context());
        assert!(run.stderr().contains(says), "{}", run.context());
    }
    assert_eq!(
        std::fs::read_to_string(&settings).ok(),
        before,
        "a refused change writes nothing, not even the good pair before the bad one"
    );

    // The defaults, shown and read one by one.
    let shown = f.json(&["config", "show", "--json"]);
    let interval = &shown.as_array().unwrap()[0];
    assert_eq!(
        (&interval["key"], &interval["value"], &interval["source"]),
        (
            &Value::from("retention.interval"),
            &Value::from("10m"),
            &Value::from("default")
        )
    );
    let get = f.conduit(&["config", "get", "retention.artifacts.max_bytes"]);
    assert_eq!(get.stdout(), "2GiB\n", "{}", get.context());

    // A value written by hand that is refused: every reader says where and what.
    std::fs::write(&settings, "[retention.artifacts]\nmax_age = \"soon\"\n").unwrap();
    for args in [vec!["config", "show"], vec!["gc", "--dry-run"]] {
        let run = f.conduit(&args);
        assert_eq!(run.code(), Some(2), "{}", run.context());
        assert!(
            run.stderr().contains("settings.toml")
                && run
                    .stderr()
                    .contains("`retention.artifacts.max_age` cannot be \"soon\""),
            "{}",
            run.context()
        );
    }
    // The daemon starts and runs anyway (with the defaults, saying why), and its gc refuses.
    f.start_daemon();
    let run = f.conduit(&["gc"]);
    assert_eq!(run.code(), Some(2), "{}", run.context());
    assert!(
        run.stderr().contains("cannot be \"soon\""),
        "{}",
        run.context()
    );
    f.wait_until("the daemon to say the settings cannot be read", || {
        std::fs::read_to_string(f.daemon_log())
            .ok()
            .filter(|l| l.contains("cannot read the retention settings"))
    });
    f.stop_daemon();

    // No package may take the table's name.
    let pkg = f.core_ext("retention", "ok");
    let run = f.conduit(&["ext", "install", "--no-wait", pkg.to_str().unwrap()]);
    assert_eq!(run.code(), Some(2), "{}", run.context());
    assert!(
        run.stderr().contains("\"retention\" is reserved"),
        "{}",
        run.context()
    );
}
