//! Per-extension limits and the filesystem sandbox, against misbehaving test extensions
//! (`fixtures/hog.py`) under the real daemon: memory, tasks, open files, the CPU share, Landlock,
//! read-only installs, and the operator's `ext set`.
//!
//! These tests use rlimits, the supervisor's /proc sampling and Landlock only; they never create
//! or change a cgroup (the cgroup code is tested against a scratch folder in the supervisor).

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::PATIENCE;
use support::fixture::Fixture;

/// A package running `hog.py MODE`, with `extra` appended to its manifest.
fn hog(f: &Fixture, name: &str, mode: &str, extra: &str) -> PathBuf {
    f.hog(name, mode, extra)
}

fn call(f: &Fixture, name: &str, method: &str, params: &str) -> Value {
    f.json(&["ext", "call", name, method, params])
}

fn landlock() -> bool {
    match conduit_supervisor::sandbox::landlock_abi() {
        Ok(_) => true,
        Err(why) => {
            eprintln!("skipped: no Landlock ({why})");
            false
        }
    }
}

/// utime + stime of `pid` in seconds, from /proc.
fn cpu_seconds(pid: i64) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &text[text.rfind(')').unwrap() + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    ticks as f64 / conduit_supervisor::usage::ticks_per_second() as f64
}

