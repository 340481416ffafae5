//! The spawner (Linux): a small process that forks the extensions on the daemon's behalf.
//!
//! A fork copies the forking process's page tables and descriptor table, and the child drops
//! both again at exec. A daemon supervising a thousand extensions holds tens of MiB and
//! thousands of descriptors, so every start cost more the more extensions already ran, and
//! after each fork the daemon's own writes took copy-on-write faults. The spawner is the
//! `conduit` binary run again ([`SPAWNER_ARG`]) when the daemon starts, still small: one
//! thread, a few descriptors, well under a MiB of its own memory. For each start the daemon
//! sends it what to run (as JSON) and the child's ends of its pipes and its Landlock ruleset
//! (as descriptors) on a Unix socket; the spawner forks with `CLONE_PARENT`, so the extension
//! is the *daemon's* child exactly as if the daemon had forked it — the daemon waits for its
//! status (through a pidfd), it is a leader to the orphan reaper, and its parent-death signal
//! is tied to the daemon's forker thread, whose child the spawner is.
//!
//! ```text
//!   daemon (forker thread) ── request + fds ──► spawner ── clone(CLONE_PARENT) ──► child
//!         ▲                                        │       prctl, setpgid, rlimits, cgroup,
//!         └──────────── pid, or errno ─────────────┘       Landlock, dup2, chdir, execve
//!                                   error pipe: EOF = exec'd, or (step, errno) ◄──┘
//! ```
//!
//! The child makes the same steps, in the same order, as [`crate::process::spawn_with_bulk`]'s
//! `pre_exec`. Invariants: one request at a time, under a lock, bounded by [`REPLY_TIMEOUT`];
//! a spawner that fails once (no answer, a broken socket) is not used again, and every later
//! start forks in the daemon as before, so a lost spawner costs speed, never a start.
//! `CONDUIT_SPAWNER=off` makes the daemon fork itself from the start.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType,
};
use serde::{Deserialize, Serialize};

use crate::child::{ExtChild, Spawned};
use crate::limits::Limits;
use crate::process::{Applied, ChildCommand, Confinement};

/// The argument that makes the `conduit` binary the spawner ([`serve`]).
pub const SPAWNER_ARG: &str = "__conduit-spawner";

/// Set to `off`, the daemon starts no spawner and forks every extension itself.
pub const SPAWNER_ENV: &str = "CONDUIT_SPAWNER";

/// The longest the daemon waits for the spawner's answer to one start.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// The spawner's descriptor for its end of the socket.
const SOCKET_FD: RawFd = 3;

/// The largest request (program, arguments, environment) the spawner reads.
const MAX_REQUEST: usize = 256 * 1024;

/// One start, as the daemon asks for it.
#[derive(Debug, Serialize, Deserialize)]
struct Request {
    program: OsString,
    args: Vec<OsString>,
    cwd: OsString,
    /// The child's whole environment.
    env: Vec<(OsString, OsString)>,
    limits: Option<Limits>,
    cgroup_procs: Option<OsString>,
    /// The daemon's pid: the child's parent, checked after its parent-death signal is set.
    parent: u32,
    /// Which descriptors follow stdin, stdout and stderr: the bulk pipe, the ruleset.
    bulk: bool,
    ruleset: bool,
}

/// What became of it.
#[derive(Debug, Serialize, Deserialize)]
enum Reply {
    Started {
        pid: u32,
    },
    /// `pid` is set when the child was forked (it exited, and the daemon reaps it).
    Failed {
        pid: Option<u32>,
        step: String,
        errno: i32,
    },
}

/// The steps of the child, as its error report names them.
const STEPS: &[&str] = &[
    "set the parent-death signal",
    "become a child subreaper",
    "the daemon exited while starting this extension",
    "create its process group",
    "reset its signals",
    "apply the resource limits",
    "join its cgroup",
    "restrict itself with Landlock",
    "set up its standard descriptors",
    "enter its working directory",
    "exec",
];
const STEP_EXEC: usize = STEPS.len() - 1;

// ---- the daemon's side ------------------------------------------------------------------

/// The daemon's handle on its spawner.
struct Handle {
    socket: Mutex<OwnedFd>,
    /// Cleared at the first failure: later starts fork in the daemon.
    usable: AtomicBool,
    pid: u32,
    /// Kept so that tokio reaps the spawner when it ends; never dropped (the handle is static).
    _child: Mutex<tokio::process::Child>,
}

