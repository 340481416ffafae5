//! The operator's commands end to end, through the real `conduit` binary and daemon: waiting for
//! an outcome, automatic and manual rollback, refusing a changed reinstall, logs kept on remove,
//! completions and man pages, the list commands, and the management API's error envelope and
//! connection limits.

mod support;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::PATIENCE;
use support::fixture::Fixture;

/// A `misbehave.py` package named `name` at `version` in `mode`, in its own folder `dir`.
fn misbehave_version(f: &Fixture, dir: &str, name: &str, version: &str, mode: &str) -> PathBuf {
    let pkg = f.misbehave(dir, mode);
    std::fs::write(
        pkg.join("conduit-extension.toml"),
        format!(
            "name = \"{name}\"\nversion = \"{version}\"\nprotocol = 1\ncommand = [\"python3\", \"misbehave.py\", \"{mode}\"]\n\n[capabilities]\nmethods = [\"echo\"]\n"
        ),
    )
    .unwrap();
    pkg
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

// ---- waiting, rollback ----------------------------------------------------------------------

#[test]
fn an_upgrade_that_crashes_at_start_exits_non_zero_in_time_and_the_previous_version_is_ready() {
    let mut f = Fixture::new();
    let v1 = misbehave_version(&f, "m1", "m", "0.1.0", "ok");
    let v2 = misbehave_version(&f, "m2", "m", "0.2.0", "exit-at-start");
    f.install(&v1);
    f.start_daemon();
    f.wait_state("m", "ready", PATIENCE);

    let timeout = Duration::from_secs(20);
    let t = Instant::now();
    let run = f.conduit(&["ext", "install", "--wait=20s", path(&v2)]);
    let took = t.elapsed();
    run.expect_code(1);
    // The wait ends once it is crash-looping (a few seconds); the rollback waits again. Both are
    // bounded by the timeout, so the whole command by twice it, with a margin for a busy machine.
    assert!(
        took < timeout * 2 + Duration::from_secs(10),
        "took {took:?}"
    );
    let err = run.stderr();
    assert!(
        run.stdout().contains("upgraded m from 0.1.0 to 0.2.0"),
        "{}",
        run.context()
    );
    assert!(
        err.contains("`m` 0.2.0 is crash-looping, not ready"),
        "{}",
        run.context()
    );
    assert!(err.contains("last error"), "{}", run.context());
    assert!(
        err.contains("cannot start: the configuration is missing"),
        "the stderr tail is shown{}",
        run.context()
    );
    assert!(
        err.contains("rolled back to m 0.1.0, which is ready"),
        "{}",
        run.context()
    );
    let s = f.status("m");
    assert_eq!(s["version"], "0.1.0", "{s:#}");
    assert_eq!(s["state"], "ready", "{s:#}");

    // The failed version is kept: a rollback by hand goes back to it (and, waiting, says it is
    // not ready), a second one returns to the good one.
    let run = f.conduit(&["ext", "rollback", "m", "--wait=20s"]);
    run.expect_code(1);
    assert!(
        run.stdout().contains("rolled back m from 0.1.0 to 0.2.0"),
        "{}",
        run.context()
    );
    let run = f.conduit(&["ext", "rollback", "m", "--json"]);
    run.expect_code(0);
    let v = run.json();
    assert_eq!(v["to"], "0.1.0", "{v:#}");
    assert_eq!(v["ready"], true, "{v:#}");
    assert_eq!(f.status("m")["state"], "ready");
}

#[test]
fn a_good_upgrade_waits_until_ready_and_rollback_puts_the_old_version_back() {
    let mut f = Fixture::new();
    let v1 = misbehave_version(&f, "m1", "m", "0.1.0", "ok");
    let v2 = misbehave_version(&f, "m2", "m", "0.2.0", "ok");
    f.install(&v1);
    // No daemon: nothing to wait for, and an explicit --wait is exit 3 before anything changes.
    let run = f.conduit(&["ext", "install", "--wait", path(&v2)]);
    run.expect_code(3);
    assert_eq!(
        f.json(&["ext", "list", "--json"])["extensions"][0]["version"],
        "0.1.0"
    );
    f.start_daemon();
    f.wait_state("m", "ready", PATIENCE);

    let run = f.conduit(&["ext", "install", path(&v2), "--json"]);
    run.expect_code(0);
    let v = run.json();
    assert_eq!(v["ready"], true, "{v:#}");
    assert_eq!(v["previous"], "0.1.0", "{v:#}");
    assert_eq!(f.status("m")["version"], "0.2.0");

    let run = f.conduit(&["ext", "rollback", "m"]);
    run.expect_code(0);
    assert!(
        run.stderr().contains("m 0.1.0 is ready"),
        "{}",
        run.context()
    );
    let s = f.status("m");
    assert_eq!(
        (s["version"].as_str(), s["state"].as_str()),
        (Some("0.1.0"), Some("ready"))
    );

    // A package never upgraded has nothing to roll back to.
    let other = misbehave_version(&f, "o", "other", "0.1.0", "ok");
    f.conduit(&["ext", "install", path(&other)]).expect_code(0);
    let run = f.conduit(&["ext", "rollback", "other"]);
    run.expect_code(2);
    assert!(
        run.stderr().contains("no previous version"),
        "{}",
        run.context()
    );
}

#[test]
fn a_command_not_on_path_reports_refused_not_started() {
    let mut f = Fixture::new();
    f.start_daemon();
    let pkg = f.dir.path().join("src/pyx");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(
        pkg.join("conduit-extension.toml"),
        "name = \"pyx\"\nversion = \"0.1.0\"\nprotocol = 1\ncommand = [\"conduit-no-such-program\"]\n",
    )
    .unwrap();
    let run = f.conduit(&["ext", "install", path(&pkg)]);
    run.expect_code(1);
    let err = run.stderr();
    assert!(
        err.contains("`pyx` 0.1.0 is refused, not ready"),
        "{}",
        run.context()
    );
    assert!(err.contains("not found on PATH"), "{}", run.context());
    assert!(!err.contains("started `pyx`"), "{}", run.context());
}

#[test]
fn enable_and_restart_wait_when_asked_and_answer_json() {
    let mut f = Fixture::new();
    f.install(&misbehave_version(&f, "m", "m", "0.1.0", "ok"));
    f.conduit(&["ext", "disable", "m"]).expect_code(0);
    f.start_daemon();
    let v = f
        .conduit(&["ext", "enable", "m", "--wait=20s", "--json"])
        .json();
    assert_eq!(
        (v["ready"].clone(), v["changed"].clone()),
        (Value::Bool(true), Value::Bool(true)),
        "{v:#}"
    );
    let pid = f.status("m")["pid"].as_u64().unwrap();
    let run = f.conduit(&["ext", "restart", "m", "--wait=20s", "--json"]);
    run.expect_code(0);
    let v = run.json();
    assert_eq!(v["ready"], true, "{v:#}");
    let s = f.status("m");
    assert_ne!(s["pid"].as_u64().unwrap(), pid, "a new run: {s:#}");
    let run = f.conduit(&["ext", "call", "m", "echo", r#"{"x":1}"#, "--json"]);
    run.expect_code(0);
    let v = run.json();
    assert_eq!(v["result"]["x"], 1, "{v:#}");
    assert!(v["took_us"].is_u64(), "{v:#}");
}

// ---- reinstall --force ----------------------------------------------------------------------

#[test]
fn a_changed_reinstall_of_the_same_version_needs_force_and_says_what_changed() {
    let f = Fixture::new();
    let src = misbehave_version(&f, "m", "m", "0.1.0", "ok");
    f.conduit(&["ext", "install", path(&src)]).expect_code(0);
    // The same files from the same place: a plain reinstall.
    let run = f.conduit(&["ext", "install", path(&src)]);
    run.expect_code(0);
    assert_eq!(run.stdout(), "reinstalled m 0.1.0\n", "{}", run.context());

    std::fs::write(src.join("notes.txt"), "new\n").unwrap();
    let run = f.conduit(&["ext", "install", path(&src)]);
    run.expect_code(2);
    let err = run.stderr();
    assert!(
        err.contains("`m` 0.1.0 is already installed, and this is not the same package"),
        "{}",
        run.context()
    );
    assert!(
        err.contains("1 file differs: notes.txt added"),
        "{}",
        run.context()
    );
    assert!(err.contains("--force"), "{}", run.context());
    let rec = f.json(&["ext", "list", "--json"]);
    assert_eq!(rec["extensions"].as_array().unwrap().len(), 1);

    let run = f.conduit(&["ext", "install", "--force", path(&src)]);
    run.expect_code(0);
    assert_eq!(
        run.stdout(),
        "reinstalled m 0.1.0 (1 file differs: notes.txt added)\n",
        "{}",
        run.context()
    );

    // Another source with the same content: the source change is named.
    let copy = f.dir.path().join("copy");
    std::fs::create_dir_all(&copy).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), copy.join(e.file_name())).unwrap();
    }
    let run = f.conduit(&["ext", "install", path(&copy)]);
    run.expect_code(2);
    assert!(
        run.stderr().contains("its source changes from"),
        "{}",
        run.context()
    );
}

