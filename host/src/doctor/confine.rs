//! What confines extensions here: the kernel's Landlock ABI (the filesystem sandbox) and
//! whether the daemon's cgroup is delegated to it (per-extension cgroups). Read from the
//! kernel, `/proc` and the daemon's own answers; no cgroup is created, written or joined.

use super::live::Answer;
use super::report::Check;
use super::service::Installed;

/// The filesystem sandbox: Landlock's ABI, or why there is none.
pub(super) fn sandbox() -> Check {
    const NAME: &str = "sandbox";
    match conduit_supervisor::sandbox::landlock_abi() {
        Ok(abi) => Check::ok(
            NAME,
            format!(
                "Landlock ABI {abi}: each extension reads and writes only its own paths (`conduit ext status NAME` lists them)"
            ),
        ),
        Err(why) => {
            let fix = if why.contains("disabled") {
                "add landlock to the kernel's lsm= boot parameter (e.g. lsm=landlock,lockdown,yama,integrity,apparmor,bpf) and reboot"
            } else if why.contains("5.13") {
                "upgrade to Linux 5.13 or later, which has Landlock"
            } else {
                "uname -r; cat /sys/kernel/security/lsm   # Landlock needs Linux 5.13+ and landlock in lsm="
            };
            Check::warn(
                NAME,
                format!(
                    "no filesystem sandbox: {why}; extensions can read and write whatever this user can"
                ),
                fix,
            )
        }
    }
}

/// Per-extension cgroups: used when the daemon was handed a delegated cgroup (the unit's
/// `Delegate=yes`). Without one, rlimits and the supervisor enforce the limits — the default,
/// and sound; what is worth a warning is a delegation asked for that the daemon could not use.
pub(super) fn cgroups(live: Option<&Answer>, unit: Option<&Installed>) -> Check {
    const NAME: &str = "cgroups";
    let fallback = "limits are enforced by rlimits and the supervisor (no delegated cgroup; the service unit delegates one)";
    let Some(live) = live else {
        let v2 = std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        return match (v2, unit.is_some_and(|u| u.delegates)) {
            (true, true) => Check::ok(
                NAME,
                "cgroup v2 is mounted and the service unit delegates a cgroup to the daemon",
            ),
            (false, true) => Check::ok(
                NAME,
                "the service unit delegates a cgroup, but this system has no cgroup v2 (a hybrid or v1 hierarchy): limits are enforced by rlimits and the supervisor",
            ),
            _ => Check::ok(NAME, fallback),
        };
    };
    let mechanisms: Vec<&str> = live
        .views
        .iter()
        .filter_map(|v| v.status.resources.as_ref().map(|r| r.mechanism.as_ref()))
        .collect();
    let asked = live.pid.is_some_and(|pid| {
        std::fs::read(format!("/proc/{pid}/environ"))
            .map(|env| {
                let want = format!("{}=delegated", conduit_supervisor::cgroup::DELEGATED_ENV);
                env.split(|b| *b == 0).any(|kv| kv == want.as_bytes())
            })
            .unwrap_or(false)
    });
    let used = mechanisms.iter().find(|m| m.starts_with("cgroup"));
    match (asked, used) {
        (_, Some(m)) => Check::ok(NAME, format!("per-extension cgroups: {m}")),
        (true, None) if !mechanisms.is_empty() => Check::warn(
            NAME,
            "the daemon was handed a delegated cgroup but could not use it (its log says why: `cannot use the delegated cgroup`); limits fall back to rlimits and the supervisor",
            "journalctl --user -u conduit | grep 'delegated cgroup'",
        ),
        (true, None) => Check::ok(
            NAME,
            "the daemon was handed a delegated cgroup (no extension with limits runs now to show it in use)",
        ),
        (false, None) => Check::ok(NAME, fallback),
    }
}
