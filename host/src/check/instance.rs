//! One running copy of the package under check, wired so the checker sees more than a host would.
//!
//! ```text
//!   Session writer ──► duplex ──► pump ──► child stdin        (raw lines injected between frames)
//!   Session reader ◄── duplex ◄── tap  ◄── child stdout       (every line recorded in StdoutLog)
//!                                          child stderr ──► StderrBuf (last 64 KiB, shown on failure)
//! ```
//!
//! The session (`conduit_rpc::Session`) drives the package exactly as the host would. Two small
//! tasks sit between it and the pipes:
//!
//! - the **pump** forwards the session's frames to stdin and writes raw bytes (a garbage line,
//!   an oversized request) when asked, only ever between two whole frames, so an injected line
//!   never splits one of the session's;
//! - the **tap** forwards stdout to the session unchanged, and records what each line was, so
//!   the rules can see answers the session ignores (errors with `"id": null`, answers to ids
//!   the session never used) and anything that is not protocol.
//!
//! Invariants: memory is bounded whatever the package writes (the tap keeps at most
//! [`TAP_LINE_LIMIT`] bytes of a line, stderr at most [`STDERR_KEEP`] bytes). The child runs in
//! its own process group, gets SIGKILL if the checker dies (Linux), and [`Instance::finish`] — or,
//! failing that, `Drop` — kills the whole group, so nothing the package started outlives the check.

use std::collections::VecDeque;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conduit_protocol::{Message, MessageError, RequestId};
use conduit_rpc::{Handler, Session, SessionConfig};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::{Notify, mpsc, oneshot};

use conduit_supervisor::BulkSink;
use conduit_supervisor::process::{self, ChildCommand, PackageLaunch};
use conduit_supervisor::sandbox::SandboxStatus;

/// The longest line the tap keeps to classify; longer ones are recorded by length and first
/// bytes only. Every answer a rule waits for is far shorter.
pub(crate) const TAP_LINE_LIMIT: usize = 1 << 20;

/// How much of the package's stderr is kept (the end of it).
pub(crate) const STDERR_KEEP: usize = 64 * 1024;

/// What one line the package wrote to stdout was.
#[derive(Clone, Debug)]
pub(crate) enum Seen {
    /// A request or notification from the package.
    Call,
    /// An answer: to `id`, with the error code if it is an error.
    Answer { id: RequestId, error: Option<i32> },
    /// An error with `"id": null`.
    NullIdError { code: i32 },
    /// Not JSON at all (a banner, a stray print).
    NotJson { sample: String },
    /// JSON, but not a JSON-RPC 2.0 message.
    NotMessage { sample: String, reason: String },
    /// Longer than the tap keeps; `object` says whether it at least starts like a JSON object.
    Long { len: usize, object: bool },
    /// Cut off by the end of the stream (no terminating newline).
    Cut { len: usize },
}

impl Seen {
    fn classify(line: &[u8]) -> Seen {
        match Message::parse(line) {
            Ok(Message::Response { id, result }) => Seen::Answer {
                id,
                error: result.err().map(|e| e.code),
            },
            Ok(Message::Request { .. } | Message::Notification { .. }) => Seen::Call,
            Err(MessageError::Orphan(e)) => Seen::NullIdError { code: e.code },
            Err(MessageError::Parse(_)) => Seen::NotJson {
                sample: sample(line),
            },
            Err(e) => Seen::NotMessage {
                sample: sample(line),
                reason: e.to_string(),
            },
        }
    }
}

/// The first 120 characters of a line, for a report.
pub(crate) fn sample(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(&line[..line.len().min(480)]);
    let mut s: String = text.chars().take(120).collect();
    if s.len() < text.len() || line.len() > 480 {
        s.push('…');
    }
    s
}

/// Every line one instance wrote to stdout, in order, and whether its stdout has ended.
#[derive(Debug, Default)]
pub(crate) struct StdoutLog {
    lines: Mutex<(Vec<Seen>, bool)>,
    changed: Notify,
}

impl StdoutLog {
    fn push(&self, seen: Seen) {
        self.lines.lock().unwrap().0.push(seen);
        self.changed.notify_waiters();
    }

    fn close(&self) {
        self.lines.lock().unwrap().1 = true;
        self.changed.notify_waiters();
    }

    /// How many lines so far: a mark to look for new ones after.
    pub(crate) fn mark(&self) -> usize {
        self.lines.lock().unwrap().0.len()
    }

    /// A copy of everything seen.
    pub(crate) fn snapshot(&self) -> Vec<Seen> {
        self.lines.lock().unwrap().0.clone()
    }