// ---- logs -----------------------------------------------------------------------------------

#[test]
fn logs_mark_each_run_show_the_previous_one_and_survive_remove_unless_purged() {
    let mut f = Fixture::new();
    f.install(&misbehave_version(&f, "m", "m", "0.1.0", "ok"));
    f.start_daemon();
    let first = f.wait_state("m", "ready", PATIENCE)["pid"]
        .as_u64()
        .unwrap();
    f.conduit(&["ext", "restart", "m", "--wait=20s"])
        .expect_code(0);
    let second = f.status("m")["pid"].as_u64().unwrap();

    let log = f.state().join("logs/m.log");
    let text = std::fs::read_to_string(&log).unwrap();
    let markers: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("=== conduit: run started "))
        .collect();
    assert_eq!(markers.len(), 2, "{text}");
    assert!(
        markers[0].ends_with(&format!(" pid {first} version 0.1.0 ===")),
        "{text}"
    );
    assert!(markers[1].contains(&format!(" pid {second} ")), "{text}");

    let prev = f.json(&["ext", "logs", "m", "--previous", "--json"]);
    let lines: Vec<&str> = prev["lines"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l.as_str())
        .collect();
    assert_eq!(lines[0], markers[0], "{prev:#}");
    assert!(
        lines.iter().all(|l| !l.contains(&format!("pid {second} "))),
        "{prev:#}"
    );

    let run = f.conduit(&["ext", "remove", "m"]);
    run.expect_code(0);
    assert!(run.stderr().contains("logs"), "{}", run.context());
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        text,
        "the log is kept whole"
    );

    f.install(&f.dir.path().join("src/m"));
    let v = f.json(&["ext", "remove", "m", "--purge", "--json"]);
    assert_eq!(v["logs_purged"].as_array().unwrap().len(), 1, "{v:#}");
    assert!(!log.exists());
}

