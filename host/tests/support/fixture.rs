//! A daemon in a temporary state directory, driven through the real `conduit` binary, with
//! what a person needs printed when an assertion fails (the daemon's log, the state dir).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Run, stage_rust_example, workspace_root};

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub daemon: Option<Child>,
}

impl Fixture {
    pub fn new() -> Self {
        Fixture {
            dir: tempfile::tempdir().unwrap(),
            daemon: None,
        }
    }

    pub fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    pub fn daemon_log(&self) -> PathBuf {
        self.dir.path().join("daemon.log")
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_conduit"));
        c.args(args)
            .env("CONDUIT_STATE_DIR", self.state())
            .env_remove("CONDUIT_LOG");
        c
    }

    pub fn conduit(&self, args: &[&str]) -> Run {
        let out = self
            .command(args)
            .output()
            .expect("the conduit binary runs");
        Run {
            cmd: format!("conduit {}", args.join(" ")),
            out,
        }
    }

    /// Everything a person needs when an assertion fails.
    pub fn context(&self) -> String {
        let log = std::fs::read_to_string(self.daemon_log()).unwrap_or_default();
        let mut listing = String::new();
        for e in walk(&self.state()) {
            listing.push_str(&format!(
                "{}\n",
                e.strip_prefix(self.dir.path()).unwrap_or(&e).display()
            ));
        }
        format!("\n--- daemon log ---\n{log}\n--- state dir ---\n{listing}")
    }

    /// `conduit ext install --no-wait --force PKG`, expecting exit 0: the tests that need the
    /// wait, the rollback or the refusal of a changed reinstall call the CLI themselves.
    pub fn install(&self, pkg: &Path) {
        let run = self.conduit(&[
            "ext",
            "install",
            "--no-wait",
            "--force",
            pkg.to_str().unwrap(),
        ]);
        assert_eq!(run.code(), Some(0), "{}{}", run.context(), self.context());
    }

    /// A package running `misbehave.py` in `mode`.
    pub fn misbehave(&self, name: &str, mode: &str) -> PathBuf {
        let pkg = self.dir.path().join("src").join(name);
        std::fs::create_dir_all(&pkg).unwrap();
        let script = workspace_root().join("host/supervisor/tests/fixtures/misbehave.py");
        std::fs::copy(script, pkg.join("misbehave.py")).unwrap();
        std::fs::write(
            pkg.join("conduit-extension.toml"),
            format!(
                "name = \"{name}\"\nversion = \"0.1.0\"\nprotocol = 1\ncommand = [\"python3\", \"misbehave.py\", \"{mode}\"]\n\n[capabilities]\nmethods = [\"echo\"]\n"
            ),
        )
        .unwrap();
        pkg
    }

    /// A package running `host/tests/fixtures/hog.py` in `mode` (it uses too much on
    /// command), with `extra` appended to its manifest (`[limits]`, `[sandbox]`).
    pub fn hog(&self, name: &str, mode: &str, extra: &str) -> PathBuf {
        let pkg = self.dir.path().join("src").join(name);
        std::fs::create_dir_all(&pkg).unwrap();
        std::fs::copy(
            workspace_root().join("host/tests/fixtures/hog.py"),
            pkg.join("hog.py"),
        )
        .unwrap();
        std::fs::write(
            pkg.join("conduit-extension.toml"),
            format!(
                "name = \"{name}\"\nversion = \"0.1.0\"\nprotocol = 1\ncommand = [\"python3\", \"hog.py\", \"{mode}\"]\n\n\
                 [capabilities]\nmethods = [\"echo\", \"pid\", \"open_files\", \"probe\"]\n{extra}"
            ),
        )
        .unwrap();
        pkg
    }

    /// A package running `host/tests/fixtures/core_ext.py` in `mode`, with every capability the
    /// core calls declared.
    pub fn core_ext(&self, name: &str, mode: &str) -> PathBuf {
        self.core_ext_kinds(name, mode, &["job".to_owned()])
    }

