//! The state directory: where it is, what it holds, and the lock that keeps one daemon on it.
//!
//! ```text
//! <state>/                 0700, owned by the user running conduit
//! ├── daemon.lock          flock(LOCK_EX) held by the running daemon; holds its pid
//! ├── packages/            installed packages and their registry (see the `packages` module)
//! ├── logs/                per-package stderr logs
//! ├── run/                 the management socket
//! ├── artifacts/           artifact contents, addressed by digest
//! └── tmp/                 scratch space on the same file system, for atomic renames
//! ```
//!
//! Where the directory is comes from [`resolve`], a pure function of the `--state-dir` flag, an
//! environment lookup and the platform, so every rule is testable without touching the process
//! environment.
//!
//! Invariant: after [`StateDir::open`] returns, the directory and every folder of the layout exist,
//! are owned by the current user and are accessible to that user only (mode 0700). A directory
//! owned by someone else is refused, never adopted: its owner could replace the package code the
//! daemon runs. A directory the user owns with a looser mode is tightened to 0700 and a warning is
//! logged, since refusing would only make the operator type the `chmod` we can do for them.
//!
//! Commands that only read (`ext list`, `metrics`, `doctor`, …) take [`StateDir::read_only`]
//! instead: it creates nothing and changes no mode, so a query never writes to disk.
//!
//! This module does not create or clean any file inside the layout folders; their owners do.

use std::ffi::OsString;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// The environment variable that names the state directory when no flag does.
pub const STATE_DIR_ENV: &str = "CONDUIT_STATE_DIR";

/// The name of the lock file, directly in the state directory.
pub const DAEMON_LOCK_FILE: &str = "daemon.lock";

/// The mode of the state directory and of every folder of its layout.
const PRIVATE_DIR_MODE: u32 = 0o700;

/// Which platform convention picks the default state directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    /// The XDG base directory convention (Linux and the other Unix systems):
    /// `$XDG_STATE_HOME/conduit`, else `~/.local/state/conduit`.
    Xdg,
    /// macOS: `~/Library/Application Support/conduit`.
    MacOs,
}

impl Platform {
    /// The platform this binary was built for.
    pub fn current() -> Platform {
        if cfg!(target_os = "macos") {
            Platform::MacOs
        } else {
            Platform::Xdg
        }
    }
}

/// Which rule chose the state directory; worth showing to an operator who wonders why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateDirSource {
    /// The `--state-dir` flag.
    Flag,
    /// The `CONDUIT_STATE_DIR` environment variable.
    Env,
    /// The platform's default.
    PlatformDefault,
}

impl fmt::Display for StateDirSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StateDirSource::Flag => "--state-dir",
            StateDirSource::Env => STATE_DIR_ENV,
            StateDirSource::PlatformDefault => "the platform default",
        })
    }
}

/// A state directory path and the rule that chose it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedStateDir {
    pub path: PathBuf,
    pub source: StateDirSource,
}

/// Why the state directory could not be found, created or locked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateDirError {
    #[error(
        "cannot choose a state directory: $HOME is not set; pass --state-dir or set {STATE_DIR_ENV}"
    )]
    NoHome,
    #[error(
        "state directory {path} is owned by uid {owner}, not by the user running conduit (uid {uid}); use a state directory you own (--state-dir or {STATE_DIR_ENV})"
    )]
    NotOwned { path: PathBuf, owner: u32, uid: u32 },
    #[error(
        "state directory {path} exists but is not a directory; remove it or choose another --state-dir"
    )]
    NotADirectory { path: PathBuf },
    /// The message carries the I/O error itself (`cause` is deliberately not `source()`), so
    /// a chain printer does not repeat it.
    #[error("cannot prepare state directory {path}: {cause}", path = path.display())]
    Io { path: PathBuf, cause: io::Error },
    #[error(
        "another conduit daemon ({}) holds the lock on {path}; stop it first, or give this one another --state-dir",
        match .pid { Some(pid) => format!("pid {pid}"), None => "pid unknown".to_owned() }
    )]
    Locked { path: PathBuf, pid: Option<u32> },
}

impl StateDirError {
    fn io(path: &Path, cause: io::Error) -> StateDirError {
        StateDirError::Io {
            path: path.to_owned(),
            cause,
        }
    }

