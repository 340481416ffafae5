//! An extension's processes, wherever they moved: finding them, recording them, killing them.
//!
//! A process group is not enough: a grandchild that calls `setsid()` or `setpgid(0, 0)` (any
//! daemonising library does) leaves it, and one that execs with an empty environment carries no
//! marker. What cannot be shed is ancestry, so on Linux:
//!
//! - each extension is made a *child subreaper* (`PR_SET_CHILD_SUBREAPER`, set between fork and
//!   exec and kept across exec): while it lives, whatever its descendants do — double fork
//!   included — they stay in its process tree, which is read from
//!   `/proc/<pid>/task/<tid>/children`;
//! - the daemon is a subreaper too (`process::become_subreaper`), so when an extension
//!   dies its orphans come to the daemon instead of init, where the supervisor finds them;
//! - every process ever seen in an extension's tree is recorded with its start time (so a reused
//!   pid is never mistaken for it), in memory and in a small file in the state directory (the
//!   *ledger*), which the next daemon reads after a crash of its own;
//! - a stop kills the recorded processes that still run, their descendants, and the members of
//!   every process group or session one of them created — repeating until none runs.
//!
//! Elsewhere (macOS): no subreaper and no `/proc`; only the extension's own process group is
//! signalled, and the ledger is empty.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// How often a running extension's tree is read and recorded while it has descendants or just
/// changed. A descendant that has lived this long is in the ledger, so the sweep after a daemon
/// crash finds it; the first process of a resting extension (see [`crate::rest`]) is seen
/// within [`crate::rest::SWEEP_INTERVAL`] (and a scheduler tick) and recorded then; that of an
/// idle extension that may not rest (near a limit, or held to its CPU share) within
/// [`TRACK_INTERVAL_QUIET`].
pub const TRACK_INTERVAL: Duration = Duration::from_millis(250);

/// The longest time between two reads of a tree that is only the extension itself and has not
/// changed while it does not rest: the interval doubles from [`TRACK_INTERVAL`] up to this
/// while nothing changes, and falls back to [`TRACK_INTERVAL`] when anything does. (Reading a
/// tree costs a few `/proc` reads; at 250 ms, a thousand idle extensions kept the daemon 12%
/// busy.)
pub const TRACK_INTERVAL_QUIET: Duration = Duration::from_secs(4);

/// One process, told apart from a later one with the same pid by its start time (clock ticks
/// after boot, `/proc/<pid>/stat` field 22).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ProcId {
    pub pid: u32,
    pub start: u64,
}

/// What `/proc/<pid>/stat` says of a process.
#[derive(Clone, Copy, Debug)]
pub struct ProcStat {
    pub id: ProcId,
    pub state: char,
    pub ppid: u32,
    pub pgrp: u32,
    pub session: u32,
    /// What it uses, from the same line (what the limits are enforced on).
    pub usage: crate::usage::ProcUse,
}

