//! This machine's two speeds (SPEC §12), and how to hold the faster one.
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
    /// them as CPU-bound before anything is measured.
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