    /// Whether retrying cannot help until someone changes the configuration: no home, a
    /// directory owned by someone else or not a directory, permissions, a read-only file
    /// system, another daemon holding the lock. A full disk or another I/O error may pass.
    pub fn is_permanent(&self) -> bool {
        match self {
            StateDirError::Io { cause, .. } => matches!(
                cause.raw_os_error().map(Errno::from_raw),
                Some(
                    Errno::EACCES
                        | Errno::EPERM
                        | Errno::EROFS
                        | Errno::ENOTDIR
                        | Errno::ELOOP
                        | Errno::ENAMETOOLONG
                )
            ),
            _ => true,
        }
    }
}

/// Chooses the state directory: `flag`, else `$CONDUIT_STATE_DIR`, else the platform default.
///
/// `env` looks a variable up (`|k| std::env::var_os(k)` in production). Empty values count as
/// unset, and a relative `$XDG_STATE_HOME` is ignored, as the XDG specification asks. The path is
/// returned as given; [`StateDir::open`] makes it absolute.
pub fn resolve(
    flag: Option<&Path>,
    env: impl Fn(&str) -> Option<OsString>,
    platform: Platform,
) -> Result<ResolvedStateDir, StateDirError> {
    let non_empty = |key: &str| env(key).filter(|v| !v.is_empty());
    if let Some(path) = flag.filter(|p| !p.as_os_str().is_empty()) {
        return Ok(ResolvedStateDir {
            path: path.to_owned(),
            source: StateDirSource::Flag,
        });
    }
    if let Some(path) = non_empty(STATE_DIR_ENV) {
        return Ok(ResolvedStateDir {
            path: path.into(),
            source: StateDirSource::Env,
        });
    }
    let path = match platform {
        Platform::Xdg => match non_empty("XDG_STATE_HOME").map(PathBuf::from) {
            Some(xdg) if xdg.is_absolute() => xdg.join("conduit"),
            _ => home(&non_empty)?.join(".local/state/conduit"),
        },
        Platform::MacOs => home(&non_empty)?.join("Library/Application Support/conduit"),
    };
    Ok(ResolvedStateDir {
        path,
        source: StateDirSource::PlatformDefault,
    })
}

/// [`resolve`] with this process's environment and platform.
pub fn resolve_from_env(flag: Option<&Path>) -> Result<ResolvedStateDir, StateDirError> {
    resolve(flag, |k| std::env::var_os(k), Platform::current())
}

fn home(non_empty: &impl Fn(&str) -> Option<OsString>) -> Result<PathBuf, StateDirError> {
    non_empty("HOME")
        .map(PathBuf::from)
        .ok_or(StateDirError::NoHome)
}

/// An opened state directory with its layout in place. Cheap to clone; holds no file open.
#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
    tightened_from: Option<u32>,
}

impl StateDir {
    /// Creates (if needed) the state directory at `path` and its layout, all mode 0700.
    ///
    /// A relative `path` is made absolute against the current directory, so later changes of
    /// directory do not move the state.
    pub fn open(path: impl AsRef<Path>) -> Result<StateDir, StateDirError> {
        let path = path.as_ref();
        let root = std::path::absolute(path).map_err(|e| StateDirError::io(path, e))?;
        if let Some(parent) = root.parent() {
            // Parents get the ordinary mode: they are the user's folders (`~/.local/state`),
            // not ours to lock down.
            fs::create_dir_all(parent).map_err(|e| StateDirError::io(parent, e))?;
        }
        let mut tightened_from = ensure_private_dir(&root, true)?;
        for sub in LAYOUT {
            tightened_from = tightened_from.or(ensure_private_dir(&root.join(sub), false)?);
        }
        Ok(StateDir {
            root,
            tightened_from,
        })
    }

