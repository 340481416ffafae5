//! `conduit service` and the daemon under a service manager: the generated files (snapshots,
//! `systemd-analyze verify`, the plist parsed as a plist), install and uninstall on a scratch
//! `$HOME`, and the sd_notify conversation with a test-bound `NOTIFY_SOCKET` (readiness after
//! the extensions, status on a crash, the watchdog stopping while the host loop is stalled on
//! purpose, `STOPPING=1`, a clean exit).
//!
//! Snapshots live in `tests/snapshots/`, with the binary's path written `{conduit}` and the
//! state directory `{state}`; `UPDATE_SNAPSHOTS=1` rewrites them.

mod support;

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::PATIENCE;
use support::fixture::{Fixture, group_members, kill, stage_examples, walk};

const CONDUIT: &str = env!("CARGO_BIN_EXE_conduit");
/// The `PATH` the CLI runs with here, so the files it writes do not depend on the machine.
const TEST_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// `conduit` with a scratch `$HOME` and no inherited state or config variables.
fn conduit(home: &Path, args: &[&str]) -> support::Run {
    let out = Command::new(CONDUIT)
        .args(args)
        .env("HOME", home)
        .env("PATH", TEST_PATH)
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("XDG_STATE_HOME")
        .env_remove("CONDUIT_STATE_DIR")
        .env_remove("CONDUIT_LOG")
        .output()
        .unwrap();
    support::Run {
        cmd: format!("HOME={} conduit {}", home.display(), args.join(" ")),
        out,
    }
}

fn snapshot(name: &str, text: &str, state: &Path) {
    let program = std::fs::canonicalize(CONDUIT).unwrap();
    let state = state.to_str().unwrap();
    let text = text
        .replace(program.to_str().unwrap(), "{conduit}")
        .replace(state, "{state}")
        .replace(&state.replace('&', "&amp;"), "{state}");

    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(name);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, &text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with UPDATE_SNAPSHOTS=1 to write it",
            path.display()
        )
    });
    assert_eq!(
        text,
        want,
        "{} changed; if that is intended, rerun with UPDATE_SNAPSHOTS=1",
        path.display()
    );
}

/// `systemd-analyze verify` on a unit, or a visible skip where the tool is missing.
fn verify_unit(text: &str, dir: &Path) {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!(
            "SKIPPED: systemd-analyze is not installed (Debian: apt-get install systemd); the unit was not verified"
        );
        return;
    }
    let path = dir.join("conduit.service");
    std::fs::write(&path, text).unwrap();
    // `Documentation=` names conduit's own man pages, which verify looks up with `man`: the
    // pages this binary writes (`make man`), found through MANPATH as if installed.
    let man = dir.join("man");
    let pages = man.join("man1");
    std::fs::create_dir_all(&pages).unwrap();
    let wrote = Command::new(CONDUIT)
        .args(["man", "--out", pages.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(wrote.status.success(), "{wrote:?}");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .env("MANPATH", &man)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stderr.contains("conduit.service"),
        "systemd-analyze verify: {:?}\n{stderr}\n{text}",
        out.status
    );
}

#[test]
fn the_generated_units_match_their_snapshots_and_pass_systemd_analyze_verify() {
    let home = tempfile::tempdir().unwrap();
    let state = home.path().join("my state"); // a space, to see the quoting
    let s = state.to_str().unwrap();
    let user = conduit(
        home.path(),
        &[
            "service",
            "install",
            "--systemd",
            "--print",
            "--state-dir",
            s,
        ],
    );
    user.expect_code(0);
    snapshot("conduit.user.service", &user.stdout(), &state);
    let scratch = tempfile::tempdir().unwrap();
    verify_unit(&user.stdout(), scratch.path());

    let system = conduit(
        home.path(),
        &[
            "service",
            "install",
            "--systemd",
            "--system",
            "--print",
            "--state-dir",
            s,
        ],
    );
    if nix::unistd::Uid::effective().is_root() {
        system.expect_code(0);
        snapshot("conduit.system.service", &system.stdout(), &state);
        let out = system.stdout();
        for key in [
            "ProtectSystem=strict",
            "PrivateTmp=yes",
            "ReadWritePaths=\"",
        ] {
            assert!(out.contains(key), "{key} missing:\n{out}");
        }
        verify_unit(&out, scratch.path());
    } else {
        // Not root: --system is refused, saying how.
        system.expect_code(2);
        assert!(system.stderr().contains("sudo"), "{}", system.context());
    }
    // Nothing was installed by --print.
    assert!(walk(home.path()).is_empty(), "{:?}", walk(home.path()));
}

