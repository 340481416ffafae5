//! Spawning an extension process in isolation (in its own process group, which `tree.rs`
//! signals to stop it).
//!
//! Each child gets: its own process group (so a stop reaches its grandchildren), the package
//! folder as working directory, an environment built from an allow-list plus `CONDUIT_*`
//! variables (nothing else of the daemon's leaks in), no file descriptors beyond stdin, stdout
//! and stderr, and on Linux a parent-death signal (SIGKILL) so that a daemon killed with
//! SIGKILL leaves no orphans, and the child-subreaper flag, so that its descendants stay in its
//! process tree whatever group or session they move to (see [`crate::tree`]).
//!
//! Every child the process forks must go through [`spawn`]: it registers the pid as a
//! *leader* before anyone can reap it, and [`reap_orphans`] reaps every other child — the
//! orphans a subreaper adopts — and never a leader, whose exit status the supervisor collects
//! (tokio for a child forked here, `child.rs` for one the spawner forked).
//!
//! The parent-death signal fires when the *thread* that forked the child exits, not the
//! process. Children must therefore be spawned from long-lived threads, never from
//! `spawn_blocking`, whose threads exit when idle: the supervisor starts every extension on one
//! thread of its own (`forker.rs`, through [`crate::start::spawn_on_forker`]), and by way of the
//! spawner where there is one (`spawner.rs`), which makes the same steps as this file's
//! `pre_exec` in a small process.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::limits::Limits;
use crate::sandbox::{SandboxRules, SandboxStatus};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// Variables passed through from the daemon's environment when set. Everything else is
/// dropped; the package gets `CONDUIT_*` variables of its own on top.
pub const ENV_ALLOW_LIST: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
];

/// What to run.
#[derive(Clone, Debug)]
pub struct ChildCommand {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub cwd: PathBuf,
    /// Extra variables (the `CONDUIT_*` ones); set after the allow-list.
    pub env: Vec<(OsString, OsString)>,
}

/// What confines one child besides the isolation every child gets: its limits (the per-process
/// part, rlimits, is applied in the child; the supervisor enforces the rest), its filesystem
/// sandbox, and the cgroup it joins where cgroups are delegated.
#[derive(Clone, Debug, Default)]
pub struct Confinement {
    pub limits: Option<Limits>,
    /// `None`: no sandbox (the operator's `sandbox = "off"`, or a child that is no package).
    pub sandbox: Option<SandboxRules>,
    /// A cgroup v2 folder the child moves itself into before exec ([`crate::cgroup`]).
    pub cgroup: Option<PathBuf>,
}

impl Confinement {
    /// No limits, no sandbox, no cgroup: what [`spawn`] gives.
    pub fn none() -> Self {
        Confinement::default()
    }
}

/// Everything that decides how a package's extension is started. The daemon and `conduit ext
/// check` both build one and call [`ChildCommand::for_package`], so the checker runs exactly
/// what the daemon runs: the same environment, data and temporary folders, limits and sandbox.
#[derive(Clone, Debug)]
pub struct PackageLaunch {
    pub name: String,
    /// The package folder: the working directory, readable in the sandbox.
    pub dir: PathBuf,
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// Its data directory (`CONDUIT_DATA_DIR`), writable in the sandbox.
    pub data_dir: PathBuf,
    /// Its temporary folder (`TMPDIR`), writable in the sandbox.
    pub tmp_dir: PathBuf,
    pub limits: Limits,
    /// `None` when the operator turned the sandbox off; else the paths granted beyond the
    /// defaults (read, write).
    pub sandbox: Option<(Vec<PathBuf>, Vec<PathBuf>)>,
    pub cgroup: Option<PathBuf>,
}