#[test]
fn a_clean_stop_leaves_no_process_ledgers_in_run() {
    let mut f = Fixture::new();
    f.install(&misbehave_version(&f, "m", "m", "0.1.0", "ok"));
    f.start_daemon();
    f.wait_state("m", "ready", PATIENCE);
    assert_eq!(f.stop_daemon(), Some(0));
    let left: Vec<String> = std::fs::read_dir(f.state().join("run"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".pids") || n.ends_with(".pgid"))
        .collect();
    assert!(left.is_empty(), "ledgers left in run/: {left:?}");
}

// ---- completions, man pages, lists ------------------------------------------------------------

#[test]
fn completions_are_generated_for_bash_zsh_and_fish() {
    let f = Fixture::new();
    for (shell, mark) in [
        ("bash", "-F _clap_complete_conduit conduit"),
        ("zsh", "#compdef conduit"),
        (
            "fish",
            "complete --keep-order --exclusive --command conduit",
        ),
    ] {
        let run = f.conduit(&["completions", shell]);
        run.expect_code(0);
        let out = run.stdout();
        assert!(out.contains(mark), "{shell}: no `{mark}`{}", run.context());
        // The script calls this binary back, by its path.
        let me = Path::new(env!("CARGO_BIN_EXE_conduit"))
            .canonicalize()
            .unwrap();
        assert!(
            out.contains(me.to_str().unwrap()),
            "{shell}{}",
            run.context()
        );
    }
    // The bash script parses.
    let script = f.dir.path().join("conduit.bash");
    std::fs::write(&script, f.conduit(&["completions", "bash"]).stdout()).unwrap();
    let st = std::process::Command::new("bash")
        .arg("-n")
        .arg(&script)
        .status()
        .unwrap();
    assert!(st.success());
    f.conduit(&["completions", "tcsh"]).expect_code(2);
}

#[test]
fn completion_offers_subcommands_and_the_installed_package_names() {
    let f = Fixture::new();
    f.install(&misbehave_version(&f, "a", "alpha", "0.1.0", "ok"));
    f.install(&misbehave_version(&f, "b", "beta", "0.1.0", "ok"));
    let script = f.dir.path().join("conduit.bash");
    std::fs::write(&script, f.conduit(&["completions", "bash"]).stdout()).unwrap();
    // What bash offers at TAB, through the script as a shell loads it.
    let complete = |words: &[&str]| -> Vec<String> {
        let list = words
            .iter()
            .map(|w| format!("'{w}'"))
            .collect::<Vec<_>>()
            .join(" ");
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!(
                "source {}; COMP_WORDS=({list}); COMP_CWORD={}; COMP_TYPE=9; _clap_complete_conduit conduit \"${{COMP_WORDS[COMP_CWORD]}}\"; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
                script.display(),
                words.len() - 1
            ))
            .env("CONDUIT_STATE_DIR", f.state())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    };
    let names = complete(&["conduit", "ext", "status", ""]);
    assert!(
        names.contains(&"alpha".to_owned()) && names.contains(&"beta".to_owned()),
        "{names:?}"
    );
    let names = complete(&["conduit", "ext", "restart", "al"]);
    assert_eq!(names, ["alpha"]);
    let subs = complete(&["conduit", "ext", "rol"]);
    assert_eq!(subs, ["rollback"]);
    // Another state directory named on the line: its packages, none here.
    let other = f.dir.path().join("other");
    let names = complete(&[
        "conduit",
        "--state-dir",
        other.to_str().unwrap(),
        "ext",
        "logs",
        "",
    ]);
    assert!(!names.iter().any(|n| n == "alpha"), "{names:?}");
    assert!(!other.exists(), "completion created a state directory");
}

