//! An extension's stderr: copied to a log file capped at 1 MiB (rotated once, so at most two
//! files of 1 MiB each exist), with the last lines kept in memory for the status.
//!
//! Each run of the extension starts its part of the log with one marker line
//! ([`run_marker`]: when, which pid, which version), so the runs can be told apart and the
//! previous one shown on its own ([`LogFile::previous_run`]).
//!
//! Invariant: whatever the child writes, memory stays bounded (one read buffer plus at most
//! `TAIL_LINES` lines of at most `TAIL_LINE_BYTES` each) and the log stays within its cap.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// Lines kept for the status.
pub const TAIL_LINES: usize = 20;
/// A kept line longer than this is cut (the log file keeps it whole).
pub const TAIL_LINE_BYTES: usize = 1024;
/// The log file's cap.
pub const LOG_CAP_BYTES: u64 = 1024 * 1024;
/// The stderr read buffer starts this small and grows by four, up to `READ_MAX`, each time a
/// read fills it.
const READ_MIN: usize = 1024;
const READ_MAX: usize = 16 * 1024;

/// How every run marker starts; a line of the log that starts so is a marker.
pub const RUN_MARKER_PREFIX: &str = "=== conduit: run started ";

/// The marker line that starts a run's part of the log (with its newline):
/// `=== conduit: run started 2026-12-01T23:59:00.123Z pid 1234 version 0.1.0 ===`.
pub fn run_marker(at_ms: i64, pid: u32, version: &str) -> String {
    format!(
        "{RUN_MARKER_PREFIX}{} pid {pid} version {version} ===\n",
        utc_timestamp(at_ms)
    )
}

fn is_marker(line: &str) -> bool {
    line.starts_with(RUN_MARKER_PREFIX)
}

