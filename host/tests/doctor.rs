//! `conduit doctor` against scratch installations: a healthy one reported healthy (and left
//! exactly as it was), then each checked thing broken in turn and seen reported with its fix —
//! and where the fix is safe to run here, run, and the check seen ok again.
//!
//! The service checks use a home folder inside the test's scratch folder, and a hard link to
//! the built `conduit` outside the build folder (what an installed binary looks like); nothing
//! is installed on the machine, no cgroup is touched, and the only processes signalled are the
//! test's own.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use support::fixture::{Fixture, walk};
use support::{PATIENCE, Run};

/// A scratch installation: the fixture's state directory, a home folder for the service file,
/// and a `conduit` outside the build folder.
struct Install {
    f: Fixture,
    home: PathBuf,
    bin: PathBuf,
}

impl Install {
    fn new() -> Self {
        let f = Fixture::new();
        let home = f.dir.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        let bin = installed_copy(&f.dir.path().join("bin"));
        Install { f, home, bin }
    }

    /// `conduit ARGS` as the installed binary, on this state directory and home.
    fn conduit(&self, args: &[&str]) -> Run {
        self.conduit_with(&self.bin, args)
    }

    fn conduit_with(&self, bin: &Path, args: &[&str]) -> Run {
        let out = Command::new(bin)
            .args(args)
            .env("CONDUIT_STATE_DIR", self.f.state())
            .env("HOME", &self.home)
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("CONDUIT_LOG")
            .output()
            .unwrap();
        Run {
            cmd: format!("{} {}", bin.display(), args.join(" ")),
            out,
        }
    }

    /// `conduit doctor --json`: the report, after checking its exit code agrees with it.
    fn doctor(&self) -> Value {
        let run = self.conduit(&["doctor", "--json"]);
        let r = run.json();
        let want = match r["status"].as_str() {
            Some("ok") => 0,
            Some("warn") => 1,
            Some("fail") => 2,
            other => panic!("status {other:?}{}", run.context()),
        };
        assert_eq!(
            run.code(),
            Some(want),
            "{}{}",
            run.context(),
            self.f.context()
        );
        r
    }

    /// [`Install::doctor`], checking that the state directory is byte for byte as it was.
    fn doctor_changing_nothing(&self) -> Value {
        let before = snapshot(&self.f.state());
        let r = self.doctor();
        assert_eq!(
            snapshot(&self.f.state()),
            before,
            "doctor changed the state directory"
        );
        r
    }

    /// Run a check's fix as printed, in a shell.
    fn apply(&self, fix: &str) {
        let out = Command::new("sh")
            .arg("-c")
            .arg(fix)
            .env("CONDUIT_STATE_DIR", self.f.state())
            .env("HOME", &self.home)
            .env("PATH", path_with(&self.bin))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the fix `{fix}` failed: {}{}",
            String::from_utf8_lossy(&out.stderr),
            self.f.context()
        );
    }
}

/// A hard link (or copy) of the built binary in `dir`.
fn installed_copy(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let bin = dir.join("conduit");
    let built = Path::new(env!("CARGO_BIN_EXE_conduit"));
    if std::fs::hard_link(built, &bin).is_err() {
        std::fs::copy(built, &bin).unwrap();
    }
    bin
}

/// `PATH` with the folder of `bin` first, so a fix that says `conduit` runs it.
fn path_with(bin: &Path) -> String {
    format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// The check named `name`.
#[track_caller]
fn check<'a>(r: &'a Value, name: &str) -> &'a Value {
    r["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name}: {r:#}"))
}

#[track_caller]
fn expect(r: &Value, name: &str, status: &str, found: &str, fix: &str) -> String {
    let c = check(r, name);
    assert_eq!(c["status"], status, "{name}: {c:#}\n{r:#}");
    let f = c["found"].as_str().unwrap();
    assert!(
        f.contains(found),
        "{name}: found {f:?}, expected it to say {found:?}"
    );
    let x = c["fix"]
        .as_str()
        .unwrap_or_else(|| panic!("{name} has no fix: {c:#}"));
    assert!(x.contains(fix), "{name}: fix {x:?}, expected {fix:?}");
    x.to_owned()
}

#[track_caller]
fn expect_ok(r: &Value, name: &str) {
    let c = check(r, name);
    assert_eq!(c["status"], "ok", "{name}: {c:#}");
    assert!(c["fix"].is_null(), "{c:#}");
}

