//! The domain operations the management API and the callbacks share: accepting events,
//! creating timers and waits, planning emissions, and finding the extension that owns a name.
//!
//! Each is the whole rule once: what is written in one transaction, and whether the host loop is
//! nudged afterwards. The callers only parse their request and shape the answer; nothing here
//! knows HTTP or the wire's error codes (`StoreError::fault` is how both decide what to say).
//!
//! Invariant: an operation that may give the host loop something to do (a new event, a timer, a
//! planned emission) nudges it after its transaction commits, never before and never on failure;
//! a delivery accepted before (a duplicate) writes nothing and does not nudge.

use std::sync::Arc;

use conduit_protocol::calls::NewEvent;
use conduit_protocol::{Capabilities, Capability};
use conduit_store::{Accepted, Planned, StoreError};
use conduit_supervisor::now_ms;

use super::shared::Core;

/// Why no extension could be taken as the owner of a name.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum OwnerError {
    /// The caller named an extension that is not running (no handshake was ever made).
    #[error("extension `{ext}` is not running here")]
    NotRunning { ext: String },
    /// The caller named an extension that does not declare the name.
    #[error("extension `{ext}` does not declare the {} `{name}`", .kind.noun())]
    NotDeclared {
        ext: String,
        kind: Capability,
        name: String,
    },
    /// The caller named none, and no running extension declares the name.
    #[error(
        "no running extension declares the {} `{name}`; `conduit ext status` shows what each declares",
        .kind.noun()
    )]
    NoOwner { kind: Capability, name: String },
}

/// The owner of `name` among `exts` (each with its last handshake's capabilities, in the
/// supervisor's order): the one the caller named if it declares the name, else the first that
/// does. A pure function of what is running, so that the rule is tested without processes.
pub fn pick_owner<'a>(
    named: Option<&str>,
    exts: impl IntoIterator<Item = (&'a str, Option<&'a Capabilities>)>,
    kind: Capability,
    name: &str,
) -> Result<String, OwnerError> {
    let mut exts = exts.into_iter();
    if let Some(ext) = named {
        let caps = exts
            .find(|(e, _)| *e == ext)
            .and_then(|(_, c)| c)
            .ok_or_else(|| OwnerError::NotRunning {
                ext: ext.to_owned(),
            })?;
        return if caps.declares(kind, name) {
            Ok(ext.to_owned())
        } else {
            Err(OwnerError::NotDeclared {
                ext: ext.to_owned(),
                kind,
                name: name.to_owned(),
            })
        };
    }
    exts.find(|(_, c)| c.is_some_and(|c| c.declares(kind, name)))
        .map(|(e, _)| e.to_owned())
        .ok_or_else(|| OwnerError::NoOwner {
            kind,
            name: name.to_owned(),
        })
}

/// Whether accepting these deliveries gave the host loop something to route: at least one was
/// new.
pub fn any_fresh(accepted: &[Accepted]) -> bool {
    accepted.iter().any(|a| !a.duplicate)
}

/// Where an ingress poll got to, written with the events it returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IngressCursor {
    pub extension: String,
    pub cursor: String,
}

impl Core {
    /// The extension that owns `name` of `kind`: the one the caller named, if it is running
    /// and declares it, or else the first running extension that declares it.
    pub fn owner(
        &self,
        named: Option<&str>,
        kind: Capability,
        name: &str,
    ) -> Result<String, OwnerError> {
        match named {
            // Only the named one's capabilities matter: look it up alone.
            Some(ext) => {
                let caps = self.capabilities(ext);
                pick_owner(Some(ext), [(ext, caps.as_deref())], kind, name)
            }
            None => {
                let exts = self.extensions();
                pick_owner(
                    None,
                    exts.iter().map(|(e, c)| (e.name(), Some(&**c))),
                    kind,
                    name,
                )
            }
        }
    }

    /// Whether `ext` declared `name` of `kind` in its last handshake.
    pub fn declares(&self, ext: &str, kind: Capability, name: &str) -> bool {
        self.capabilities(ext)
            .is_some_and(|c| c.declares(kind, name))
    }

    /// Accept one delivery from `source` (see [`Core::accept_events`]).
    pub async fn accept_event(
        self: &Arc<Self>,
        source: String,
        event: NewEvent,
    ) -> Result<Accepted, StoreError> {
        let mut accepted = self.accept_events(source, vec![event], None).await?;
        Ok(accepted.remove(0))
    }

    /// Accept deliveries from `source` and, in the same transaction, move an ingress cursor (so a
    /// crash never loses events behind a cursor that moved past them); then nudge the host loop
    /// unless every delivery was a duplicate. One [`Accepted`] per event, in order. The events'
    /// fields and payload depth are the caller's to check first (the protocol's rules).
    pub async fn accept_events(
        self: &Arc<Self>,
        source: String,
        events: Vec<NewEvent>,
        cursor: Option<IngressCursor>,
    ) -> Result<Vec<Accepted>, StoreError> {
        let accepted = self
            .write(move |tx| {
                let now = now_ms();
                let accepted = events
                    .iter()
                    .map(|e| tx.accept_event(&source, &e.delivery_id, &e.kind, &e.payload, now))
                    .collect::<Result<Vec<_>, _>>()?;
                if let Some(c) = &cursor {
                    tx.set_ingress_cursor(&c.extension, &source, &c.cursor, now)?;
                }
                Ok(accepted)
            })
            .await?;
        if any_fresh(&accepted) {
            self.nudge();
        }
        Ok(accepted)
    }

