//! A running extension process as the supervisor holds it ([`ExtChild`]), whether this process
//! forked it (a tokio child) or the spawner did (a child of this process all the same, watched
//! through its pidfd and reaped here): the same pipes, wait, kill and pid either way.
//!
//! Invariant: a child nobody holds any more is killed, as tokio's `kill_on_drop` does.

use std::io;
#[cfg(target_os = "linux")]
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use tokio::process::Child;

/// A running extension process, however it was started: forked here (a tokio child) or by the
/// spawner (`spawner.rs`: a child of this process watched through its pidfd). Its pipes are the
/// same either way.
#[derive(Debug)]
pub struct ExtChild {
    inner: Inner,
    pub stdin: Option<tokio::net::unix::pipe::Sender>,
    pub stdout: Option<tokio::net::unix::pipe::Receiver>,
    pub stderr: Option<tokio::net::unix::pipe::Receiver>,
}

#[derive(Debug)]
enum Inner {
    Tokio(Child),
    #[cfg(target_os = "linux")]
    Pidfd(Spawned),
}

impl ExtChild {
    /// A child tokio started, its pipes taken over (inside a runtime).
    pub fn from_tokio(mut child: Child) -> io::Result<ExtChild> {
        use tokio::net::unix::pipe;
        let stdin = child
            .stdin
            .take()
            .map(|s| s.into_owned_fd().and_then(pipe::Sender::from_owned_fd))
            .transpose()?;
        let stdout = child
            .stdout
            .take()
            .map(|s| s.into_owned_fd().and_then(pipe::Receiver::from_owned_fd))
            .transpose()?;
        let stderr = child
            .stderr
            .take()
            .map(|s| s.into_owned_fd().and_then(pipe::Receiver::from_owned_fd))
            .transpose()?;
        Ok(ExtChild {
            inner: Inner::Tokio(child),
            stdin,
            stdout,
            stderr,
        })
    }

    #[cfg(target_os = "linux")]
    pub(crate) fn from_spawned(
        spawned: Spawned,
        stdin: tokio::net::unix::pipe::Sender,
        stdout: tokio::net::unix::pipe::Receiver,
        stderr: tokio::net::unix::pipe::Receiver,
    ) -> ExtChild {
        ExtChild {
            inner: Inner::Pidfd(spawned),
            stdin: Some(stdin),
            stdout: Some(stdout),
            stderr: Some(stderr),
        }
    }

    /// The pid, until the exit status has been collected.
    pub fn id(&self) -> Option<u32> {
        match &self.inner {
            Inner::Tokio(c) => c.id(),
            #[cfg(target_os = "linux")]
            Inner::Pidfd(s) => s.id(),
        }
    }

    /// Wait for the exit and collect its status (cancel-safe).
    pub async fn wait(&mut self) -> io::Result<std::process::ExitStatus> {
        match &mut self.inner {
            Inner::Tokio(c) => c.wait().await,
            #[cfg(target_os = "linux")]
            Inner::Pidfd(s) => s.wait().await,
        }
    }

    /// SIGKILL, unless the status was already collected.
    pub fn start_kill(&mut self) -> io::Result<()> {
        match &mut self.inner {
            Inner::Tokio(c) => c.start_kill(),
            #[cfg(target_os = "linux")]
            Inner::Pidfd(s) => s.start_kill(),
        }
    }
}

/// A child the spawner forked for this process: watched through its pidfd, reaped here.
#[cfg(target_os = "linux")]
#[derive(Debug)]
pub(crate) struct Spawned {
    pid: u32,
    pidfd: tokio::io::unix::AsyncFd<OwnedFd>,
    status: Option<std::process::ExitStatus>,
}

#[cfg(target_os = "linux")]
impl Spawned {
    pub(crate) fn new(pid: u32) -> io::Result<Spawned> {
        // SAFETY: a plain system call; the descriptor it returns is ours.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0u32) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned open by the kernel and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        let flags = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFD)?;
        nix::fcntl::fcntl(
            &fd,
            nix::fcntl::FcntlArg::F_SETFD(
                nix::fcntl::FdFlag::from_bits_truncate(flags) | nix::fcntl::FdFlag::FD_CLOEXEC,
            ),
        )?;
        Ok(Spawned {
            pid,
            // SAFETY: the AsyncFd owns the descriptor, which stays open until it is dropped.
            pidfd: unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
            }?,
            status: None,
        })
    }

    pub(crate) fn id(&self) -> Option<u32> {
        self.status.is_none().then_some(self.pid)
    }

    /// Collect the status if the child has exited.
    fn try_wait(&mut self) -> io::Result<Option<std::process::ExitStatus>> {
        if self.status.is_none() {
            self.status = reap(self.pid)?;
        }
        Ok(self.status)
    }

    pub(crate) async fn wait(&mut self) -> io::Result<std::process::ExitStatus> {
        loop {
            if let Some(st) = self.try_wait()? {
                return Ok(st);
            }
            // Readable once the process has exited; the readiness is cleared only after a look
            // that found it still running, so an exit is never missed.
            let mut ready = self.pidfd.readable().await?;
            match reap(self.pid)? {
                Some(st) => {
                    self.status = Some(st);
                    return Ok(st);
                }
                None => ready.clear_ready(),
            }
        }
    }

    pub(crate) fn start_kill(&mut self) -> io::Result<()> {
        if self.try_wait()?.is_some() {
            return Ok(());
        }
        // SAFETY: a plain system call on our pidfd: never another process, even were the pid
        // reused (it cannot be before we reap it).
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.get_ref().as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0u32,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// The status of our child `pid` if it has exited (`waitpid` without blocking).
#[cfg(target_os = "linux")]
fn reap(pid: u32) -> io::Result<Option<std::process::ExitStatus>> {
    let mut raw = 0;
    // SAFETY: waitpid on our own child, with a stack value for the status.
    let r = unsafe { libc::waitpid(pid as libc::pid_t, &mut raw, libc::WNOHANG) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    if r == 0 {
        return Ok(None);
    }
    use std::os::unix::process::ExitStatusExt;
    Ok(Some(std::process::ExitStatus::from_raw(raw)))
}

#[cfg(target_os = "linux")]
impl Drop for Spawned {
    fn drop(&mut self) {
        // As tokio's `kill_on_drop`: a child nobody holds is killed. Its status is collected
        // here if it is already there, else by the orphan reaper once it is no leader.
        if self.status.is_none() {
            let _ = self.start_kill();
            let _ = self.try_wait();
        }
    }
}
