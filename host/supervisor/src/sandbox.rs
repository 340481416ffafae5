//! The filesystem sandbox of an extension: Landlock on Linux, applied in the child between fork
//! and exec, so the extension and everything it starts are held to it.
//!
//! By default an extension may read (and execute from) its package folder and the system's
//! libraries and interpreters ([`SYSTEM_READ`]), and read and write its data directory, its
//! temporary folder and a few device files ([`DEVICE_WRITE`]). Anything more is declared by the
//! package and granted by the operator (the host decides; this module only applies a list).
//! Everything else — the operator's home, `~/.ssh`, other extensions' data — is refused with
//! `EACCES`.
//!
//! The ruleset is built in the parent (it allocates and opens paths, which a forked child of a
//! multi-threaded process must not); the child only calls `prctl(PR_SET_NO_NEW_PRIVS)` and
//! `landlock_restrict_self` on its descriptor, both async-signal-safe. Where the kernel has no
//! Landlock (old kernels, disabled at boot, macOS) nothing is applied and [`SandboxStatus`] says
//! so; nothing pretends.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// What every extension may read and execute: system libraries, interpreters and
/// configuration. Paths that do not exist here are skipped.
pub const SYSTEM_READ: &[&str] = &[
    "/usr",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/bin",
    "/sbin",
    "/etc",
    "/proc",
    "/sys",
    "/dev",
    "/run/systemd/resolve",
];

/// Device files every extension may write (and `/dev/shm`, where Python's multiprocessing
/// keeps its semaphores).
pub const DEVICE_WRITE: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/shm",
];

/// The paths one extension may read and write.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxRules {
    pub read: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
}

impl SandboxRules {
    /// The defaults for a package in `package_dir` with `data_dir` and `tmp_dir`.
    pub fn defaults(package_dir: &Path, data_dir: &Path, tmp_dir: &Path) -> Self {
        let mut read: Vec<PathBuf> = SYSTEM_READ.iter().map(PathBuf::from).collect();
        read.push(package_dir.to_owned());
        let mut write: Vec<PathBuf> = vec![data_dir.to_owned(), tmp_dir.to_owned()];
        write.extend(DEVICE_WRITE.iter().map(PathBuf::from));
        SandboxRules { read, write }
    }

    /// Add granted paths.
    pub fn grant(mut self, read: &[PathBuf], write: &[PathBuf]) -> Self {
        self.read.extend(read.iter().cloned());
        self.write.extend(write.iter().cloned());
        self
    }
}

/// What the sandbox of a run is, for `ext status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum SandboxStatus {
    /// Landlock is enforced with this ABI. The lists are shared, not copied, by every copy of a
    /// status (the host copies each extension's status several times a pass).
    Landlock {
        abi: u32,
        #[serde(with = "shared_paths")]
        read: Arc<[PathBuf]>,
        #[serde(with = "shared_paths")]
        write: Arc<[PathBuf]>,
    },
    /// The operator turned it off for this package.
    Off,
    /// It was asked for but this system cannot apply it.
    Unavailable { reason: String },
}

impl SandboxStatus {
    /// One line for people.
    pub fn summary(&self) -> String {
        match self {
            SandboxStatus::Landlock { abi, read, write } => format!(
                "Landlock (ABI {abi}): reads {} paths, writes {}",
                read.len(),
                write
                    .iter()
                    .filter(|p| !p.starts_with("/dev"))
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            SandboxStatus::Off => "off (the operator's choice)".into(),
            SandboxStatus::Unavailable { reason } => format!("none: {reason}"),
        }
    }
}

/// A shared list of paths, written and read as a plain list.
mod shared_paths {
    use std::path::PathBuf;
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(super) fn serialize<S: Serializer>(
        paths: &Arc<[PathBuf]>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        paths.as_ref().serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<[PathBuf]>, D::Error> {
        Vec::<PathBuf>::deserialize(d).map(Arc::from)
    }
}

/// The Landlock ABI the running kernel offers, or why there is none.
pub fn landlock_abi() -> Result<u32, String> {
    #[cfg(target_os = "linux")]
    {
        const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
        // SAFETY: with a null attribute, size 0 and the VERSION flag the call only returns the
        // ABI version (or fails); it creates nothing.
        let v = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<libc::c_void>(),
                0usize,
                LANDLOCK_CREATE_RULESET_VERSION,
            )
        };
        if v > 0 {
            return Ok(v as u32);
        }
        let e = std::io::Error::last_os_error();
        Err(match e.raw_os_error() {
            Some(libc::ENOSYS) => "this kernel has no Landlock (Linux 5.13 or later has it)".into(),
            Some(libc::EOPNOTSUPP) => {
                "Landlock is disabled on this system (see the `lsm=` boot parameter)".into()
            }
            _ => format!("Landlock cannot be queried: {e}"),
        })
    }
    #[cfg(not(target_os = "linux"))]
    {
        Err(
            "Landlock exists only on Linux; this system has no filesystem sandbox for extensions"
                .into(),
        )
    }
}

