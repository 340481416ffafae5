//! `conduit service`: the file that runs `conduit daemon run` under the platform's service
//! manager — a systemd unit on Linux, a launchd property list on macOS — and where it goes.
//!
//! Generating a file is a pure function of a [`ServiceConfig`] (defined in `config.rs`, rendered
//! by `systemd.rs` and `launchd.rs`), so the text can be snapshot-tested and verified
//! (`systemd-analyze verify`, `plutil`) without installing anything. Installing writes that file, and only that file; it never runs
//! `systemctl` or `launchctl` itself: it says the command to run next, so an operator sees
//! (and a script decides) when the service manager acts. What the daemon says to the service
//! manager while it runs (readiness, status, watchdog) is `notify.rs`; whether it runs under one
//! at all is `under.rs`.

mod config;
pub mod launchd;
pub mod notify;
pub mod systemd;
pub mod under;

use std::path::Path;

pub use config::{
    GENERATED_MARK, LAUNCHD_LABEL, Manager, PERMANENT_EXIT_CODE, STOP_TIMEOUT_SECS, SYSTEMD_UNIT,
    Scope, ServiceConfig, WATCHDOG_SECS, build_folder, clean_path,
};

impl ServiceConfig {
    /// The file's text (each generator is a pure function of the config; the config does not
    /// know them, so it lives apart in `config.rs`).
    pub fn render(&self) -> String {
        match self.manager {
            Manager::Systemd => systemd::unit(self),
            Manager::Launchd => launchd::plist(self),
        }
    }
}

/// What an installed service file runs: its program and the `--state-dir` it passes, read
/// back from `text` as `manager`'s generator writes them. `None` when the text has none.
pub fn installed_command(manager: Manager, text: &str) -> Option<(String, Option<String>)> {
    match manager {
        Manager::Systemd => systemd::exec_start(text),
        Manager::Launchd => launchd::program_arguments(text),
    }
}

/// What is at the install path, compared with what would be written.
#[derive(Debug, PartialEq, Eq)]
pub enum Existing {
    /// Nothing there.
    Absent,
    /// Exactly the text that would be written.
    Same,
    /// Something else: an older generated file, or one edited or written by hand.
    Different,
}

/// Compare the file at `path` with `text`.
pub fn existing(path: &Path, text: &str) -> std::io::Result<Existing> {
    match std::fs::read_to_string(path) {
        Ok(t) if t == text => Ok(Existing::Same),
        Ok(_) => Ok(Existing::Different),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Existing::Absent),
        Err(e) => Err(e),
    }
}

/// Write `text` at `path` atomically (a temporary file beside it, renamed over it), creating
/// the folder if needed. A service file is read by a manager that may look at any time.
pub fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(&mut tmp, text.as_bytes())?;
    tmp.as_file().sync_all()?;
    let f = tmp.persist(path).map_err(|e| e.error)?;
    use std::os::unix::fs::PermissionsExt;
    f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
    Ok(())
}
