//! What a service file is generated from: the [`ServiceConfig`] (manager, scope, the binary and
//! the state directory), where each manager's file goes, the settings every file shares, and
//! the quoting both generators use. Pure: nothing here reads or writes a file.

use std::path::{Path, PathBuf};

/// Which service manager a file is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Manager {
    Systemd,
    Launchd,
}

impl Manager {
    /// The platform's own: launchd on macOS, systemd everywhere else.
    pub fn native() -> Self {
        if cfg!(target_os = "macos") {
            Manager::Launchd
        } else {
            Manager::Systemd
        }
    }
}

/// A service of the user's own service manager, or of the machine's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    User,
    System,
}

/// The unit's name under systemd (`conduit.service`).
pub const SYSTEMD_UNIT: &str = "conduit.service";
/// The job's label under launchd.
pub const LAUNCHD_LABEL: &str = "conduit.daemon";

/// Exit code of `conduit daemon run` that a restart cannot fix (the state directory is
/// unusable, another daemon holds its lock, the configuration is wrong). Every other failure
/// exit is worth a retry. The service files restart on every failure but this one.
pub const PERMANENT_EXIT_CODE: u8 = 2;

/// How long the daemon may take to stop, at most, before the service manager kills it. The
/// daemon's own worst case is about 25 s: each extension's shutdown grace (5 s), closing stdin
/// (2 s), SIGTERM (2 s) and SIGKILL (1 s), all extensions at once; then background tasks (5 s)
/// and open management connections (5 s). While a stop is under way the daemon also extends
/// the timeout (`EXTEND_TIMEOUT_USEC`), so a slow but progressing stop is not cut short.
pub const STOP_TIMEOUT_SECS: u64 = 90;

/// The watchdog interval the unit asks for; the daemon sends a heartbeat at half of it, only
/// while its host loop and runtime make progress.
pub const WATCHDOG_SECS: u64 = 30;

/// What a generated file says.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    pub manager: Manager,
    pub scope: Scope,
    /// The `conduit` binary to run, absolute.
    pub program: PathBuf,
    /// The state directory the daemon runs on, absolute.
    pub state_dir: PathBuf,
    /// The `PATH` the daemon (and so every extension) gets: the installing shell's, since a
    /// service manager's own is short and would not find interpreters such as `python3` or
    /// `node` where a user installed them.
    pub path_env: Option<String>,
}

impl ServiceConfig {
    /// Where the file is installed, given the user's home and `XDG_CONFIG_HOME`.
    pub fn install_path(&self, home: &Path, xdg_config_home: Option<&Path>) -> PathBuf {
        match (self.manager, self.scope) {
            (Manager::Systemd, Scope::User) => xdg_config_home
                .map(Path::to_owned)
                .unwrap_or_else(|| home.join(".config"))
                .join("systemd/user")
                .join(SYSTEMD_UNIT),
            (Manager::Systemd, Scope::System) => {
                Path::new("/etc/systemd/system").join(SYSTEMD_UNIT)
            }
            (Manager::Launchd, Scope::User) => home
                .join("Library/LaunchAgents")
                .join(format!("{LAUNCHD_LABEL}.plist")),
            (Manager::Launchd, Scope::System) => {
                Path::new("/Library/LaunchDaemons").join(format!("{LAUNCHD_LABEL}.plist"))
            }
        }
    }

    /// The commands that make the service manager load and start the installed file.
    pub fn next_steps(&self, path: &Path) -> Vec<String> {
        match (self.manager, self.scope) {
            (Manager::Systemd, Scope::User) => vec![
                "systemctl --user daemon-reload && systemctl --user enable --now conduit".into(),
                "loginctl enable-linger \"$USER\"   # to keep it running when you log out".into(),
            ],
            (Manager::Systemd, Scope::System) => {
                vec!["systemctl daemon-reload && systemctl enable --now conduit".into()]
            }
            (Manager::Launchd, Scope::User) => vec![format!(
                "launchctl bootstrap gui/$(id -u) {}",
                path.display()
            )],
            (Manager::Launchd, Scope::System) => {
                vec![format!("launchctl bootstrap system {}", path.display())]
            }
        }
    }