#[test]
fn man_pages_are_written_for_every_command() {
    let f = Fixture::new();
    let out = f.dir.path().join("man");
    f.conduit(&["man", "--out", path(&out)]).expect_code(0);
    for page in ["conduit.1", "conduit-ext-install.1", "conduit-waits-list.1"] {
        let text =
            std::fs::read_to_string(out.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.contains(".TH"), "{page}");
    }
    let install = std::fs::read_to_string(out.join("conduit-ext-install.1")).unwrap();
    assert!(install.contains("no\\-wait"), "{install}");
}

#[test]
fn waits_timers_and_emissions_are_listed_and_shown_with_and_without_a_daemon() {
    let mut f = Fixture::new();
    f.install(&f.core_ext("core", "ok"));
    f.start_daemon();
    f.wait_state("core", "ready", PATIENCE);
    let wait = f.json(&["waits", "add", "match", "subject", "--json"])["wait_id"]
        .as_i64()
        .unwrap();
    let timer = f.json(&["timers", "add", "tick", "every 3600000", "--json"])["timer_id"]
        .as_i64()
        .unwrap();
    let em = f.json(&["emissions", "add", "note", "{}", "--json"])["emission_id"]
        .as_i64()
        .unwrap();
    let show = f.wait_until("the emission to be committed", || {
        let v = f.json(&["emissions", "show", &em.to_string(), "--json"]);
        (v["state"] != "planned").then_some(v)
    });
    assert!(show["state"].is_string(), "{show:#}");
    for _ in 0..2 {
        for (kind, id) in [("waits", wait), ("timers", timer), ("emissions", em)] {
            let v = f.json(&[kind, "list", "--json"]);
            let ids: Vec<i64> = v[kind]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|r| r["id"].as_i64())
                .collect();
            assert_eq!(ids, [id], "{kind}: {v:#}");
            let run = f.conduit(&[kind, "list"]);
            run.expect_code(0);
            // The table's columns are as wide as their cells: the ID column is two wide here.
            assert!(
                run.stdout().starts_with("ID  EXTENSION  "),
                "{}",
                run.context()
            );
            let one = f.json(&[kind, "show", &id.to_string(), "--json"]);
            assert_eq!(one["id"], id, "{one:#}");
        }
        let run = f.conduit(&["waits", "show", "999"]);
        run.expect_code(2);
        assert!(run.stderr().contains("no wait 999"), "{}", run.context());
        // Again from the database alone.
        f.stop_daemon();
    }
}