static SPAWNER: std::sync::OnceLock<Handle> = std::sync::OnceLock::new();

/// Start the spawner from `exe` (the `conduit` binary) and use it for every later
/// [`crate::start::spawn_on_forker`], unless `CONDUIT_SPAWNER=off`. `Ok(None)`: turned off.
/// Call once, early, inside the runtime; a second call changes nothing.
pub async fn start(exe: &Path) -> io::Result<Option<u32>> {
    if std::env::var_os(SPAWNER_ENV).is_some_and(|v| v == "off") {
        return Ok(None);
    }
    if let Some(h) = SPAWNER.get() {
        return Ok(Some(h.pid));
    }
    let (ours, theirs) = nix::sys::socket::socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?;
    set_timeout(ours.as_fd(), REPLY_TIMEOUT)?;
    let cmd = ChildCommand {
        program: exe.to_owned(),
        args: vec![SPAWNER_ARG.into()],
        cwd: "/".into(),
        env: Vec::new(),
    };
    // Forked by the daemon itself, on the forker thread (its parent-death signal is tied to
    // that thread, and its children's too), once, while the daemon is small; its end of the
    // socket is its descriptor 3, as a bulk pipe would be.
    let mut child = crate::forker::run(
        move || {
            crate::process::spawn_with_bulk(&cmd, &Confinement::none(), Some(theirs.as_fd()))
                .map(|(c, _)| c)
        },
        drop,
    )
    .await?;
    let pid = child.id().unwrap_or(0);
    if let Some(stderr) = child.stderr.take() {
        // Each line to the daemon's log as it comes (the first 64 KiB), the rest read and
        // dropped, so the spawner never blocks or fails on a full stderr. Ends with the spawner.
        tokio::spawn(async move {
            use tokio::io::AsyncBufReadExt;
            let mut lines = tokio::io::BufReader::new(stderr).split(b'\n');
            let mut logged = 0usize;
            while let Ok(Some(line)) = lines.next_segment().await {
                if logged < 64 * 1024 {
                    logged += line.len();
                    tracing::warn!(spawner = pid, "{}", String::from_utf8_lossy(&line));
                }
            }
        });
    }
    let _ = SPAWNER.set(Handle {
        socket: Mutex::new(ours),
        usable: AtomicBool::new(true),
        pid,
        _child: Mutex::new(child),
    });
    Ok(Some(pid))
}

/// Start `cmd` through the spawner, on the calling thread (the forker). `None` when there is
/// no usable spawner: the caller forks itself.
pub(crate) fn spawn(
    cmd: &ChildCommand,
    confine: &Confinement,
    bulk: Option<BorrowedFd<'_>>,
) -> Option<io::Result<(ExtChild, Applied)>> {
    let h = SPAWNER.get()?;
    if !h.usable.load(Ordering::Relaxed) {
        return None;
    }
    Some(spawn_with(h, cmd, confine, bulk))
}