    /// A handle on the state directory at `path` for a command that only reads it: nothing is
    /// created and no mode is changed. The directory may be missing (then nothing is installed
    /// and no daemon runs on it, and every read finds nothing); one that exists must be a
    /// directory owned by this user, as for [`StateDir::open`]. Loose modes are left as they
    /// are ([`StateDir::open`], which the daemon and installs call, tightens them).
    pub fn read_only(path: impl AsRef<Path>) -> Result<StateDir, StateDirError> {
        let path = path.as_ref();
        let root = std::path::absolute(path).map_err(|e| StateDirError::io(path, e))?;
        match fs::metadata(&root) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(StateDirError::io(&root, e)),
            Ok(meta) if !meta.is_dir() => {
                return Err(StateDirError::NotADirectory { path: root });
            }
            Ok(meta) => {
                let uid = nix::unistd::geteuid().as_raw();
                if meta.uid() != uid {
                    return Err(StateDirError::NotOwned {
                        path: root,
                        owner: meta.uid(),
                        uid,
                    });
                }
            }
        }
        Ok(StateDir {
            root,
            tightened_from: None,
        })
    }

    /// Whether the directory exists (a [`StateDir::read_only`] handle may name a missing one).
    pub fn exists(&self) -> bool {
        self.root.is_dir()
    }

    /// The state directory itself (absolute).
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// If [`StateDir::open`] found the root (or a layout folder) open to other users and tightened
    /// it to 0700, the mode it had. Lets a CLI without a log subscriber tell the operator.
    pub fn tightened_from(&self) -> Option<u32> {
        self.tightened_from
    }

    /// `<state>/packages`: installed packages and their registry.
    pub fn packages_dir(&self) -> PathBuf {
        self.root.join(PACKAGES)
    }

    /// `<state>/logs`: per-package stderr logs.
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join(LOGS)
    }

    /// `<state>/run`: the management socket.
    pub fn run_dir(&self) -> PathBuf {
        self.root.join(RUN)
    }

    /// `<state>/artifacts`: artifact contents.
    pub fn artifacts_dir(&self) -> PathBuf {
        self.root.join(ARTIFACTS)
    }

    /// `<state>/tmp`: scratch space on the state's file system, so a staged file can be renamed
    /// into place atomically.
    pub fn tmp_dir(&self) -> PathBuf {
        self.root.join(TMP)
    }

    /// `<state>/daemon.lock`.
    pub fn lock_path(&self) -> PathBuf {
        self.root.join(DAEMON_LOCK_FILE)
    }

    /// Takes the daemon lock: an exclusive, non-blocking `flock` on `daemon.lock`, and writes this
    /// process's pid into the file (if it can: a full disk leaves the file empty, with a warning).
    ///
    /// Fails at once with [`StateDirError::Locked`], naming the holder's pid, if another open of
    /// the file (in this process or another) holds it. The lock lasts as long as the guard, and
    /// the kernel drops it when the process dies however it dies, so a stale file never blocks.
    pub fn lock_exclusive(&self) -> Result<DaemonLock, StateDirError> {
        let path = self.lock_path();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| StateDirError::io(&path, e))?;
        let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((mut file, Errno::EWOULDBLOCK)) => {
                let pid = read_pid(&mut file);
                return Err(StateDirError::Locked { path, pid });
            }
            Err((_, errno)) => return Err(StateDirError::io(&path, errno.into())),
        };
        let pid = std::process::id();
        let write = |f: &mut File| -> io::Result<()> {
            f.set_len(0)?;
            f.seek(SeekFrom::Start(0))?;
            writeln!(f, "{pid}")?;
            f.sync_all()
        };
        // The lock is the flock, not the pid: a pid that cannot be written (a full disk) only
        // makes a second daemon's refusal say "pid unknown", so it must not keep this one down.
        if let Err(e) = write(&mut lock) {
            let _ = lock.set_len(0);
            tracing::warn!(path = %path.display(), error = %e, "cannot write the pid into the lock file; holding the lock without it");
        }
        Ok(DaemonLock { lock, path, pid })
    }
}

/// Reads the pid a lock holder wrote; `None` if it has not written it yet or wrote garbage.
fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.take(64).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

/// Proof that this process is the one daemon on a state directory. Dropping it releases the lock.
#[derive(Debug)]
pub struct DaemonLock {
    lock: Flock<File>,
    path: PathBuf,
    pid: u32,
}

