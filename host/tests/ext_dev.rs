//! `conduit ext dev` end to end: the real binary in a pseudo-terminal (so Ctrl-C is the
//! terminal's, sent to the foreground process group as a person's would be), a real daemon
//! (a scratch one with --standalone, or the fixture's), a real Python extension edited on
//! disk, calls made with `conduit ext call`. Events are read as `--json` lines.
//!
//! Each wait polls under `support::PATIENCE`; the one bound that is the feature — a broken
//! version is not restarted — is watched for a few seconds, far above the 100 ms first
//! restart delay it would otherwise show.

mod support;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use portable_pty::{CommandBuilder, PtySize, native_pty_system};
use serde_json::{Value, json};
use support::PATIENCE;
use support::fixture::Fixture;

/// A `conduit ext dev` session in a pseudo-terminal.
struct Dev {
    writer: Box<dyn Write + Send>,
    child: Box<dyn portable_pty::Child + Send + Sync>,
    raw: Arc<Mutex<Vec<u8>>>,
    _master: Box<dyn portable_pty::MasterPty + Send>,
}

impl Dev {
    fn start(state: Option<&Path>, args: &[&str]) -> Dev {
        let pty = native_pty_system()
            .openpty(PtySize {
                rows: 50,
                cols: 200,
                pixel_width: 0,
                pixel_height: 0,
            })
            .expect("open a pseudo-terminal");
        let mut cmd = CommandBuilder::new(env!("CARGO_BIN_EXE_conduit"));
        cmd.args(["ext", "dev"]);
        cmd.args(args);
        cmd.env_remove("CONDUIT_LOG");
        cmd.env_remove("CONDUIT_STATE_DIR");
        cmd.env_remove("NOTIFY_SOCKET");
        cmd.env_remove("INVOCATION_ID");
        if let Some(s) = state {
            cmd.env("CONDUIT_STATE_DIR", s);
        }
        let child = pty.slave.spawn_command(cmd).expect("start conduit ext dev");
        drop(pty.slave);
        let raw = Arc::new(Mutex::new(Vec::new()));
        let mut reader = pty.master.try_clone_reader().unwrap();
        let r = raw.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                r.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        let writer = pty.master.take_writer().unwrap();
        Dev {
            writer,
            child,
            raw,
            _master: pty.master,
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.raw.lock().unwrap()).replace('\r', "")
    }

    /// `conduit ext dev PKG --standalone --json --debounce-ms 100`, and its `session` event.
    fn standalone(pkg: &Path) -> (Dev, Value) {
        let args = [
            pkg.to_str().unwrap(),
            "--standalone",
            "--json",
            "--debounce-ms",
            "100",
        ];
        let dev = Dev::start(None, &args);
        let (_, session) = dev.wait_event("the session", 0, |e| e["event"] == "session");
        (dev, session)
    }

