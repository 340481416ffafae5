//! What a reload does: which packages to start, stop and restart, decided from the registry's
//! records and what the daemon supervises.
//!
//! A pure function of those facts, so every case is tested without processes; the daemon's
//! handle reads the registry and the operator's settings, calls [`decide`], and applies the
//! plan (the supervisor's starts and stops).

use std::collections::{BTreeMap, HashMap};

/// How a package is to be launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launch {
    /// Not supervised yet.
    Start,
    /// Supervised, but from something else (another version, a reinstall, changed settings).
    Restart,
}

/// What a reload does, every list in name order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Supervised but no longer enabled (disabled or removed).
    pub stop: Vec<String>,
    /// Enabled and not running from what the registry now holds.
    pub launch: Vec<(String, Launch)>,
    /// Enabled and running (or being started beside the running version) from exactly what
    /// the registry holds.
    pub unchanged: Vec<String>,
    /// A new version is starting beside the running one, but the registry went back to the
    /// running one (a rollback): the new one is given up.
    pub cancel: Vec<String>,
}

/// Decide a reload. `wanted` maps each enabled package to the fingerprint of what it would be
/// started from (version, install time, the operator's settings); `running` maps each
/// supervised package to the fingerprint it was started from, and `incoming` each package
/// whose new version is starting beside the running one to that version's.
pub fn decide(
    wanted: &BTreeMap<String, String>,
    running: &HashMap<String, String>,
    incoming: &HashMap<String, String>,
) -> Plan {
    let mut stop: Vec<String> = running
        .keys()
        .filter(|name| !wanted.contains_key(*name))
        .cloned()
        .collect();
    stop.sort();
    let mut plan = Plan {
        stop,
        ..Plan::default()
    };
    for (name, fingerprint) in wanted {
        match (running.get(name), incoming.get(name)) {
            // Under way already: it takes over once it is ready.
            (_, Some(next)) if next == fingerprint => plan.unchanged.push(name.clone()),
            (Some(before), Some(_)) if before == fingerprint => {
                plan.cancel.push(name.clone());
                plan.unchanged.push(name.clone());
            }
            (Some(before), _) if before == fingerprint => plan.unchanged.push(name.clone()),
            (Some(_), _) => plan.launch.push((name.clone(), Launch::Restart)),
            (None, _) => plan.launch.push((name.clone(), Launch::Start)),
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map<M: FromIterator<(String, String)>>(pairs: &[(&str, &str)]) -> M {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn nothing_wanted_nothing_running_does_nothing() {
        assert_eq!(
            decide(&BTreeMap::new(), &HashMap::new(), &HashMap::new()),
            Plan::default()
        );
    }

    #[test]
    fn an_enabled_package_not_running_is_started() {
        let plan = decide(&map(&[("echo", "1@5@")]), &HashMap::new(), &HashMap::new());
        assert_eq!(plan.launch, vec![("echo".to_owned(), Launch::Start)]);
        assert!(plan.stop.is_empty() && plan.unchanged.is_empty());
    }

    #[test]
    fn a_running_package_no_longer_enabled_is_stopped() {
        let plan = decide(&BTreeMap::new(), &map(&[("echo", "1@5@")]), &HashMap::new());
        assert_eq!(plan.stop, vec!["echo".to_owned()]);
        assert!(plan.launch.is_empty() && plan.unchanged.is_empty());
    }

    #[test]
    fn a_changed_fingerprint_restarts_and_the_same_one_is_left_alone() {
        let wanted = map(&[("echo", "2@9@"), ("notes", "1@5@a")]);
        let running = map(&[("echo", "1@5@"), ("notes", "1@5@a")]);
        let plan = decide(&wanted, &running, &HashMap::new());
        assert_eq!(plan.launch, vec![("echo".to_owned(), Launch::Restart)]);
        assert_eq!(plan.unchanged, vec!["notes".to_owned()]);
        assert!(plan.stop.is_empty());
    }

    #[test]
    fn a_version_under_way_is_left_to_finish_and_given_up_on_a_rollback() {
        let running = map(&[("echo", "1@5@"), ("notes", "1@5@")]);
        let incoming = map(&[("echo", "2@9@"), ("notes", "2@9@")]);
        // `echo`: the registry still wants what is starting; `notes`: it went back.
        let wanted = map(&[("echo", "2@9@"), ("notes", "1@5@")]);
        let plan = decide(&wanted, &running, &incoming);
        assert_eq!(plan.unchanged, vec!["echo".to_owned(), "notes".to_owned()]);
        assert_eq!(plan.cancel, vec!["notes".to_owned()]);
        assert!(plan.launch.is_empty() && plan.stop.is_empty());
        // A third version while the second is under way: a new replacement.
        let plan = decide(&map(&[("echo", "3@12@")]), &running, &incoming);
        assert_eq!(plan.launch, vec![("echo".to_owned(), Launch::Restart)]);
    }

    #[test]
    fn every_list_is_in_name_order() {
        let wanted = map(&[("d", "1"), ("c", "1"), ("f", "2"), ("e", "1")]);
        let running = map(&[("b", "1"), ("a", "1"), ("f", "1"), ("e", "1")]);
        let plan = decide(&wanted, &running, &HashMap::new());
        assert_eq!(plan.stop, vec!["a".to_owned(), "b".to_owned()]);
        assert_eq!(
            plan.launch,
            vec![
                ("c".to_owned(), Launch::Start),
                ("d".to_owned(), Launch::Start),
                ("f".to_owned(), Launch::Restart),
            ]
        );
        assert_eq!(plan.unchanged, vec!["e".to_owned()]);
    }
}