#[test]
fn the_unit_gets_a_clean_path_and_a_binary_in_a_build_folder_is_warned_about() {
    let home = tempfile::tempdir().unwrap();
    let state = home.path().join("state");
    let out = Command::new(CONDUIT)
        .args(["service", "install", "--systemd", "--json", "--state-dir"])
        .arg(&state)
        .env("HOME", home.path())
        .env("PATH", "/opt/x/bin:/usr/bin::/opt/x/bin/:bin:./y:/usr/bin")
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("CONDUIT_STATE_DIR")
        .output()
        .unwrap();
    let run = support::Run {
        cmd: "conduit service install --systemd --json".into(),
        out,
    };
    run.expect_code(0);
    let v = run.json();
    let unit = std::fs::read_to_string(v["path"].as_str().unwrap()).unwrap();
    // Each folder once, no empty or relative entries.
    assert!(
        unit.contains("\nEnvironment=PATH=/opt/x/bin:/usr/bin\n"),
        "{unit}"
    );
    // The tests' binary lies in the build folder (`target/`, or wherever CARGO_TARGET_DIR
    // put it: the folder holding cargo's CACHEDIR.TAG): said in the answer and on stderr.
    let target = Path::new(CONDUIT)
        .canonicalize()
        .unwrap()
        .ancestors()
        .find(|p| p.join("CACHEDIR.TAG").is_file())
        .unwrap()
        .to_owned();
    let warning = v["warnings"][0].as_str().unwrap_or("");
    assert!(
        warning.contains(&format!("inside the build folder {}", target.display())),
        "{v:#}"
    );
    assert!(
        run.stderr().contains("warning: the service runs"),
        "{}",
        run.context()
    );
    // The unit reads the journal the way a user unit must.
    assert!(unit.contains("`journalctl --user -u conduit`"), "{unit}");
    assert!(
        unit.contains("Documentation=man:conduit-daemon-run(1) man:conduit(1)"),
        "{unit}"
    );
}

#[test]
fn the_generated_plist_parses_as_a_plist_with_the_expected_keys() {
    let home = tempfile::tempdir().unwrap();
    let state = home.path().join("state & more");
    let s = state.to_str().unwrap();
    let run = conduit(
        home.path(),
        &[
            "service",
            "install",
            "--launchd",
            "--print",
            "--state-dir",
            s,
        ],
    );
    run.expect_code(0);
    snapshot("conduit.daemon.plist", &run.stdout(), &state);
    let file = home.path().join("conduit.daemon.plist");
    std::fs::write(&file, run.stdout()).unwrap();
    // Python's plistlib reads the format launchd does.
    let script =
        "import json, plistlib, sys; print(json.dumps(plistlib.load(open(sys.argv[1], 'rb'))))";
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["Label"], "conduit.daemon");
    let program = std::fs::canonicalize(CONDUIT).unwrap();
    assert_eq!(
        v["ProgramArguments"],
        serde_json::json!([program, "daemon", "run", "--state-dir", s])
    );
    assert_eq!(v["KeepAlive"]["SuccessfulExit"], false);
    assert_eq!(v["EnvironmentVariables"]["PATH"], TEST_PATH);
    assert_eq!(v["RunAtLoad"], true);
    assert_eq!(v["ProcessType"], "Background");
    assert!(v["ThrottleInterval"].as_u64().unwrap() >= 1);
    assert!(v["StandardErrorPath"].as_str().unwrap().starts_with(s));
    assert!(v["StandardOutPath"].as_str().unwrap().starts_with(s));
}

