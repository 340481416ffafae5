//! Running the package's `[dev] build` command for `conduit ext dev`: `sh -c COMMAND` in the
//! package folder, its stdout and stderr read as lines while it runs.
//!
//! The build runs in a process group of its own, so a Ctrl-C at the terminal reaches the
//! session (which decides) rather than the compiler, and ending the session (or dropping a
//! [`Build`]) kills the whole group: `cargo` and every `rustc` it started.
//!
//! Invariant: every line read is at most [`MAX_LINE`] bytes (a longer one is cut and marked);
//! the reader tasks end with the build and are aborted with it.

use std::collections::VecDeque;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// The longest build output line kept whole, in bytes.
pub(super) const MAX_LINE: usize = 8 * 1024;

/// How many of its last lines a failed build reports.
pub(super) const TAIL_LINES: usize = 20;

/// A build that runs.
#[derive(Debug)]
pub(super) struct Build {
    child: tokio::process::Child,
    pgid: Option<i32>,
    lines: mpsc::Receiver<String>,
    readers: Vec<JoinHandle<()>>,
    started: Instant,
    tail: VecDeque<String>,
}

/// One step of a build: a line of its output, or its end.
#[derive(Debug)]
pub(super) enum Step {
    Line(String),
    Done {
        ok: bool,
        code: Option<i32>,
        took: Duration,
        tail: Vec<String>,
    },
}

impl Build {
    pub(super) fn start(command: &str, dir: &Path) -> std::io::Result<Build> {
        let mut cmd = tokio::process::Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(command)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let pgid = child.id().map(|p| p as i32);
        let (tx, lines) = mpsc::channel(256);
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            readers.push(tokio::spawn(read_lines(out, tx.clone())));
        }
        if let Some(err) = child.stderr.take() {
            readers.push(tokio::spawn(read_lines(err, tx)));
        }
        Ok(Build {
            child,
            pgid,
            lines,
            readers,
            started: Instant::now(),
            tail: VecDeque::new(),
        })
    }

    /// The next line, or the end once every line is read and the process has exited.
    /// Cancel-safe.
    pub(super) async fn next(&mut self) -> std::io::Result<Step> {
        if let Some(line) = self.lines.recv().await {
            if self.tail.len() == TAIL_LINES {
                self.tail.pop_front();
            }
            self.tail.push_back(line.clone());
            return Ok(Step::Line(line));
        }
        let status = self.child.wait().await?;
        // The shell is gone; anything it left in its group goes with it.
        self.kill_group();
        Ok(Step::Done {
            ok: status.success(),
            code: status.code(),
            took: self.started.elapsed(),
            tail: if status.success() {
                Vec::new()
            } else {
                self.tail.iter().cloned().collect()
            },
        })
    }

    fn kill_group(&mut self) {
        if let Some(pgid) = self.pgid.take() {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pgid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

impl Drop for Build {
    fn drop(&mut self) {
        self.kill_group();
        for r in &self.readers {
            r.abort();
        }
    }
}

/// Send each line of `r` (without its newline) until EOF. A line longer than [`MAX_LINE`] is
/// sent cut (marked `…`) as soon as it is that long, and the rest of it is dropped up to its
/// newline, so the buffer never holds more than a line's cap and a read.
async fn read_lines(mut r: impl AsyncRead + Unpin, tx: mpsc::Sender<String>) {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    // Inside a line already sent cut: drop bytes until its newline.
    let mut dropping = false;
    loop {
        let n = r.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            if !buf.is_empty() {
                let _ = tx.send(line_text(&buf)).await;
            }
            return;
        }
        let mut rest = &chunk[..n];
        while !rest.is_empty() {
            let Some(i) = rest.iter().position(|&b| b == b'\n') else {
                if !dropping {
                    buf.extend_from_slice(rest);
                }
                break;
            };
            if !dropping {
                buf.extend_from_slice(&rest[..i]);
                if tx.send(line_text(&buf)).await.is_err() {
                    return;
                }
            }
            buf.clear();
            dropping = false;
            rest = &rest[i + 1..];
        }
        if buf.len() > MAX_LINE {
            if tx.send(line_text(&buf)).await.is_err() {
                return;
            }
            buf.clear();
            dropping = true;
        }
    }
}

/// A line as text, cut at [`MAX_LINE`] bytes (marked `…`), without a trailing `\r`.
pub(super) fn line_text(bytes: &[u8]) -> String {
    let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    if bytes.len() > MAX_LINE {
        let mut s = String::from_utf8_lossy(&bytes[..MAX_LINE]).into_owned();
        s.push('…');
        s
    } else {
        String::from_utf8_lossy(bytes).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn finish(mut b: Build) -> (Vec<String>, bool, Option<i32>, Vec<String>) {
        let mut lines = Vec::new();
        loop {
            match b.next().await.unwrap() {
                Step::Line(l) => lines.push(l),
                Step::Done { ok, code, tail, .. } => return (lines, ok, code, tail),
            }
        }
    }

    #[tokio::test]
    async fn output_is_read_as_lines_and_a_failure_keeps_its_tail() {
        let dir = tempfile::tempdir().unwrap();
        let b = Build::start("echo one; echo two >&2; printf last", dir.path()).unwrap();
        let (mut lines, ok, code, tail) = finish(b).await;
        lines.sort();
        assert_eq!(lines, ["last", "one", "two"]);
        assert!(ok && code == Some(0) && tail.is_empty());
        let b = Build::start("echo 'error: no'; exit 3", dir.path()).unwrap();
        let (_, ok, code, tail) = finish(b).await;
        assert!(!ok);
        assert_eq!(code, Some(3));
        assert_eq!(tail, ["error: no"]);
    }

    #[tokio::test]
    async fn a_long_line_is_cut_at_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let cmd = format!("head -c {} /dev/zero | tr '\\0' x; echo", MAX_LINE * 2 + 10);
        let (lines, ok, ..) = finish(Build::start(&cmd, dir.path()).unwrap()).await;
        assert!(ok);
        assert_eq!(lines.len(), 1, "one line, cut");
        assert_eq!(lines[0].trim_end_matches('…').len(), MAX_LINE);
        assert!(lines[0].ends_with('…'));
        // At the cap exactly: whole, unmarked; then the next line is read as usual.
        let cmd = format!("head -c {MAX_LINE} /dev/zero | tr '\\0' y; echo; echo next");
        let (lines, ..) = finish(Build::start(&cmd, dir.path()).unwrap()).await;
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].len(), MAX_LINE);
        assert_eq!(lines[1], "next");
    }

    #[tokio::test]
    async fn dropping_a_build_kills_its_whole_group() {
        let dir = tempfile::tempdir().unwrap();
        let b = Build::start("sleep 600 & echo $!; wait", dir.path()).unwrap();
        let mut b = b;
        let Step::Line(pid) = b.next().await.unwrap() else {
            panic!("expected the pid")
        };
        let pid: i32 = pid.parse().unwrap();
        drop(b);
        let alive = || nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
        let until = Instant::now() + Duration::from_secs(30);
        // Killed at once; the zombie is reaped by its parent shell's end (or init).
        while alive() && Instant::now() < until {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat.contains(") Z ") || stat.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty() || stat.contains(") Z "),
            "sleep still runs: {stat}"
        );
    }
}