/// Whether the file system of `path` has so little free space that the disk check warns
/// (below 1 GiB or 10%), measured here independently of the check.
fn disk_is_low(path: &Path) -> bool {
    let v = nix::sys::statvfs::statvfs(path).unwrap();
    #[allow(clippy::unnecessary_cast)]
    let (free, total) = (
        v.blocks_available() as u64 * v.fragment_size() as u64,
        v.blocks() as u64 * v.fragment_size() as u64,
    );
    free < (1 << 30) || free * 10 < total
}

/// Every file under `dir` with its size and content (and of SQLite's shared-memory index only
/// its size: every reader writes its read mark there, which is how readers and the writer of
/// a WAL store agree, not data).
fn snapshot(dir: &Path) -> Vec<(PathBuf, u64, u32, Vec<u8>)> {
    walk(dir)
        .into_iter()
        .filter(|p| !p.ends_with("daemon.log"))
        .map(|p| {
            let m = std::fs::symlink_metadata(&p).unwrap();
            let bytes = if m.is_file() && !p.to_string_lossy().ends_with("-shm") {
                std::fs::read(&p).unwrap_or_default()
            } else {
                Vec::new()
            };
            (p, m.len(), m.permissions().mode(), bytes)
        })
        .collect()
}

#[test]
fn a_healthy_install_is_reported_healthy_and_left_as_it_was() {
    let mut i = Install::new();
    i.f.install(&i.f.misbehave("calm", "ok"));
    i.f.install(&i.f.misbehave("steady", "ok"));
    let run = i.conduit(&["service", "install"]);
    run.expect_code(0);
    i.f.start_daemon();
    i.f.wait_state("calm", "ready", PATIENCE);
    i.f.wait_state("steady", "ready", PATIENCE);

    let r = i.doctor_changing_nothing();
    // The shape others read: exactly these keys.
    let keys: Vec<&String> = r.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["checks", "status"], "{r:#}");
    for c in r["checks"].as_array().unwrap() {
        let mut k: Vec<&String> = c.as_object().unwrap().keys().collect();
        k.sort();
        assert_eq!(k, ["fix", "found", "name", "status"], "{c:#}");
    }
    let names: Vec<&str> = r["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "state-dir",
            "daemon",
            "store",
            "disk",
            "wal",
            "service",
            "sandbox",
            "cgroups",
            "packages",
            "processes",
            "extensions"
        ],
        "{r:#}"
    );
    for c in r["checks"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let excused = (name == "disk" && disk_is_low(&i.f.state()))
            || (name == "sandbox" && conduit_supervisor::sandbox::landlock_abi().is_err());
        if !excused {
            expect_ok(&r, name);
        }
    }
    assert!(
        check(&r, "extensions")["found"]
            .as_str()
            .unwrap()
            .starts_with("2 of 2 extensions ready"),
        "{r:#}"
    );
    assert!(
        check(&r, "store")["found"]
            .as_str()
            .unwrap()
            .contains("quick_check ok"),
        "{r:#}"
    );
    // The text: one line per check, each beginning with its status, then the count.
    let run = i.conduit(&["doctor"]);
    let text = run.stdout();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), names.len() + 1, "{}", run.context());
    for (line, name) in lines.iter().zip(&names) {
        let mut words = line.split_whitespace();
        let status = words.next().unwrap();
        assert!(["ok", "warn", "fail"].contains(&status), "{line}");
        assert_eq!(words.next(), Some(*name), "{line}");
    }
    assert!(lines.last().unwrap().contains(" ok, "), "{text}");

    // Without a daemon it still changes nothing (the store is read as it lies on disk).
    i.f.stop_daemon();
    let r = i.doctor_changing_nothing();
    expect(
        &r,
        "daemon",
        "warn",
        "not running",
        "systemctl --user restart conduit",
    );
    expect_ok(&r, "store");
    expect_ok(&r, "processes");
}

#[test]
fn no_state_directory_is_reported_and_none_is_created() {
    let i = Install::new();
    // The platform's default under an empty home: nothing installed yet, a warning.
    let out = Command::new(&i.bin)
        .args(["doctor", "--json"])
        .env_remove("CONDUIT_STATE_DIR")
        .env_remove("XDG_STATE_HOME")
        .env("HOME", &i.home)
        .output()
        .unwrap();
    let run = Run {
        cmd: "conduit doctor --json".into(),
        out,
    };
    run.expect_code(1);
    let r = run.json();
    expect(
        &r,
        "state-dir",
        "warn",
        "no state directory",
        "conduit ext install",
    );
    expect(&r, "daemon", "warn", "not running", "conduit daemon run");
    assert!(
        std::fs::read_dir(&i.home).unwrap().next().is_none(),
        "doctor created something in the home folder"
    );
    // A state directory someone named that does not exist is a failure (a typo, most likely).
    let r = i.doctor();
    assert_eq!(r["status"], "fail");
    expect(&r, "state-dir", "fail", "no state directory", "--state-dir");
    assert!(!i.f.state().exists(), "doctor created the state directory");
}

