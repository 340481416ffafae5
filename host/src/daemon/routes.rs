//! Where an event stands with routing, for people and tools: routed into a Work, routed to
//! no Work, or waiting — and for which extension, and why. `GET /v1/events` adds it to each
//! event as `route`, and `conduit events list` prints it; a push of a kind no running extension
//! declares is warned about with [`warning`].
//!
//! The rules are the host loop's own (`core::host_loop`): an event's work kind is the longest
//! declared kind that is its kind or a prefix of it at a dot (`host_loop::work_kind_of`), the
//! extension whose name sorts first owns a kind two declare, and an event waits behind an
//! owner on its first start or a degraded owner with a trigger. This module only reads them
//! back from the views; it decides nothing the loop acts on.
//!
//! What an event was routed to is recorded; why it went to no Work is not (the owners of that
//! moment are gone), so that reason is the rule's, not the moment's.

use std::collections::BTreeMap;

use conduit_store::EventRecord;
use conduit_supervisor::State;
use serde::{Deserialize, Serialize};

use super::handle::ExtensionView;
use crate::core::health::Condition;
use crate::core::host_loop::work_kind_of;

/// Where an event stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum Route {
    /// Routed into this Work.
    Work { work_id: i64 },
    /// Routed to no Work: when it was routed, no running extension declared its work kind.
    /// It is not routed again.
    Nowhere { why: String },
    /// Not routed yet: behind `owner` (the extension that owns its work kind), or behind no
    /// one (the next pass routes it), and why.
    Waiting {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<String>,
        why: String,
    },
}

impl Route {
    /// A few words for a table cell: `work 3`, `no work`, `waits for notes (degraded)`.
    pub fn short(&self) -> String {
        match self {
            Route::Work { work_id } => format!("work {work_id}"),
            Route::Nowhere { .. } => "no work".into(),
            Route::Waiting {
                owner: Some(o),
                why,
            } => match why.split_once(": ") {
                Some((state, _)) if !state.contains(' ') => format!("waits for {o} ({state})"),
                _ => format!("waits for {o}"),
            },
            Route::Waiting { owner: None, .. } => "waiting".into(),
        }
    }
}

/// How the owner of a work kind stands now.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Owner {
    name: String,
    trigger: bool,
    /// On its first start: its events wait for its handshake.
    settling: bool,
    /// Degraded or unresponsive: a trigger's calls wait until a probe answers.
    held: Option<Condition>,
}

/// Who owns each declared work kind now, from the daemon's views; `None` when no daemon runs.
#[derive(Clone, Debug, Default)]
pub struct Owners {
    kinds: Option<BTreeMap<String, Owner>>,
}

impl Owners {
    /// The owners as the host loop sees them: every enabled extension (in name order) with
    /// the capabilities of its manifest or last handshake.
    pub fn from_views(views: &[ExtensionView]) -> Self {
        let mut sorted: Vec<&ExtensionView> = views.iter().filter(|v| v.enabled).collect();
        sorted.sort_by(|a, b| a.status.name.cmp(&b.status.name));
        let mut kinds = BTreeMap::new();
        for v in sorted {
            let Some(caps) = &v.status.capabilities else {
                continue;
            };
            let s = &v.status;
            let owner = |trigger| Owner {
                name: s.name.clone(),
                trigger,
                settling: s.state == State::Starting
                    && s.restarts == 0
                    && s.protocol_version.is_none(),
                held: v
                    .health
                    .as_ref()
                    .map(|h| h.condition)
                    .filter(|c| *c != Condition::Healthy),
            };
            for k in &caps.work_kinds {
                kinds
                    .entry(k.name.clone())
                    .or_insert_with(|| owner(k.trigger));
            }
        }
        Owners { kinds: Some(kinds) }
    }

    /// No daemon runs: nothing routes.
    pub fn no_daemon() -> Self {
        Owners { kinds: None }
    }

    /// Where the event of kind `kind` stands, given what routing recorded of it.
    pub fn route(&self, kind: &str, routed_at_ms: Option<i64>, work_id: Option<i64>) -> Route {
        if routed_at_ms.is_some() {
            return match work_id {
                Some(work_id) => Route::Work { work_id },
                None => Route::Nowhere {
                    why: "when it was routed, no running extension declared its work kind".into(),
                },
            };
        }
        let Some(kinds) = &self.kinds else {
            return Route::Waiting {
                owner: None,
                why: "no daemon is running; it is routed once one runs".into(),
            };
        };
        let Some(work_kind) = work_kind_of(kind, |k| kinds.contains_key(k)) else {
            return Route::Waiting {
                owner: None,
                why: format!(
                    "no running extension declares a work kind for `{kind}`: the next routing pass routes it to no Work"
                ),
            };
        };
        let o = &kinds[work_kind];
        let why = if o.settling {
            format!("starting: it waits for `{}`'s first handshake", o.name)
        } else if let (Some(c), true) = (o.held, o.trigger) {
            format!(
                "{}: `{}`'s trigger calls wait until a probe answers (`conduit ext status {}`)",
                c.as_str(),
                o.name,
                o.name
            )
        } else {
            format!("due: the next routing pass gives it to `{}`", o.name)
        };
        Route::Waiting {
            owner: Some(o.name.clone()),
            why,
        }
    }