#[test]
fn a_timer_deleted_a_wait_cancelled_and_a_work_closed_are_kept_and_say_so() {
    let mut f = Fixture::new();
    f.install(&f.core_ext("core", "ok"));
    f.start_daemon();
    f.wait_state("core", "ready", PATIENCE);
    let timer = f.json(&["timers", "add", "tick", "every 3600000", "--json"])["timer_id"]
        .as_i64()
        .unwrap()
        .to_string();
    let wait = f.json(&["waits", "add", "match", "subject", "--json"])["wait_id"]
        .as_i64()
        .unwrap()
        .to_string();
    f.push("s", "d1", "job.x", "{}");
    let work = f.wait_until("the event's Work", || {
        f.json(&["work", "list", "--json"])["work"][0]["id"].as_i64()
    });
    let work = work.to_string();

    let run = f.conduit(&["timers", "delete", &timer]);
    run.expect_code(0);
    assert!(
        run.stdout()
            .starts_with(&format!("timer {timer} deleted at ")),
        "{}",
        run.context()
    );
    let again = f.conduit(&["timers", "delete", &timer]);
    again.expect_code(0);
    assert!(
        again.stdout().contains("was deleted already"),
        "{}",
        again.context()
    );
    let t = f.json(&["timers", "show", &timer, "--json"]);
    assert!(
        t["deleted_at_ms"].is_i64() && t["next_at_ms"].is_null(),
        "{t:#}"
    );
    assert!(f.conduit(&["timers", "list"]).stdout().contains("deleted "));

    let v = f.json(&["waits", "cancel", &wait, "--json"]);
    assert_eq!(v["changed"], true, "{v:#}");
    assert_eq!(v["wait"]["state"], "cancelled", "{v:#}");
    let v = f.json(&["waits", "cancel", &wait, "--json"]);
    assert_eq!(v["changed"], false, "{v:#}");
    assert!(
        f.conduit(&["waits", "list"])
            .stdout()
            .contains("cancelled  - (cancelled at ")
    );
    let missing = f.conduit(&["waits", "cancel", "999"]);
    missing.expect_code(2);
    assert!(
        missing.stderr().contains("no wait 999"),
        "{}",
        missing.context()
    );

    let run = f.conduit(&["work", "close", &work, "--reason", "handled by hand"]);
    run.expect_code(0);
    assert!(
        run.stdout().starts_with(&format!("work {work} closed at ")),
        "{}",
        run.context()
    );
    let w = &f.json(&["work", "list", "--json"])["work"][0];
    assert_eq!(w["state"], "done", "{w:#}");
    assert_eq!(w["close_reason"], "handled by hand", "{w:#}");
    assert!(w["closed_at_ms"].is_i64(), "{w:#}");
    assert!(
        f.conduit(&["work", "list"])
            .stdout()
            .contains("done (closed)")
    );
    // The reason's limit at its edge (the Work is closed already: nothing changes).
    let at = "x".repeat(conduit_host::api::MAX_CLOSE_REASON);
    f.conduit(&["work", "close", &work, "--reason", &at])
        .expect_code(0);
    let long = "x".repeat(conduit_host::api::MAX_CLOSE_REASON + 1);
    let run = f.conduit(&["work", "close", &work, "--reason", &long]);
    run.expect_code(2);
    assert!(run.stderr().contains("at most 1024"), "{}", run.context());

    // Kept once the daemon is gone, and ending needs one.
    f.stop_daemon();
    let t = f.json(&["timers", "show", &timer, "--json"]);
    assert!(t["deleted_at_ms"].is_i64(), "{t:#}");
    f.conduit(&["timers", "delete", &timer]).expect_code(3);
}

// ---- manifest size cap -----------------------------------------------------------------------

#[test]
fn a_manifest_of_64_kib_installs_and_one_byte_more_is_refused() {
    let f = Fixture::new();
    let pkg = misbehave_version(&f, "big", "big", "0.1.0", "ok");
    let manifest = pkg.join("conduit-extension.toml");
    let base = std::fs::read_to_string(&manifest).unwrap();
    let limit = 64 * 1024;
    // Pad with a comment to exactly the limit.
    let pad = limit - base.len() - 2;
    std::fs::write(&manifest, format!("{base}#{}\n", "x".repeat(pad))).unwrap();
    assert_eq!(std::fs::metadata(&manifest).unwrap().len(), limit as u64);
    f.conduit(&["ext", "install", path(&pkg)]).expect_code(0);

    std::fs::write(&manifest, format!("{base}#{}\n", "x".repeat(pad + 1))).unwrap();
    let run = f.conduit(&["ext", "install", "--force", path(&pkg)]);
    run.expect_code(2);
    assert!(
        run.stderr()
            .contains("is larger than 64 KiB (65536 bytes), the limit for a manifest"),
        "{}",
        run.context()
    );
    let run = f.conduit(&["ext", "check", path(&pkg)]);
    run.expect_code(2);
    assert!(
        run.stderr().contains("the limit for a manifest"),
        "{}",
        run.context()
    );
}

// ---- the API: one error envelope, header timeout, connection cap ------------------------------

/// Send `raw` as it is; the status, the headers (lowercase) and the body.
fn raw(socket: &Path, raw: &[u8]) -> (u16, String, String) {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.write_all(raw).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, head.to_ascii_lowercase(), body.to_owned())
}

