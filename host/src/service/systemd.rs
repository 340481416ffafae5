//! The systemd unit for `conduit daemon run`, each setting commented in the file itself so an
//! operator reading `systemctl cat conduit` learns why it is there.

use std::fmt::Write;

use super::config::{
    GENERATED_MARK, PERMANENT_EXIT_CODE, STOP_TIMEOUT_SECS, Scope, ServiceConfig, WATCHDOG_SECS,
    quote,
};

/// One `ExecStart=` or path-list word: quoted when needed, with systemd's specifier (`%`)
/// and variable (`$`) characters doubled so they are taken literally.
fn word(text: &str) -> String {
    quote(text).replace('%', "%%").replace('$', "$$")
}

/// The unit's text.
pub fn unit(cfg: &ServiceConfig) -> String {
    let program = cfg.program.to_string_lossy();
    let state = cfg.state_dir.to_string_lossy();
    let mut u = String::new();
    let _ = writeln!(u, "# conduit.service — {GENERATED_MARK}.");
    let _ = writeln!(
        u,
        "# Rewrite it with `conduit service install --force`; remove it with `conduit service uninstall`."
    );
    u.push_str(
        "\n[Unit]
Description=conduit: runs extension packages and their coordination core
Documentation=man:conduit-daemon-run(1) man:conduit(1)
# Never give up after quick crashes: a transient cause (a full disk, a busy machine) clears by
# itself, and a cause no restart can fix exits with the permanent code, which is not restarted
# (RestartPreventExitStatus below). RestartSec keeps the retries gentle.
StartLimitIntervalSec=0

[Service]
# The daemon says READY=1 once its socket is bound and every enabled extension has
# handshaken or failed, and STATUS= lines that `systemctl status conduit` shows.
Type=notify
# Only the daemon itself may notify; its extensions never see NOTIFY_SOCKET.
NotifyAccess=main
",
    );
    let _ = writeln!(
        u,
        "ExecStart={} daemon run --state-dir {}",
        word(&program),
        word(&state)
    );
    if let Some(path) = &cfg.path_env {
        let _ = writeln!(
            u,
            "# Extensions get PATH (and HOME, USER, LANG, TZ, TMPDIR…) and nothing else; this is the PATH
# of the shell that installed the unit, so they find their interpreters (python3, node) there.
Environment={}",
            word(&format!("PATH={path}"))
        );
    }
    u.push_str(
        "# SIGHUP re-reads the package registry, as `conduit ext enable/disable` does.
ExecReload=/bin/kill -HUP $MAINPID
",
    );
    let _ = writeln!(
        u,
        "# A heartbeat at half this interval, sent only while the host loop and the runtime make
# progress: a daemon that is alive but stuck is restarted.
WatchdogSec={WATCHDOG_SECS}
# Restart after a crash, a watchdog timeout or a failure exit, 5 s apart…
Restart=on-failure
RestartSec=5
# …except after exit {PERMANENT_EXIT_CODE}: the state directory is unusable or another daemon holds it,
# and only an operator can fix that (`{journal}` says what).
RestartPreventExitStatus={PERMANENT_EXIT_CODE}
# SIGTERM goes to the daemon alone, which stops its extensions gracefully (shutdown, then
# SIGTERM, then SIGKILL to each one's processes); whatever is left when it exits is killed.
KillMode=mixed
# Handshakes of slow extensions are bounded by the daemon's own start timeout (10 s each, all
# at once); this leaves room for a slow machine.
TimeoutStartSec=120
# Longer than the daemon's own worst-case stop (about 25 s); it also extends this while a
# stop is under way.
TimeoutStopSec={STOP_TIMEOUT_SECS}
# Extensions are third-party code: none of them may gain privileges through setuid programs.
NoNewPrivileges=yes
# The daemon's cgroup is its own to divide: one cgroup per extension, with its memory, CPU and
# task limits (memory.max, cpu.max, pids.max); the variable tells the daemon it may.
Delegate=yes
Environment={}=delegated",
        conduit_supervisor::cgroup::DELEGATED_ENV,
        journal = cfg.journal_command(),
    );
    match cfg.scope {
        Scope::System => {
            let _ = writeln!(
                u,
                "# The file system is read-only for the daemon and its extensions but for the state directory
# (packages, their data folders, logs, the database) and a private /tmp.
ProtectSystem=strict
ReadWritePaths={}
PrivateTmp=yes",
                word(&state)
            );
        }
        Scope::User => u.push_str(
            "# ProtectSystem= and PrivateTmp= are left out: in a user's service manager they need
# unprivileged user namespaces, which many kernels turn off, and the unit would not start.
",
        ),
    }
    let target = match cfg.scope {
        Scope::User => "default.target",
        Scope::System => "multi-user.target",
    };
    let _ = writeln!(u, "\n[Install]\nWantedBy={target}");
    u
}

/// What an installed unit runs: the program of its `ExecStart=` line and the `--state-dir`
/// given to it, read back with the quoting [`unit`] writes (double quotes, `\` escapes, `%%`
/// and `$$`). `None` when the text has no `ExecStart=`.
pub fn exec_start(text: &str) -> Option<(String, Option<String>)> {
    let line = text
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("ExecStart="))?;
    let mut words = Vec::new();
    let mut word = String::new();
    let (mut quoted, mut escaped, mut any) = (false, false, false);
    for c in line.chars() {
        if escaped {
            word.push(c);
            escaped = false;
        } else if c == '\\' && quoted {
            escaped = true;
        } else if c == '"' {
            quoted = !quoted;
            any = true;
        } else if c.is_whitespace() && !quoted {
            if any || !word.is_empty() {
                words.push(std::mem::take(&mut word));
            }
            any = false;
        } else {
            word.push(c);
        }
    }
    if any || !word.is_empty() {
        words.push(word);
    }
    let literal = |w: &str| w.replace("%%", "%").replace("$$", "$");
    let program = literal(words.first()?);
    let state = words
        .iter()
        .position(|w| w == "--state-dir")
        .and_then(|i| words.get(i + 1))
        .map(|w| literal(w));
    Some((program, state))
}
