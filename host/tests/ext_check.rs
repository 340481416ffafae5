//! `conduit ext check` end to end: the real `conduit` binary against real packages.
//!
//! The fixtures under `tests/packages/` are Python 3 (standard library) packages: `good`
//! passes every rule; each broken one must fail exactly the rule it breaks, with a message
//! that tells its author what to fix. The example packages under `examples/` must pass too;
//! the Rust ones are staged from the binaries built in this target directory.
//!
//! Checks run one at a time (a lock): each starts three package processes and holds 64
//! requests, and the rules' "at once" windows are fairer on a quiet machine. On failure a test
//! prints the command, its exit code, stdout and stderr.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use support::{Run, stage_rust_example};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const ALL_RULES: &[&str] = &[
    "handshake",
    "version",
    "capabilities-match-manifest",
    "declared-methods-answer",
    "unknown-method",
    "malformed-line",
    "not-json",
    "batch",
    "request-ids",
    "repeated-members",
    "method-with-result",
    "unknown-members",
    "refusal-order",
    "oversized-line",
    "cancellation",
    "duplicate-id",
    "overload",
    "not-initialized",
    "shutdown",
    "shutting-down",
    "stdin-eof",
    "stdout-only-protocol",
    "read-only-folder",
];

/// A test package: its folder's manifest plus the one shared `serve.py`, staged together.
fn fixture(name: &str) -> PathBuf {
    support::python_package(name)
}

fn conduit(args: &[&str]) -> Run {
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let bin = env!("CARGO_BIN_EXE_conduit");
    let out = Command::new(bin)
        .args(args)
        .output()
        .expect("the conduit binary runs");
    Run {
        cmd: format!("{bin} {}", args.join(" ")),
        out,
    }
}

fn check(dir: &Path, json: bool) -> Run {
    let path = dir.to_str().unwrap();
    if json {
        conduit(&["ext", "check", "--json", path])
    } else {
        conduit(&["ext", "check", path])
    }
}

/// Rule id → (status, detail, fix) from a `--json` report, after checking its shape (every
/// rule, in order, each naming the section of docs/protocol.md it enforces).
#[track_caller]
fn rules(run: &Run) -> BTreeMap<String, (String, String, Option<String>)> {
    let report = run.json();
    let ids: Vec<&str> = report["rules"]
        .as_array()
        .unwrap_or_else(|| panic!("no `rules` array{}", run.context()))
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ALL_RULES, "every rule, in order{}", run.context());
    assert!(report["package"]["name"].is_string(), "{}", run.context());
    for r in report["rules"].as_array().unwrap() {
        assert!(
            r["section"].as_str().is_some_and(|s| s.starts_with('§')),
            "rule {} names its section{}",
            r["id"],
            run.context()
        );
    }
    report["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap().to_owned(),
                (
                    r["status"].as_str().unwrap().to_owned(),
                    r["detail"].as_str().unwrap().to_owned(),
                    r["fix"].as_str().map(str::to_owned),
                ),
            )
        })
        .collect()
}

/// Checks that `run` failed exactly `rule`, that every other rule passed (or is in `skipped`),
/// and returns the failure's detail and fix.
#[track_caller]
fn fails_exactly(run: &Run, rule: &str, skipped: &[&str]) -> (String, String) {
    run.expect_code(1);
    let rules = rules(run);
    assert_eq!(run.json()["passed"], false, "{}", run.context());
    for (id, (status, _, _)) in &rules {
        let want = if id == rule {
            "fail"
        } else if skipped.contains(&id.as_str()) {
            "skip"
        } else {
            "pass"
        };
        assert_eq!(status, want, "rule `{id}`{}", run.context());
    }
    let (_, detail, fix) = rules[rule].clone();
    (detail, fix.expect("a failure always says what to fix"))
}

#[test]
fn the_good_package_passes_every_rule() {
    let run = check(&fixture("good"), false);
    run.expect_code(0);
    let out = run.stdout();
    for rule in ALL_RULES {
        assert!(
            out.contains(&format!("PASS {rule}\n")),
            "PASS {rule}{}",
            run.context()
        );
    }
    assert!(
        !out.contains("FAIL") && !out.contains("SKIP"),
        "{}",
        run.context()
    );
    assert!(
        out.contains("good 0.1.0: every rule passed"),
        "{}",
        run.context()
    );

    let json = check(&fixture("good"), true);
    json.expect_code(0);
    let report = json.json();
    assert_eq!(report["passed"], true);
    assert_eq!(report["package"]["name"], "good");
    assert_eq!(report["package"]["protocol"], serde_json::json!([1]));
    for (id, (status, detail, fix)) in rules(&json) {
        assert_eq!(status, "pass", "{id}: {detail}");
        assert!(!detail.is_empty(), "{id} says what it saw");
        assert_eq!(fix, None, "{id}");
    }
}