    /// `e` as JSON with its `route` beside its fields.
    pub fn annotate(&self, e: &EventRecord) -> serde_json::Value {
        let mut v = serde_json::to_value(e).unwrap_or(serde_json::Value::Null);
        if let Some(map) = v.as_object_mut() {
            let route = self.route(&e.event.kind, e.routed_at_ms, e.work_id);
            map.insert(
                "route".into(),
                serde_json::to_value(route).unwrap_or(serde_json::Value::Null),
            );
        }
        v
    }
}

/// The warning for a push of `kind` when no running extension declares a work kind for it
/// (it will be routed to no Work); `None` when one does. `views` are every installed
/// package's, so a disabled one that declares it can be named with the command that enables
/// it.
pub fn warning(kind: &str, views: &[ExtensionView]) -> Option<String> {
    let declares = |v: &ExtensionView| {
        v.status.capabilities.as_ref().is_some_and(|c| {
            work_kind_of(kind, |k| c.work_kinds.iter().any(|w| w.name == k)).is_some()
        })
    };
    if views.iter().any(|v| v.enabled && declares(v)) {
        return None;
    }
    let disabled: Vec<&str> = views
        .iter()
        .filter(|v| !v.enabled && declares(v))
        .map(|v| v.status.name.as_str())
        .collect();
    Some(match disabled.first() {
        Some(name) => format!(
            "no running extension declares a work kind for `{kind}` (`{name}` does, but is disabled: `conduit ext enable {name}`); it will be routed to no Work"
        ),
        None => format!(
            "no installed package declares a work kind for `{kind}` (its kind, or a prefix of it at a dot); it will be routed to no Work"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use conduit_protocol::Capabilities;
    use conduit_protocol::handshake::WorkKind;
    use conduit_supervisor::Status;

    fn view(name: &str, state: State, kinds: &[(&str, bool)]) -> ExtensionView {
        let mut caps = Capabilities::default();
        caps.work_kinds = kinds.iter().map(|(k, t)| WorkKind::new(*k, *t)).collect();
        let mut status = Status::new(name, "1.0.0", state, Some(caps));
        status.protocol_version = Some(1);
        ExtensionView {
            status,
            enabled: true,
            installed_at_ms: 0,
            description: None,
            health: None,
            dev: None,
        }
    }

    #[test]
    fn an_event_waits_behind_its_owner_and_says_why() {
        let mut slow = view("slow", State::Ready, &[("job", true)]);
        slow.health = Some(crate::core::health::HealthView {
            condition: Condition::Degraded,
            since_ms: Some(1),
            reason: None,
            failures: 1,
            unresponsive_after: 5,
            next_probe_at_ms: None,
            unresponsive_restarts: 0,
            degraded_since_ms: Some(1),
            degraded_ms_total: 0,
        });
        let mut fresh = view("fresh", State::Starting, &[("note", true)]);
        fresh.status.protocol_version = None;
        let fine = view(
            "fine",
            State::Ready,
            &[("note.posted", false), ("job", false)],
        );
        let owners = Owners::from_views(&[slow, fresh, fine]);
        // `fine` sorts before `slow`: it owns `job`, and is healthy.
        let r = owners.route("job.run", None, None);
        assert_eq!(r.short(), "waits for fine (due)");
        // The longest declared kind at a dot: `note.posted` is fine's, plain `note` fresh's.
        assert_eq!(
            owners.route("note.posted", None, None).short(),
            "waits for fine (due)"
        );
        let r = owners.route("note.edited", None, None);
        assert_eq!(r.short(), "waits for fresh (starting)", "{r:?}");
        let r = owners.route("unknown.thing", None, None);
        assert_eq!(r.short(), "waiting");
        assert!(
            matches!(&r, Route::Waiting { why, .. } if why.contains("no running extension declares"))
        );
        assert_eq!(
            owners.route("job.run", Some(5), Some(3)),
            Route::Work { work_id: 3 }
        );
        assert_eq!(owners.route("x", Some(5), None).short(), "no work");
        assert!(matches!(
            Owners::no_daemon().route("job.run", None, None),
            Route::Waiting { owner: None, why } if why.contains("no daemon")
        ));
        let degraded = Owners::from_views(&[{
            let mut v = view("slow", State::Ready, &[("job", true)]);
            v.health = Some(crate::core::health::HealthView {
                condition: Condition::Unresponsive,
                since_ms: Some(1),
                reason: None,
                failures: 5,
                unresponsive_after: 5,
                next_probe_at_ms: None,
                unresponsive_restarts: 1,
                degraded_since_ms: Some(1),
                degraded_ms_total: 0,
            });
            v
        }]);
        assert_eq!(
            degraded.route("job.run", None, None).short(),
            "waits for slow (unresponsive)"
        );
    }

    #[test]
    fn a_push_of_a_kind_nobody_declares_is_warned_about() {
        let mut off = view("off", State::Disabled, &[("mail", true)]);
        off.enabled = false;
        let views = [view("notes", State::Ready, &[("note", true)]), off];
        assert_eq!(warning("note.posted", &views), None);
        let w = warning("unknown.thing", &views).unwrap();
        assert!(
            w.contains("no installed package declares") && w.contains("no Work"),
            "{w}"
        );
        let w = warning("mail.in", &views).unwrap();
        assert!(w.contains("conduit ext enable off"), "{w}");
    }
}