#[test]
fn broken_files_are_reported_with_fixes_that_fix_them() {
    let i = Install::new();
    let src = i.f.misbehave("calm", "ok");
    i.f.install(&src);
    let state = i.f.state();
    // Every layout folder exists once a daemon has run; start and stop one.
    let mut f = i;
    f.f.start_daemon();
    f.f.wait_state("calm", "ready", PATIENCE);
    f.f.stop_daemon();
    let i = f;
    let r = i.doctor();
    expect_ok(&r, "state-dir");
    expect_ok(&r, "packages");
    expect_ok(&r, "processes");

    // Modes open to others, and a layout folder gone.
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    let r = i.doctor();
    let fix = expect(&r, "state-dir", "fail", "is mode 0755", "chmod 700");
    i.apply(&fix);
    std::fs::remove_dir_all(state.join("logs")).unwrap();
    let r = i.doctor();
    let fix = expect(&r, "state-dir", "warn", "logs", "mkdir -m 700");
    i.apply(&fix);
    expect_ok(&i.doctor(), "state-dir");

    // An installed file changed after install.
    let script = state.join("packages/calm/misbehave.py");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(&script, "print('changed')\n").unwrap();
    let r = i.doctor();
    let fix = expect(
        &r,
        "package calm",
        "fail",
        "misbehave.py changed",
        &format!("conduit ext install {}", src.display()),
    );
    i.apply(&fix);
    expect_ok(&i.doctor(), "packages");

    // A stale ledger, and one naming a process that escaped its extension's end.
    std::fs::write(state.join("run/gone.pids"), "boot x\n1 1\n").unwrap();
    let r = i.doctor();
    let fix = expect(&r, "processes", "warn", "stale pid ledgers", "rm -f");
    i.apply(&fix);
    expect_ok(&i.doctor(), "processes");
    let mut sleeper = Command::new("sleep").arg("600").spawn().unwrap();
    let pid = sleeper.id();
    let stat = conduit_supervisor::tree::stat(pid).unwrap();
    conduit_supervisor::tree::Ledger::new(state.join("run/runaway.pids"))
        .write(&[stat.id].into_iter().collect())
        .unwrap();
    let r = i.doctor();
    let fix = expect(
        &r,
        "processes",
        "fail",
        &format!("runaway: {pid}"),
        &format!("kill {pid}"),
    );
    i.apply(&fix);
    sleeper.wait().unwrap();
    std::fs::remove_file(state.join("run/runaway.pids")).unwrap();
    expect_ok(&i.doctor(), "processes");

    // A WAL that checkpoints could not reset (a sparse file: only its size is looked at).
    let wal = state.join("conduit.db-wal");
    let kept = std::fs::read(&wal).ok();
    std::fs::File::create(&wal)
        .unwrap()
        .set_len(200 << 20)
        .unwrap();
    expect(
        &i.doctor(),
        "wal",
        "warn",
        "200 MiB",
        "wal_checkpoint(TRUNCATE)",
    );
    match kept {
        Some(bytes) => std::fs::write(&wal, bytes).unwrap(),
        None => std::fs::remove_file(&wal).unwrap(),
    }
    expect_ok(&i.doctor(), "wal");

    // A store that is not a database any more. (The clean stop checkpointed everything into
    // conduit.db; without the kept WAL, whose frames would shadow the damage, the file itself
    // is read.)
    std::fs::remove_file(state.join("conduit.db-wal")).unwrap();
    std::fs::remove_file(state.join("conduit.db-shm")).unwrap();
    let db = state.join("conduit.db");
    let mut bytes = std::fs::read(&db).unwrap();
    bytes[..100].fill(0x5a);
    std::fs::write(&db, &bytes).unwrap();
    let r = i.doctor();
    expect(&r, "store", "fail", "conduit.db", "conduit daemon run");
    assert_eq!(r["status"], "fail");
    assert_eq!(
        std::fs::read(&db).unwrap(),
        bytes,
        "doctor repaired nothing"
    );
}