fn request(method: &str, path: &str, headers: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "{method} {path} HTTP/1.1\r\nhost: conduit\r\nconnection: close\r\ncontent-length: {}\r\n{headers}\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

#[test]
fn every_api_error_path_answers_the_json_envelope() {
    let mut f = Fixture::new();
    f.install(&misbehave_version(&f, "m", "m", "0.1.0", "ok"));
    f.start_daemon();
    f.wait_state("m", "ready", PATIENCE);
    let socket = f.state().join("run/conduit.sock");
    let json = "content-type: application/json\r\n";
    let big = vec![b' '; 2 * 1024 * 1024 + 1];
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "unknown path",
            request("GET", "/v1/nope", "", b""),
            404,
            "not_found",
        ),
        (
            "unknown package",
            request("GET", "/v1/extensions/nope", "", b""),
            404,
            "not_found",
        ),
        (
            "method",
            request("POST", "/v1/health", "", b""),
            405,
            "method_not_allowed",
        ),
        (
            "body too large (call)",
            request("POST", "/v1/extensions/m/call", json, &big),
            413,
            "too_large",
        ),
        (
            "body too large (events)",
            request("POST", "/v1/events", json, &vec![b' '; 1024 * 1024 + 1]),
            413,
            "too_large",
        ),
        (
            "no content type",
            request("POST", "/v1/events", "", b"{}"),
            415,
            "invalid",
        ),
        (
            "missing field",
            request("POST", "/v1/events", json, b"{}"),
            422,
            "invalid",
        ),
        (
            "not JSON",
            request("POST", "/v1/events", json, b"{nope"),
            400,
            "invalid",
        ),
        (
            "bad query",
            request("GET", "/v1/events?limit=abc", "", b""),
            400,
            "invalid",
        ),
        (
            "query out of range",
            request("GET", "/v1/events?limit=0", "", b""),
            400,
            "invalid",
        ),
        (
            "bad path parameter",
            request("GET", "/v1/work/abc", "", b""),
            400,
            "invalid",
        ),
        (
            "bad artifact id",
            request("GET", "/v1/artifacts/xyz", "", b""),
            400,
            "invalid",
        ),
    ];
    for (what, req, status, code) in cases {
        let (got, head, body) = raw(&socket, &req);
        assert_eq!(got, status, "{what}: {head}\n{body}");
        assert!(
            head.contains("content-type: application/json"),
            "{what}: {head}"
        );
        let v: Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{what}: {e}: {body}"));
        assert_eq!(v["error"]["code"], code, "{what}: {v}");
        let msg = v["error"]["message"].as_str().unwrap_or("");
        assert!(!msg.is_empty(), "{what}: {v}");
        if status == 405 {
            assert!(
                msg.contains("/v1/health does not take POST; it takes GET"),
                "{v}"
            );
            assert!(head.contains("allow: "), "{head}");
        }
    }
}

/// Connect and send `partial` (perhaps nothing), then wait for the daemon to close the
/// connection; how long it took, or `None` if it stayed open for `within`.
fn closed_after(socket: &Path, partial: &[u8], within: Duration) -> (UnixStream, Instant) {
    let mut s = UnixStream::connect(socket).unwrap();
    s.write_all(partial).unwrap();
    s.set_read_timeout(Some(within)).unwrap();
    (s, Instant::now())
}

fn wait_closed(mut s: UnixStream, since: Instant) -> Option<Duration> {
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Some(since.elapsed()),
            Ok(_) => continue, // hyper may answer 408 before closing
            Err(_) => return None,
        }
    }
}

#[test]
fn a_stalled_connection_is_closed_after_the_header_timeout_while_another_client_is_served() {
    let mut f = Fixture::new();
    let timeout = Duration::from_millis(1500);
    f.start_daemon_with(&[("CONDUIT_API_HEADER_TIMEOUT_MS", "1500".as_ref())]);
    let socket = f.state().join("run/conduit.sock");
    let margin = Duration::from_secs(15);
    let (half, t_half) = closed_after(
        &socket,
        b"GET /v1/health HTTP/1.1\r\nhost: x\r\n",
        timeout + margin,
    );
    let (silent, t_silent) = closed_after(&socket, b"", timeout + margin);
    // Another client is served at once, while both stall.
    let t = Instant::now();
    let (code, _, body) = raw(&socket, &request("GET", "/v1/health", "", b""));
    assert_eq!(code, 200, "{body}");
    assert!(
        t.elapsed() < timeout,
        "served in {:?}, not before the stalled ones were closed",
        t.elapsed()
    );
    for (what, s, since) in [("half a head", half, t_half), ("nothing", silent, t_silent)] {
        let took = wait_closed(s, since)
            .unwrap_or_else(|| panic!("{what}: still open after {:?}", timeout + margin));
        assert!(
            took >= timeout - Duration::from_millis(100),
            "{what}: closed after {took:?}, before the timeout"
        );
        assert!(took < timeout + margin, "{what}: closed after {took:?}");
    }
}