/// A ruleset ready for a child to restrict itself with.
#[derive(Debug)]
pub struct Prepared {
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) fd: OwnedFd,
    pub abi: u32,
}

/// Build the ruleset for `rules` in this process. `Err` says why the sandbox cannot be had.
pub fn prepare(rules: &SandboxRules) -> Result<Prepared, String> {
    let abi = landlock_abi()?;
    #[cfg(target_os = "linux")]
    {
        use landlock::{
            ABI, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, path_beneath_rules,
        };
        // The file-system rights of ABI 5 (ABI 6 and 7 add no file-system rights); an older
        // kernel gets what it has (best effort), which `abi` reports.
        let target = ABI::V5;
        let err = |e: landlock::RulesetError| format!("cannot build the Landlock ruleset: {e}");
        let created = Ruleset::default()
            .handle_access(AccessFs::from_all(target))
            .map_err(err)?
            .create()
            .map_err(err)?
            .add_rules(path_beneath_rules(&rules.read, AccessFs::from_read(target)))
            .map_err(err)?
            .add_rules(path_beneath_rules(&rules.write, AccessFs::from_all(target)))
            .map_err(err)?;
        let fd: Option<OwnedFd> = created.into();
        let fd = fd.ok_or("the kernel refused to create a Landlock ruleset")?;
        Ok(Prepared { fd, abi })
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (rules, abi);
        Err("no Landlock on this system".into())
    }
}

/// In the child, between fork and exec: restrict this process to the ruleset `fd`.
/// Async-signal-safe (two system calls, no allocation).
#[cfg(target_os = "linux")]
pub(crate) fn restrict_self(fd: std::os::fd::RawFd) -> std::io::Result<()> {
    // SAFETY: plain system calls with constant or integer arguments.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_read_the_package_and_write_only_data_and_temp() {
        let r = SandboxRules::defaults(Path::new("/p"), Path::new("/d"), Path::new("/t"));
        assert!(r.read.contains(&PathBuf::from("/p")));
        assert!(r.read.contains(&PathBuf::from("/usr")));
        assert!(
            !r.read
                .iter()
                .any(|p| p.starts_with("/home") || p.starts_with("/root"))
        );
        let w: Vec<_> = r.write.iter().filter(|p| !p.starts_with("/dev")).collect();
        assert_eq!(w, [Path::new("/d"), Path::new("/t")]);
    }

    #[test]
    fn a_landlock_status_is_written_and_read_as_plain_lists() {
        let st = SandboxStatus::Landlock {
            abi: 7,
            read: vec![PathBuf::from("/usr")].into(),
            write: vec![PathBuf::from("/d"), PathBuf::from("/t")].into(),
        };
        let text = serde_json::to_string(&st).unwrap();
        assert_eq!(
            text,
            r#"{"state":"landlock","abi":7,"read":["/usr"],"write":["/d","/t"]}"#
        );
        assert_eq!(serde_json::from_str::<SandboxStatus>(&text).unwrap(), st);
    }

    #[test]
    fn the_abi_is_reported_or_the_reason_there_is_none() {
        match landlock_abi() {
            Ok(v) => assert!(v >= 1),
            Err(why) => assert!(!why.is_empty()),
        }
    }
}