    /// The first line after `mark` that `pick` accepts, waiting up to `timeout` for it. `None`
    /// when time runs out or stdout ends first.
    pub(crate) async fn wait_for<T>(
        &self,
        mark: usize,
        timeout: Duration,
        pick: impl Fn(&Seen) -> Option<T>,
    ) -> Option<T> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Register for the wake-up before looking, so a line pushed in between is not missed.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let guard = self.lines.lock().unwrap();
                if let Some(found) = guard.0.iter().skip(mark).find_map(&pick) {
                    return Some(found);
                }
                if guard.1 {
                    return None;
                }
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return None;
            }
        }
    }
}

/// The end of the package's stderr.
#[derive(Debug, Default)]
pub(crate) struct StderrBuf {
    kept: VecDeque<u8>,
    dropped: usize,
}

impl StderrBuf {
    fn push(&mut self, bytes: &[u8]) {
        self.kept.extend(bytes);
        let over = self.kept.len().saturating_sub(STDERR_KEEP);
        if over > 0 {
            self.kept.drain(..over);
            self.dropped += over;
        }
    }

    /// The kept text, lossily decoded, noting how much came before it.
    pub(crate) fn text(&self) -> String {
        let (a, b) = self.kept.as_slices();
        let mut bytes = Vec::with_capacity(a.len() + b.len());
        bytes.extend_from_slice(a);
        bytes.extend_from_slice(b);
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if self.dropped > 0 {
            format!("[{} earlier bytes not kept]\n{text}", self.dropped)
        } else {
            text
        }
    }
}

type RawWrite = (Vec<u8>, oneshot::Sender<std::io::Result<()>>);

/// A running package, its session, and what it has written.
#[derive(Debug)]
pub(crate) struct Instance {
    /// Which instance this is (`main`, `version`, `overload`), for reports.
    pub(crate) label: &'static str,
    pub(crate) session: Option<Session>,
    pub(crate) stdout: Arc<StdoutLog>,
    pub(crate) stderr: Arc<Mutex<StderrBuf>>,
    child: Child,
    pgid: Pid,
    raw: mpsc::UnboundedSender<RawWrite>,
    /// The tap and the stderr collector: they end at EOF, which [`Instance::finish`] awaits
    /// so that the logs are complete before anyone reads them.
    readers: Vec<tokio::task::JoinHandle<()>>,
    exit: Option<ExitStatus>,
    group_killed: bool,
}

/// How the package exited, for messages.
pub(crate) fn describe_exit(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => match Signal::try_from(sig) {
            Ok(s) => format!("signal {s}"),
            Err(_) => format!("signal {sig}"),
        },
        _ => "an unknown status".into(),
    }
}

impl Instance {
    /// Start the package as the daemon would ([`ChildCommand::for_package`]: the same scrubbed
    /// environment, data and temporary folders, limits and sandbox, and the bulk pipe as
    /// descriptor 3, whose read end goes to `bulk`) and a session over its pipes. Returns the
    /// sandbox it runs in too.
    pub(crate) fn spawn(
        launch: &PackageLaunch,
        label: &'static str,
        handler: impl Handler,
        bulk: BulkSink,
        config: SessionConfig,
    ) -> std::io::Result<(Instance, SandboxStatus)> {
        let (command, confine) = ChildCommand::for_package(launch);
        // As the daemon makes it: close-on-exec here, descriptor 3 in the child.
        let (bulk_read, bulk_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        // The daemon's own spawn: its own process group (killing the group at the end stops
        // whatever the package started), a parent-death signal, rlimits and Landlock before
        // exec. The parent-death signal fires when the thread that forked exits; that is a
        // runtime worker, which lives as long as the check.
        let (mut child, applied) = process::spawn_with_bulk(
            &command,
            &confine,
            Some(std::os::fd::AsFd::as_fd(&bulk_write)),
        )?;
        drop(bulk_write);
        let pid = child.id().expect("a just-spawned child has a pid");
        let pgid = Pid::from_raw(pid as i32);

        let stdin = child.stdin.take().expect("stdin is piped");
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr_pipe = child.stderr.take().expect("stderr is piped");

        let (session_write, pump_read) = tokio::io::duplex(64 * 1024);
        let (tap_write, session_read) = tokio::io::duplex(64 * 1024);
        let (raw, raw_rx) = mpsc::unbounded_channel();
        tokio::spawn(pump(pump_read, raw_rx, stdin));
        let log = Arc::new(StdoutLog::default());
        let stderr = Arc::new(Mutex::new(StderrBuf::default()));
        let readers = vec![
            tokio::spawn(tap(stdout, tap_write, log.clone())),
            tokio::spawn(collect_stderr(stderr_pipe, stderr.clone())),
        ];

        let session = Session::new(session_read, session_write, handler, config);
        bulk(&session.peer(), bulk_read);
        let inst = Instance {
            label,
            session: Some(session),
            stdout: log,
            stderr,
            child,
            pgid,
            raw,
            readers,
            exit: None,
            group_killed: false,
        };
        Ok((inst, applied.sandbox))
    }

    /// The session's peer. Panics after [`Instance::close_session`].
    pub(crate) fn peer(&self) -> conduit_rpc::Peer {
        self.session.as_ref().expect("session is open").peer()
    }

    /// Whether the session has ended (the package closed stdout, exited, or was killed).
    pub(crate) fn session_ended(&self) -> bool {
        self.session.as_ref().is_none_or(|s| s.peer().is_closed())
    }

    /// Write `bytes` to the package's stdin between two of the session's frames, waiting at
    /// most `timeout` for the package to read them.
    pub(crate) async fn write_raw(&self, bytes: Vec<u8>, timeout: Duration) -> Result<(), String> {
        let (done, rx) = oneshot::channel();
        self.raw
            .send((bytes, done))
            .map_err(|_| "the package's stdin is closed".to_owned())?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(format!("writing to the package's stdin failed: {e}")),
            Ok(Err(_)) => Err("the package's stdin is closed".into()),
            Err(_) => Err(format!(
                "the package did not read its stdin for {} ms",
                timeout.as_millis()
            )),
        }
    }