#[test]
fn a_banner_on_stdout_fails_stdout_only_protocol() {
    let run = check(&fixture("banner"), true);
    let (detail, fix) = fails_exactly(&run, "stdout-only-protocol", &[]);
    assert!(
        detail.contains("banner fixture 0.1.0 starting"),
        "quotes the line: {detail}"
    );
    assert!(fix.contains("print logs to stderr, never stdout"), "{fix}");

    let text = check(&fixture("banner"), false);
    text.expect_code(1);
    let out = text.stdout();
    let line = out
        .lines()
        .find(|l| l.starts_with("FAIL stdout-only-protocol: "))
        .unwrap_or_else(|| panic!("a FAIL line{}", text.context()));
    assert!(
        line.contains(" — print logs to stderr, never stdout"),
        "{line}"
    );
    assert!(
        out.contains("stderr of the package (main instance"),
        "shows stderr on failure{}",
        text.context()
    );
    assert!(
        out.contains("fixture: banner: serving protocol [1]"),
        "{}",
        text.context()
    );
}

#[test]
fn ignoring_cancel_fails_cancellation() {
    let run = check(&fixture("ignores-cancel"), true);
    let (detail, fix) = fails_exactly(&run, "cancellation", &[]);
    assert!(
        detail.contains("did not answer check.sleep {\"ms\": 10000} within 1000 ms of `$/cancel`"),
        "{detail}"
    );
    assert!(fix.contains("cancelled (-32001)"), "{fix}");
}

#[test]
fn serving_a_65th_request_fails_overload() {
    let run = check(&fixture("no-overload"), true);
    let (detail, fix) = fails_exactly(&run, "overload", &[]);
    assert!(
        detail.contains("accepted a 65th concurrent request"),
        "{detail}"
    );
    assert!(
        fix.contains("overloaded (-32000)") && fix.contains("{\"limit\": 64}"),
        "{fix}"
    );
}