#[test]
fn past_the_connection_cap_the_oldest_connection_without_a_request_makes_room() {
    let mut f = Fixture::new();
    let header_timeout = Duration::from_secs(60);
    f.start_daemon_with(&[
        ("CONDUIT_API_MAX_CONNECTIONS", "3".as_ref()),
        ("CONDUIT_API_HEADER_TIMEOUT_MS", "60000".as_ref()),
    ]);
    let socket = f.state().join("run/conduit.sock");
    let served = || raw(&socket, &request("GET", "/v1/health", "", b"")).0 == 200;
    // At the limit: two stalled connections and a working client make three; it is served, and
    // neither stalled connection is closed for it.
    let a = UnixStream::connect(&socket).unwrap();
    let b = UnixStream::connect(&socket).unwrap();
    f.wait_until("the daemon to accept both", || {
        // A served request proves the accept loop went past both connections.
        served().then_some(())
    });
    for s in [&a, &b] {
        s.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 1];
        let still_open =
            matches!((&*s).read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
        assert!(still_open, "a stalled connection was closed at the limit");
    }
    // One past: three stalled connections; the next client is served at once (well before the
    // 60 s header timeout), and the oldest stalled one, `a`, is closed to make room.
    let c = UnixStream::connect(&socket).unwrap();
    std::thread::sleep(Duration::from_millis(300)); // let the daemon accept it
    let t = Instant::now();
    assert!(served(), "past the cap, a working client is still served");
    assert!(
        t.elapsed() < header_timeout / 4,
        "served after {:?}",
        t.elapsed()
    );
    a.set_nonblocking(false).unwrap();
    a.set_read_timeout(Some(header_timeout / 4)).unwrap();
    let closed = wait_closed(a, Instant::now());
    assert!(
        closed.is_some_and(|d| d < header_timeout / 4),
        "the oldest stalled connection was not closed: {closed:?}"
    );
    drop((b, c));
}

// ---- stderr: -q, NO_COLOR ---------------------------------------------------------------------

#[test]
fn quiet_leaves_out_notes_and_keeps_data() {
    let f = Fixture::new();
    f.install(&misbehave_version(&f, "m", "m", "0.1.0", "ok"));
    let run = f.conduit(&["ext", "list"]);
    assert!(
        run.stderr().contains("no daemon is running"),
        "{}",
        run.context()
    );
    let quiet = f.conduit(&["ext", "list", "-q"]);
    quiet.expect_code(0);
    assert_eq!(quiet.stderr(), "", "{}", quiet.context());
    assert_eq!(quiet.stdout(), run.stdout());
}

/// Runs `cmd` under a pseudo-terminal (`script`), so that colours would be on; its output.
fn on_a_terminal(f: &Fixture, cmd: &str, no_color: bool) -> Option<String> {
    let mut c = std::process::Command::new("script");
    c.args(["-qec", cmd, "/dev/null"])
        .env("CONDUIT_STATE_DIR", f.state())
        .env_remove("CONDUIT_LOG");
    if no_color {
        c.env("NO_COLOR", "1");
    } else {
        c.env_remove("NO_COLOR");
    }
    let out = c.output().ok()?;
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn no_color_turns_colours_off_on_a_terminal() {
    let f = Fixture::new();
    let bin = env!("CARGO_BIN_EXE_conduit");
    // A layout folder open to others gives a WARN log line, which is coloured on a terminal,
    // when a command that may change the state directory tightens it (`ext enable` of an
    // enabled package changes nothing else; a read-only command such as `ext list` leaves
    // the mode alone).
    f.install(&misbehave_version(&f, "m", "m", "0.1.0", "ok"));
    let loosen = || {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            f.state().join("logs"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
    };
    loosen();
    let Some(coloured) = on_a_terminal(&f, &format!("{bin} ext enable m; {bin} ext --help"), false)
    else {
        eprintln!("skipped: no `script` to make a pseudo-terminal");
        return;
    };
    assert!(
        coloured.contains('\u{1b}'),
        "the control: colours on a terminal: {coloured}"
    );
    assert!(coloured.contains("logs was mode 755"), "{coloured}");
    loosen();
    let plain = on_a_terminal(&f, &format!("{bin} ext enable m; {bin} ext --help"), true).unwrap();
    assert!(plain.contains("WARN"), "{plain}");
    assert!(
        !plain.contains('\u{1b}'),
        "NO_COLOR=1 still coloured: {plain:?}"
    );
}

#[test]
fn a_state_directory_too_long_for_a_socket_is_refused_in_plain_words() {
    let f = Fixture::new();
    // 107 bytes is the most a socket path may have here; `<state>/run/conduit.sock` is longer.
    let long = f.dir.path().join("d".repeat(120));
    let run = f.conduit(&["daemon", "run", "--state-dir", path(&long)]);
    run.expect_code(1);
    assert!(
        run.stderr()
            .contains("a Unix socket's path may be at most 107 bytes long"),
        "{}",
        run.context()
    );
    assert!(run.stderr().contains("shorter path"), "{}", run.context());
}

#[test]
fn the_wait_ends_at_its_timeout_with_the_state_it_found() {
    let mut f = Fixture::new();
    f.start_daemon();
    // It never answers `initialize`: `starting` until the 10 s start timeout, past the wait.
    let pkg = misbehave_version(&f, "mute", "mute", "0.1.0", "no-handshake");
    let t = Instant::now();
    let run = f.conduit(&["ext", "install", "--wait=1500ms", path(&pkg)]);
    let took = t.elapsed();
    run.expect_code(1);
    assert!(
        took >= Duration::from_millis(1500),
        "gave up after {took:?}"
    );
    assert!(
        took < Duration::from_millis(1500) + Duration::from_secs(8),
        "took {took:?}"
    );
    assert!(
        run.stderr()
            .contains("`mute` 0.1.0 did not become ready within 1.5 s: it is starting"),
        "{}",
        run.context()
    );
    // A new install has nothing to roll back to.
    assert!(!run.stderr().contains("rolled back"), "{}", run.context());
    // Bad timeouts are usage errors.
    let run = f.conduit(&["ext", "install", "--wait=5d", path(&pkg)]);
    run.expect_code(2);
}

#[test]
fn an_api_limit_out_of_range_refuses_the_start_with_exit_2() {
    let f = Fixture::new();
    let run = f
        .command(&["daemon", "run"])
        .env("CONDUIT_API_MAX_CONNECTIONS", "0")
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(2));
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        err.contains("CONDUIT_API_MAX_CONNECTIONS must be a whole number from 1 to 65536, not `0`"),
        "{err}"
    );
}