    /// The command that shows the daemon's log under this manager: a user unit's journal
    /// needs `--user`.
    pub fn journal_command(&self) -> String {
        match (self.manager, self.scope) {
            (Manager::Systemd, Scope::User) => "journalctl --user -u conduit".into(),
            (Manager::Systemd, Scope::System) => "journalctl -u conduit".into(),
            (Manager::Launchd, _) => format!(
                "tail -f {}",
                quote(&self.state_dir.join("logs/daemon.log").to_string_lossy())
            ),
        }
    }

    /// The command that starts (or restarts) the installed service now.
    pub fn restart_command(&self) -> String {
        match (self.manager, self.scope) {
            (Manager::Systemd, Scope::User) => "systemctl --user restart conduit".into(),
            (Manager::Systemd, Scope::System) => "systemctl restart conduit".into(),
            (Manager::Launchd, Scope::User) => {
                format!("launchctl kickstart -k gui/$(id -u)/{LAUNCHD_LABEL}")
            }
            (Manager::Launchd, Scope::System) => {
                format!("launchctl kickstart -k system/{LAUNCHD_LABEL}")
            }
        }
    }

    /// The commands that stop the service and make the manager forget it, before the file
    /// is removed.
    pub fn stop_steps(&self, path: &Path) -> Vec<String> {
        match (self.manager, self.scope) {
            (Manager::Systemd, Scope::User) => vec![
                "systemctl --user disable --now conduit".into(),
                "systemctl --user daemon-reload".into(),
            ],
            (Manager::Systemd, Scope::System) => vec![
                "systemctl disable --now conduit".into(),
                "systemctl daemon-reload".into(),
            ],
            (Manager::Launchd, Scope::User) => {
                vec![format!("launchctl bootout gui/$(id -u) {}", path.display())]
            }
            (Manager::Launchd, Scope::System) => {
                vec![format!("launchctl bootout system {}", path.display())]
            }
        }
    }
}

/// The build folder `program` lies in, if it is one: a `target` folder beside a `Cargo.toml`,
/// or any folder holding the `CACHEDIR.TAG` cargo writes at the top of every build folder
/// (which finds one moved elsewhere with `CARGO_TARGET_DIR`). `is_file` says whether a path is
/// a file; `std::path::Path::is_file` in production. A service that runs a binary from there
/// runs whatever the next build or `cargo clean` leaves.
pub fn build_folder(program: &Path, is_file: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    program
        .ancestors()
        .skip(1)
        .find(|dir| {
            is_file(&dir.join("CACHEDIR.TAG"))
                || (dir.file_name().is_some_and(|n| n == "target")
                    && dir.parent().is_some_and(|p| is_file(&p.join("Cargo.toml"))))
        })
        .map(Path::to_owned)
}

/// A `PATH` fit for a service: each folder once (the first time it appears), without empty
/// entries and relative folders (which would resolve against the service's working folder,
/// not the installing shell's).
pub fn clean_path(path: &str) -> String {
    let mut seen = std::collections::HashSet::new();
    path.split(':')
        .filter(|p| p.starts_with('/'))
        .map(|p| {
            let trimmed = p.trim_end_matches('/');
            if trimmed.is_empty() { "/" } else { trimmed }
        })
        .filter(|p| seen.insert(*p))
        .collect::<Vec<_>>()
        .join(":")
}

/// The first line of every generated file, by which `install` tells its own files (which it
/// may rewrite when unchanged) from a file someone wrote or edited.
pub const GENERATED_MARK: &str = "generated by `conduit service install`";