impl DaemonLock {
    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The pid written into the lock file (this process's).
    pub fn pid(&self) -> u32 {
        self.pid
    }
}

impl Drop for DaemonLock {
    fn drop(&mut self) {
        // Clear the pid while still holding the lock, so nobody reads a pid that no longer
        // holds it. Failing to is harmless: the pid is only read while the lock is held.
        let _ = self.lock.set_len(0);
    }
}

const PACKAGES: &str = "packages";
const LOGS: &str = "logs";
const RUN: &str = "run";
const ARTIFACTS: &str = "artifacts";
const TMP: &str = "tmp";

/// The folders of the layout, directly under the state directory, each mode 0700.
pub const LAYOUT: [&str; 5] = [PACKAGES, LOGS, RUN, ARTIFACTS, TMP];

/// The mode of the state directory and of every folder of its layout.
pub const PRIVATE_MODE: u32 = PRIVATE_DIR_MODE;

/// Makes sure `dir` is a directory owned by us with mode 0700; returns the mode it had if that let
/// other users in and had to be tightened.
///
/// `follow` allows `dir` to be a symlink to a directory: the root may be one (a common way to keep
/// state on another disk), but a layout folder replaced by a symlink is not ours and is refused.
fn ensure_private_dir(dir: &Path, follow: bool) -> Result<Option<u32>, StateDirError> {
    match fs::DirBuilder::new().mode(PRIVATE_DIR_MODE).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(StateDirError::io(dir, e)),
    }
    let meta = if follow {
        fs::metadata(dir)
    } else {
        fs::symlink_metadata(dir)
    }
    .map_err(|e| StateDirError::io(dir, e))?;
    if !meta.is_dir() {
        return Err(StateDirError::NotADirectory {
            path: dir.to_owned(),
        });
    }
    let uid = nix::unistd::geteuid().as_raw();
    if meta.uid() != uid {
        return Err(StateDirError::NotOwned {
            path: dir.to_owned(),
            owner: meta.uid(),
            uid,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode == PRIVATE_DIR_MODE {
        return Ok(None);
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(PRIVATE_DIR_MODE))
        .map_err(|e| StateDirError::io(dir, e))?;
    if mode & 0o077 == 0 {
        // Only the owner's own bits differed (say 0500): nothing was exposed, nothing to report.
        return Ok(None);
    }
    tracing::warn!(
        path = %dir.display(),
        "a state directory folder had mode {mode:04o}, open to other users; set it to 0700 so that only its owner can read or replace what conduit runs"
    );
    Ok(Some(mode))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::io::BufRead;
    use std::process::{Command, Stdio};

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let vars: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |k| vars.get(k).cloned()
    }

    fn check(
        flag: Option<&str>,
        vars: &[(&str, &str)],
        platform: Platform,
    ) -> (String, StateDirSource) {
        let r = resolve(flag.map(Path::new), env(vars), platform).unwrap();
        (r.path.display().to_string(), r.source)
    }

    #[test]
    fn flag_wins_over_env_and_default() {
        let vars = [
            ("CONDUIT_STATE_DIR", "/env"),
            ("HOME", "/home/u"),
            ("XDG_STATE_HOME", "/xdg"),
        ];
        assert_eq!(
            check(Some("/flag"), &vars, Platform::Xdg),
            ("/flag".into(), StateDirSource::Flag)
        );
        assert_eq!(
            check(None, &vars, Platform::Xdg),
            ("/env".into(), StateDirSource::Env)
        );
        assert_eq!(
            check(None, &vars, Platform::MacOs),
            ("/env".into(), StateDirSource::Env)
        );
    }

    #[test]
    fn empty_values_count_as_unset() {
        let vars = [
            ("CONDUIT_STATE_DIR", ""),
            ("HOME", "/home/u"),
            ("XDG_STATE_HOME", ""),
        ];
        assert_eq!(
            check(Some(""), &vars, Platform::Xdg),
            (
                "/home/u/.local/state/conduit".into(),
                StateDirSource::PlatformDefault
            )
        );
    }

    #[test]
    fn xdg_default() {
        let home = [("HOME", "/home/u")];
        assert_eq!(
            check(None, &home, Platform::Xdg).0,
            "/home/u/.local/state/conduit"
        );
        let xdg = [("HOME", "/home/u"), ("XDG_STATE_HOME", "/srv/state")];
        assert_eq!(check(None, &xdg, Platform::Xdg).0, "/srv/state/conduit");
        // The XDG specification says a relative value is invalid and must be ignored.
        let relative = [("HOME", "/home/u"), ("XDG_STATE_HOME", "state")];
        assert_eq!(
            check(None, &relative, Platform::Xdg).0,
            "/home/u/.local/state/conduit"
        );
    }

    #[test]
    fn macos_default_ignores_xdg() {
        let vars = [("HOME", "/Users/u"), ("XDG_STATE_HOME", "/xdg")];
        assert_eq!(
            check(None, &vars, Platform::MacOs).0,
            "/Users/u/Library/Application Support/conduit"
        );
    }

    #[test]
    fn no_home_is_a_clear_error() {
        let err = resolve(None, env(&[]), Platform::Xdg).unwrap_err();
        assert!(matches!(err, StateDirError::NoHome));
        assert!(err.to_string().contains("--state-dir"), "{err}");
        // A flag or the variable needs no home.
        assert!(resolve(Some(Path::new("/s")), env(&[]), Platform::MacOs).is_ok());
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().mode() & 0o7777
    }

    #[test]
    fn open_creates_the_private_layout() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("a/b/state");
        let state = StateDir::open(&root).unwrap();
        assert_eq!(state.path(), root);
        assert_eq!(state.tightened_from(), None);
        for dir in [
            state.path().to_owned(),
            state.packages_dir(),
            state.logs_dir(),
            state.run_dir(),
            state.artifacts_dir(),
            state.tmp_dir(),
        ] {
            assert!(dir.is_dir(), "{}", dir.display());
            assert_eq!(mode(&dir), 0o700, "{}", dir.display());
        }
        // Opening again is a no-op.
        let again = StateDir::open(&root).unwrap();
        assert_eq!(again.tightened_from(), None);
    }

    #[test]
    fn open_tightens_a_loose_mode_and_says_so() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("state");
        fs::create_dir(&root).unwrap();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        let state = StateDir::open(&root).unwrap();
        assert_eq!(state.tightened_from(), Some(0o755));
        assert_eq!(mode(&root), 0o700);

        fs::set_permissions(state.run_dir(), fs::Permissions::from_mode(0o777)).unwrap();
        let state = StateDir::open(&root).unwrap();
        assert_eq!(state.tightened_from(), Some(0o777));
        assert_eq!(mode(&state.run_dir()), 0o700);
    }