    /// Like [`Fixture::core_ext`], declaring the work kinds `kinds` (each with a trigger) in
    /// the manifest and the handshake alike.
    pub fn core_ext_kinds(&self, name: &str, mode: &str, kinds: &[String]) -> PathBuf {
        let pkg = self.dir.path().join("src").join(name);
        std::fs::create_dir_all(&pkg).unwrap();
        std::fs::copy(
            workspace_root().join("host/tests/fixtures/core_ext.py"),
            pkg.join("core_ext.py"),
        )
        .unwrap();
        let list = kinds.join(",");
        let decl: Vec<String> = kinds
            .iter()
            .map(|k| format!("{{ name = \"{k}\", trigger = true }}"))
            .collect();
        std::fs::write(
            pkg.join("conduit-extension.toml"),
            format!(
                "name = \"{name}\"\nversion = \"0.1.0\"\nprotocol = 1\ncommand = [\"python3\", \"core_ext.py\", \"{mode}\", \"{list}\"]\n\n\
                 [capabilities]\nwork_kinds = [{}]\nrecurrences = [\"tick\"]\n\
                 dependency_filters = [\"match\"]\nemissions = [\"note\"]\ningress = [\"feed\"]\nmethods = [\"make-artifact\", \"open-streams\"]\n",
                decl.join(", ")
            ),
        )
        .unwrap();
        pkg
    }

    /// `conduit` with `args`, expecting exit 0; its `--json` output.
    pub fn json(&self, args: &[&str]) -> Value {
        let run = self.conduit(args);
        assert_eq!(run.code(), Some(0), "{}{}", run.context(), self.context());
        serde_json::from_slice(&run.out.stdout)
            .unwrap_or_else(|e| panic!("not JSON: {e}{}", run.context()))
    }

    /// Push an event through the CLI; its `{event_id, duplicate}`.
    pub fn push(&self, source: &str, delivery: &str, kind: &str, payload: &str) -> Value {
        self.json(&[
            "events",
            "push",
            "--source",
            source,
            "--delivery-id",
            delivery,
            "--kind",
            kind,
            "--payload",
            payload,
            "--json",
        ])
    }

    /// Every event, by listing pages of 200.
    pub fn all_events(&self) -> Vec<Value> {
        let mut out = Vec::new();
        let mut after = 0i64;
        loop {
            let page = self.json(&[
                "events",
                "list",
                "--after",
                &after.to_string(),
                "--limit",
                "200",
                "--json",
            ]);
            let evs = page["events"].as_array().unwrap().clone();
            if evs.is_empty() {
                return out;
            }
            after = evs.last().unwrap()["id"].as_i64().unwrap();
            out.extend(evs);
        }
    }

    pub fn start_daemon(&mut self) {
        self.start_daemon_with(&[]);
    }

    /// Start the daemon with extra environment variables, and wait until its management
    /// socket accepts a connection (a socket file left by a killed daemon does not count). The
    /// daemon's log is appended to, so one fixture's log holds every daemon run it started.
    pub fn start_daemon_with(&mut self, env: &[(&str, &std::ffi::OsStr)]) {
        self.start_daemon_ignoring(env, &[]);
    }