// ---- read-only commands ---------------------------------------------------------------------

/// `conduit ARGS` with `home` as `$HOME` and the state directory left to the platform default.
fn at_home(home: &Path, args: &[&str]) -> support::Run {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_conduit"))
        .args(args)
        .env("HOME", home)
        .env_remove("CONDUIT_STATE_DIR")
        .env_remove("XDG_STATE_HOME")
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("CONDUIT_LOG")
        .output()
        .unwrap();
    support::Run {
        cmd: format!("HOME={} conduit {}", home.display(), args.join(" ")),
        out,
    }
}

#[test]
fn read_only_commands_never_create_or_change_a_state_directory() {
    let home = tempfile::tempdir().unwrap();
    // Each with the exit code it owes when nothing is installed and no daemon runs.
    for (args, code) in [
        (&["metrics"][..], 3),
        (&["ext", "list"], 0),
        (&["ext", "status"], 0),
        (&["ext", "status", "nope"], 2),
        (&["ext", "logs", "nope"], 2),
        (&["ext", "restart", "nope"], 3),
        (&["ext", "call", "nope", "echo"], 3),
        (&["events", "list"], 0),
        (&["work", "list"], 0),
        (&["timers", "list"], 0),
        (&["waits", "show", "1"], 2),
        (&["emissions", "list"], 0),
        (
            &[
                "events",
                "push",
                "--source",
                "s",
                "--delivery-id",
                "d",
                "--kind",
                "k",
            ],
            3,
        ),
        (
            &["artifacts", "get", &format!("sha256:{}", "0".repeat(64))],
            2,
        ),
        (&["ext", "disable", "nope"], 2),
        (&["ext", "remove", "nope"], 2),
        (&["ext", "set", "nope", "limits.memory=64MiB"], 2),
        (&["service", "status"], 1),
        (&["doctor"], 1),
    ] {
        let run = at_home(home.path(), args);
        run.expect_code(code);
        let left: Vec<PathBuf> = support::fixture::walk(home.path());
        assert!(
            left.is_empty(),
            "`conduit {}` wrote {left:?}{}",
            args.join(" "),
            run.context()
        );
    }

    // An existing state directory is read as it is: no mode tightened, no folder added, and
    // without a daemon the store is read without creating its WAL files.
    let f = Fixture::new();
    f.install(&misbehave_version(&f, "m", "m", "0.1.0", "ok"));
    let mut f = f;
    f.start_daemon();
    f.wait_state("m", "ready", PATIENCE);
    f.push("s", "d1", "x.y", "{}");
    f.stop_daemon();
    let state = f.state();
    for side in ["conduit.db-wal", "conduit.db-shm"] {
        std::fs::remove_file(state.join(side)).unwrap();
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o750)).unwrap();
    std::fs::remove_dir(state.join("artifacts")).unwrap();
    let before = support::fixture::walk(&state);
    for args in [
        &["ext", "list"][..],
        &["events", "list"],
        &["work", "list"],
        &["timers", "list"],
        &["metrics"],
    ] {
        let run = f.conduit(args);
        assert!(
            run.code() == Some(0) || run.code() == Some(3),
            "{}",
            run.context()
        );
        assert_eq!(support::fixture::walk(&state), before, "{}", run.context());
    }
    let events = f.json(&["events", "list", "--json"]);
    assert_eq!(events["events"][0]["delivery_id"], "d1", "{events:#}");
    assert_eq!(
        std::fs::metadata(&state).unwrap().permissions().mode() & 0o777,
        0o750
    );
}
