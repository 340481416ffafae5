//! Per-extension cgroups in a delegated cgroup v2 subtree (systemd's `Delegate=yes`).
//!
//! ```text
//!   <delegated root>/                 the daemon's own cgroup, handed to it by systemd
//!   ├── cgroup.subtree_control        "+memory +cpu +pids" written here
//!   ├── daemon/cgroup.procs           the daemon moves itself here (no process may stay in an
//!   │                                 inner node whose children have controllers)
//!   └── ext-<name>/                   one per extension: memory.max, cpu.max, pids.max;
//!       └── cgroup.procs              the child writes itself here between fork and exec
//! ```
//!
//! Used only when the daemon is told its cgroup is delegated ([`DELEGATED_ENV`], which the
//! generated systemd unit sets beside `Delegate=yes`): being able to write to a cgroup (root
//! can write to any) does not make it the daemon's to divide. Everything here takes the
//! subtree's path, so the tests lay out a scratch folder like a delegated subtree and never
//! touch the machine's cgroups.

use std::ffi::CStr;
use std::io;
use std::path::{Path, PathBuf};

use crate::limits::Limits;

/// Set to `delegated` (by the generated systemd unit) when the daemon's cgroup is its own.
pub const DELEGATED_ENV: &str = "CONDUIT_CGROUPS";

/// The period of `cpu.max`, in microseconds.
pub const CPU_PERIOD_US: u64 = 100_000;

/// The controllers the daemon enables for its extensions.
pub const CONTROLLERS: &[&str] = &["memory", "cpu", "pids"];

/// The cgroup folder of this process, from the text of `/proc/self/cgroup` (the v2 line
/// `0::/path`) under the cgroup2 mount point `mount`.
pub fn own_cgroup(mount: &Path, proc_self_cgroup: &str) -> Option<PathBuf> {
    let rel = proc_self_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))?
        .trim()
        .trim_start_matches('/');
    Some(mount.join(rel))
}

/// A delegated subtree the daemon divides among its extensions.
#[derive(Clone, Debug)]
pub struct Delegated {
    root: PathBuf,
}

impl Delegated {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Delegated { root: root.into() }
    }

    /// The daemon's delegated cgroup, when [`DELEGATED_ENV`] says it has one.
    pub fn from_env() -> Option<Delegated> {
        if std::env::var(DELEGATED_ENV).ok()?.trim() != "delegated" {
            return None;
        }
        let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        own_cgroup(Path::new("/sys/fs/cgroup"), &text).map(Delegated::new)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Move process `pid` (the daemon) into `daemon/` and enable the [`CONTROLLERS`] the
    /// subtree offers for the children. Returns the controllers enabled.
    pub fn prepare(&self, pid: u32) -> io::Result<Vec<String>> {
        let leaf = self.root.join("daemon");
        mkdir(&leaf)?;
        std::fs::write(leaf.join("cgroup.procs"), format!("{pid}\n"))?;
        let offered = std::fs::read_to_string(self.root.join("cgroup.controllers"))?;
        let enable: Vec<String> = offered
            .split_whitespace()
            .filter(|c| CONTROLLERS.contains(c))
            .map(str::to_owned)
            .collect();
        if !enable.is_empty() {
            let line: Vec<String> = enable.iter().map(|c| format!("+{c}")).collect();
            std::fs::write(self.root.join("cgroup.subtree_control"), line.join(" "))?;
        }
        Ok(enable)
    }

    /// The folder of extension `name`.
    pub fn dir(&self, name: &str) -> PathBuf {
        self.root.join(format!("ext-{name}"))
    }

    /// Create (or reuse) extension `name`'s cgroup and write its limits.
    pub fn create(&self, name: &str, limits: &Limits) -> io::Result<PathBuf> {
        let dir = self.dir(name);
        mkdir(&dir)?;
        write_limits(&dir, limits)?;
        Ok(dir)
    }

    /// Remove extension `name`'s cgroup (it must hold no process).
    pub fn remove(&self, name: &str) -> io::Result<()> {
        match std::fs::remove_dir(self.dir(name)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }
}

fn mkdir(dir: &Path) -> io::Result<()> {
    match std::fs::create_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        r => r,
    }
}

/// `memory.max`, `memory.swap.max` (0: the limit is on memory, not pushed into swap),
/// `cpu.max` and `pids.max` of one cgroup.
pub fn write_limits(dir: &Path, l: &Limits) -> io::Result<()> {
    std::fs::write(dir.join("memory.max"), format!("{}\n", l.memory))?;
    std::fs::write(dir.join("memory.swap.max"), "0\n")?;
    let quota = ((l.cpu * CPU_PERIOD_US as f64).round() as u64).max(1000);
    std::fs::write(dir.join("cpu.max"), format!("{quota} {CPU_PERIOD_US}\n"))?;
    std::fs::write(dir.join("pids.max"), format!("{}\n", l.tasks))?;
    Ok(())
}