#[test]
fn the_service_file_is_checked_against_this_binary_and_this_state_directory() {
    let i = Install::new();
    i.f.install(&i.f.misbehave("calm", "ok"));
    let unit = i.home.join(".config/systemd/user/conduit.service");
    // None yet.
    let r = i.doctor();
    let fix = expect(&r, "service", "warn", "no service file", "service install");
    // For the state directory this doctor looked at (given by CONDUIT_STATE_DIR here).
    assert_eq!(
        fix,
        format!(
            "conduit --state-dir {} service install",
            i.f.state().display()
        )
    );
    // Written by the binary in the build folder: it runs whatever the next build leaves.
    i.conduit_with(
        Path::new(env!("CARGO_BIN_EXE_conduit")),
        &["service", "install"],
    )
    .expect_code(0);
    expect(
        &i.doctor(),
        "service",
        "warn",
        "inside the build folder",
        "service install --force",
    );
    // Written by another copy that is gone since: the service cannot start.
    let other = installed_copy(&i.f.dir.path().join("old-bin"));
    i.conduit_with(&other, &["service", "install", "--force"])
        .expect_code(0);
    std::fs::remove_file(&other).unwrap();
    let fix = expect(
        &i.doctor(),
        "service",
        "fail",
        "which does not exist",
        "--force",
    );
    i.apply(&fix);
    expect_ok(&i.doctor(), "service");
    // For another state directory.
    let text = std::fs::read_to_string(&unit).unwrap();
    let elsewhere = i.f.dir.path().join("elsewhere");
    std::fs::write(
        &unit,
        text.replace(i.f.state().to_str().unwrap(), elsewhere.to_str().unwrap()),
    )
    .unwrap();
    let fix = expect(&i.doctor(), "service", "warn", "not on", "--force");
    i.apply(&fix);
    expect_ok(&i.doctor(), "service");
    assert!(
        std::fs::read_to_string(&unit)
            .unwrap()
            .contains(&format!("ExecStart={} daemon run", i.bin.display())),
        "the fix rewrote the unit to run this binary"
    );
}

#[test]
fn extensions_in_trouble_and_a_daemon_gone_are_reported() {
    let mut i = Install::new();
    i.f.install(&i.f.misbehave("crashy", "exit-at-start"));
    i.f.install(&i.f.hog("leaky", "alloc", "[limits]\nmemory = \"64MiB\"\n"));
    let calm = i.f.misbehave("calm", "ok");
    i.f.install(&calm);
    i.f.install(&i.f.misbehave("steady", "ok"));
    i.f.start_daemon();
    i.f.wait_state("steady", "ready", PATIENCE);
    i.f.wait_state("crashy", "crash-looping", PATIENCE);
    i.f.wait_for("leaky", PATIENCE, |s| {
        s["recent_exits"][0]["cause"] == "over-limit"
    });
    i.f.wait_state("calm", "ready", PATIENCE);
    // `calm` changed after install, then restarted: refused.
    let script = i.f.state().join("packages/calm/misbehave.py");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(&script, "print('changed')\n").unwrap();
    i.f.conduit(&["ext", "restart", "calm"]).expect_code(0);
    i.f.wait_state("calm", "refused", PATIENCE);

    let r = i.doctor();
    assert_eq!(r["status"], "fail", "{r:#}");
    expect(
        &r,
        "extension crashy",
        "fail",
        "crash-looping since ",
        "conduit ext logs crashy --previous",
    );
    expect(
        &r,
        "extension calm",
        "fail",
        "refused since ",
        &format!("conduit ext install {}", calm.display()),
    );
    let leaky = check(&r, "extension leaky");
    let found = leaky["found"].as_str().unwrap();
    // Over its limit, or (after five stops in a row) crash-looping for it.
    assert!(found.contains("over its 64 MiB memory limit"), "{leaky:#}");
    if found.starts_with("over-limit") {
        assert_eq!(leaky["status"], "warn", "{leaky:#}");
        assert_eq!(leaky["fix"], "conduit ext set leaky limits.memory=128MiB");
    }
    expect(
        &r,
        "package calm",
        "fail",
        "misbehave.py changed",
        "conduit ext install",
    );

    // The daemon killed outright: its socket and ledgers stay behind.
    support::fixture::kill(i.f.daemon_pid(), nix::sys::signal::Signal::SIGKILL);
    let mut child = i.f.daemon.take().unwrap();
    child.wait().unwrap();
    let r = i.doctor();
    expect(&r, "daemon", "warn", "stale socket", "daemon run");
    // Its ledgers are left too: stale, or naming processes that outlived it.
    let p = check(&r, "processes");
    match p["status"].as_str() {
        Some("warn") => assert!(p["found"].as_str().unwrap().contains("stale"), "{p:#}"),
        Some("fail") => {
            i.apply(p["fix"].as_str().unwrap());
            i.f.wait_until("the escaped processes to be gone", || {
                (check(&i.doctor(), "processes")["status"] != "fail").then_some(())
            });
        }
        _ => panic!("the killed daemon's ledgers were not reported: {p:#}"),
    }
    assert!(
        r["checks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| !c["name"].as_str().unwrap().starts_with("extension")),
        "{r:#}"
    );
}
