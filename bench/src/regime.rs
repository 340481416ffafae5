//! This machine's two speeds (docs/performance.md, "Machine"), and how to hold the faster one.
//!
//! The VMs' vCPUs halt when idle, and waking one costs more than a pipe round trip's work:
//! the same call measures several times slower on an idle machine than on one kept awake.
//! [`Spinners`] keep it awake with one lowest-priority (`nice -n 19`) busy loop pinned to each
//! CPU; they take CPU time only when nothing else wants it, so what they change is the
//! wake-up cost, not the share of CPU a measured process gets.
//!
//! Invariant: a spinner never outlives its [`Spinners`]: dropping it kills and reaps them, so
//! a failed run leaves none behind, and each asks the kernel to kill it when the process that
//! started it dies, so a killed run leaves none either.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use nix::sched::{CpuSet, sched_setaffinity};
use nix::unistd::Pid;

/// Which speed a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Regime {
    /// Nothing else runs: each wake-up pays for a halted vCPU.
    Idle,
    /// [`Spinners`] keep every vCPU from halting.
    Awake,
}

impl Regime {
    pub fn as_str(self) -> &'static str {
        match self {
            Regime::Idle => "idle",
            Regime::Awake => "awake",
        }
    }
}

/// Lowest-priority busy loops, one pinned to each CPU.
#[derive(Debug)]
pub struct Spinners(Vec<Child>);

impl Spinners {
    /// Start one busy loop per CPU: `nice -n 19 <program> <spin_arg> <cpu>`, where `program`
    /// answers `<spin_arg> <cpu>` by calling [`spin`]. Waits a moment so the scheduler sees
    /// them as CPU-bound before anything is measured. Call it unpinned: the CPUs counted are
    /// those the calling thread may run on.
    pub fn start(program: &Path, spin_arg: &str) -> anyhow::Result<Spinners> {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut s = Spinners(Vec::with_capacity(n));
        for cpu in 0..n {
            let child = Command::new("nice")
                .args(["-n", "19"])
                .arg(program)
                .arg(spin_arg)
                .arg(cpu.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .context("starting a `nice -n 19` busy loop")?;
            s.0.push(child);
        }
        std::thread::sleep(Duration::from_millis(300));
        Ok(s)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Run the calling thread (and the children it spawns from now on, which inherit it) on `cpu`
/// only, or on every CPU for `None`.
///
/// Where two processes that ping-pong run moves a round trip more than anything the code does
/// (one CPU: two context switches; two CPUs: a wake-up of the other CPU each message), and the
/// scheduler picks anew for every child; pinning makes one run comparable with the next.
pub fn pin_to(cpu: Option<usize>) -> anyhow::Result<()> {
    sched_setaffinity(Pid::from_raw(0), &cpu_set(cpu)?).context("sched_setaffinity")
}

/// `cpu` alone, or every CPU for `None`.
fn cpu_set(cpu: Option<usize>) -> anyhow::Result<CpuSet> {
    let mut set = CpuSet::new();
    match cpu {
        Some(c) => set.set(c).context("CPU number")?,
        None => {
            // Every CPU the set can name, not `available_parallelism()`: that counts the CPUs
            // this thread may use *now*, so a thread pinned to one CPU would stay pinned. The
            // kernel keeps the ones that exist.
            for c in 0..CpuSet::count() {
                set.set(c).context("CPU number")?;
            }
        }
    }
    Ok(set)
}

/// Move every thread of process `pid` to `cpu` (or to every CPU for `None`): for a process
/// started by another (an extension the daemon spawned), which no fork of ours could place.
/// Threads it starts afterwards inherit the mask of the thread that starts them.
pub fn pin_process(pid: u32, cpu: Option<usize>) -> anyhow::Result<()> {
    let set = cpu_set(cpu)?;
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .with_context(|| format!("listing the threads of {pid}"))?;
    for task in tasks.flatten() {
        if let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<i32>().ok())
        {
            sched_setaffinity(Pid::from_raw(tid), &set)
                .with_context(|| format!("sched_setaffinity of thread {tid} of {pid}"))?;
        }
    }
    Ok(())
}

/// Where a benchmark's host runs and where the children it spawns run (`None`: anywhere, or
/// for the child, wherever the host may run).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cpus {
    pub host: Option<usize>,
    pub child: Option<usize>,
}

impl Cpus {
    /// Pin the calling thread where the host runs.
    pub fn pin_host(&self) -> anyhow::Result<()> {
        pin_to(self.host)
    }

    /// Run `spawn` (which forks a child from this thread) so that the child starts on
    /// `self.child`: a child inherits the CPU mask of the thread that forks it, so the thread
    /// moves there for the fork and back to the host's CPU after.
    pub fn spawn_with<T>(&self, spawn: impl FnOnce() -> T) -> T {
        if self.child.is_none() {
            return spawn();
        }
        // Best effort: a mask that cannot be set leaves the child where the host is, which the
        // figures of that placement would show.
        let _ = pin_to(self.child);
        let res = spawn();
        let _ = pin_to(self.host);
        res
    }
}

/// Keep CPU `cpu` busy until killed.
///
/// Pinned, because the load balancer weighs nice-19 loops by their tiny share and may stack
/// two on one CPU, leaving the other free to halt. No `pause` in the loop: a hypervisor may
/// take a pause loop for a spinning lock and deschedule the vCPU, the opposite of the point.
pub fn spin(cpu: usize) -> anyhow::Result<std::convert::Infallible> {
    // Die with the benchmark even when it is killed (Ctrl-C, SIGKILL) and cannot drop its
    // `Spinners`: an orphaned busy loop would skew every later measurement on the machine.
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .context("asking to die with the benchmark")?;
    if nix::unistd::getppid() == Pid::from_raw(1) {
        anyhow::bail!("the benchmark that started this busy loop is gone");
    }
    let mut set = CpuSet::new();
    set.set(cpu).context("CPU number")?;
    sched_setaffinity(Pid::from_raw(0), &set).context("pinning the busy loop")?;
    let mut x = 0u64;
    loop {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}