/// The notes of rule `id` in a `--json` report.
#[track_caller]
fn notes_of(run: &Run, id: &str) -> Vec<String> {
    let report = run.json();
    let rule = report["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == id)
        .unwrap_or_else(|| panic!("no rule {id}{}", run.context()));
    rule["notes"]
        .as_array()
        .map(|n| {
            n.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// What the fixture's `make-artifact` streams (`serve.py`).
fn fixture_artifact() -> Vec<u8> {
    b"conduit check artifact\n".repeat(1000)
}

#[test]
fn an_artifact_closed_without_a_sha256_passes_and_is_stored_under_the_hosts_digest() {
    // docs/protocol.md §8: the receiver computes the digest; the sender may leave it out.
    let run = check(&fixture("artifact-no-sha256"), true);
    run.expect_code(0);
    for (id, (status, detail, _)) in rules(&run) {
        assert_eq!(status, "pass", "{id}: {detail}{}", run.context());
    }
    let notes = notes_of(&run, "declared-methods-answer");
    let want = "artifact `check.txt`: 23000 bytes as chunks, size verified, sha256 computed by the host (the package sent none)";
    assert!(
        notes.iter().any(|n| n == want),
        "{notes:?}{}",
        run.context()
    );
}

#[test]
fn an_artifact_closed_with_a_wrong_sha256_fails_declared_methods_answer() {
    let run = check(&fixture("artifact-wrong-sha256"), true);
    let (detail, fix) = fails_exactly(&run, "declared-methods-answer", &[]);
    use sha2::Digest as _;
    let digest = hex::encode(sha2::Sha256::digest(fixture_artifact()));
    assert!(
        detail.contains("artifact `check.txt` refused: the artifact does not match its close")
            && detail.contains(&format!("received 23000 bytes with sha256 {digest}")),
        "names the stream and what arrived: {detail}"
    );
    assert!(fix.contains("the sha256 of exactly those bytes"), "{fix}");
}

// ---- one broken package per message-shape and lifecycle rule ------------------------------

#[test]
fn nan_and_a_byte_order_mark_fail_not_json() {
    let run = check(&fixture("lax-json"), true);
    let (detail, fix) = fails_exactly(&run, "not-json", &[]);
    assert!(
        detail.contains("answered a request holding `NaN` with an error -32601"),
        "{detail}"
    );
    assert!(detail.contains("after a byte-order mark"), "{detail}");
    assert!(
        !detail.contains("a line of spaces"),
        "spaces are refused: {detail}"
    );
    assert!(
        fix.contains("§3.3") && fix.contains("parse_error (-32700)"),
        "{fix}"
    );
}

#[test]
fn answering_a_batch_with_a_parse_error_fails_batch() {
    let run = check(&fixture("serve-batches"), true);
    let (detail, fix) = fails_exactly(&run, "batch", &[]);
    assert!(
        detail.contains("answered a batch of one request with an error -32700 with id null instead of invalid_request (-32600) with id null"),
        "{detail}"
    );
    assert!(fix.contains("§2, §3.2"), "{fix}");
}

#[test]
fn answering_minus_zero_as_id_0_fails_request_ids() {
    let run = check(&fixture("lax-ids"), true);
    let (detail, fix) = fails_exactly(&run, "request-ids", &[]);
    assert!(
        detail.contains("answered the id `-0` with an error -32601 with id 0 instead of invalid_request (-32600) with id null"),
        "{detail}"
    );
    assert!(!detail.contains("`1.5`"), "only -0 is wrong: {detail}");
    assert!(fix.contains("`-0` excluded"), "{fix}");
}

#[test]
fn serving_a_repeated_id_member_fails_repeated_members() {
    let run = check(&fixture("keep-last-member"), true);
    let (detail, fix) = fails_exactly(&run, "repeated-members", &[]);
    assert!(
        detail.contains("answered a request with `id` twice with an error -32601"),
        "{detail}"
    );
    assert!(fix.contains("its last id"), "{fix}");
}

#[test]
fn serving_method_with_result_fails_method_with_result() {
    let run = check(&fixture("method-with-result"), true);
    let (detail, fix) = fails_exactly(&run, "method-with-result", &[]);
    assert!(
        detail.contains("answered a request with `result` with an error -32601"),
        "{detail}"
    );
    assert!(fix.contains("invalid_request (-32600)"), "{fix}");
}

#[test]
fn refusing_unknown_members_fails_unknown_members() {
    let run = check(&fixture("strict-members"), true);
    let (detail, fix) = fails_exactly(&run, "unknown-members", &[]);
    assert!(
        detail.contains("answered a request with an unknown top-level member with an error -32600"),
        "{detail}"
    );
    assert!(fix.contains("§1.2"), "{fix}");
}

#[test]
fn checking_params_before_the_method_fails_refusal_order() {
    let run = check(&fixture("params-first"), true);
    let (detail, fix) = fails_exactly(&run, "refusal-order", &[]);
    assert!(
        detail.contains("an unknown method with params `[1,2]` with an error -32602"),
        "{detail}"
    );
    assert!(fix.contains("§3.4"), "{fix}");
}

#[test]
fn serving_a_running_id_again_fails_duplicate_id() {
    let run = check(&fixture("no-duplicate-check"), true);
    let (detail, fix) = fails_exactly(&run, "duplicate-id", &[]);
    assert!(
        detail.contains("with a result with id")
            && detail.contains("instead of invalid_request (-32600)"),
        "{detail}"
    );
    assert!(fix.contains("let the first go on"), "{fix}");
}

#[test]
fn serving_before_the_handshake_fails_not_initialized() {
    let run = check(&fixture("no-handshake-gate"), true);
    let (detail, fix) = fails_exactly(&run, "not-initialized", &[]);
    assert!(
        detail.contains("answered an unknown method before `initialize` with an error -32601"),
        "{detail}"
    );
    assert!(fix.contains("not_initialized (-32007)"), "{fix}");
}

#[test]
fn serving_after_shutdown_fails_shutting_down() {
    let run = check(&fixture("serve-after-shutdown"), true);
    let (detail, fix) = fails_exactly(&run, "shutting-down", &[]);
    assert!(
        detail
            .contains("served a request written right after `shutdown`: it answered error -32601"),
        "{detail}"
    );
    assert!(fix.contains("shutting_down (-32008)"), "{fix}");
}

#[test]
fn a_nonzero_exit_at_stdin_eof_fails_stdin_eof() {
    let run = check(&fixture("eof-exit-3"), true);
    let (detail, fix) = fails_exactly(&run, "stdin-eof", &[]);
    assert!(
        detail.contains("exited with exit code 3 when its stdin closed"),
        "{detail}"
    );
    assert!(fix.contains("§5"), "{fix}");
}

#[test]
fn minus_32000_without_its_limit_fails_overload_as_a_server_error() {
    // docs/protocol.md §12: a -32000 without data.limit is a generic server error, not an
    // overload; the host would not read it as one.
    let run = check(&fixture("overload-without-limit"), true);
    let (detail, fix) = fails_exactly(&run, "overload", &[]);
    assert!(
        detail.contains("its data is absent instead of {\"limit\": 64}")
            && detail.contains("read as a generic server error, not an overload"),
        "{detail}"
    );
    assert!(fix.contains("§10, §12"), "{fix}");
}

#[test]
fn refusing_an_id_in_use_with_overloaded_fails_overload() {
    // docs/protocol.md §3.4: while 64 are held, a request reusing one of their ids is
    // invalid_request; a package that looks at the limit first answers overloaded.
    let run = check(&fixture("overload-first"), true);
    let (detail, fix) = fails_exactly(&run, "overload", &[]);
    assert!(
        detail.contains("while 64 are held, a request with the id") && detail.contains("-32000"),
        "{detail}"
    );
    assert!(fix.contains("an id in use wins over overloaded"), "{fix}");
}

#[test]
fn a_package_speaking_only_version_2_fails_the_handshake() {
    let session_rules: Vec<&str> = ALL_RULES
        .iter()
        .copied()
        .filter(|r| !matches!(*r, "handshake" | "version" | "stdout-only-protocol"))
        .collect();
    let run = check(&fixture("wrong-version"), true);
    let (detail, fix) = fails_exactly(&run, "handshake", &session_rules);
    assert!(
        detail.contains("refused every protocol version this conduit speaks ([1])"),
        "{detail}"
    );
    assert!(detail.contains("it speaks [2]"), "{detail}");
    assert!(fix.contains("add protocol version 1"), "{fix}");
    let skip = &rules(&run)["shutdown"].1;
    assert!(skip.contains("needs a completed handshake"), "{skip}");
}

#[test]
fn nothing_the_package_started_outlives_the_check() {
    // The good package, but each of its four instances also starts a `sleep 300` of its own
    // and writes its pid down: the check must stop every one of them (process group kill).
    let tmp = tempfile::tempdir().unwrap();
    let pkg = tmp.path().join("pkg");
    std::fs::create_dir(&pkg).unwrap();
    std::fs::copy(
        support::python_package("good").join("serve.py"),
        pkg.join("serve.py"),
    )
    .unwrap();
    let pids = tmp.path().join("pids");
    let manifest = std::fs::read_to_string(fixture("good").join("conduit-extension.toml"))
        .unwrap()
        .replace(
            "\"--name\", \"good\"]",
            &format!(
                "\"--name\", \"good\", \"--grandchild\", \"{}\"]",
                pids.display()
            ),
        );
    assert!(manifest.contains("--grandchild"), "{manifest}");
    // The check runs the package in its sandbox, with the paths it declares granted.
    let manifest = format!(
        "{manifest}\n[sandbox]\nwrite = [\"{}\"]\n",
        tmp.path().display()
    );
    std::fs::write(pkg.join("conduit-extension.toml"), manifest).unwrap();

    let run = check(&pkg, false);
    run.expect_code(0);
    let pids: Vec<i32> = std::fs::read_to_string(&pids)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(
        pids.len(),
        5,
        "one per instance (main, version, overload, lifecycle, read-only)"
    );
    for pid in pids {
        // A killed process may linger for a moment as a zombie of init; give it a few.
        let gone = (0..50).any(|_| {
            // Gone from /proc (reaped) is gone too, not running.
            let running = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|state| state.rsplit(')').next().map(str::to_owned))
                .is_some_and(|rest| !rest.trim_start().starts_with('Z'));
            if running {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            !running
        });
        let what = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default()
            + &std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .unwrap_or_default()
                .replace('\0', " ");
        assert!(
            gone,
            "pid {pid} (a grandchild of the check) is still running: `{what}`{}",
            run.context()
        );
    }
}

#[test]
fn a_bad_manifest_exits_2_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("conduit-extension.toml"),
        "name = \"Bad_Name\"\nversion = \"0.1.0\"\nprotocol = 1\ncommand = [\"./x\"]\n",
    )
    .unwrap();
    let run = check(dir.path(), false);
    run.expect_code(2);
    let err = run.stderr();
    assert!(
        err.contains("conduit-extension.toml: `name` contains 'B'"),
        "{}",
        run.context()
    );
    assert!(
        err.contains("lowercase letters"),
        "says how to fix it{}",
        run.context()
    );
    assert!(run.stdout().is_empty(), "{}", run.context());

    std::fs::write(
        dir.path().join("conduit-extension.toml"),
        "name = \"ok\"\nversion = \"0.1.0\"\nprotocol = 1\ncommand = [\"./x\"]\ncomand = 1\n",
    )
    .unwrap();
    let run = check(dir.path(), true);
    run.expect_code(2);
    assert!(
        run.stderr().contains("unknown key `comand`"),
        "{}",
        run.context()
    );

    // A program that is not there is a manifest problem too: nothing could be started.
    std::fs::write(
        dir.path().join("conduit-extension.toml"),
        "name = \"ok\"\nversion = \"0.1.0\"\nprotocol = 1\ncommand = [\"./x\"]\n",
    )
    .unwrap();
    let run = check(dir.path(), false);
    run.expect_code(2);
    assert!(
        run.stderr()
            .contains("`command` program `./x` does not exist"),
        "{}",
        run.context()
    );
}

#[test]
fn a_package_that_exits_at_once_fails_the_handshake_and_shows_its_stderr() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let program = tmp.path().join("run");
    std::fs::write(
        &program,
        "#!/bin/sh\necho 'cannot open the database' >&2\nexit 3\n",
    )
    .unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        tmp.path().join("conduit-extension.toml"),
        "name = \"quits\"\nversion = \"0.1.0\"\nprotocol = 1\ncommand = [\"./run\"]\n",
    )
    .unwrap();
    let run = check(tmp.path(), true);
    run.expect_code(1);
    let rules = rules(&run);
    let (status, detail, fix) = &rules["handshake"];
    assert_eq!(status, "fail");
    assert!(
        detail.contains("asked to `initialize`, the package ended the session before answering; it exited with exit code 3"),
        "{detail}"
    );
    assert!(fix.as_ref().unwrap().contains("stderr"), "{fix:?}");
    assert_eq!(
        rules["version"].0, "fail",
        "it cannot refuse a version either"
    );
    assert_eq!(rules["stdout-only-protocol"].0, "pass");
    assert!(
        run.json()["stderr"]["main"]
            .as_str()
            .unwrap()
            .contains("cannot open the database"),
        "{}",
        run.context()
    );
    let text = check(tmp.path(), false);
    assert!(
        text.stdout().contains("  | cannot open the database"),
        "{}",
        text.context()
    );
}