#[test]
fn install_and_uninstall_on_a_scratch_home_touch_only_their_own_files() {
    let home = tempfile::tempdir().unwrap();
    let state_parent = tempfile::tempdir().unwrap();
    let state = state_parent.path().join("state");
    let s = state.to_str().unwrap();
    std::fs::write(home.path().join(".profile"), "# someone's\n").unwrap();
    let before = walk(home.path());

    let run = conduit(
        home.path(),
        &[
            "service",
            "install",
            "--user",
            "--systemd",
            "--state-dir",
            s,
        ],
    );
    run.expect_code(0);
    let unit = home.path().join(".config/systemd/user/conduit.service");
    assert!(unit.is_file(), "{}", run.context());
    assert!(
        run.stdout()
            .contains("systemctl --user daemon-reload && systemctl --user enable --now conduit"),
        "{}",
        run.context()
    );
    assert!(
        state.is_dir(),
        "the state directory is made for ReadWritePaths="
    );
    let printed = conduit(
        home.path(),
        &[
            "service",
            "install",
            "--systemd",
            "--print",
            "--state-dir",
            s,
        ],
    );
    assert_eq!(std::fs::read_to_string(&unit).unwrap(), printed.stdout());

    // Again: unchanged, not rewritten.
    let again = conduit(
        home.path(),
        &[
            "service",
            "install",
            "--systemd",
            "--state-dir",
            s,
            "--json",
        ],
    );
    assert_eq!(again.json()["written"], false, "{}", again.context());

    // A file edited by hand is kept, unless --force.
    std::fs::write(&unit, "# mine\n").unwrap();
    let refused = conduit(
        home.path(),
        &["service", "install", "--systemd", "--state-dir", s],
    );
    refused.expect_code(1);
    assert!(
        refused.stderr().contains("--force"),
        "{}",
        refused.context()
    );
    assert_eq!(std::fs::read_to_string(&unit).unwrap(), "# mine\n");
    conduit(
        home.path(),
        &[
            "service",
            "install",
            "--systemd",
            "--state-dir",
            s,
            "--force",
        ],
    )
    .expect_code(0);
    assert_eq!(std::fs::read_to_string(&unit).unwrap(), printed.stdout());

    // The status knows the file; no daemon runs.
    let st = conduit(
        home.path(),
        &["service", "status", "--systemd", "--state-dir", s, "--json"],
    );
    st.expect_code(1);
    let v = st.json();
    assert_eq!(
        (v["installed"].as_bool(), v["current"].as_bool()),
        (Some(true), Some(true))
    );
    assert!(v["daemon"].is_null());

    // What `systemctl --user enable` would add: the link goes with the unit.
    let wants = home
        .path()
        .join(".config/systemd/user/default.target.wants");
    std::fs::create_dir_all(&wants).unwrap();
    std::os::unix::fs::symlink(&unit, wants.join("conduit.service")).unwrap();
    let run = conduit(
        home.path(),
        &["service", "uninstall", "--systemd", "--state-dir", s],
    );
    run.expect_code(0);
    assert!(
        run.stdout()
            .contains("systemctl --user disable --now conduit"),
        "{}",
        run.context()
    );
    let after: Vec<PathBuf> = walk(home.path())
        .into_iter()
        .filter(|p| !p.is_dir())
        .collect();
    let files_before: Vec<PathBuf> = before.into_iter().filter(|p| !p.is_dir()).collect();
    assert_eq!(
        after, files_before,
        "only the service's own files were added and removed"
    );
    // Nothing left to remove: still exit 0.
    conduit(
        home.path(),
        &["service", "uninstall", "--systemd", "--state-dir", s],
    )
    .expect_code(0);

    // A file conduit did not write is not removed without --force.
    std::fs::write(&unit, "# mine\n").unwrap();
    conduit(
        home.path(),
        &["service", "uninstall", "--systemd", "--state-dir", s],
    )
    .expect_code(1);
    assert!(unit.exists());
    conduit(
        home.path(),
        &[
            "service",
            "uninstall",
            "--systemd",
            "--state-dir",
            s,
            "--force",
        ],
    )
    .expect_code(0);
    assert!(!unit.exists());
}

/// What a test-bound `NOTIFY_SOCKET` received, each with the unix time (ms) it arrived.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<(i64, String)>>>);