impl ProcStat {
    /// A zombie (or dead) process runs nothing and holds nothing open.
    pub fn is_zombie(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Read one process's stat; `None` if it is gone (or this is not Linux).
pub fn stat(pid: u32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(pid, &text)
}

fn parse_stat(pid: u32, text: &str) -> Option<ProcStat> {
    // `pid (comm) state ppid pgrp session …`; comm may contain spaces and parentheses. After
    // the comm, counting from 0: state 0, ppid 1, pgrp 2, session 3, utime 11, stime 12,
    // num_threads 17, starttime 19, rss 21 (pages).
    let rest = &text[text.rfind(')')? + 1..];
    // The first 22 fields, without a heap allocation (this runs for every process of every
    // tree read).
    let mut f = [""; 22];
    let mut got = 0;
    for (slot, field) in f.iter_mut().zip(rest.split_whitespace()) {
        *slot = field;
        got += 1;
    }
    if got < f.len() {
        return None;
    }
    let n = |i: usize| f.get(i)?.parse::<u64>().ok();
    Some(ProcStat {
        usage: crate::usage::ProcUse {
            cpu_ticks: n(11)? + n(12)?,
            threads: n(17)? as u32,
            rss_pages: n(21)?,
        },
        id: ProcId {
            pid,
            start: f.get(19)?.parse().ok()?,
        },
        state: f.first()?.chars().next()?,
        ppid: f.get(1)?.parse().ok()?,
        pgrp: f.get(2)?.parse().ok()?,
        session: f.get(3)?.parse().ok()?,
    })
}

/// A process's CPU clock: the CPU time of all its threads, live and ended, read with one
/// `clock_gettime` — no `/proc` file to open, format and parse. It moves whenever the process
/// runs at all (a fork, an allocation, a thread's start all take CPU time), to the nanosecond,
/// where `/proc/<pid>/stat` counts whole clock ticks; so an unmoved clock says the process did
/// nothing in between (its threads' time is brought up to date at least every scheduler tick).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuClock(libc::clockid_t);

impl CpuClock {
    /// The clock of process `pid`; `None` if it is gone, or where there is none to read (not
    /// Linux).
    pub fn of(pid: u32) -> Option<CpuClock> {
        #[cfg(target_os = "linux")]
        {
            let mut id: libc::clockid_t = 0;
            // SAFETY: writes one clockid_t through a valid pointer.
            let r = unsafe { libc::clock_getcpuclockid(pid as libc::pid_t, &mut id) };
            (r == 0).then_some(CpuClock(id))
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = pid;
            None
        }
    }

    /// The CPU time used so far, in nanoseconds; `None` once the process is gone.
    pub fn read(self) -> Option<u64> {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: writes one timespec through a valid pointer.
        if unsafe { libc::clock_gettime(self.0, &mut ts) } != 0 {
            return None;
        }
        Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
    }
}

/// Whether `id` still runs (same pid, same start time, not a zombie).
pub fn alive(id: ProcId) -> bool {
    stat(id.pid).is_some_and(|s| s.id.start == id.start && !s.is_zombie())
}

/// The direct children of `pid`, from every thread's `children` file (a child belongs to the
/// thread that forked it).
pub fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    out
}

/// The direct children of a process whose stat was just read as `s`. A live single-threaded
/// process's children are all in its one thread's `children` file, read without listing
/// `/proc/<pid>/task` (a directory read costs a 32 KiB buffer and three more system calls; most
/// extensions and their processes have one thread). A thread started since the stat was read
/// may have children this read misses; the next read sees them, as it sees any process started
/// just after a read.
fn children_of(s: &ProcStat) -> Vec<u32> {
    if s.usage.threads != 1 || s.is_zombie() {
        // Several threads, or a leader that is gone while others run: every thread's file.
        return children(s.id.pid);
    }
    let pid = s.id.pid;
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .map(|text| {
            text.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// `root` and every live descendant of it.
pub fn tree(root: u32) -> Vec<ProcStat> {
    let mut out = Vec::new();
    let mut todo = vec![root];
    let mut seen = BTreeSet::new();
    while let Some(pid) = todo.pop() {
        if !seen.insert(pid) {
            continue;
        }
        let Some(s) = stat(pid) else { continue };
        todo.extend(children_of(&s));
        if !s.is_zombie() {
            out.push(s);
        }
    }
    out
}

/// Every process on the system (Linux; empty elsewhere).
fn all_processes() -> Vec<ProcStat> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(stat)
        .collect()
}

/// What runs of what `recorded` names: the recorded processes that still run (same start
/// time), their descendants, and the members of each process group or session whose id is the
/// pid of a recorded process (one created inside the tree — never the daemon's own, which no
/// recorded process leads) and which a recorded process still belongs to.
pub fn still_running(recorded: &BTreeSet<ProcId>) -> Vec<ProcStat> {
    if recorded.is_empty() {
        return Vec::new();
    }
    still_running_in(&all_processes(), recorded)
}

/// [`still_running`] among `all`, one read of every process.
fn still_running_in(all: &[ProcStat], recorded: &BTreeSet<ProcId>) -> Vec<ProcStat> {
    let pids: BTreeSet<u32> = recorded.iter().map(|r| r.pid).collect();
    let mut by_parent: HashMap<u32, Vec<usize>> = HashMap::new();
    for (i, p) in all.iter().enumerate() {
        by_parent.entry(p.ppid).or_default().push(i);
    }
    // A group or session counts only while a recorded process is still in it: then it has
    // existed since the recorded one ran, and its id cannot have been reused by a stranger.
    let groups: BTreeSet<u32> = all
        .iter()
        .filter(|p| recorded.contains(&p.id))
        .flat_map(|p| [p.pgrp, p.session])
        .filter(|g| pids.contains(g))
        .collect();
    let mut hit = vec![false; all.len()];
    let mut todo: Vec<usize> = Vec::new();
    for (i, p) in all.iter().enumerate() {
        let survivor = recorded.contains(&p.id);
        let grouped = groups.contains(&p.pgrp) || groups.contains(&p.session);
        if survivor || grouped {
            todo.push(i);
        }
    }
    while let Some(i) = todo.pop() {
        if std::mem::replace(&mut hit[i], true) {
            continue;
        }
        if let Some(kids) = by_parent.get(&all[i].id.pid) {
            todo.extend(kids.iter().copied());
        }
    }
    let me = std::process::id();
    all.iter()
        .zip(hit)
        .filter(|(p, h)| *h && !p.is_zombie() && p.id.pid != me)
        .map(|(p, _)| *p)
        .collect()
}

/// One read of every process, shared by the stops that ask for one at the same time.
///
/// A stop needs a read that began after it asked (after its SIGKILLs), never an older one;
/// stops that ask while a read is under way share the next. So when 1,000 extensions stop at
/// once (the daemon's shutdown) `/proc` is read a few times per round instead of once per
/// extension, each read costing a stat of every process on the machine.
#[derive(Debug)]
pub struct Scans {
    /// Requests so far; each takes the next number.
    asked: AtomicU64,
    /// The latest read, and the highest request number taken before it began.
    last: tokio::sync::Mutex<Option<(u64, Arc<Vec<ProcStat>>)>>,
    /// Reads made, for the tests.
    reads: AtomicU64,
}

impl Scans {
    pub const fn new() -> Self {
        Scans {
            asked: AtomicU64::new(0),
            last: tokio::sync::Mutex::const_new(None),
            reads: AtomicU64::new(0),
        }
    }

    /// Every process, read after this call began. The lock is held only across the read of
    /// `/proc` (a few ms at 1,000 extensions, on a blocking thread), never across anything an
    /// extension can delay.
    pub async fn fresh(&self) -> Arc<Vec<ProcStat>> {
        let ticket = self.asked.fetch_add(1, Ordering::SeqCst) + 1;
        let mut last = self.last.lock().await;
        if let Some((covers, all)) = &*last
            && *covers >= ticket
        {
            return all.clone();
        }
        // Every request numbered up to here was made before this read begins.
        let covers = self.asked.load(Ordering::SeqCst);
        self.reads.fetch_add(1, Ordering::Relaxed);
        let all = tokio::task::spawn_blocking(all_processes)
            .await
            .unwrap_or_else(|_| all_processes());
        let all = Arc::new(all);
        *last = Some((covers, all.clone()));
        all
    }

    /// How many reads of `/proc` were made.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }
}

impl Default for Scans {
    fn default() -> Self {
        Scans::new()
    }
}

/// The reads every stop of this process shares.
static SCANS: Scans = Scans::new();

/// [`still_running`] from a read shared with the stops asking at the same time ([`Scans`]).
pub async fn still_running_shared(recorded: &BTreeSet<ProcId>) -> Vec<ProcStat> {
    if recorded.is_empty() {
        return Vec::new();
    }
    still_running_in(&SCANS.fresh().await, recorded)
}

/// SIGKILL everything [`still_running`] finds, again and again until nothing runs or `within`
/// has passed (a process forking while it is killed leaves children the next round finds).
/// Also signals `pgid`'s group, which is all there is to go on where `/proc` is missing.
/// Returns how many processes were killed, and whether nothing was left running: then no
/// further look is needed (what no recorded process runs cannot start again), and a stop at
/// 1,000 extensions reads `/proc` half as often.
pub async fn kill_all(
    recorded: &BTreeSet<ProcId>,
    pgid: Option<u32>,
    within: Duration,
) -> (usize, bool) {
    let deadline = Instant::now() + within;
    let mut killed = BTreeSet::new();
    loop {
        if let Some(g) = pgid {
            let _ = signal_group(g, Signal::SIGKILL);
        }
        let left = still_running_shared(recorded).await;
        let group_left = pgid.is_some_and(|g| !cfg!(target_os = "linux") && group_alive(g));
        let gone = left.is_empty() && !group_left;
        if gone || Instant::now() >= deadline {
            return (killed.len(), gone);
        }
        for p in &left {
            if kill(Pid::from_raw(p.id.pid as i32), Signal::SIGKILL).is_ok() {
                killed.insert(p.id);
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The blocking form of [`kill_all`], for the sweep at start (before the runtime serves).
pub fn kill_all_blocking(recorded: &BTreeSet<ProcId>, within: Duration) -> usize {
    let deadline = Instant::now() + within;
    let mut killed = BTreeSet::new();
    loop {
        let left = still_running(recorded);
        if left.is_empty() || Instant::now() >= deadline {
            return killed.len();
        }
        for p in &left {
            if kill(Pid::from_raw(p.id.pid as i32), Signal::SIGKILL).is_ok() {
                killed.insert(p.id);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Send `sig` to the whole group led by `pgid`. A group that no longer exists is not an error.
pub fn signal_group(pgid: u32, sig: Signal) -> io::Result<()> {
    match killpg(Pid::from_raw(pgid as i32), sig) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
        Err(e) => Err(io::Error::from(e)),
    }
}

/// Whether any process of the group is still alive. A killed grandchild stays a zombie until
/// its new parent reaps it; a zombie runs nothing and holds nothing open, so it does not count.
pub fn group_alive(pgid: u32) -> bool {
    #[cfg(target_os = "linux")]
    {
        if let Ok(dir) = std::fs::read_dir("/proc") {
            return dir.flatten().any(|e| {
                let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                    return false;
                };
                // `pid (comm) state ppid pgrp …`; comm may contain spaces and parentheses.
                let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
                    return false;
                };
                let mut fields = rest.split_whitespace();
                let state = fields.next();
                let pgrp = fields.nth(1).and_then(|f| f.parse::<u32>().ok());
                pgrp == Some(pgid) && state != Some("Z") && state != Some("X")
            });
        }
    }
    // Signal 0 checks for existence without sending anything.
    matches!(
        nix::sys::signal::killpg(Pid::from_raw(pgid as i32), None),
        Ok(())
    )
}

/// SIGKILL the group and wait (at most `within`) until none of it runs.
pub async fn kill_group_and_wait(pgid: u32, within: Duration) {
    let _ = signal_group(pgid, Signal::SIGKILL);
    let deadline = Instant::now() + within;
    while group_alive(pgid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// This boot's id: a ledger from before a reboot names processes that no longer exist.
fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// The file recording one extension's processes: `boot <id>`, then one `<pid> <start>` a line.
#[derive(Clone, Debug)]
pub struct Ledger {
    path: PathBuf,
}

/// A ledger's file name ends with this, after the extension's name.
pub const LEDGER_SUFFIX: &str = ".pids";

impl Ledger {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Ledger { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Replace the file's content with `set` (written aside, then renamed: a crash mid-write
    /// leaves the old list, never half of one).
    pub fn write(&self, set: &BTreeSet<ProcId>) -> io::Result<()> {
        let mut text = format!("boot {}\n", boot_id());
        for p in set {
            text.push_str(&format!("{} {}\n", p.pid, p.start));
        }
        let tmp = self.path.with_extension("pids.tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &self.path)
    }

    /// The recorded processes, if the file is from this boot.
    pub fn read(&self) -> BTreeSet<ProcId> {
        let Ok(text) = std::fs::read_to_string(&self.path) else {
            return BTreeSet::new();
        };
        let mut lines = text.lines();
        if lines.next().and_then(|l| l.strip_prefix("boot ")) != Some(boot_id().as_str()) {
            return BTreeSet::new();
        }
        lines
            .filter_map(|l| {
                let (pid, start) = l.split_once(' ')?;
                Some(ProcId {
                    pid: pid.parse().ok()?,
                    start: start.parse().ok()?,
                })
            })
            .collect()
    }

    pub fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Kill what extensions of an earlier daemon left running, from the ledgers in `dir` (each
/// `<name>.pids`), and remove them. Returns `(name, killed)` for each ledger that named a
/// running process. Bounded: at most 2 s per ledger.
pub fn sweep_ledgers(dir: &Path) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let path = e.path();
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(LEDGER_SUFFIX))
            .map(str::to_owned)
        else {
            continue;
        };
        let ledger = Ledger::new(&path);
        let killed = kill_all_blocking(&ledger.read(), Duration::from_secs(2));
        if killed > 0 {
            out.push((name, killed));
        }
        ledger.remove();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stops_asking_at_once_share_one_read_and_a_later_ask_reads_again() {
        let scans = Arc::new(Scans::new());
        let mut sleeper = std::process::Command::new("sleep")
            .arg("1000")
            .spawn()
            .unwrap();
        let pid = sleeper.id();
        // Held here, so that all 64 ask while the first of them waits to read.
        let held = scans.last.lock().await;
        let asks: Vec<_> = (0..64)
            .map(|_| {
                let scans = scans.clone();
                tokio::spawn(async move { scans.fresh().await })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        while scans.asked.load(Ordering::SeqCst) < 64 {
            assert!(Instant::now() < deadline, "the asks never came");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(held);
        for a in asks {
            let all = a.await.unwrap();
            assert!(all.iter().any(|p| p.id.pid == pid), "each sees the sleeper");
        }
        assert_eq!(scans.reads(), 1, "64 asks at once share one read");
        // A process gone before the next ask is gone from its read: a new one was made.
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
        let all = scans.fresh().await;
        assert_eq!(scans.reads(), 2);
        assert!(
            !all.iter().any(|p| p.id.pid == pid),
            "a later ask reads again"
        );
    }

    #[test]
    fn stat_lines_with_odd_command_names_parse() {
        let line = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 1 1";
        let s = parse_stat(4242, line).unwrap();
        assert_eq!((s.ppid, s.pgrp, s.session, s.state), (1, 4242, 4242, 'S'));
        assert_eq!(s.id.start, 987654);
        let line = "77 (a (b) c) R 1 77 77 0 -1 0 0 0 0 0 250 50 0 0 20 0 3 0 1234 100000 512 0";
        let u = parse_stat(77, line).unwrap().usage;
        assert_eq!((u.cpu_ticks, u.threads, u.rss_pages), (300, 3, 512));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_tree_holds_the_children_of_single_and_multi_threaded_processes() {
        // `sh` has one thread; this test process has several (the test harness's).
        let mut sh = std::process::Command::new("sh")
            .args(["-c", "sleep 1000 & wait"])
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let sleeper = loop {
            let t = tree(sh.id());
            if let Some(s) = t.iter().find(|p| p.id.pid != sh.id()) {
                assert_eq!(t[0].usage.threads, 1, "sh is single-threaded");
                break s.id.pid;
            }
            assert!(Instant::now() < deadline, "the shell's child never showed");
            std::thread::sleep(Duration::from_millis(10));
        };
        let mine = tree(std::process::id());
        assert!(mine.iter().any(|p| p.id.pid == sh.id()));
        assert!(mine.iter().any(|p| p.id.pid == sleeper));
        let _ = kill(Pid::from_raw(sleeper as i32), Signal::SIGKILL);
        sh.wait().unwrap();
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_cpu_clock_moves_with_work_stands_still_in_sleep_and_ends_with_its_process() {
        let me = CpuClock::of(std::process::id()).unwrap();
        let before = me.read().unwrap();
        let mut x = 0u64;
        while me.read().unwrap() == before {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
        }
        let mut child = std::process::Command::new("sleep")
            .arg("1000")
            .spawn()
            .unwrap();
        let clock = CpuClock::of(child.id()).unwrap();
        // Once started and asleep, its clock stands still (polled: its start takes CPU).
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut last = clock.read().unwrap();
        loop {
            std::thread::sleep(Duration::from_millis(50));
            let now = clock.read().unwrap();
            if now == last {
                break;
            }
            assert!(now > last, "a clock never goes back");
            assert!(
                Instant::now() < deadline,
                "a sleeping process's clock kept moving"
            );
            last = now;
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(
            clock.read(),
            None,
            "the clock of a reaped process cannot be read"
        );
    }

    #[test]
    fn a_ledger_round_trips_and_one_from_another_boot_names_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let l = Ledger::new(dir.path().join("x.pids"));
        let set: BTreeSet<ProcId> = [ProcId { pid: 7, start: 9 }, ProcId { pid: 8, start: 10 }]
            .into_iter()
            .collect();
        l.write(&set).unwrap();
        assert_eq!(l.read(), set);
        std::fs::write(l.path(), "boot not-this-one\n7 9\n").unwrap();
        assert!(l.read().is_empty());
    }
}