#[test]
fn usage_errors_exit_2_and_help_documents_the_codes() {
    conduit(&["ext", "check"]).expect_code(2);
    conduit(&["ext", "check", "--timeout-ms", "0", "x"]).expect_code(2);
    let missing = conduit(&["ext", "check", "/nonexistent/package"]);
    missing.expect_code(2);
    assert!(
        missing
            .stderr()
            .contains("a package is a folder that holds a conduit-extension.toml"),
        "{}",
        missing.context()
    );
    let file = conduit(&[
        "ext",
        "check",
        concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
    ]);
    file.expect_code(2);
    assert!(
        file.stderr().contains("is a file; pass the package folder"),
        "{}",
        file.context()
    );

    let help = conduit(&["ext", "check", "--help"]);
    help.expect_code(0);
    let out = help.stdout();
    for want in [
        "Exit codes:",
        "0  every rule passed",
        "1  at least one rule failed",
        "2  usage error",
        "--json",
        "--timeout-ms",
    ] {
        assert!(out.contains(want), "{want}{}", help.context());
    }
}

// ---- the example packages ------------------------------------------------------------------

#[track_caller]
fn passes(pkg: &Path) {
    let run = check(pkg, false);
    run.expect_code(0);
    assert!(
        run.stdout().contains(": every rule passed"),
        "{}",
        run.context()
    );
}