    /// Every JSON event so far (a line may start with the terminal's echo of `^C`).
    fn events(&self) -> Vec<Value> {
        self.text()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(&l[l.find('{')?..]).ok())
            .collect()
    }

    /// Wait for an event after the first `skip` for which `pred` holds; returns it and its
    /// index.
    #[track_caller]
    fn wait_event(&self, what: &str, skip: usize, pred: impl Fn(&Value) -> bool) -> (usize, Value) {
        let start = Instant::now();
        loop {
            if let Some((i, e)) = self
                .events()
                .into_iter()
                .enumerate()
                .skip(skip)
                .find(|(_, e)| pred(e))
            {
                return (i, e);
            }
            assert!(
                start.elapsed() < PATIENCE,
                "the session never showed {what}:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The next `ready` after event `skip`, with its pid.
    #[track_caller]
    fn wait_ready(&self, skip: usize) -> (usize, u32) {
        let (i, e) = self.wait_event("the extension ready", skip, |e| {
            e["event"] == "state" && e["state"] == "ready"
        });
        (i, e["pid"].as_u64().unwrap() as u32)
    }

    /// The text once `pred` holds of it: the terminal's output may still be on its way when
    /// the process has exited.
    #[track_caller]
    fn wait_text(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let text = self.text();
            if pred(&text) {
                return text;
            }
            assert!(start.elapsed() < PATIENCE, "never showed {what}:\n{text}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Ctrl-C at the terminal.
    fn ctrl_c(&mut self) {
        self.writer.write_all(b"\x03").unwrap();
        self.writer.flush().unwrap();
    }

    #[track_caller]
    fn wait_exit(&mut self) -> u32 {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.exit_code();
            }
            assert!(
                start.elapsed() < PATIENCE,
                "conduit ext dev did not exit:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The python-echo example staged into `dir` (with its SDK beside it), to edit.
fn python_echo(dir: &Path) -> PathBuf {
    support::stage_example("python-echo", dir)
}

/// Replace `from` with `to` in a file, written whole.
fn edit(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{} has no {from:?}", path.display());
    std::fs::write(path, text.replacen(from, to, 1)).unwrap();
}

/// `conduit ext call NAME echo {"text": "hi"}` on a state directory.
fn call_echo(state: &Path) -> Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_conduit"))
        .args(["ext", "call", "python-echo", "echo", r#"{"text":"hi"}"#])
        .env("CONDUIT_STATE_DIR", state)
        .env_remove("CONDUIT_LOG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat.is_empty() && !stat.contains(") Z ")
}

#[track_caller]
fn wait_gone(pid: u32, what: &str) {
    let start = Instant::now();
    while alive(pid) {
        assert!(start.elapsed() < PATIENCE, "{what} (pid {pid}) still runs");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_edit_restarts_it_a_broken_one_stays_stopped_and_ctrl_c_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let pkg = python_echo(dir.path());
    let (mut dev, session) = Dev::standalone(&pkg);
    assert_eq!(session["daemon"], "standalone");
    let state = PathBuf::from(session["state_dir"].as_str().unwrap());
    let (i, first) = dev.wait_ready(0);
    assert_eq!(call_echo(&state), json!({"text": "hi"}));
    // The call is streamed with its method, latency and outcome.
    dev.wait_event("the call", i, |e| {
        e["event"] == "call"
            && e["method"] == "echo"
            && e["outcome"] == "ok"
            && e["took_us"].as_u64() > Some(0)
    });
    let health = support::http::get(&state.join("run/conduit.sock"), "/v1/health");
    let daemon_pid = health["pid"].as_u64().unwrap() as u32;

    // An edit: the next call answers the new way, without a manual step.
    edit(
        &pkg.join("echo.py"),
        "    return params",
        "    return {\"edited\": True, **params}",
    );
    let (_, second) = dev.wait_ready(i + 1);
    assert_ne!(second, first, "a new run");
    wait_gone(first, "the replaced run");
    assert_eq!(call_echo(&state), json!({"text": "hi", "edited": true}));

    // A syntax error: its stderr is shown, and it stays stopped with the cause.
    let n = dev.events().len();
    std::fs::write(
        pkg.join("echo.py"),
        std::fs::read_to_string(pkg.join("echo.py")).unwrap() + "\ndef broken(:\n",
    )
    .unwrap();
    dev.wait_event("the syntax error on stderr", n, |e| {
        e["event"] == "stderr" && e["line"].as_str().unwrap_or("").contains("SyntaxError")
    });
    let (_, stopped) = dev.wait_event("the stopped state", n, |e| {
        e["event"] == "state" && e["state"] == "stopped"
    });
    assert!(
        stopped["error"].as_str().unwrap().contains("not restarted"),
        "{stopped}"
    );
    // Not restarted in a loop: a crash loop's first restart comes 100 ms after a failure.
    let runs = |text: &str| text.matches("conduit: run started").count();
    let log = state.join("logs/python-echo.log");
    let before = runs(&std::fs::read_to_string(&log).unwrap());
    let watch_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < watch_until {
        let status = support::http::get(
            &state.join("run/conduit.sock"),
            "/v1/extensions/python-echo",
        );
        assert_eq!(status["state"], "stopped", "{status}");
        assert_eq!(runs(&std::fs::read_to_string(&log).unwrap()), before);
        std::thread::sleep(Duration::from_millis(100));
    }

    // The fix starts it again.
    edit(&pkg.join("echo.py"), "\ndef broken(:\n", "\n");
    dev.wait_ready(n);
    assert_eq!(call_echo(&state), json!({"text": "hi", "edited": true}));
    let (_, third) = dev.wait_ready(n);

    // Ctrl-C: nothing left, neither the extension, nor the daemon, nor its folder.
    dev.ctrl_c();
    assert_eq!(dev.wait_exit(), 0, "{}", dev.text());
    let (_, ended) = dev.wait_event("the end", 0, |e| e["event"] == "ended");
    assert_eq!(ended["by"], "SIGINT");
    assert_eq!(ended["scratch_removed"], true);
    wait_gone(third, "the extension");
    wait_gone(daemon_pid, "the scratch daemon");
    assert!(!state.exists(), "{} is left", state.display());
    // The author's folder is as they left it.
    assert!(pkg.join("echo.py").exists() && pkg.join("conduit-extension.toml").exists());
}

/// A package whose build checks and copies the handler: `src/handler.py` → `echo.py`.
fn built_package(dir: &Path) -> PathBuf {
    let pkg = python_echo(dir);
    std::fs::create_dir(pkg.join("src")).unwrap();
    std::fs::rename(pkg.join("echo.py"), pkg.join("src/handler.py")).unwrap();
    let manifest = std::fs::read_to_string(pkg.join("conduit-extension.toml")).unwrap();
    std::fs::write(
        pkg.join("conduit-extension.toml"),
        format!(
            "{manifest}\n[dev]\nbuild = \"python3 -c 'import ast,sys; ast.parse(open(sys.argv[1]).read())' src/handler.py && cp src/handler.py echo.py && echo built\"\nignore = [\"echo.py\"]\n"
        ),
    )
    .unwrap();
    pkg
}

#[test]
fn a_failed_build_keeps_the_last_good_version_running_and_shows_why() {
    let dir = tempfile::tempdir().unwrap();
    let pkg = built_package(dir.path());
    assert!(!pkg.join("echo.py").exists(), "built by the session");
    let (mut dev, session) = Dev::standalone(&pkg);
    let state = PathBuf::from(session["state_dir"].as_str().unwrap());
    dev.wait_event("the first build", 0, |e| {
        e["event"] == "build_finished" && e["ok"] == true
    });
    dev.wait_event("its output", 0, |e| {
        e["event"] == "build_output" && e["line"] == "built"
    });
    let (i, first) = dev.wait_ready(0);
    assert_eq!(call_echo(&state), json!({"text": "hi"}));

    // A broken handler: the build fails, says why, and the running version keeps answering.
    let handler = pkg.join("src/handler.py");
    edit(&handler, "    return params", "    return params)");
    let (j, failed) = dev.wait_event("the failed build", i, |e| {
        e["event"] == "build_finished" && e["ok"] == false
    });
    assert_eq!(failed["kept"], true, "{failed}");
    assert_ne!(failed["exit_code"], 0);
    let tail = failed["tail"].to_string();
    assert!(tail.contains("SyntaxError"), "{failed}");
    assert!(dev.text().contains("\"event\":\"build_output\""));
    assert_eq!(call_echo(&state), json!({"text": "hi"}));
    let status = support::http::get(
        &state.join("run/conduit.sock"),
        "/v1/extensions/python-echo",
    );
    assert_eq!(
        (status["state"].as_str(), status["pid"].as_u64()),
        (Some("ready"), Some(first as u64))
    );
    assert!(
        !dev.events()[j..].iter().any(|e| e["event"] == "installed"),
        "a failed build installs nothing"
    );

    // Fixed: built, installed, restarted, answering the new way.
    edit(
        &handler,
        "    return params)",
        "    return {\"built\": 2, **params}",
    );
    let (_, second) = dev.wait_ready(j);
    assert_ne!(second, first);
    assert_eq!(call_echo(&state), json!({"text": "hi", "built": 2}));

    // SIGTERM ends it as Ctrl-C does.
    support::fixture::kill(
        dev.child.process_id().unwrap() as i32,
        nix::sys::signal::Signal::SIGTERM,
    );
    assert_eq!(dev.wait_exit(), 0, "{}", dev.text());
    wait_gone(second, "the extension");
    assert!(!state.exists());
}

/// The names `conduit ext list --json` shows.
fn names(f: &Fixture) -> Vec<String> {
    let list = f.json(&["ext", "list", "--json"]);
    list["extensions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn on_the_running_daemon_it_is_shown_as_dev_and_ctrl_c_leaves_the_list_as_before() {
    let mut f = Fixture::new();
    let other = f.misbehave("bystander", "normal");
    f.install(&other);
    f.start_daemon();
    f.wait_state("bystander", "ready", PATIENCE);
    let before = names(&f);
    let pkg = python_echo(f.dir.path());

    let mut dev = Dev::start(Some(&f.state()), &[pkg.to_str().unwrap(), "--json"]);
    let (_, session) = dev.wait_event("the session", 0, |e| e["event"] == "session");
    assert_eq!(session["daemon"], "running");
    let (_, pid) = dev.wait_ready(0);
    // Shown as a development install: status (JSON and text), list, doctor.
    let status = f.status("python-echo");
    assert_eq!(status["dev"], pkg.canonicalize().unwrap().to_str().unwrap());
    let text = f.conduit(&["ext", "status", "python-echo"]).stdout();
    assert!(text.contains("dev install   from"), "{text}");
    assert!(text.contains("not checked"), "{text}");
    assert!(f.conduit(&["ext", "list"]).stdout().contains("0.1.0 (dev)"));
    let doctor = f.conduit(&["doctor", "--json"]).json();
    let check = doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "package python-echo")
        .unwrap_or_else(|| panic!("no check of the package: {doctor:#}"))
        .clone();
    assert_eq!(check["status"], "warn", "{check}");
    assert!(
        check["found"]
            .as_str()
            .unwrap()
            .contains("development install"),
        "{check}"
    );
    // The journal of calls: kept for a dev install only; a page of 1 to 1024.
    let socket = f.state().join("run/conduit.sock");
    let calls =
        |q: &str| support::http::request(&socket, "GET", &format!("/v1/extensions/{q}"), None);
    let (code, body) = calls("bystander/calls");
    assert_eq!(
        (code, &body["journaled"], &body["calls"]),
        (200, &json!(false), &json!([]))
    );
    let (code, body) = calls("python-echo/calls?limit=1024");
    assert_eq!((code, &body["journaled"]), (200, &json!(true)), "{body}");
    assert_eq!(calls("python-echo/calls?limit=1").0, 200);
    assert_eq!(calls("python-echo/calls?limit=0").0, 400);
    assert_eq!(calls("python-echo/calls?limit=1025").0, 400);
    assert_eq!(calls("nobody/calls").0, 404);
    // An install from the store does not replace it, and says why.
    let run = f.conduit(&["ext", "install", "--no-wait", pkg.to_str().unwrap()]);
    assert_ne!(run.code(), Some(0), "{}", run.context());
    assert!(
        run.stderr().contains("development install"),
        "{}",
        run.context()
    );
    // A second session on the name is refused (exit 2), and changes nothing.
    let mut second = Dev::start(Some(&f.state()), &[pkg.to_str().unwrap()]);
    assert_eq!(second.wait_exit(), 2, "{}", second.text());
    second.wait_text("the refusal", |t| t.contains("another `conduit ext dev`"));
    assert_eq!(f.status("python-echo")["pid"], pid);

    dev.ctrl_c();
    assert_eq!(dev.wait_exit(), 0, "{}", dev.text());
    wait_gone(pid, "the extension");
    assert_eq!(names(&f), before);
    assert!(
        !f.state().join("logs/python-echo.log").exists(),
        "its log goes too"
    );
    assert!(!f.state().join("data/python-echo").exists());
    assert!(
        pkg.join("echo.py").exists(),
        "the author's folder is untouched"
    );
    f.wait_state("bystander", "ready", PATIENCE);

    // --keep keeps it running as a development install; a remove takes the record alone.
    let mut dev = Dev::start(
        Some(&f.state()),
        &[pkg.to_str().unwrap(), "--json", "--keep"],
    );
    let (_, pid) = dev.wait_ready(0);
    dev.ctrl_c();
    assert_eq!(dev.wait_exit(), 0, "{}", dev.text());
    let (_, ended) = dev.wait_event("the end", 0, |e| e["event"] == "ended");
    assert_eq!(
        (ended["kept"].as_bool(), ended["removed"].as_bool()),
        (Some(true), Some(false))
    );
    let status = f.status("python-echo");
    assert_eq!(
        (status["state"].as_str(), status["pid"].as_u64()),
        (Some("ready"), Some(pid as u64))
    );
    assert!(status["dev"].is_string());
    f.conduit(&["ext", "remove", "python-echo"]).expect_code(0);
    wait_gone(pid, "the kept extension");
    assert_eq!(names(&f), before);
    assert!(pkg.join("echo.py").exists() && pkg.join("conduit_extension").is_dir());
}

#[test]
fn a_daemon_running_as_a_service_is_refused_unless_forced() {
    let mut f = Fixture::new();
    // What systemd gives a Type=notify service: INVOCATION_ID, and NOTIFY_SOCKET (here a
    // datagram socket of the test's, so the daemon's notifications go somewhere real).
    let notify = f.dir.path().join("notify.sock");
    let _listener = std::os::unix::net::UnixDatagram::bind(&notify).unwrap();
    f.start_daemon_with(&[
        ("INVOCATION_ID", "0123456789abcdef0123456789abcdef".as_ref()),
        ("NOTIFY_SOCKET", notify.as_os_str()),
    ]);
    let health = support::http::get(&f.state().join("run/conduit.sock"), "/v1/health");
    assert_eq!(health["service"]["manager"], "systemd", "{health}");
    let pkg = python_echo(f.dir.path());
    let mut dev = Dev::start(Some(&f.state()), &[pkg.to_str().unwrap()]);
    assert_eq!(dev.wait_exit(), 2, "{}", dev.text());
    let text = dev.wait_text("the refusal", |t| t.contains("--force"));
    assert!(text.contains("systemd service"), "{text}");
    assert!(text.contains("INVOCATION_ID"), "{text}");
    assert!(
        text.contains("--force") && text.contains("--standalone"),
        "{text}"
    );
    assert!(names(&f).is_empty(), "nothing installed");

    let mut dev = Dev::start(
        Some(&f.state()),
        &[pkg.to_str().unwrap(), "--force", "--json"],
    );
    let (_, pid) = dev.wait_ready(0);
    dev.ctrl_c();
    assert_eq!(dev.wait_exit(), 0, "{}", dev.text());
    wait_gone(pid, "the extension");
    assert!(names(&f).is_empty());
}