fn spawn_with(
    h: &Handle,
    cmd: &ChildCommand,
    confine: &Confinement,
    bulk: Option<BorrowedFd<'_>>,
) -> io::Result<(ExtChild, Applied)> {
    let (prepared, sandbox) = crate::process::prepare_sandbox(confine)?;
    let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from);
    let (stdin_r, stdin_w) = pipe()?;
    let (stdout_r, stdout_w) = pipe()?;
    let (stderr_r, stderr_w) = pipe()?;
    let env = crate::process::child_env(|k| std::env::var_os(k), &cmd.env);
    let req = Request {
        program: cmd.program.clone().into_os_string(),
        args: cmd.args.clone(),
        cwd: cmd.cwd.clone().into_os_string(),
        env,
        limits: confine.limits,
        cgroup_procs: confine
            .cgroup
            .as_ref()
            .map(|d| d.join("cgroup.procs").into_os_string()),
        parent: std::process::id(),
        bulk: bulk.is_some(),
        ruleset: prepared.is_some(),
    };
    let body = serde_json::to_vec(&req).map_err(io::Error::other)?;
    let mut fds: Vec<RawFd> = vec![
        stdin_r.as_raw_fd(),
        stdout_w.as_raw_fd(),
        stderr_w.as_raw_fd(),
    ];
    fds.extend(bulk.map(|b| b.as_raw_fd()));
    fds.extend(prepared.as_ref().map(|p| p.fd.as_raw_fd()));

    // Held from before the request until the pid is a leader: the orphan reaper never takes the
    // status of a child it does not know yet.
    let mut leaders = crate::process::leaders();
    let reply = {
        let sock = h.socket.lock().unwrap_or_else(|p| p.into_inner());
        exchange(sock.as_fd(), &body, &fds)
    };
    let reply = match reply {
        Ok(r) => r,
        Err(e) => {
            drop(leaders);
            h.usable.store(false, Ordering::Relaxed);
            tracing::warn!(spawner = h.pid, error = %e, "the spawner did not answer; extensions are forked by the daemon from now on");
            return crate::process::spawn_with_bulk(cmd, confine, bulk)
                .and_then(|(c, applied)| Ok((ExtChild::from_tokio(c)?, applied)));
        }
    };
    let pid = match reply {
        Reply::Started { pid } => pid,
        Reply::Failed { pid, step, errno } => {
            if let Some(pid) = pid {
                // It exited at that step; its status is ours to collect.
                let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid as i32), None);
            }
            drop(leaders);
            let os = io::Error::from_raw_os_error(errno);
            return Err(if step == STEPS[STEP_EXEC] {
                os
            } else {
                io::Error::new(os.kind(), format!("cannot {step}: {os}"))
            });
        }
    };
    leaders.insert(pid);
    drop(leaders);
    // The child has its copies now.
    drop((stdin_r, stdout_w, stderr_w, prepared));
    let spawned = match Spawned::new(pid) {
        Ok(s) => s,
        Err(e) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid as i32), None);
            crate::process::release_leader(pid);
            return Err(e);
        }
    };
    use tokio::net::unix::pipe;
    let child = ExtChild::from_spawned(
        spawned,
        pipe::Sender::from_owned_fd(stdin_w)?,
        pipe::Receiver::from_owned_fd(stdout_r)?,
        pipe::Receiver::from_owned_fd(stderr_r)?,
    );
    Ok((child, Applied { sandbox }))
}

fn set_timeout(fd: BorrowedFd<'_>, t: Duration) -> io::Result<()> {
    let tv = nix::sys::time::TimeVal::new(t.as_secs() as _, 0);
    nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::ReceiveTimeout, &tv)?;
    nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::SendTimeout, &tv)?;
    Ok(())
}

/// Send one request with its descriptors and read the reply.
fn exchange(sock: BorrowedFd<'_>, body: &[u8], fds: &[RawFd]) -> io::Result<Reply> {
    let iov = [io::IoSlice::new(body)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    nix::sys::socket::sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)?;
    let mut buf = vec![0u8; 4096];
    let n = loop {
        match nix::unistd::read(sock, &mut buf) {
            Ok(n) => break n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the spawner closed its socket",
        ));
    }
    serde_json::from_slice(&buf[..n]).map_err(io::Error::other)
}

// ---- the spawner's side -------------------------------------------------------------------

/// The spawner's main: serve requests on descriptor 3 until the daemon closes it. Runs in a
/// process of its own with one thread, so its children may do anything before exec.
pub fn serve() -> std::process::ExitCode {
    // Checked before it is owned: run by hand without a descriptor 3, this says so and exits.
    // SAFETY: fcntl on a descriptor number; a closed one fails with EBADF.
    if unsafe { libc::fcntl(SOCKET_FD, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        eprintln!(
            "conduit spawner: descriptor 3 is not usable ({}); this command is started by `conduit daemon run`, not by hand",
            io::Error::last_os_error()
        );
        return std::process::ExitCode::FAILURE;
    }
    // SAFETY: descriptor 3 is open (above): the socket the daemon gave this process, which
    // nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(SOCKET_FD) };
    let mut buf = vec![0u8; MAX_REQUEST];
    loop {
        let (n, fds) = match receive(sock.as_fd(), &mut buf) {
            Ok(Some(got)) => got,
            Ok(None) => return std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("conduit spawner: cannot read a request: {e}");
                return std::process::ExitCode::FAILURE;
            }
        };
        let reply = match serde_json::from_slice::<Request>(&buf[..n]) {
            Ok(req) => start_child(&req, &fds),
            Err(e) => {
                eprintln!("conduit spawner: a request that is not one: {e}");
                Reply::Failed {
                    pid: None,
                    step: "read the request".into(),
                    errno: libc::EINVAL,
                }
            }
        };
        drop(fds);
        let body = serde_json::to_vec(&reply).unwrap_or_default();
        if let Err(e) = nix::unistd::write(&sock, &body) {
            eprintln!("conduit spawner: cannot answer: {e}");
            return std::process::ExitCode::FAILURE;
        }
    }
}