/// What a cgroup says of its use and its kills.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupUse {
    pub memory_bytes: u64,
    pub tasks: u32,
    pub cpu_usec: u64,
    /// How many times the kernel killed a process of it for memory (`memory.events`).
    pub oom_kills: u64,
}

/// Read `memory.current`, `pids.current`, `cpu.stat` and `memory.events` of `dir`.
pub fn read_use(dir: &Path) -> CgroupUse {
    let num = |f: &str| -> u64 {
        std::fs::read_to_string(dir.join(f))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    let field = |f: &str, key: &str| -> u64 {
        std::fs::read_to_string(dir.join(f))
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| {
                    let (k, v) = l.split_once(' ')?;
                    (k == key).then(|| v.trim().parse().ok())?
                })
            })
            .unwrap_or(0)
    };
    CgroupUse {
        memory_bytes: num("memory.current"),
        tasks: num("pids.current") as u32,
        cpu_usec: field("cpu.stat", "usage_usec"),
        oom_kills: field("memory.events", "oom_kill"),
    }
}

/// In the child, between fork and exec: move this process into the cgroup whose
/// `cgroup.procs` is `procs`. Async-signal-safe (open, write, close).
pub(crate) fn join_in_child(procs: &CStr) -> io::Result<()> {
    // SAFETY: plain system calls on a NUL-terminated path and a static buffer.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = libc::write(fd, b"0\n".as_ptr().cast(), 2);
        let err = io::Error::last_os_error();
        libc::close(fd);
        if n != 2 {
            return Err(err);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch folder laid out like a delegated cgroup v2 subtree.
    fn scratch() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("cgroup.controllers"),
            "cpuset cpu io memory pids\n",
        )
        .unwrap();
        std::fs::write(d.path().join("cgroup.subtree_control"), "").unwrap();
        std::fs::write(d.path().join("cgroup.procs"), "").unwrap();
        d
    }

    #[test]
    fn the_own_cgroup_is_the_v2_line_under_the_mount() {
        let text = "12:pids:/ignored\n0::/system.slice/conduit.service\n";
        assert_eq!(
            own_cgroup(Path::new("/sys/fs/cgroup"), text).unwrap(),
            Path::new("/sys/fs/cgroup/system.slice/conduit.service")
        );
        assert_eq!(own_cgroup(Path::new("/m"), "1:name=systemd:/x\n"), None);
    }

    #[test]
    fn prepare_moves_the_daemon_to_a_leaf_and_enables_the_controllers_offered() {
        let d = scratch();
        let g = Delegated::new(d.path());
        let enabled = g.prepare(4242).unwrap();
        assert_eq!(enabled, ["cpu", "memory", "pids"]);
        assert_eq!(
            std::fs::read_to_string(d.path().join("cgroup.subtree_control")).unwrap(),
            "+cpu +memory +pids"
        );
        assert_eq!(
            std::fs::read_to_string(d.path().join("daemon/cgroup.procs")).unwrap(),
            "4242\n"
        );
    }

    #[test]
    fn an_extension_cgroup_gets_its_limits_and_reports_its_use() {
        let d = scratch();
        let g = Delegated::new(d.path());
        let l = Limits {
            memory: 256 << 20,
            cpu: 0.25,
            tasks: 64,
            open_files: 1024,
        };
        let dir = g.create("notes", &l).unwrap();
        assert_eq!(dir, d.path().join("ext-notes"));
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
        assert_eq!(read("memory.max"), "268435456\n");
        assert_eq!(read("memory.swap.max"), "0\n");
        assert_eq!(read("cpu.max"), "25000 100000\n");
        assert_eq!(read("pids.max"), "64\n");
        // Created again (a restart): reused, limits rewritten.
        g.create("notes", &Limits { tasks: 8, ..l }).unwrap();
        assert_eq!(read("pids.max"), "8\n");
        // What the kernel would write, read back.
        std::fs::write(dir.join("memory.current"), "1048576\n").unwrap();
        std::fs::write(dir.join("pids.current"), "3\n").unwrap();
        std::fs::write(dir.join("cpu.stat"), "usage_usec 12345\nuser_usec 10000\n").unwrap();
        std::fs::write(
            dir.join("memory.events"),
            "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n",
        )
        .unwrap();
        assert_eq!(
            read_use(&dir),
            CgroupUse {
                memory_bytes: 1 << 20,
                tasks: 3,
                cpu_usec: 12345,
                oom_kills: 1
            }
        );
    }

    #[test]
    fn a_child_joins_by_writing_zero_to_cgroup_procs() {
        let d = scratch();
        let procs = d.path().join("cgroup.procs");
        let c = std::ffi::CString::new(procs.to_str().unwrap()).unwrap();
        join_in_child(&c).unwrap();
        assert_eq!(std::fs::read_to_string(&procs).unwrap(), "0\n");
        let missing = std::ffi::CString::new("/nonexistent/cgroup.procs").unwrap();
        assert!(join_in_child(&missing).is_err());
    }
}