    #[test]
    fn open_refuses_a_file_and_a_symlinked_layout_folder() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("file");
        fs::write(&file, "x").unwrap();
        let err = StateDir::open(&file).unwrap_err();
        assert!(matches!(err, StateDirError::NotADirectory { .. }), "{err}");

        let root = tmp.path().join("state");
        fs::create_dir(&root).unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.join("packages")).unwrap();
        let err = StateDir::open(&root).unwrap_err();
        assert!(err.to_string().contains("packages"), "{err}");
    }

    #[test]
    fn open_follows_a_symlinked_root() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        fs::create_dir(&real).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let state = StateDir::open(&link).unwrap();
        assert!(real.join("packages").is_dir());
        assert_eq!(state.path(), link);
    }

    #[test]
    fn a_second_lock_in_the_same_process_fails_naming_the_pid() {
        let tmp = tempfile::tempdir().unwrap();
        let state = StateDir::open(tmp.path()).unwrap();
        let lock = state.lock_exclusive().unwrap();
        assert_eq!(lock.pid(), std::process::id());
        let written = fs::read_to_string(lock.path()).unwrap();
        assert_eq!(written.trim(), std::process::id().to_string());

        // flock belongs to the open file description, so a second open conflicts even here.
        let err = state.lock_exclusive().unwrap_err();
        match &err {
            StateDirError::Locked { path, pid } => {
                assert_eq!(path, &state.lock_path());
                assert_eq!(*pid, Some(std::process::id()));
            }
            other => panic!("expected Locked, got {other:?}"),
        }
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        assert!(msg.contains("daemon.lock"), "{msg}");

        drop(lock);
        let again = state.lock_exclusive().unwrap();
        drop(again);
    }

    /// The environment variable that turns [`lock_holder_child`] into a lock holder.
    const HOLDER_ENV: &str = "CONDUIT_TEST_LOCK_HOLDER_STATE_DIR";

    /// Not a test of its own: when re-executed by `a_lock_held_by_another_process_…` with
    /// [`HOLDER_ENV`] set, it takes the lock, says so on stdout and holds it until killed.
    #[test]
    fn lock_holder_child() {
        let Some(dir) = std::env::var_os(HOLDER_ENV) else {
            return;
        };
        let state = StateDir::open(dir).unwrap();
        let _lock = state.lock_exclusive().unwrap();
        println!("LOCKED {}", std::process::id());
        let mut line = String::new();
        let _ = io::stdin().read_line(&mut line);
    }

    #[test]
    fn a_lock_held_by_another_process_fails_at_once_and_frees_when_it_dies() {
        let tmp = tempfile::tempdir().unwrap();
        let state = StateDir::open(tmp.path()).unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "state_dir::tests::lock_holder_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HOLDER_ENV, tmp.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        // The harness prints the test's name on the same line first.
        while !line.contains("LOCKED ") {
            line.clear();
            assert_ne!(
                out.read_line(&mut line).unwrap(),
                0,
                "the child exited before locking"
            );
        }

        let started = std::time::Instant::now();
        let err = state.lock_exclusive().unwrap_err();
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "a held lock must not block"
        );
        match err {
            StateDirError::Locked { pid, .. } => assert_eq!(pid, Some(child.id())),
            other => panic!("expected Locked, got {other:?}"),
        }

        // The kernel releases the lock with the process, however it dies.
        child.kill().unwrap();
        child.wait().unwrap();
        let lock = state.lock_exclusive().unwrap();
        assert_eq!(lock.pid(), std::process::id());
    }
}