/// Quote one argument for a systemd `ExecStart=` line or a shell: left bare when it is made
/// of characters neither treats specially, else in double quotes with `\` and `"` escaped.
pub(crate) fn quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:@,".contains(c));
    if plain {
        arg.to_owned()
    } else {
        let mut s = String::from("\"");
        for c in arg.chars() {
            if c == '\\' || c == '"' {
                s.push('\\');
            }
            s.push(c);
        }
        s.push('"');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_leaves_plain_paths_bare_and_quotes_the_rest() {
        assert_eq!(quote("/usr/bin/conduit"), "/usr/bin/conduit");
        assert_eq!(quote("/home/a b/state"), "\"/home/a b/state\"");
        assert_eq!(quote("x\"y\\z"), "\"x\\\"y\\\\z\"");
        assert_eq!(quote(""), "\"\"");
    }

    #[test]
    fn a_path_keeps_each_absolute_folder_once() {
        assert_eq!(
            clean_path(
                "/home/u/.cargo/bin:/usr/bin::/home/u/.cargo/bin/:bin:./x:/usr/local/bin:/usr/bin"
            ),
            "/home/u/.cargo/bin:/usr/bin:/usr/local/bin"
        );
        assert_eq!(clean_path(""), "");
        assert_eq!(clean_path("/:/"), "/");
    }

    #[test]
    fn a_binary_under_a_cargo_target_folder_is_in_a_build_folder() {
        let cargo = |p: &Path| p == Path::new("/src/conduit/Cargo.toml");
        assert_eq!(
            build_folder(Path::new("/src/conduit/target/debug/conduit"), cargo),
            Some(PathBuf::from("/src/conduit/target"))
        );
        assert_eq!(
            build_folder(Path::new("/src/conduit/target/release/conduit"), cargo),
            Some(PathBuf::from("/src/conduit/target"))
        );
        // A folder called target with no Cargo.toml beside it is not one.
        assert_eq!(
            build_folder(Path::new("/opt/target/bin/conduit"), cargo),
            None
        );
        assert_eq!(
            build_folder(Path::new("/usr/local/bin/conduit"), cargo),
            None
        );
        // A build folder moved with CARGO_TARGET_DIR is known by the tag cargo leaves in it.
        let tagged = |p: &Path| p == Path::new("/var/tmp/ci-target/CACHEDIR.TAG");
        assert_eq!(
            build_folder(Path::new("/var/tmp/ci-target/debug/conduit"), tagged),
            Some(PathBuf::from("/var/tmp/ci-target"))
        );
    }

    #[test]
    fn the_journal_of_a_user_unit_is_read_with_user() {
        let cfg = |scope| ServiceConfig {
            manager: Manager::Systemd,
            scope,
            program: "/usr/bin/conduit".into(),
            state_dir: "/s".into(),
            path_env: None,
        };
        assert_eq!(
            cfg(Scope::User).journal_command(),
            "journalctl --user -u conduit"
        );
        assert_eq!(
            cfg(Scope::System).journal_command(),
            "journalctl -u conduit"
        );
    }

    #[test]
    fn install_paths_follow_the_managers_conventions() {
        let cfg = |manager, scope| ServiceConfig {
            manager,
            scope,
            program: "/usr/bin/conduit".into(),
            state_dir: "/s".into(),
            path_env: None,
        };
        let home = Path::new("/home/u");
        assert_eq!(
            cfg(Manager::Systemd, Scope::User).install_path(home, None),
            Path::new("/home/u/.config/systemd/user/conduit.service")
        );
        assert_eq!(
            cfg(Manager::Systemd, Scope::User).install_path(home, Some(Path::new("/x"))),
            Path::new("/x/systemd/user/conduit.service")
        );
        assert_eq!(
            cfg(Manager::Systemd, Scope::System).install_path(home, None),
            Path::new("/etc/systemd/system/conduit.service")
        );
        assert_eq!(
            cfg(Manager::Launchd, Scope::User).install_path(home, None),
            Path::new("/home/u/Library/LaunchAgents/conduit.daemon.plist")
        );
    }
}