impl ChildCommand {
    /// The command and confinement of a package's extension (see [`PackageLaunch`]). Besides
    /// the allow-listed environment it gets `CONDUIT_EXTENSION`, `CONDUIT_DATA_DIR`,
    /// `CONDUIT_PROTOCOL_VERSION`, `TMPDIR` (its own temporary folder) and
    /// `PYTHONDONTWRITEBYTECODE=1`: an installed package is read-only, and an interpreter's
    /// cache written into it would be refused as tampering at the next start.
    pub fn for_package(p: &PackageLaunch) -> (ChildCommand, Confinement) {
        let env: Vec<(OsString, OsString)> = vec![
            ("CONDUIT_EXTENSION".into(), p.name.clone().into()),
            (
                "CONDUIT_DATA_DIR".into(),
                p.data_dir.clone().into_os_string(),
            ),
            (
                "CONDUIT_PROTOCOL_VERSION".into(),
                conduit_protocol::PROTOCOL_VERSION.to_string().into(),
            ),
            ("TMPDIR".into(), p.tmp_dir.clone().into_os_string()),
            ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
        ];
        let cmd = ChildCommand {
            program: p.program.clone(),
            args: p.args.clone(),
            cwd: p.dir.clone(),
            env,
        };
        let sandbox = p.sandbox.as_ref().map(|(read, write)| {
            SandboxRules::defaults(&p.dir, &p.data_dir, &p.tmp_dir).grant(read, write)
        });
        let confine = Confinement {
            limits: Some(p.limits),
            sandbox,
            cgroup: p.cgroup.clone(),
        };
        (cmd, confine)
    }
}

/// What confined a child that [`spawn_confined`] started.
#[derive(Clone, Debug, PartialEq)]
pub struct Applied {
    pub sandbox: SandboxStatus,
}

/// The environment a child gets: the allow-listed part of ours, then `extra`.
pub fn child_env(
    lookup: impl Fn(&str) -> Option<OsString>,
    extra: &[(OsString, OsString)],
) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = ENV_ALLOW_LIST
        .iter()
        .filter_map(|k| lookup(k).map(|v| (OsString::from(*k), v)))
        .collect();
    env.extend(extra.iter().cloned());
    env
}

/// The children [`spawn`] started that tokio has not reaped yet.
static LEADERS: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

pub(crate) fn leaders() -> std::sync::MutexGuard<'static, BTreeSet<u32>> {
    LEADERS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Forget a child [`spawn`] started, once its exit status has been collected.
pub fn release_leader(pid: u32) {
    leaders().remove(&pid);
}

/// Whether `pid` is a child [`spawn`] started and tokio has not reaped.
pub fn is_leader(pid: u32) -> bool {
    leaders().contains(&pid)
}