/// One request and its descriptors (close-on-exec here); `None` at the daemon's end.
fn receive(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Option<(usize, Vec<OwnedFd>)>> {
    let mut space = nix::cmsg_space!([RawFd; 8]);
    loop {
        let mut iov = [io::IoSliceMut::new(buf)];
        let msg = match nix::sys::socket::recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(m) => m,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        let mut fds = Vec::new();
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(got) = c {
                // SAFETY: descriptors the kernel just installed in this process for us.
                fds.extend(
                    got.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        let n = msg.bytes;
        if n == 0 && fds.is_empty() {
            return Ok(None);
        }
        return Ok(Some((n, fds)));
    }
}

fn cstring(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "a program, argument or variable holds a NUL byte",
        )
    })
}

/// `program` as `execvp` would find it on the child's `PATH`.
fn resolve(program: &OsStr, env: &[(OsString, OsString)]) -> Option<CString> {
    if program.as_bytes().contains(&b'/') {
        return cstring(program).ok();
    }
    let path = env.iter().rev().find(|(k, _)| k == "PATH").map_or_else(
        || OsString::from("/usr/local/bin:/usr/bin:/bin"),
        |(_, v)| v.clone(),
    );
    std::env::split_paths(&path).find_map(|dir| {
        let candidate = dir.join(program);
        let c = cstring(candidate.as_os_str()).ok()?;
        // SAFETY: access(2) on a NUL-terminated path.
        let ok = unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0 && candidate.is_file();
        ok.then_some(c)
    })
}

fn failed(pid: Option<u32>, step: usize, errno: i32) -> Reply {
    Reply::Failed {
        pid,
        step: STEPS[step].into(),
        errno,
    }
}

/// Fork the child for `req` and report how its exec went.
fn start_child(req: &Request, fds: &[OwnedFd]) -> Reply {
    let want = 3 + usize::from(req.bulk) + usize::from(req.ruleset);
    if fds.len() != want {
        eprintln!(
            "conduit spawner: a request with {} descriptors where {want} belong",
            fds.len()
        );
        return failed(None, 8, libc::EINVAL);
    }
    let Some(program) = resolve(&req.program, &req.env) else {
        return failed(None, STEP_EXEC, libc::ENOENT);
    };
    let built: io::Result<_> = (|| {
        let mut argv = vec![cstring(&req.program)?];
        for a in &req.args {
            argv.push(cstring(a)?);
        }
        let mut envp = Vec::new();
        for (k, v) in &req.env {
            let mut kv = k.clone();
            kv.push("=");
            kv.push(v);
            envp.push(cstring(&kv)?);
        }
        let cwd = cstring(&req.cwd)?;
        let cgroup = req.cgroup_procs.as_deref().map(cstring).transpose()?;
        Ok((argv, envp, cwd, cgroup))
    })();
    let (argv, envp, cwd, cgroup) = match built {
        Ok(b) => b,
        Err(_) => return failed(None, STEP_EXEC, libc::EINVAL),
    };
    let mut argv_p: Vec<*const libc::c_char> = argv.iter().map(|c| c.as_ptr()).collect();
    argv_p.push(std::ptr::null());
    let mut envp_p: Vec<*const libc::c_char> = envp.iter().map(|c| c.as_ptr()).collect();
    envp_p.push(std::ptr::null());
    let (err_r, err_w) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => return failed(None, STEP_EXEC, e as i32),
    };
    let raw = |i: usize| fds[i].as_raw_fd();
    let child = Child {
        program: &program,
        argv: &argv_p,
        envp: &envp_p,
        cwd: &cwd,
        cgroup: cgroup.as_deref(),
        limits: req.limits,
        parent: req.parent,
        stdio: [raw(0), raw(1), raw(2)],
        bulk: req.bulk.then(|| raw(3)),
        ruleset: req.ruleset.then(|| raw(want - 1)),
        report: err_w.as_raw_fd(),
    };
    // SAFETY: this process has one thread, so the forked copy may run any code; with
    // CLONE_PARENT it is the daemon's child, and `run` never returns in it.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_PARENT | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid < 0 {
        return failed(
            None,
            STEP_EXEC,
            io::Error::last_os_error().raw_os_error().unwrap_or(0),
        );
    }
    if pid == 0 {
        child.run();
    }
    drop(err_w);
    let mut report = [0u8; 8];
    let mut got = 0;
    while got < report.len() {
        match nix::unistd::read(&err_r, &mut report[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break,
        }
    }
    let pid = pid as u32;
    if got < report.len() {
        // Closed by the exec (close-on-exec), before any report: the extension runs.
        return Reply::Started { pid };
    }
    let step = u32::from_ne_bytes(report[..4].try_into().unwrap_or_default()) as usize;
    let errno = i32::from_ne_bytes(report[4..].try_into().unwrap_or_default());
    failed(Some(pid), step.min(STEP_EXEC), errno)
}