#[test]
fn the_echo_example_passes() {
    let tmp = tempfile::tempdir().unwrap();
    if let Some(pkg) = stage_rust_example("echo", tmp.path()) {
        passes(&pkg);
    }
}

#[test]
fn the_notes_example_passes_and_its_export_takes_the_bulk_pipe() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(pkg) = stage_rust_example("notes", tmp.path()) else {
        return;
    };
    passes(&pkg);
    // `export` (called by declared-methods-answer) streams the checker's three synthetic events
    // through the SDK: the checker offers the bulk pipe as the daemon does, and verifies what
    // came on it with the daemon's receiver.
    let run = check(&pkg, true);
    run.expect_code(0);
    let report = run.json();
    let rule = report["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "declared-methods-answer")
        .unwrap();
    let notes: Vec<&str> = rule["notes"]
        .as_array()
        .map(|n| n.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    assert!(
        notes.iter().any(|n| n.starts_with("artifact `")
            && n.contains(" bytes on the bulk pipe, size verified, sha256 computed by the host")),
        "{notes:?}{}",
        run.context()
    );
}

#[test]
fn the_python_echo_example_passes() {
    let tmp = tempfile::tempdir().unwrap();
    passes(&support::stage_example("python-echo", tmp.path()));
}

#[test]
fn a_package_that_writes_into_its_own_folder_fails_read_only_folder() {
    // The good package behind a wrapper that first writes a file beside itself (ignoring a
    // refusal, as a cache would): in the sandbox the write is refused unseen, so the check
    // starts it again from a read-only copy without the sandbox and compares the folder.
    if !nix::unistd::geteuid().is_root() {
        // Then the write bits refuse the write, the wrapper ignores it, and nothing is written.
        eprintln!("skipped: only root can write into a read-only copy");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let pkg = tmp.path().join("pkg");
    std::fs::create_dir(&pkg).unwrap();
    std::fs::copy(
        support::python_package("good").join("serve.py"),
        pkg.join("serve.py"),
    )
    .unwrap();
    std::fs::write(
        pkg.join("wrap.py"),
        "import os, runpy, sys\n\
         here = os.path.dirname(os.path.abspath(__file__))\n\
         try:\n    open(os.path.join(here, 'cache.txt'), 'a').write('x')\n\
         except OSError as e:\n    sys.stderr.write(f'cannot write beside myself: {e}\\n')\n\
         sys.argv = ['serve.py', '--name', 'good']\n\
         runpy.run_path(os.path.join(here, 'serve.py'), run_name='__main__')\n",
    )
    .unwrap();
    let manifest = std::fs::read_to_string(fixture("good").join("conduit-extension.toml"))
        .unwrap()
        .replace(
            "[\"python3\", \"serve.py\", \"--name\", \"good\"]",
            "[\"python3\", \"wrap.py\"]",
        );
    assert!(manifest.contains("wrap.py"), "{manifest}");
    std::fs::write(pkg.join("conduit-extension.toml"), manifest).unwrap();
    let run = check(&pkg, true);
    let (detail, fix) = fails_exactly(&run, "read-only-folder", &[]);
    assert!(
        detail.contains("wrote into it: cache.txt was added"),
        "{detail}"
    );
    assert!(fix.contains("$CONDUIT_DATA_DIR"), "{fix}");
}

#[test]
fn the_check_says_the_limits_and_sandbox_it_ran_the_package_under() {
    let run = check(&fixture("good"), true);
    let report = run.json();
    let under = &report["run_under"];
    assert_eq!(under["limits"]["memory"], 1u64 << 30, "{}", run.context());
    assert_eq!(under["limits"]["open_files"], 1024, "{}", run.context());
    let sandbox = under["sandbox"].as_str().unwrap();
    match conduit_supervisor::sandbox::landlock_abi() {
        Ok(abi) => assert!(
            sandbox.starts_with(&format!("Landlock (ABI {abi})")),
            "{sandbox}"
        ),
        Err(_) => {
            assert!(sandbox.starts_with("none: "), "{sandbox}");
            eprintln!("skipped: no Landlock (the report says so: {sandbox})");
        }
    }
}