#[test]
fn an_extension_over_its_memory_limit_is_stopped_named_and_restarted_while_others_run_on() {
    let mut f = Fixture::new();
    f.install(&hog(&f, "leaky", "alloc", "[limits]\nmemory = \"64MiB\"\n"));
    f.install(&hog(&f, "calm", "ok", ""));
    f.start_daemon();
    let calm = f.wait_state("calm", "ready", PATIENCE);
    let s = f.wait_for("leaky", PATIENCE, |s| {
        s["resources"]["limit_stops"].as_u64() >= Some(2)
    });
    let rec = &s["recent_exits"][0];
    assert_eq!(rec["cause"], "over-limit", "{s:#}");
    let summary = rec["summary"].as_str().unwrap();
    assert!(
        summary.starts_with("stopped: over its 64 MiB memory limit (resident "),
        "{summary}"
    );
    assert_eq!(s["resources"]["limits"]["memory"], 64 << 20, "{s:#}");
    assert!(s["restarts"].as_u64() >= Some(1), "restarted: {s:#}");
    // The text status says it too.
    let text = f.conduit(&["ext", "status", "leaky"]).stdout();
    assert!(text.contains("over its 64 MiB memory limit"), "{text}");
    assert!(text.contains("limits        memory 64 MiB"), "{text}");
    // The other extension and the daemon were not touched.
    let calm_now = f.status("calm");
    assert_eq!(calm_now["pid"], calm["pid"], "{calm_now:#}");
    assert_eq!(calm_now["restarts"], 0);
    assert_eq!(
        call(&f, "calm", "echo", r#"{"still":"here"}"#)["still"],
        "here"
    );
    let u = &calm_now["resources"]["usage"];
    assert!(u["rss_bytes"].as_u64().unwrap() > 0, "{calm_now:#}");
    assert!(u["tasks"].as_u64().unwrap() >= 1, "{calm_now:#}");
    f.stop_daemon();
}

#[test]
fn the_memory_limit_holds_before_the_handshake_too() {
    let mut f = Fixture::new();
    f.install(&hog(
        &f,
        "eager",
        "alloc-early",
        "[limits]\nmemory = \"64MiB\"\n",
    ));
    f.start_daemon();
    let s = f.wait_for("eager", PATIENCE, |s| {
        s["recent_exits"][0]["cause"] == "over-limit"
    });
    let summary = s["recent_exits"][0]["summary"].as_str().unwrap();
    assert!(
        summary.starts_with("stopped: over its 64 MiB memory limit"),
        "{summary}"
    );
    assert!(
        s["ready_since_ms"].is_null(),
        "it never became ready: {s:#}"
    );
    f.stop_daemon();
}

#[test]
fn an_extension_that_forks_without_bound_is_stopped_at_its_task_limit() {
    // RLIMIT_NPROC counts every process of the user and is not enforced for root (these tests
    // run as root), so the supervisor counts the tree's tasks itself.
    let mut f = Fixture::new();
    f.install(&hog(&f, "forker", "fork", "[limits]\ntasks = 8\n"));
    f.start_daemon();
    let s = f.wait_for("forker", PATIENCE, |s| {
        s["recent_exits"][0]["cause"] == "over-limit"
    });
    let summary = s["recent_exits"][0]["summary"].as_str().unwrap();
    // Forking every 20 ms, it is seen at 9 or a few more within one 100 ms sample.
    assert!(
        summary.starts_with("stopped: over its limit of 8 tasks ("),
        "{summary}"
    );
    let seen: u32 = summary["stopped: over its limit of 8 tasks (".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((9..=20).contains(&seen), "{summary}");
    // The whole tree went with it: nothing of it outlives the stop (the ledger is empty).
    f.stop_daemon();
}

#[test]
fn descriptors_stop_at_open_files_exactly() {
    let mut f = Fixture::new();
    f.install(&hog(&f, "fds", "ok", "[limits]\nopen_files = 64\n"));
    f.start_daemon();
    f.wait_state("fds", "ready", PATIENCE);
    let r = call(&f, "fds", "open_files", "{}");
    assert_eq!(r["errno"], "EMFILE", "{r}");
    // Descriptors are numbered from 0: the 64th and last one allowed is 63.
    assert_eq!(r["highest_fd"], 63, "{r}");
    // Still serving after hitting the limit.
    assert_eq!(call(&f, "fds", "echo", r#"{"a":1}"#)["a"], 1);
    f.stop_daemon();
}

#[test]
fn a_spinner_is_held_to_its_cpu_share_measured_from_proc() {
    // A share well below what a spinner gets even on a loaded machine (a whole test suite on
    // two cores left a free spinner 0.1 of a CPU), so the duty cycle must act, and says so
    // (`throttles`); a second spinner with the default share runs beside it.
    let mut f = Fixture::new();
    f.install(&hog(&f, "spinner", "spin", "[limits]\ncpu = 0.02\n"));
    f.install(&hog(&f, "free", "spin", ""));
    f.start_daemon();
    let pid = f.wait_state("spinner", "ready", PATIENCE)["pid"]
        .as_i64()
        .unwrap();
    let free = f.wait_state("free", "ready", PATIENCE)["pid"]
        .as_i64()
        .unwrap();
    let (t0, c0, f0) = (Instant::now(), cpu_seconds(pid), cpu_seconds(free));
    // A window of at least 4 s of wall time, measured, not slept for a fixed time.
    f.wait_until("4 s of the spinners' life", || {
        (t0.elapsed() >= Duration::from_secs(4)).then_some(())
    });
    let wall = t0.elapsed().as_secs_f64();
    let share = (cpu_seconds(pid) - c0) / wall;
    let free_share = (cpu_seconds(free) - f0) / wall;
    eprintln!(
        "over {wall:.1} s: the spinner with cpu = 0.02 used {share:.3} of one CPU, the one with the default share {free_share:.3}"
    );
    // Its share, plus at most one 100 ms sample at full speed and the half second of share it
    // may save up, spread over the window: 0.02 + 0.025 + 0.0025.
    assert!(share <= 0.06, "share {share} is over 0.02 (+ margin)");
    assert!(share > 0.0, "share {share}: it should still run");
    let s = f.status("spinner");
    let u = &s["resources"]["usage"];
    assert!(u["throttles"].as_u64().unwrap() > 0, "{s:#}");
    assert_eq!(
        s["pid"].as_i64(),
        Some(pid),
        "never restarted for its CPU: {s:#}"
    );
    f.stop_daemon();
}

#[test]
fn the_sandbox_refuses_the_home_folder_and_writes_outside_the_data_dir() {
    if !landlock() {
        return;
    }
    let mut f = Fixture::new();
    let home = f.dir.path().join("home");
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    std::fs::write(home.join(".ssh/id_ed25519"), "not a real key\n").unwrap();
    f.install(&hog(&f, "nosy", "ok", ""));
    f.start_daemon_with(&[("HOME", home.as_os_str())]);
    let s = f.wait_state("nosy", "ready", PATIENCE);
    assert_eq!(s["resources"]["sandbox"]["state"], "landlock", "{s:#}");
    let data = f.state().join("data/nosy");
    let key = home.join(".ssh/id_ed25519");
    let outside = home.join("dropped.txt");
    let own = f.state().join("packages/nosy/dropped.txt");
    let inside = data.join("ok.txt");
    let params = serde_json::json!({
        "read": [key, "/etc/hostname"],
        "write": [outside, own, inside],
    });
    let r = call(&f, "nosy", "probe", &params.to_string());
    assert_eq!(r[key.to_str().unwrap()], "EACCES", "{r}");
    assert_eq!(r[outside.to_str().unwrap()], "EACCES", "{r}");
    assert_eq!(r[own.to_str().unwrap()], "EACCES", "{r}");
    assert_eq!(r[inside.to_str().unwrap()], "ok", "{r}");
    assert!(!outside.exists() && !own.exists());
    // The daemon itself (not sandboxed) can still read what the extension cannot.
    assert!(key.exists());
    // The text status lists every path the sandbox lets through, so a refusal can be checked
    // against it: what it reads (the system's folders and its package), what it writes.
    let text = f.conduit(&["ext", "status", "nosy"]).stdout();
    let lines: Vec<&str> = text.lines().collect();
    let reads = lines
        .iter()
        .position(|l| l.starts_with("  reads "))
        .unwrap();
    let writes = lines
        .iter()
        .position(|l| l.starts_with("  writes "))
        .unwrap();
    let read_text = lines[reads..writes].join(" ");
    for p in ["/usr", "/etc", "/proc"] {
        assert!(read_text.contains(p), "{text}");
    }
    let pkg = f.state().join("packages/nosy");
    assert!(read_text.contains(pkg.to_str().unwrap()), "{text}");
    assert!(!text.contains(".ssh"), "{text}");
    assert!(lines[writes].contains(data.to_str().unwrap()), "{text}");
    assert!(
        !text.contains("reads 1"),
        "no count in place of the list: {text}"
    );
    f.stop_daemon();
}

#[test]
fn each_extensions_memory_and_cpu_are_metrics_beside_their_limits() {
    let mut f = Fixture::new();
    f.install(&hog(
        &f,
        "measured",
        "ok",
        "[limits]\nmemory = \"64MiB\"\ncpu = 0.5\n",
    ));
    f.start_daemon();
    f.wait_state("measured", "ready", PATIENCE);
    let s = f.wait_for("measured", PATIENCE, |s| {
        s["resources"]["usage"]["rss_bytes"].as_u64().unwrap_or(0) > 0
    });
    let metrics = f.conduit(&["metrics"]).stdout();
    let value = |name: &str| -> f64 {
        let prefix = format!("{name}{{extension=\"measured\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {name} for `measured`: {metrics}"))
            .parse()
            .unwrap()
    };
    assert!(
        value("conduit_extension_memory_bytes") > 1e6,
        "{s:#}\n{metrics}"
    );
    assert_eq!(
        value("conduit_extension_memory_limit_bytes"),
        (64u64 << 20) as f64
    );
    let cpu = value("conduit_extension_cpu_ratio");
    assert!((0.0..=1.0).contains(&cpu), "{metrics}");
    assert_eq!(value("conduit_extension_cpu_limit_ratio"), 0.5);
    assert!(value("conduit_extension_tasks") >= 1.0, "{metrics}");
    assert_eq!(value("conduit_extension_throttled"), 0.0);
    assert_eq!(value("conduit_extension_limit_stops_total"), 0.0);
    for family in [
        "conduit_extension_memory_bytes",
        "conduit_extension_cpu_ratio",
    ] {
        assert!(
            metrics.contains(&format!("# TYPE {family} gauge\n")),
            "{metrics}"
        );
    }
    f.stop_daemon();
}

#[test]
fn declared_sandbox_paths_are_granted_only_by_the_operator_and_off_is_the_operators_choice() {
    if !landlock() {
        return;
    }
    let mut f = Fixture::new();
    let shared = f.dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::write(shared.join("in.txt"), "hello\n").unwrap();
    let extra = format!("[sandbox]\nread = [\"{}\"]\n", shared.display());
    let pkg = hog(&f, "asker", "ok", &extra);
    let run = f.conduit(&["ext", "install", pkg.to_str().unwrap()]);
    assert_eq!(run.code(), Some(0), "{}", run.context());
    assert!(
        run.stderr()
            .contains("conduit ext set asker sandbox.grant=yes"),
        "shown at install: {}",
        run.stderr()
    );
    f.start_daemon();
    f.wait_state("asker", "ready", PATIENCE);
    let file = shared.join("in.txt");
    let probe = serde_json::json!({ "read": [file] }).to_string();
    let key = file.to_str().unwrap();
    assert_eq!(call(&f, "asker", "probe", &probe)[key], "EACCES");
    let pid = f.status("asker")["pid"].clone();
    f.json(&["ext", "set", "asker", "sandbox.grant=yes", "--json"]);
    let s = f.wait_for("asker", PATIENCE, |s| {
        s["state"] == "ready" && s["pid"] != pid
    });
    assert_eq!(call(&f, "asker", "probe", &probe)[key], "ok", "{s:#}");
    let pid = s["pid"].clone();
    f.json(&["ext", "set", "asker", "sandbox=off", "--json"]);
    let s = f.wait_for("asker", PATIENCE, |s| {
        s["state"] == "ready" && s["pid"] != pid
    });
    assert_eq!(s["resources"]["sandbox"]["state"], "off", "{s:#}");
    f.stop_daemon();
}

#[test]
fn ext_set_changes_the_limits_in_force_and_refuses_bad_values_changing_nothing() {
    let mut f = Fixture::new();
    f.install(&hog(&f, "tuned", "ok", "[limits]\nmemory = \"4GiB\"\n"));
    f.start_daemon();
    let s = f.wait_state("tuned", "ready", PATIENCE);
    // The package asked for more than the default: not granted, and the status says how.
    assert_eq!(s["resources"]["limits"]["memory"], 1u64 << 30, "{s:#}");
    let notes = s["resources"]["notes"].to_string();
    assert!(
        notes.contains("conduit ext set tuned limits.memory=4GiB"),
        "{notes}"
    );
    let pid = s["pid"].clone();
    let v = f.json(&[
        "ext",
        "set",
        "tuned",
        "limits.memory=256MiB",
        "limits.open_files=128",
        "--json",
    ]);
    assert_eq!(v["limits"]["memory"], 256u64 << 20, "{v}");
    assert_eq!(v["sources"]["memory"], "operator", "{v}");
    let s = f.wait_for("tuned", PATIENCE, |s| {
        s["state"] == "ready" && s["pid"] != pid
    });
    assert_eq!(s["resources"]["limits"]["memory"], 256u64 << 20, "{s:#}");
    assert_eq!(s["resources"]["limits"]["open_files"], 128, "{s:#}");
    assert_eq!(s["resources"]["sources"]["memory"], "operator", "{s:#}");
    assert_eq!(s["resources"]["sources"]["cpu"], "default", "{s:#}");
    // One past a bound, an unknown key, a missing `=`: exit 2, and the file is unchanged.
    let before = std::fs::read_to_string(f.state().join("settings.toml")).unwrap();
    for bad in ["limits.open_files=15", "limits.disk=1", "limits.memory"] {
        let run = f.conduit(&["ext", "set", "tuned", "limits.cpu=0.5", bad]);
        assert_eq!(run.code(), Some(2), "{bad}: {}", run.context());
    }
    let run = f.conduit(&["ext", "set", "tuned", "limits.open_files=15"]);
    assert!(
        run.stderr().contains("below the least, 16"),
        "{}",
        run.stderr()
    );
    assert_eq!(
        std::fs::read_to_string(f.state().join("settings.toml")).unwrap(),
        before
    );
    f.stop_daemon();
}

#[test]
fn a_vendored_python_package_survives_three_restarts_from_its_read_only_install() {
    use std::os::unix::fs::PermissionsExt;
    let mut f = Fixture::new();
    let pkg = f.dir.path().join("src/vendored");
    std::fs::create_dir_all(pkg.join("vendor/tinydep")).unwrap();
    std::fs::write(
        pkg.join("vendor/tinydep/__init__.py"),
        "def shout(s):\n    return s.upper()\n",
    )
    .unwrap();
    // The hog fixture, importing its vendored dependency first (as a real package would).
    let hog_src = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hog.py"),
    )
    .unwrap();
    std::fs::write(
        pkg.join("main.py"),
        format!(
            "import os, sys\nsys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'vendor'))\nimport tinydep\nassert tinydep.shout('a') == 'A'\n{hog_src}"
        ),
    )
    .unwrap();
    std::fs::write(
        pkg.join("conduit-extension.toml"),
        "name = \"vendored\"\nversion = \"0.1.0\"\nprotocol = 1\ncommand = [\"python3\", \"main.py\", \"ok\"]\n\n[capabilities]\nmethods = [\"echo\", \"pid\", \"open_files\", \"probe\"]\n",
    )
    .unwrap();
    f.install(&pkg);
    // Installed without write bits, files and folders alike.
    for p in support::fixture::walk(&f.state().join("packages/vendored")) {
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o222, 0, "{} is writable ({mode:o})", p.display());
    }
    // Without the sandbox, which would refuse the cache's write on its own: what keeps the
    // folder unwritten here is PYTHONDONTWRITEBYTECODE (for root, which ignores write bits).
    f.json(&["ext", "set", "vendored", "sandbox=off", "--json"]);
    f.start_daemon();
    let s = f.wait_state("vendored", "ready", PATIENCE);
    assert_eq!(s["resources"]["sandbox"]["state"], "off", "{s:#}");
    let mut pid = s["pid"].clone();
    for n in 1..=3 {
        let run = f.conduit(&["ext", "restart", "vendored"]);
        assert_eq!(run.code(), Some(0), "{}", run.context());
        let s = f.wait_for("vendored", PATIENCE, |s| {
            assert_ne!(s["state"], "refused", "restart {n}: {s:#}");
            s["state"] == "ready" && s["pid"] != pid
        });
        pid = s["pid"].clone();
    }
    assert!(
        !f.state()
            .join("packages/vendored/vendor/tinydep/__pycache__")
            .exists(),
        "no bytecode cache was written into the installed package"
    );
    // Removing a read-only package works.
    f.stop_daemon();
    let run = f.conduit(&["ext", "remove", "vendored"]);
    assert_eq!(run.code(), Some(0), "{}", run.context());
    assert!(!f.state().join("packages/vendored").exists());
}