    /// [`Fixture::start_daemon_with`], the daemon starting with `ignored` signals set to be
    /// ignored, as a shell gives a background job SIGINT and SIGQUIT.
    pub fn start_daemon_ignoring(
        &mut self,
        env: &[(&str, &std::ffi::OsStr)],
        ignored: &[nix::sys::signal::Signal],
    ) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.daemon_log())
            .unwrap();
        let mut cmd = self.command(&["daemon", "run"]);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let ignored = ignored.to_vec();
        if !ignored.is_empty() {
            use std::os::unix::process::CommandExt;
            // SAFETY: only sigaction calls between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    for sig in &ignored {
                        nix::sys::signal::signal(*sig, nix::sys::signal::SigHandler::SigIgn)
                            .map_err(std::io::Error::from)?;
                    }
                    Ok(())
                });
            }
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start the daemon");
        self.daemon = Some(child);
        let socket = self.state().join("run/conduit.sock");
        self.wait_until("the daemon to answer on its socket", || {
            std::os::unix::net::UnixStream::connect(&socket)
                .ok()
                .map(|_| ())
        });
    }

    pub fn daemon_pid(&self) -> i32 {
        self.daemon.as_ref().unwrap().id() as i32
    }

    pub fn status(&self, name: &str) -> Value {
        let run = self.conduit(&["ext", "status", name, "--json"]);
        serde_json::from_slice(&run.out.stdout)
            .unwrap_or_else(|e| panic!("status --json: {e}{}{}", run.context(), self.context()))
    }

    /// Poll the status until `pred` holds; panics with context after `timeout`.
    pub fn wait_for(&self, name: &str, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            let s = self.status(name);
            if pred(&s) {
                return s;
            }
            assert!(
                start.elapsed() < timeout,
                "`{name}` never reached the expected state; last status: {s:#}{}",
                self.context()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Poll `probe` until it gives a value; panics after [`super::PATIENCE`] with `what`, the
    /// daemon's log and the state directory.
    pub fn wait_until<T>(&self, what: &str, probe: impl Fn() -> Option<T>) -> T {
        let start = Instant::now();
        loop {
            if let Some(v) = probe() {
                return v;
            }
            assert!(
                start.elapsed() < super::PATIENCE,
                "timed out waiting for {what}{}",
                self.context()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn wait_state(&self, name: &str, state: &str, timeout: Duration) -> Value {
        self.wait_for(name, timeout, |s| s["state"] == state)
    }

    /// SIGTERM the daemon and wait for its exit code.
    pub fn stop_daemon(&mut self) -> Option<i32> {
        let mut child = self.daemon.take()?;
        kill(child.id() as i32, nix::sys::signal::Signal::SIGTERM);
        let start = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st.code();
            }
            if start.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                panic!(
                    "the daemon did not exit within 20 s of SIGTERM{}",
                    self.context()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if self.daemon.is_some() {
            let _ = self.stop_daemon();
        }
    }
}

pub fn kill(pid: i32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
}

/// How many bytes process `pid` has read so far (`rchar` of `/proc/PID/io`, Linux). A test
/// that must know a request has reached an extension waits for this to grow, instead of
/// sleeping and hoping.
pub fn bytes_read(pid: i32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Polls until `pid` has read more than `before` bytes; panics after [`super::PATIENCE`].
pub fn wait_read_past(pid: i32, before: u64, what: &str) {
    let start = Instant::now();
    while bytes_read(pid) <= before {
        assert!(
            start.elapsed() < super::PATIENCE,
            "process {pid} never read {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            out.push(p.clone());
            if p.is_dir() && !p.is_symlink() {
                out.extend(walk(&p));
            }
        }
    }
    out.sort();
    out
}

/// Every pid whose process group is `pgid` and which is not a zombie (Linux).
pub fn group_members(pgid: u32) -> Vec<u32> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some(rest) = stat.rfind(')').map(|i| stat[i + 1..].to_owned()) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.get(2).and_then(|g| g.parse::<u32>().ok()) == Some(pgid) && f[0] != "Z" && f[0] != "X"
        {
            pids.push(pid);
        }
    }
    pids
}

/// A field of `/proc/<pid>/status`.
pub fn proc_status(pid: i32, key: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
        .unwrap_or_default()
}

/// The daemon's spawner (`conduit __conduit-spawner`, a child of the daemon), if one runs.
pub fn spawner_of(daemon: i32) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let ours = proc_status(pid, "PPid") == daemon.to_string()
            && cmdline
                .split(|b| *b == 0)
                .any(|a| a == b"__conduit-spawner");
        ours.then_some(pid)
    })
}

pub fn wait_gone(pgid: u32, within: Duration) -> Vec<u32> {
    let start = Instant::now();
    loop {
        let left = group_members(pgid);
        if left.is_empty() || start.elapsed() > within {
            return left;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn stage_examples(f: &Fixture) -> Vec<PathBuf> {
    let into = f.dir.path().join("staged");
    let mut pkgs: Vec<PathBuf> = ["echo", "notes"]
        .iter()
        .filter_map(|e| stage_rust_example(e, &into))
        .collect();
    pkgs.push(super::stage_example("python-echo", &into));
    pkgs
}