    /// Create a timer of `ext`'s `recurrence`, first due at `first_at_ms` (now when absent),
    /// and nudge the host loop.
    pub async fn create_timer(
        self: &Arc<Self>,
        ext: String,
        recurrence: String,
        spec: String,
        first_at_ms: Option<i64>,
    ) -> Result<i64, StoreError> {
        let now = now_ms();
        let first = first_at_ms.unwrap_or(now);
        let id = self
            .write(move |tx| tx.create_timer(&ext, &recurrence, &spec, first, now))
            .await?;
        self.nudge();
        Ok(id)
    }

    /// Create a wait on `ext`'s dependency `filter`. Only events accepted after the wait was
    /// made can satisfy it: its cursor starts at the latest event, read in the same
    /// transaction. The host loop is not nudged: a wait alone gives it nothing to do.
    pub async fn create_wait(
        self: &Arc<Self>,
        ext: String,
        filter: String,
        subject: String,
        work_id: Option<i64>,
    ) -> Result<i64, StoreError> {
        self.write(move |tx| {
            let after = tx.latest_event_id()?.unwrap_or(0);
            tx.create_wait(&ext, &filter, &subject, work_id, after, now_ms())
        })
        .await
    }

    /// Plan `ext`'s `emission` (committed later by the host loop's `emit.commit`), and nudge
    /// the host loop.
    pub async fn plan_emission(
        self: &Arc<Self>,
        ext: String,
        emission: String,
        work_id: Option<i64>,
        payload: serde_json::Value,
    ) -> Result<Planned, StoreError> {
        let planned = self
            .write(move |tx| tx.plan_emission(&ext, &emission, work_id, &payload, now_ms()))
            .await?;
        self.nudge();
        Ok(planned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(emissions: &[&str]) -> Capabilities {
        let mut caps = Capabilities::default();
        caps.emissions = emissions.iter().map(|s| (*s).to_owned()).collect();
        caps
    }

    #[test]
    fn the_owner_is_the_named_extension_if_it_declares_the_name_else_the_first_that_does() {
        let (a, b) = (caps(&["note"]), caps(&["note", "mail"]));
        let running = || [("a", Some(&a)), ("b", Some(&b)), ("c", None)];
        let pick = |named, name| pick_owner(named, running(), Capability::Emissions, name);
        assert_eq!(pick(None, "note"), Ok("a".to_owned()));
        assert_eq!(pick(None, "mail"), Ok("b".to_owned()));
        assert_eq!(pick(Some("b"), "note"), Ok("b".to_owned()));
        assert_eq!(
            pick(Some("a"), "mail"),
            Err(OwnerError::NotDeclared {
                ext: "a".into(),
                kind: Capability::Emissions,
                name: "mail".into()
            })
        );
        // Running without a handshake yet, or not supervised at all: not running.
        for ext in ["c", "d"] {
            assert_eq!(
                pick(Some(ext), "note"),
                Err(OwnerError::NotRunning { ext: ext.into() })
            );
        }
        assert_eq!(
            pick(None, "sms"),
            Err(OwnerError::NoOwner {
                kind: Capability::Emissions,
                name: "sms".into()
            })
        );
    }

    #[test]
    fn owner_errors_say_what_was_looked_for_as_the_api_always_said_it() {
        let cases = [
            (
                OwnerError::NotRunning { ext: "a".into() },
                "extension `a` is not running here",
            ),
            (
                OwnerError::NotDeclared {
                    ext: "a".into(),
                    kind: Capability::DependencyFilters,
                    name: "f".into(),
                },
                "extension `a` does not declare the dependency filter `f`",
            ),
            (
                OwnerError::NoOwner {
                    kind: Capability::Recurrences,
                    name: "cron".into(),
                },
                "no running extension declares the recurrence `cron`; `conduit ext status` shows what each declares",
            ),
        ];
        for (e, text) in cases {
            assert_eq!(e.to_string(), text);
        }
    }

    #[test]
    fn each_kind_reads_its_own_capability_list() {
        let mut c = Capabilities::default();
        c.recurrences = vec!["r".into()];
        c.dependency_filters = vec!["f".into()];
        c.emissions = vec!["e".into()];
        c.ingress = vec!["i".into()];
        for (kind, name) in [
            (Capability::Recurrences, "r"),
            (Capability::DependencyFilters, "f"),
            (Capability::Emissions, "e"),
            (Capability::Ingress, "i"),
        ] {
            for other in ["r", "f", "e", "i"] {
                assert_eq!(c.declares(kind, other), other == name, "{kind:?} {other}");
            }
        }
    }

    #[test]
    fn only_a_fresh_delivery_gives_the_loop_something_to_route() {
        let dup = Accepted {
            event_id: 1,
            duplicate: true,
        };
        let new = Accepted {
            event_id: 2,
            duplicate: false,
        };
        assert!(!any_fresh(&[]));
        assert!(!any_fresh(&[dup, dup]));
        assert!(any_fresh(&[dup, new]));
    }
}