/// `at_ms` (Unix milliseconds) as an RFC 3339 UTC timestamp with milliseconds.
pub fn utc_timestamp(at_ms: i64) -> String {
    let secs = at_ms.div_euclid(1000);
    let ms = at_ms.rem_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days since 1970-01-01 to a civil date (the proleptic Gregorian calendar).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The last lines of stderr, shared with the status.
#[derive(Clone, Debug, Default)]
pub struct Tail(Arc<Mutex<TailInner>>);

#[derive(Debug, Default)]
struct TailInner {
    lines: VecDeque<String>,
    partial: Vec<u8>,
}

impl Tail {
    /// The kept lines, oldest first (a partial last line included).
    pub fn lines(&self) -> Vec<String> {
        let t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<String> = t.lines.iter().cloned().collect();
        if !t.partial.is_empty() {
            v.push(String::from_utf8_lossy(&t.partial).into_owned());
        }
        v
    }

    fn push_bytes(&self, bytes: &[u8]) {
        let mut t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for &b in bytes {
            if b == b'\n' {
                let line = String::from_utf8_lossy(&t.partial).into_owned();
                t.partial.clear();
                if t.lines.len() == TAIL_LINES {
                    t.lines.pop_front();
                }
                t.lines.push_back(line);
            } else if t.partial.len() < TAIL_LINE_BYTES {
                t.partial.push(b);
            }
        }
    }
}

/// The log file of one extension.
#[derive(Debug)]
pub struct LogFile {
    path: PathBuf,
    cap: u64,
}

impl LogFile {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        LogFile {
            path: path.into(),
            cap: LOG_CAP_BYTES,
        }
    }

    /// A log with another cap (tests).
    pub fn with_cap(path: impl Into<PathBuf>, cap: u64) -> Self {
        LogFile {
            path: path.into(),
            cap,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The rotated file (`<name>.log.1`).
    pub fn rotated_path(&self) -> PathBuf {
        let mut p = self.path.clone().into_os_string();
        p.push(".1");
        p.into()
    }

    /// Copy `stderr` into the log and the tail until it ends. Errors writing the log are
    /// logged once and the copy goes on into the tail only: a full disk must not stall the
    /// child (a child blocked on a full stderr pipe would stop answering).
    pub async fn capture<R: AsyncRead + Unpin>(&self, stderr: R, tail: Tail) {
        self.capture_run(stderr, tail, None).await
    }

    /// [`LogFile::capture`], writing `marker` (a [`run_marker`]) first.
    pub async fn capture_run<R: AsyncRead + Unpin>(
        &self,
        mut stderr: R,
        tail: Tail,
        marker: Option<String>,
    ) {
        let mut file = self.open_append().await.ok();
        let mut written = match &file {
            Some(_) => tokio::fs::metadata(&self.path)
                .await
                .map(|m| m.len())
                .unwrap_or(0),
            None => 0,
        };
        if let Some(m) = marker {
            if file.is_some() && written >= self.cap {
                drop(file.take());
                file = self.rotate().await;
                written = 0;
            }
            if let Some(f) = file.as_mut()
                && f.write_all(m.as_bytes()).await.is_ok()
            {
                written += m.len() as u64;
            }
        }
        // Small until the child writes more than a line or two at once: a thousand quiet
        // extensions would otherwise hold 16 MiB of read buffers between them.
        let mut buf = vec![0u8; READ_MIN];
        loop {
            let n = match stderr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if n == buf.len() && buf.len() < READ_MAX {
                buf.resize((buf.len() * 4).min(READ_MAX), 0);
            }
            let mut chunk = &buf[..n];
            while !chunk.is_empty() {
                let Some(f) = file.as_mut() else { break };
                if written >= self.cap {
                    drop(file.take());
                    file = self.rotate().await;
                    written = 0;
                    continue;
                }
                let room = (self.cap - written) as usize;
                let k = room.min(chunk.len());
                if let Err(e) = f.write_all(&chunk[..k]).await {
                    tracing::warn!(path = %self.path.display(), error = %e, "cannot write the extension log; keeping only the last lines in memory");
                    file = None;
                    break;
                }
                written += k as u64;
                chunk = &chunk[k..];
            }
            // A tokio file's write returns before the bytes reach the file; wait for them, so
            // that what the status's tail shows is already in the log (`conduit ext logs`).
            if let Some(f) = file.as_mut()
                && let Err(e) = f.flush().await
            {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot write the extension log; keeping only the last lines in memory");
                file = None;
            }
            tail.push_bytes(&buf[..n]);
        }
        if let Some(mut f) = file {
            let _ = f.flush().await;
        }
    }

    async fn open_append(&self) -> std::io::Result<tokio::fs::File> {
        if let Some(dir) = self.path.parent() {
            tokio::fs::create_dir_all(dir).await?;
        }
        tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .await
    }

    /// Keeps the full log as `<name>.log.1` and starts the log afresh. On Linux there is no
    /// moment in which `<name>.log` does not exist (a reader such as `conduit ext logs` may look
    /// at any time): an empty file is made under a temporary name and exchanged with the log
    /// in one `renameat2(RENAME_EXCHANGE)`, then the old log, now under the temporary name, is
    /// renamed over the rotated file. Elsewhere the log is renamed and created again.
    async fn rotate(&self) -> Option<tokio::fs::File> {
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(".new");
        let tmp = PathBuf::from(tmp);
        let exchanged = match tokio::fs::File::create(&tmp).await {
            Ok(_) => {
                let (a, b) = (tmp.clone(), self.path.clone());
                tokio::task::spawn_blocking(move || exchange(&a, &b))
                    .await
                    .is_ok_and(|r| r.is_ok())
            }
            Err(_) => false,
        };
        if exchanged {
            let _ = tokio::fs::rename(&tmp, self.rotated_path()).await;
        } else {
            let _ = tokio::fs::remove_file(&tmp).await;
            let _ = tokio::fs::rename(&self.path, self.rotated_path()).await;
        }
        self.open_append().await.ok()
    }

    /// The last `n` lines of the log (rotated file included when needed), for `conduit ext logs`.
    pub fn last_lines(&self, n: usize) -> std::io::Result<Vec<String>> {
        let text = self.read_all()?;
        let lines: Vec<&str> = text.lines().collect();
        Ok(lines[lines.len().saturating_sub(n)..]
            .iter()
            .map(|s| s.to_string())
            .collect())
    }

    /// The last `n` lines of the run before the current (or last) one: from the marker before
    /// the last marker (or the start of what is kept) up to the last marker, that marker
    /// excluded. Empty when the log holds one run or none. For `conduit ext logs --previous`.
    pub fn previous_run(&self, n: usize) -> std::io::Result<Vec<String>> {
        let text = self.read_all()?;
        let lines: Vec<&str> = text.lines().collect();
        let markers: Vec<usize> = (0..lines.len()).filter(|&i| is_marker(lines[i])).collect();
        let Some(&last) = markers.last() else {
            return Ok(Vec::new());
        };
        let start = markers.len().checked_sub(2).map_or(0, |i| markers[i]);
        let run = &lines[start..last];
        Ok(run[run.len().saturating_sub(n)..]
            .iter()
            .map(|s| s.to_string())
            .collect())
    }

    /// The rotated file and the log, as one text (empty when neither exists).
    fn read_all(&self) -> std::io::Result<String> {
        let mut text = std::fs::read(self.rotated_path()).unwrap_or_default();
        match std::fs::read(&self.path) {
            Ok(b) => text.extend_from_slice(&b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(String::from_utf8_lossy(&text).into_owned())
    }
}

/// Swaps two paths atomically.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
    renameat2(AT_FDCWD, a, AT_FDCWD, b, RenameFlags::RENAME_EXCHANGE).map_err(std::io::Error::from)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn exchange(_: &Path, _: &Path) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_line_the_tail_shows_is_already_in_the_log_file() {
        let dir = tempfile::tempdir().unwrap();
        let log = LogFile::new(dir.path().join("x.log"));
        let (mut w, r) = tokio::io::duplex(4096);
        let tail = Tail::default();
        let path = log.path().to_owned();
        let copy = {
            let tail = tail.clone();
            tokio::spawn(async move { log.capture(r, tail).await })
        };
        for i in 0..200 {
            let line = format!("line {i}");
            w.write_all(format!("{line}\n").as_bytes()).await.unwrap();
            // Polled; only a failing test waits out the ceiling.
            let reached = async {
                while !tail.lines().contains(&line) {
                    tokio::task::yield_now().await;
                }
            };
            tokio::time::timeout(std::time::Duration::from_secs(30), reached)
                .await
                .unwrap_or_else(|_| panic!("{line} never reached the tail"));
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                text.contains(&format!("{line}\n")),
                "{line} is in the tail, not in the file"
            );
        }
        drop(w);
        copy.await.unwrap();
    }

    #[tokio::test]
    async fn ten_mib_of_stderr_stays_within_the_cap_and_the_tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let log = LogFile::new(dir.path().join("x.log"));
        let mut input = Vec::new();
        let mut i = 0;
        while input.len() < 10 * 1024 * 1024 {
            input.extend_from_slice(format!("line {i} {}\n", "z".repeat(100)).as_bytes());
            i += 1;
        }
        input.extend_from_slice(&vec![b'q'; 5000]); // a last, long, unterminated line
        let tail = Tail::default();
        log.capture(&input[..], tail.clone()).await;
        let main = std::fs::metadata(log.path()).unwrap().len();
        let rotated = std::fs::metadata(log.rotated_path()).unwrap().len();
        assert!(
            main <= LOG_CAP_BYTES && rotated <= LOG_CAP_BYTES,
            "{main} {rotated}"
        );
        let lines = tail.lines();
        assert_eq!(lines.len(), TAIL_LINES + 1);
        assert!(lines[TAIL_LINES - 1].starts_with(&format!("line {} ", i - 1)));
        assert_eq!(
            lines[TAIL_LINES].len(),
            TAIL_LINE_BYTES,
            "a long line is cut in the tail"
        );
        let last = log.last_lines(3).unwrap();
        assert_eq!(last.len(), 3);
    }

    #[tokio::test]
    async fn each_run_starts_with_a_marker_and_the_previous_run_reads_alone() {
        let dir = tempfile::tempdir().unwrap();
        let log = LogFile::new(dir.path().join("x.log"));
        for (pid, version, text) in [
            (11, "0.1.0", "first a\nfirst b\n"),
            (12, "0.2.0", "second a\nsecond b\nsecond c\n"),
            (13, "0.2.0", "third\n"),
        ] {
            let marker = run_marker(1_796_169_540_123, pid, version);
            log.capture_run(text.as_bytes(), Tail::default(), Some(marker))
                .await;
        }
        let all = log.last_lines(100).unwrap();
        assert_eq!(all.len(), 9, "{all:?}");
        assert_eq!(
            all[3],
            "=== conduit: run started 2026-12-01T23:59:00.123Z pid 12 version 0.2.0 ==="
        );
        let prev = log.previous_run(100).unwrap();
        assert_eq!(prev[0], all[3]);
        assert_eq!(&prev[1..], ["second a", "second b", "second c"]);
        assert_eq!(log.previous_run(2).unwrap(), ["second b", "second c"]);
        // One run only: no previous run.
        let one = LogFile::new(dir.path().join("y.log"));
        one.capture_run(&b"only\n"[..], Tail::default(), Some(run_marker(0, 1, "1")))
            .await;
        assert!(one.previous_run(100).unwrap().is_empty());
        assert_eq!(utc_timestamp(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc_timestamp(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn the_log_exists_at_every_moment_of_a_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(LogFile::new(dir.path().join("x.log")));
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Rotations on a thread of their own, while this thread looks at the path.
        let writer = {
            let (log, done) = (log.clone(), done.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                let input = vec![b'x'; 8 * LOG_CAP_BYTES as usize];
                rt.block_on(log.capture(&input[..], Tail::default()));
                done.store(true, std::sync::atomic::Ordering::SeqCst);
            })
        };
        while !log.path().exists() {
            std::thread::yield_now();
        }
        let mut looks = 0u64;
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            assert!(log.path().exists(), "the log was missing during a rotation");
            looks += 1;
        }
        writer.join().unwrap();
        assert!(looks > 0);
        // Nothing was lost to the rotation: both files are full of what was written.
        for p in [log.path().to_owned(), log.rotated_path()] {
            let text = std::fs::read(&p).unwrap();
            assert_eq!(text.len() as u64, LOG_CAP_BYTES, "{}", p.display());
            assert!(text.iter().all(|b| *b == b'x'));
        }
    }
}
