//! `conduit top` as a person uses it: in a real pseudo-terminal, its screen read by a terminal
//! emulator's parser (`vt100`), against a real daemon running real extensions. It shows a
//! crashed extension's state and cause within one refresh, restarts the selected extension on
//! `r`, redraws for a new terminal size, and gives the terminal back (cooked mode, the cursor
//! shown, the main screen) on Ctrl-C. Not on a terminal it says so and exits 2.

mod support;

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use portable_pty::{CommandBuilder, MasterPty, PtySize, native_pty_system};
use support::PATIENCE;
use support::fixture::Fixture;

/// `conduit top` in a pseudo-terminal: what it wrote, parsed and raw.
struct Screen {
    master: Box<dyn MasterPty + Send>,
    writer: Box<dyn Write + Send>,
    child: Box<dyn portable_pty::Child + Send + Sync>,
    parser: Arc<Mutex<vt100::Parser>>,
    raw: Arc<Mutex<Vec<u8>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Screen {
    fn start(f: &Fixture, args: &[&str], rows: u16, cols: u16) -> Screen {
        let pty = native_pty_system()
            .openpty(PtySize {
                rows,
                cols,
                pixel_width: 0,
                pixel_height: 0,
            })
            .expect("open a pseudo-terminal");
        let mut cmd = CommandBuilder::new(env!("CARGO_BIN_EXE_conduit"));
        cmd.args(args);
        cmd.env("CONDUIT_STATE_DIR", f.state());
        cmd.env("TERM", "xterm-256color");
        cmd.env("NO_COLOR", "1");
        cmd.env_remove("CONDUIT_LOG");
        let child = pty.slave.spawn_command(cmd).expect("start conduit top");
        drop(pty.slave);
        let parser = Arc::new(Mutex::new(vt100::Parser::new(rows, cols, 0)));
        let raw = Arc::new(Mutex::new(Vec::new()));
        let mut reader = pty.master.try_clone_reader().unwrap();
        let (p, r) = (parser.clone(), raw.clone());
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                p.lock().unwrap().process(&buf[..n]);
                r.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        let writer = pty.master.take_writer().unwrap();
        Screen {
            master: pty.master,
            writer,
            child,
            parser,
            raw,
            reader: Some(reader),
        }
    }

    fn text(&self) -> String {
        self.parser.lock().unwrap().screen().contents()
    }

    fn rows(&self) -> Vec<String> {
        let p = self.parser.lock().unwrap();
        let (_, cols) = p.screen().size();
        p.screen().rows(0, cols).collect()
    }

    /// The row of the table that starts with `name`.
    fn row_of(&self, name: &str) -> Option<String> {
        self.rows()
            .into_iter()
            .find(|r| r.split_whitespace().next() == Some(name))
    }

    /// The refresh count the footer shows.
    fn refreshes(&self) -> u64 {
        let text = self.text();
        text.rsplit("refresh #")
            .next()
            .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    fn send(&mut self, keys: &str) {
        self.writer.write_all(keys.as_bytes()).unwrap();
        self.writer.flush().unwrap();
    }

    /// Wait until `pred` holds of the screen; panic with the screen after [`PATIENCE`].
    fn wait(&self, what: &str, f: &Fixture, pred: impl Fn(&Screen) -> bool) {
        let start = Instant::now();
        while !pred(self) {
            assert!(
                start.elapsed() < PATIENCE,
                "the screen never showed {what}:\n{}{}",
                self.text(),
                f.context()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_exit(&mut self) -> portable_pty::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "conduit top did not exit:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            drop(r); // the reader ends at EOF once the child and the master are gone
        }
    }
}

fn pid_of(f: &Fixture, name: &str) -> i64 {
    f.status(name)["pid"].as_i64().unwrap_or(0)
}

#[test]
fn top_shows_a_crash_within_a_refresh_restarts_on_r_redraws_on_resize_and_restores_on_ctrl_c() {
    let mut f = Fixture::new();
    f.install(&f.misbehave("steady", "ok"));
    f.install(&f.misbehave("flaky", "ok"));
    f.install(&f.misbehave("broken", "exit-at-start"));
    f.start_daemon();
    f.wait_state("steady", "ready", PATIENCE);
    f.wait_state("flaky", "ready", PATIENCE);

    let mut s = Screen::start(&f, &["top", "--interval", "1s"], 40, 160);
    s.wait("the three extensions", &f, |s| {
        s.row_of("steady").is_some_and(|r| r.contains("ready"))
            && s.row_of("flaky").is_some_and(|r| r.contains("ready"))
            && s.row_of("broken").is_some()
    });
    // One that never starts: its state and the cause of its exits.
    s.wait("broken's state and exit cause", &f, |s| {
        s.row_of("broken").is_some_and(|r| {
            (r.contains("backing-off") || r.contains("crash-looping")) && r.contains("exit code 3")
        })
    });

    // A crash: the first refresh after the daemon knew of it shows the cause.
    let before = pid_of(&f, "flaky");
    support::fixture::kill(before as i32, nix::sys::signal::Signal::SIGKILL);
    f.wait_for("flaky", PATIENCE, |st| {
        st["recent_exits"][0]["pid"].as_i64() == Some(before)
    });
    let known_at = s.refreshes();
    s.wait("flaky's crash", &f, |s| {
        s.row_of("flaky")
            .is_some_and(|r| r.contains("killed by SIGKILL"))
    });
    let shown_at = s.refreshes();
    // The refresh in flight when the daemon recorded it may have been answered before; the
    // next one was asked after.
    assert!(
        shown_at <= known_at + 2,
        "the crash was known at refresh {known_at} and shown at {shown_at}:\n{}",
        s.text()
    );
    // Started again: one restart, ready (the exit may show a refresh before the new run).
    s.wait("flaky restarted once", &f, |s| {
        s.row_of("flaky")
            .is_some_and(|r| r.contains(" ready ") && r.split_whitespace().nth(4) == Some("1"))
    });

    // Select `steady` by filtering, then restart it with `r`, confirmed.
    s.send("/steady\r");
    s.wait("the filtered table", &f, |s| {
        s.row_of("steady").is_some() && s.row_of("flaky").is_none()
    });
    let old = pid_of(&f, "steady");
    s.send("r");
    s.wait("the restart question", &f, |s| {
        s.text().contains("Restart steady?")
    });
    s.send("y");
    f.wait_for("steady", PATIENCE, |st| {
        st["state"] == "ready" && st["pid"].as_i64().is_some_and(|p| p != old)
    });
    s.wait("the restart's note and new pid", &f, |s| {
        s.text().contains("restarting steady")
            && s.row_of("steady")
                .is_some_and(|r| r.contains(&pid_of(&f, "steady").to_string()))
    });

    // A smaller terminal: the footer moves to its new last row.
    s.master
        .resize(PtySize {
            rows: 24,
            cols: 100,
            pixel_width: 0,
            pixel_height: 0,
        })
        .unwrap();
    s.parser.lock().unwrap().set_size(24, 100);
    s.wait("the frame redrawn at 24x100", &f, |s| {
        let rows = s.rows();
        rows[23].contains("q quit") && rows[0].starts_with(" conduit top")
    });

    // Ctrl-C: exit 0, the terminal as it was.
    s.send("\x03");
    let st = s.wait_exit();
    assert!(st.success(), "exit status {st:?}:\n{}", s.text());
    let raw = s.raw.lock().unwrap().clone();
    let last = |needle: &[u8]| raw.windows(needle.len()).rposition(|w| w == needle);
    let entered = last(b"\x1b[?1049h").expect("it used the alternate screen");
    let left = last(b"\x1b[?1049l").expect("it left the alternate screen");
    let shown = last(b"\x1b[?25h").expect("it showed the cursor");
    assert!(left > entered && shown > entered);
    assert!(!s.parser.lock().unwrap().screen().hide_cursor());
    let fd = s.master.as_raw_fd().unwrap();
    // SAFETY: the descriptor is the master's, alive for the borrow.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let t = nix::sys::termios::tcgetattr(fd).unwrap();
    use nix::sys::termios::LocalFlags;
    assert!(
        t.local_flags
            .contains(LocalFlags::ICANON | LocalFlags::ECHO),
        "the terminal was left in raw mode: {:?}",
        t.local_flags
    );
}

#[test]
fn top_once_draws_one_frame_and_exits_0() {
    let mut f = Fixture::new();
    f.install(&f.misbehave("steady", "ok"));
    f.start_daemon();
    f.wait_state("steady", "ready", PATIENCE);
    let mut s = Screen::start(&f, &["top", "--once"], 30, 140);
    let st = s.wait_exit();
    assert!(st.success(), "exit status {st:?}:\n{}", s.text());
    s.wait("the frame", &f, |s| {
        s.row_of("steady").is_some_and(|r| r.contains("ready")) && s.text().contains("events")
    });
}

#[test]
fn top_refuses_without_a_terminal_and_without_a_daemon() {
    let mut f = Fixture::new();
    f.install(&f.misbehave("steady", "ok"));
    // No terminal: a clear message and exit 2, whether or not a daemon runs.
    let run = f.conduit(&["top"]);
    run.expect_code(2);
    assert!(
        run.stderr().contains("draws on a terminal") && run.stderr().contains("--json"),
        "{}",
        run.context()
    );
    f.start_daemon();
    f.conduit(&["top", "--once"]).expect_code(2);
    f.stop_daemon();
    // A terminal but no daemon: exit 3 saying how to start one.
    let mut s = Screen::start(&f, &["top"], 24, 100);
    let st = s.wait_exit();
    assert_eq!(st.exit_code(), 3, "{}", s.text());
    s.wait("the no-daemon message", &f, |s| {
        s.text().contains("conduit daemon run")
    });
}