/// Make this process a child subreaper (Linux): descendants of its children that lose their
/// parent are re-parented to it rather than to init, so a stop can still find them. Returns
/// whether it is one now (never, elsewhere). A process that calls this must fork only through
/// [`spawn`], and reap adopted orphans ([`reap_orphans`]; the supervisor does, when this is set).
pub fn become_subreaper() -> bool {
    #[cfg(target_os = "linux")]
    {
        nix::sys::prctl::set_child_subreaper(true).is_ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// Whether this process is a child subreaper.
pub fn is_subreaper() -> bool {
    #[cfg(target_os = "linux")]
    {
        nix::sys::prctl::get_child_subreaper().unwrap_or(false)
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// What one pass of [`reap_orphans`] found among this process's children that are not leaders.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Orphans {
    /// Zombies reaped.
    pub reaped: usize,
    /// Processes SIGKILLed: the unclaimed orphans and their descendants.
    pub killed: usize,
    /// Live orphans a running extension claims, left running (its stop kills them).
    pub kept: usize,
}

impl Orphans {
    /// Whether the pass found any child that is not a leader.
    pub fn any(&self) -> bool {
        self.reaped + self.killed + self.kept > 0
    }
}

/// How often the orphan reaper looks without a SIGCHLD.
pub const REAP_INTERVAL: Duration = Duration::from_millis(250);

/// The longest the reaper waits without a SIGCHLD while it finds no orphan at all.
pub const REAP_INTERVAL_IDLE: Duration = Duration::from_secs(30);

/// The reaper's wait after a pass that found `found` (see [`Orphans::any`]): [`REAP_INTERVAL`]
/// while there are orphans (one kept for a running extension is killed soon after that
/// extension stops claiming it), doubling up to [`REAP_INTERVAL_IDLE`] while there are none.
/// Every orphan arrives with a SIGCHLD (its parent, one of this process's children, died), which
/// wakes the reaper at once whatever the wait; reading this process's `children` lists, a
/// thousand pids with a thousand extensions, every 250 ms found nothing almost always.
pub fn reap_interval(prev: Duration, found: bool) -> Duration {
    if found {
        REAP_INTERVAL
    } else {
        (prev * 2).clamp(REAP_INTERVAL, REAP_INTERVAL_IDLE)
    }
}

/// Reap this process's zombie children that are not leaders, and SIGKILL its live ones that
/// are not leaders and that `keep` does not claim (adopted orphans of no running extension,
/// with their descendants).
pub fn reap_orphans(keep: impl Fn(crate::tree::ProcId) -> bool) -> Orphans {
    let me = std::process::id();
    let (mut reaped, mut killed, mut kept) = (0, 0, 0);
    for pid in crate::tree::children(me) {
        // Held while reaping, so a child spawned meanwhile is a leader before it can be seen.
        // Leaders first: the extensions themselves are most of the children, and need no read
        // of their stat (a thousand of them every pass kept the daemon busy).
        let leaders = leaders();
        if leaders.contains(&pid) {
            continue;
        }
        let Some(st) = crate::tree::stat(pid) else {
            continue;
        };
        if st.is_zombie() {
            use nix::sys::wait::{WaitPidFlag, waitpid};
            if waitpid(Pid::from_raw(pid as i32), Some(WaitPidFlag::WNOHANG)).is_ok() {
                reaped += 1;
            }
            continue;
        }
        drop(leaders);
        if keep(st.id) {
            kept += 1;
            continue;
        }
        for p in crate::tree::tree(pid) {
            if nix::sys::signal::kill(Pid::from_raw(p.id.pid as i32), Signal::SIGKILL).is_ok() {
                killed += 1;
            }
        }
    }
    Orphans {
        reaped,
        killed,
        kept,
    }
}

/// Spawn `cmd` with piped stdio, in its own process group, isolated as the module docs say.
pub fn spawn(cmd: &ChildCommand) -> io::Result<Child> {
    spawn_confined(cmd, &Confinement::none()).map(|(c, _)| c)
}

/// [`spawn`], confined by `confine`: rlimits, then the cgroup, then the sandbox, each applied
/// in the child before exec. A sandbox asked for where Landlock is missing is reported in
/// [`Applied`], not an error; one that cannot be built where Landlock exists is an error.
pub fn spawn_confined(cmd: &ChildCommand, confine: &Confinement) -> io::Result<(Child, Applied)> {
    spawn_with_bulk(cmd, confine, None)
}

/// [`spawn_confined`], and with `bulk` (a pipe's write end) given to the child as descriptor
/// [`conduit_protocol::bulk::BULK_FD`] (3), its one descriptor beyond the standard three. The
/// caller keeps `bulk` open until this returns and closes its copy afterwards.
pub fn spawn_with_bulk(
    cmd: &ChildCommand,
    confine: &Confinement,
    bulk: Option<std::os::fd::BorrowedFd<'_>>,
) -> io::Result<(Child, Applied)> {
    let bulk_fd = bulk.map(|fd| std::os::fd::AsRawFd::as_raw_fd(&fd));
    let mut c = Command::new(&cmd.program);
    c.args(&cmd.args)
        .current_dir(&cmd.cwd)
        .env_clear()
        .envs(child_env(|k| std::env::var_os(k), &cmd.env))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let parent = nix::unistd::getpid();
    let (prepared, sandbox) = prepare_sandbox(confine)?;
    #[cfg(target_os = "linux")]
    let ruleset_fd = prepared
        .as_ref()
        .map(|p| std::os::fd::AsRawFd::as_raw_fd(&p.fd));
    let limits = confine.limits;
    let cgroup_procs = match &confine.cgroup {
        Some(dir) => Some(
            std::ffi::CString::new(
                dir.join("cgroup.procs")
                    .into_os_string()
                    .into_encoded_bytes(),
            )
            .map_err(io::Error::other)?,
        ),
        None => None,
    };
    // SAFETY: the closure runs in the child between fork and exec and only makes
    // async-signal-safe system calls (prctl, getppid, setrlimit, open/write/close,
    // landlock_restrict_self, close_range/fcntl); it allocates nothing: everything it needs was
    // built above, in the parent.
    unsafe {
        c.pre_exec(move || {
            #[cfg(target_os = "linux")]
            {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
                // Kept across exec: what the extension starts stays in its tree.
                nix::sys::prctl::set_child_subreaper(true).map_err(io::Error::from)?;
                // The daemon may have died between fork and prctl: then nobody would kill us.
                if nix::unistd::getppid() != parent {
                    return Err(io::Error::other(
                        "the daemon exited while starting this extension",
                    ));
                }
            }
            #[cfg(not(target_os = "linux"))]
            let _ = parent;
            if let Some(l) = &limits {
                l.apply_rlimits()?;
            }
            if let Some(path) = &cgroup_procs {
                crate::cgroup::join_in_child(path)?;
            }
            #[cfg(target_os = "linux")]
            if let Some(fd) = ruleset_fd {
                crate::sandbox::restrict_self(fd)?;
            }
            reset_signals();
            mark_inherited_fds_cloexec();
            if let Some(fd) = bulk_fd {
                give_bulk_fd(fd)?;
            }
            Ok(())
        });
    }
    // Registered before the lock is released: the orphan reaper never takes a leader's status.
    let mut leaders = leaders();
    let child = c.spawn()?;
    if let Some(pid) = child.id() {
        leaders.insert(pid);
    }
    drop(leaders);
    // The child has its copy of the ruleset (or has exec'd); ours closes here.
    drop(prepared);
    Ok((child, Applied { sandbox }))
}

/// The Landlock ruleset `confine` asks for, built in this process for the child to restrict
/// itself with, and what the child's status will say of its sandbox. A sandbox asked for where
/// Landlock is missing is reported, not an error; one that cannot be built where it exists is.
pub(crate) fn prepare_sandbox(
    confine: &Confinement,
) -> io::Result<(Option<crate::sandbox::Prepared>, SandboxStatus)> {
    Ok(match &confine.sandbox {
        None => (None, SandboxStatus::Off),
        Some(rules) => match crate::sandbox::landlock_abi() {
            Err(reason) => (None, SandboxStatus::Unavailable { reason }),
            Ok(_) => {
                let p = crate::sandbox::prepare(rules).map_err(io::Error::other)?;
                let status = SandboxStatus::Landlock {
                    abi: p.abi,
                    read: rules.read.as_slice().into(),
                    write: rules.write.as_slice().into(),
                };
                (Some(p), status)
            }
        },
    })
}

/// Ask the kernel for a pipe buffer of `bytes` (Linux; elsewhere a no-op answering `Ok(0)`);
/// the size granted. Refused past the user's pipe pages or `pipe-max-size`, and when shrinking
/// below what the pipe holds.
pub fn set_pipe_size(fd: std::os::fd::BorrowedFd<'_>, bytes: usize) -> io::Result<usize> {
    #[cfg(target_os = "linux")]
    {
        let bytes = i32::try_from(bytes).map_err(io::Error::other)?;
        // SAFETY: fcntl on a descriptor the caller holds open.
        let r = unsafe {
            libc::fcntl(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                libc::F_SETPIPE_SZ,
                bytes,
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (fd, bytes);
        Ok(0)
    }
}

/// In the child: make `fd` descriptor 3, kept across exec. `dup2` onto 3 clears close-on-exec
/// on the copy; when `fd` already is 3 the flag is cleared by hand. Descriptor 3 is not the
/// standard library's exec-error pipe: the bulk pipe was open in the parent before that pipe
/// was made, so 3 was taken by then (by the bulk pipe or another open file), unless another
/// thread closed it in between; then a failed exec would be reported as a child that exits at
/// once rather than as a spawn error.
fn give_bulk_fd(fd: i32) -> io::Result<()> {
    let target = conduit_protocol::bulk::BULK_FD;
    // SAFETY: plain system calls on descriptors the parent opened for the child.
    let r = unsafe {
        if fd == target {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags < 0 {
                -1
            } else {
                libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC)
            }
        } else {
            libc::dup2(fd, target)
        }
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// In the child, before exec: every signal at its default action and none blocked, whatever
/// this process ignored or blocked (a daemon started from a shell in the background inherits
/// SIGINT ignored; this binary's runtime ignores SIGPIPE). Async-signal-safe (`sigaction`,
/// `sigprocmask`).
pub(crate) fn reset_signals() {
    // SAFETY: plain system calls on stack values; SIGKILL and SIGSTOP are refused harmlessly.
    // The kernel's own call, not the C library's `sigaction`, which refuses the two real-time
    // signals it reserves (an ignored one was seen inherited here); a zeroed kernel
    // `struct sigaction` is SIG_DFL, no flags, no mask on every layout.
    unsafe {
        let default = [0u64; 4];
        for sig in 1..65 {
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                default.as_ptr(),
                std::ptr::null_mut::<u64>(),
                8usize,
            );
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
}

/// Make every descriptor above stderr close on exec. Closing them here instead would also
/// close the pipe the standard library uses to report a failed exec back to the parent.
fn mark_inherited_fds_cloexec() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a plain system call with constant arguments.
        let r = unsafe {
            libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            )
        };
        if r == 0 {
            return;
        }
    }
    // Older kernels and other Unixes: walk a bounded range.
    for fd in 3..4096 {
        // SAFETY: fcntl on a descriptor that may not exist fails harmlessly with EBADF.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}

/// How a child ended: its exit code, or the signal that killed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExitInfo {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    pub at_ms: i64,
}

impl ExitInfo {
    pub fn from_status(status: std::process::ExitStatus, at_ms: i64) -> Self {
        use std::os::unix::process::ExitStatusExt;
        ExitInfo {
            code: status.code(),
            signal: status.signal(),
            at_ms,
        }
    }

    /// Whether this was a clean exit (code 0).
    pub fn is_clean(&self) -> bool {
        self.code == Some(0)
    }
}

impl std::fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.code, self.signal) {
            (Some(c), _) => write!(f, "exit code {c}"),
            (None, Some(s)) => match Signal::try_from(s) {
                Ok(sig) => write!(f, "killed by {sig}"),
                Err(_) => write!(f, "killed by signal {s}"),
            },
            (None, None) => write!(f, "ended"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reaper_backs_off_while_it_finds_nothing_and_is_quick_while_orphans_are_about() {
        let mut every = REAP_INTERVAL;
        let mut seen = Vec::new();
        for _ in 0..9 {
            every = reap_interval(every, false);
            seen.push(every.as_millis());
        }
        assert_eq!(
            seen,
            [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        assert_eq!(reap_interval(every, true), REAP_INTERVAL);
        assert_eq!(reap_interval(Duration::ZERO, false), REAP_INTERVAL);
        assert!(!Orphans::default().any());
        assert!(
            Orphans {
                kept: 1,
                ..Orphans::default()
            }
            .any()
        );
    }

    #[test]
    fn only_allow_listed_variables_pass_and_conduit_ones_are_added() {
        let env = child_env(
            |k| match k {
                "PATH" => Some("/bin".into()),
                "HOME" => Some("/root".into()),
                _ => None,
            },
            &[("CONDUIT_EXTENSION".into(), "notes".into())],
        );
        let keys: Vec<_> = env
            .iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        assert_eq!(keys, ["PATH", "HOME", "CONDUIT_EXTENSION"]);
    }
}
