//! Whether this process runs as a service of a service manager, as `conduit service install`
//! sets one up: the daemon reports it in `GET /v1/health` (`service`), and `conduit ext dev`
//! refuses to put code under development into such a daemon unless told to.
//!
//! How it knows, from what the manager itself gives the process:
//! - systemd starts every process of a unit with `INVOCATION_ID` in its environment, and a
//!   `Type=notify` service (the unit `conduit service install` writes) with `NOTIFY_SOCKET`
//!   too. Both set is a service; `INVOCATION_ID` alone is also taken when the parent process is
//!   systemd itself (a `Type=simple` unit). A shell started from a unit (a terminal emulator run
//!   as a user service) inherits `INVOCATION_ID` but is neither, so it does not count.
//! - launchd gives each job `XPC_SERVICE_NAME`, its label; a login shell's is `0`. The label
//!   `conduit service install` writes is [`LAUNCHD_LABEL`].
//!
//! Not here: which scope (user or system) — both are someone's real daemon.

use serde::Serialize;

use super::config::LAUNCHD_LABEL;

/// The service manager a process runs under, and the evidence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UnderService {
    /// `systemd` or `launchd`.
    pub manager: &'static str,
    /// The unit (systemd, from `/proc/self/cgroup`) or label (launchd), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// What showed it, for people: `INVOCATION_ID and NOTIFY_SOCKET are set`.
    pub evidence: String,
}

/// The decision, from the environment (`env`), the parent's command name and the cgroup path.
pub fn detect(
    env: &dyn Fn(&str) -> Option<String>,
    parent_comm: Option<&str>,
    cgroup: Option<&str>,
) -> Option<UnderService> {
    let unit = cgroup
        .and_then(|c| c.trim().rsplit('/').find(|part| part.ends_with(".service")))
        .map(str::to_owned);
    if env("INVOCATION_ID").is_some_and(|v| !v.is_empty()) {
        if env("NOTIFY_SOCKET").is_some_and(|v| !v.is_empty()) {
            return Some(UnderService {
                manager: "systemd",
                unit,
                evidence: "INVOCATION_ID and NOTIFY_SOCKET are set (systemd gives both to a Type=notify service)".into(),
            });
        }
        if parent_comm.map(str::trim) == Some("systemd") {
            return Some(UnderService {
                manager: "systemd",
                unit,
                evidence: "INVOCATION_ID is set and the parent process is systemd".into(),
            });
        }
    }
    match env("XPC_SERVICE_NAME") {
        Some(label) if label == LAUNCHD_LABEL => Some(UnderService {
            manager: "launchd",
            unit: Some(label),
            evidence: format!(
                "XPC_SERVICE_NAME is {LAUNCHD_LABEL} (launchd gives each job its label)"
            ),
        }),
        _ => None,
    }
}

/// [`detect`] for this process, worked out once.
pub fn current() -> Option<&'static UnderService> {
    static ONCE: std::sync::OnceLock<Option<UnderService>> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let parent = std::fs::read_to_string(format!(
            "/proc/{}/comm",
            std::os::unix::process::parent_id()
        ))
        .ok();
        let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok();
        detect(
            &|k| std::env::var(k).ok(),
            parent.as_deref(),
            cgroup.as_deref(),
        )
    })
    .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn a_service_is_told_by_what_its_manager_gives_it() {
        let cg = Some("0::/system.slice/conduit.service\n");
        let both = env(&[
            ("INVOCATION_ID", "ab12"),
            ("NOTIFY_SOCKET", "/run/systemd/notify"),
        ]);
        let s = detect(&both, Some("bash"), cg).unwrap();
        assert_eq!(
            (s.manager, s.unit.as_deref()),
            ("systemd", Some("conduit.service"))
        );
        // A simple unit: the parent is systemd.
        let id = env(&[("INVOCATION_ID", "ab12")]);
        assert_eq!(
            detect(&id, Some("systemd\n"), None).unwrap().manager,
            "systemd"
        );
        // A shell that inherited INVOCATION_ID from a terminal run as a user service is not.
        assert_eq!(detect(&id, Some("bash"), cg), None);
        assert_eq!(
            detect(&env(&[("NOTIFY_SOCKET", "/x")]), Some("systemd"), cg),
            None
        );
        assert_eq!(
            detect(&env(&[("INVOCATION_ID", "")]), Some("systemd"), cg),
            None
        );
        // launchd: the label conduit writes, not a login shell's `0`.
        let job = env(&[("XPC_SERVICE_NAME", LAUNCHD_LABEL)]);
        assert_eq!(detect(&job, None, None).unwrap().manager, "launchd");
        assert_eq!(detect(&env(&[("XPC_SERVICE_NAME", "0")]), None, None), None);
        assert_eq!(detect(&env(&[]), Some("systemd"), cg), None);
    }
}