    /// The exit status, if the process has exited (waits up to `wait` for it).
    pub(crate) async fn exit_status(&mut self, wait: Duration) -> Option<ExitStatus> {
        if self.exit.is_none()
            && let Ok(Ok(status)) = tokio::time::timeout(wait, self.child.wait()).await
        {
            self.exit = Some(status);
        }
        self.exit
    }

    /// "it exited with exit code 3" / "it is still running": a clause for messages about a
    /// session that ended or a call that got no answer.
    pub(crate) async fn state_note(&mut self) -> String {
        match self.exit_status(Duration::from_millis(300)).await {
            Some(status) => format!("it exited with {}", describe_exit(&status)),
            None if self.session_ended() => "it closed its stdout but is still running".into(),
            None => "it is still running".into(),
        }
    }

    /// Close the session (which closes the package's stdin) without waiting for anything.
    pub(crate) fn close_session(&mut self) {
        self.session = None;
    }

    /// Kill the process group and reap the child; nothing of this instance keeps running.
    /// Calling it again does nothing more.
    pub(crate) async fn finish(&mut self) -> Option<ExitStatus> {
        self.close_session();
        if !self.group_killed {
            self.kill_group();
        }
        let status = self.exit_status(Duration::from_secs(5)).await;
        if status.is_some() {
            process::release_leader(self.pgid.as_raw() as u32);
        }
        // Every process of the group is gone, so both pipes reach EOF at once; the bound is
        // for a process that escaped the group with a copy of them.
        for reader in std::mem::take(&mut self.readers) {
            let abort = reader.abort_handle();
            if tokio::time::timeout(Duration::from_secs(1), reader)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        status
    }

    fn kill_group(&mut self) {
        // ESRCH (nobody left in the group) is the normal case after a clean exit. The group id
        // is the child's pid, which cannot be reused while the child is unreaped (or while any
        // member of its group lives), so the signal reaches this package's processes only; it
        // is sent once, never after the reap.
        let _ = killpg(self.pgid, Signal::SIGKILL);
        self.group_killed = true;
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // Only an instance that was never finished (a panic, an early return) gets here with
        // its group alive.
        if !self.group_killed {
            let _ = killpg(self.pgid, Signal::SIGKILL);
        }
    }
}

/// Forward the session's frames to the child's stdin, and raw bytes between frames.
async fn pump(
    mut from_session: DuplexStream,
    mut raw: mpsc::UnboundedReceiver<RawWrite>,
    mut stdin: ChildStdin,
) {
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut raw_open = true;
    let mut broken = false;
    loop {
        tokio::select! {
            n = from_session.read_buf(&mut buf) => {
                match n {
                    Ok(0) | Err(_) => {
                        // The session closed its write half: pass the rest on and close stdin.
                        if !broken && !buf.is_empty() {
                            let _ = stdin.write_all(&buf).await;
                        }
                        let _ = stdin.shutdown().await;
                        return;
                    }
                    Ok(_) => {
                        // Only whole frames go out, so that raw bytes land between two frames.
                        if let Some(end) = buf.iter().rposition(|&b| b == b'\n') {
                            if !broken {
                                let res = async {
                                    stdin.write_all(&buf[..=end]).await?;
                                    stdin.flush().await
                                }
                                .await;
                                // A broken pipe means the child is gone; keep draining the
                                // session so its writer never blocks on us.
                                broken = res.is_err();
                            }
                            buf.drain(..=end);
                        }
                    }
                }
            }
            r = raw.recv(), if raw_open => match r {
                Some((bytes, done)) => {
                    let res = if broken {
                        Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
                    } else {
                        let res = async {
                            stdin.write_all(&bytes).await?;
                            stdin.flush().await
                        }
                        .await;
                        broken = res.is_err();
                        res
                    };
                    let _ = done.send(res);
                }
                None => raw_open = false,
            },
        }
    }
}

/// Forward the child's stdout to the session unchanged, recording each line.
async fn tap(mut stdout: ChildStdout, mut to_session: DuplexStream, log: Arc<StdoutLog>) {
    let mut chunk = vec![0u8; 64 * 1024];
    let mut line: Vec<u8> = Vec::new();
    let mut line_len = 0usize;
    let mut forwarding = true;
    loop {
        let n = match stdout.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut rest = &chunk[..n];
        while !rest.is_empty() {
            let (part, done) = match rest.iter().position(|&b| b == b'\n') {
                Some(i) => (&rest[..i], true),
                None => (rest, false),
            };
            let room = TAP_LINE_LIMIT.saturating_sub(line.len());
            line.extend_from_slice(&part[..part.len().min(room)]);
            line_len += part.len();
            rest = &rest[part.len() + usize::from(done)..];
            if done {
                record_line(&log, &line, line_len);
                line.clear();
                line_len = 0;
            }
        }
        // Recorded before forwarded: when a call returns, its line is already in the log.
        if forwarding && to_session.write_all(&chunk[..n]).await.is_err() {
            // The session is gone; keep reading so the package never blocks on a full pipe.
            forwarding = false;
        }
    }
    if line_len > 0 {
        log.push(Seen::Cut { len: line_len });
    }
    log.close();
    let _ = to_session.shutdown().await;
}

fn record_line(log: &StdoutLog, line: &[u8], len: usize) {
    let body = line.strip_suffix(b"\r").unwrap_or(line);
    if len == 0 || (len == 1 && body.is_empty()) {
        return; // empty lines are allowed and ignored
    }
    if len > TAP_LINE_LIMIT {
        let object = line.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
        log.push(Seen::Long { len, object });
    } else {
        log.push(Seen::classify(body));
    }
}

async fn collect_stderr(mut pipe: impl AsyncRead + Unpin, buf: Arc<Mutex<StderrBuf>>) {
    let mut chunk = vec![0u8; 8192];
    while let Ok(n) = pipe.read(&mut chunk).await {
        if n == 0 {
            break;
        }
        buf.lock().unwrap().push(&chunk[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_classified() {
        assert!(matches!(
            Seen::classify(br#"{"jsonrpc":"2.0","id":3,"result":{}}"#),
            Seen::Answer { error: None, .. }
        ));
        assert!(matches!(
            Seen::classify(br#"{"jsonrpc":"2.0","id":4,"error":{"code":-32001,"message":"c"}}"#),
            Seen::Answer {
                error: Some(-32001),
                ..
            }
        ));
        assert!(matches!(
            Seen::classify(br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"p"}}"#),
            Seen::NullIdError { code: -32700 }
        ));
        assert!(matches!(
            Seen::classify(br#"{"jsonrpc":"2.0","method":"$/cancel","params":{"id":1}}"#),
            Seen::Call
        ));
        assert!(matches!(
            Seen::classify(b"starting up..."),
            Seen::NotJson { .. }
        ));
        assert!(matches!(
            Seen::classify(br#"{"hello":"world"}"#),
            Seen::NotMessage { .. }
        ));
    }

    #[test]
    fn stderr_keeps_the_end() {
        let mut b = StderrBuf::default();
        b.push(&vec![b'a'; STDERR_KEEP]);
        b.push(b"tail\n");
        let text = b.text();
        assert!(
            text.starts_with("[5 earlier bytes not kept]\n"),
            "{}",
            &text[..40]
        );
        assert!(text.ends_with("tail\n"));
    }

    #[test]
    fn samples_are_short() {
        assert_eq!(sample(b"hi"), "hi");
        let long = sample(&[b'x'; 1000]);
        assert_eq!(long.chars().count(), 121);
        assert!(long.ends_with('…'));
    }

    #[tokio::test]
    async fn wait_for_sees_lines_pushed_later_and_gives_up_at_eof() {
        let log = Arc::new(StdoutLog::default());
        let mark = log.mark();
        let l2 = log.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            l2.push(Seen::NullIdError { code: -32700 });
        });
        let code = log
            .wait_for(mark, Duration::from_secs(5), |s| match s {
                Seen::NullIdError { code } => Some(*code),
                _ => None,
            })
            .await;
        assert_eq!(code, Some(-32700));
        log.close();
        let none = log
            .wait_for(log.mark(), Duration::from_secs(5), |_| Some(()))
            .await;
        assert_eq!(none, None);
    }
}