impl Received {
    fn listen(sock: UnixDatagram) -> Received {
        let r = Received::default();
        let out = r.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 8192];
            while let Ok(n) = sock.recv(&mut buf) {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap()
                    .as_millis() as i64;
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                for line in text.lines() {
                    out.0.lock().unwrap().push((now, line.to_owned()));
                }
            }
        });
        r
    }

    fn all(&self) -> Vec<(i64, String)> {
        self.0.lock().unwrap().clone()
    }

    fn times_of(&self, line: &str) -> Vec<i64> {
        self.all()
            .into_iter()
            .filter(|(_, l)| l == line)
            .map(|(t, _)| t)
            .collect()
    }

    /// Polls until a line matching `pred` arrives; its time and text.
    fn wait_for(&self, what: &str, f: &Fixture, pred: impl Fn(&str) -> bool) -> (i64, String) {
        let start = Instant::now();
        loop {
            if let Some(hit) = self.all().into_iter().find(|(_, l)| pred(l)) {
                return hit;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "never received {what}; received: {:#?}{}",
                self.all(),
                f.context()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[test]
fn under_a_notify_socket_the_daemon_says_ready_status_watchdog_and_stopping() {
    let mut f = Fixture::new();
    let pkgs = stage_examples(&f);
    f.install(&pkgs[0]); // echo
    f.install(&f.core_ext("slow", "slow-start")); // reads nothing for its first second
    let sock_path = f.dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    let got = Received::listen(sock);
    let stall = f.dir.path().join("stall");
    // A 2 s watchdog: a heartbeat every second; withheld once the loop has not passed for 3 s.
    f.start_daemon_with(&[
        ("NOTIFY_SOCKET", sock_path.as_os_str()),
        ("WATCHDOG_USEC", "2000000".as_ref()),
        ("CONDUIT_FAULT_STALL_HOST_LOOP", stall.as_os_str()),
    ]);

    // READY=1 comes after both extensions have handshaken, with a status line.
    let (ready_at, _) = got.wait_for("READY=1", &f, |l| l == "READY=1");
    for name in ["echo", "slow"] {
        let s = f.status(name);
        assert_eq!(s["state"], "ready", "{s:#}");
        let since = s["ready_since_ms"].as_i64().unwrap();
        assert!(
            since <= ready_at,
            "`{name}` was ready at {since}, after READY=1 at {ready_at}"
        );
    }
    assert!(
        got.all()
            .iter()
            .any(|(_, l)| l.starts_with("STATUS=2 ready")),
        "{:#?}",
        got.all()
    );
    // The extensions never see the socket.
    let pid = f.status("echo")["pid"].as_i64().unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    assert!(!String::from_utf8_lossy(&environ).contains("NOTIFY_SOCKET"));

    // Heartbeats at the configured rate: more often than the 2 s watchdog, not a flood.
    let beats = f.wait_until("four heartbeats", || {
        let beats = got.times_of("WATCHDOG=1");
        (beats.len() >= 4).then_some(beats)
    });
    let mut gaps: Vec<i64> = beats.windows(2).map(|w| w[1] - w[0]).collect();
    gaps.sort();
    assert!(
        gaps[0] >= 500,
        "heartbeats closer than a quarter of the interval: {gaps:?}"
    );
    assert!(
        gaps[gaps.len() / 2] < 2000,
        "heartbeats slower than the watchdog: {gaps:?}"
    );

    // A crash shows in the status line.
    kill(pid as i32, nix::sys::signal::Signal::SIGKILL);
    got.wait_for("a STATUS= line after the crash", &f, |l| {
        l.starts_with("STATUS=") && !l.contains("; 0 restarts;")
    });

    // The host loop stalled on purpose: the heartbeat stops, then comes back.
    std::fs::write(&stall, "").unwrap();
    let stalled_at = now_ms();
    f.wait_until(
        &format!("the heartbeat to stop while the loop is stalled (stalled at {stalled_at})"),
        || {
            let last = got.times_of("WATCHDOG=1").last().copied().unwrap_or(0);
            // 3 s without a pass, then one beat interval, then a margin.
            (now_ms() - last > 5000).then_some(())
        },
    );
    let n = got.times_of("WATCHDOG=1").len();
    std::fs::remove_file(&stall).unwrap();
    f.wait_until("the heartbeat to come back", || {
        (got.times_of("WATCHDOG=1").len() > n).then_some(())
    });

    // SIGTERM: STOPPING=1, exit 0, no extension process left.
    let pgids: Vec<u32> = ["echo", "slow"]
        .iter()
        .filter_map(|n| f.status(n)["pid"].as_u64().map(|p| p as u32))
        .collect();
    assert_eq!(f.stop_daemon(), Some(0), "{}", f.context());
    assert!(
        got.all().iter().any(|(_, l)| l == "STOPPING=1"),
        "{:#?}",
        got.all()
    );
    for g in pgids {
        assert!(group_members(g).is_empty(), "group {g} left running");
    }
}