/// What the forked child needs, all built before the fork.
struct Child<'a> {
    program: &'a CString,
    argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
    cwd: &'a CString,
    cgroup: Option<&'a std::ffi::CStr>,
    limits: Option<Limits>,
    parent: u32,
    stdio: [RawFd; 3],
    bulk: Option<RawFd>,
    ruleset: Option<RawFd>,
    report: RawFd,
}

impl Child<'_> {
    /// In the child: the steps of `spawn_with_bulk`'s `pre_exec`, then exec; on failure report
    /// the step and errno on the error pipe and exit.
    fn run(&self) -> ! {
        let fail = |step: usize, errno: i32| -> ! {
            let mut report = [0u8; 8];
            report[..4].copy_from_slice(&(step as u32).to_ne_bytes());
            report[4..].copy_from_slice(&errno.to_ne_bytes());
            // SAFETY: a write of a stack buffer, then the exit of this copy of the process.
            unsafe {
                libc::write(self.report, report.as_ptr().cast(), report.len());
                libc::_exit(127)
            }
        };
        let errno = || io::Error::last_os_error().raw_os_error().unwrap_or(0);
        let check = |step: usize, r: libc::c_long| {
            if r < 0 {
                fail(step, errno());
            }
        };
        // SAFETY: plain system calls on values built before the fork.
        unsafe {
            check(0, libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) as _);
            // Kept across exec: what the extension starts stays in its tree.
            check(1, libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) as _);
            // The daemon may have died before the signal was set: then nobody would kill us.
            if libc::getppid() as u32 != self.parent {
                fail(2, libc::ESRCH);
            }
            check(3, libc::setpgid(0, 0) as _);
            crate::process::reset_signals();
            if let Some(l) = &self.limits
                && let Err(e) = l.apply_rlimits()
            {
                fail(5, e.raw_os_error().unwrap_or(0));
            }
            if let Some(path) = self.cgroup
                && let Err(e) = crate::cgroup::join_in_child(path)
            {
                fail(6, e.raw_os_error().unwrap_or(0));
            }
            if let Some(fd) = self.ruleset
                && let Err(e) = crate::sandbox::restrict_self(fd)
            {
                fail(7, e.raw_os_error().unwrap_or(0));
            }
            // Every descriptor received is 4 or above (0–2 are this process's own pipes, 3 its
            // socket), so none is overwritten before it is copied; the copies keep across exec.
            for (i, fd) in self.stdio.iter().enumerate() {
                check(8, libc::dup2(*fd, i as RawFd) as _);
            }
            if let Some(fd) = self.bulk {
                check(8, libc::dup2(fd, conduit_protocol::bulk::BULK_FD) as _);
            }
            // Anything else open here closes at exec (the socket, the received originals, the
            // error pipe — the last two already are close-on-exec).
            let first = if self.bulk.is_some() { 4 } else { 3 };
            libc::syscall(
                libc::SYS_close_range,
                first as u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            check(9, libc::chdir(self.cwd.as_ptr()) as _);
            libc::execve(
                self.program.as_ptr(),
                self.argv.as_ptr(),
                self.envp.as_ptr(),
            );
        }
        fail(STEP_EXEC, errno())
    }
}
