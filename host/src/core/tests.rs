//! The core's operations on a real store in a temporary directory, with no extension running.

use std::sync::Arc;

use conduit_protocol::ErrorCode;
use conduit_protocol::calls::NewEvent;
use conduit_store::{Fault, Store, StoreError};
use conduit_supervisor::Supervisor;

use super::Core;
use super::fault::store_fault;
use super::ops::{IngressCursor, OwnerError};
use conduit_protocol::Capability;

/// A core over a fresh store; the directory lives as long as the core is used.
fn core() -> (Arc<Core>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("conduit.db")).unwrap();
    let supervisor = Supervisor::new(conduit_supervisor::no_callbacks());
    let core = Core::new(
        Arc::new(store),
        Arc::new(supervisor),
        dir.path().join("artifacts"),
        dir.path().join("tmp"),
    );
    (Arc::new(core), dir)
}

/// Whether a nudge is waiting (taking it), without waiting for one.
async fn take_nudge(core: &Core) -> bool {
    tokio::select! {
        biased;
        () = core.nudged() => true,
        () = std::future::ready(()) => false,
    }
}

fn event(delivery_id: &str) -> NewEvent {
    NewEvent::new(delivery_id, "note", serde_json::json!({ "n": 1 }))
}

#[tokio::test]
async fn a_panicking_write_or_read_is_a_host_fault_never_the_callers() {
    let (core, _dir) = core();
    let e = core
        .write(|_tx| -> Result<(), StoreError> { panic!("a bug in a write") })
        .await
        .unwrap_err();
    assert!(
        matches!(&e, StoreError::Panicked { what: "write", reason } if reason == "a bug in a write"),
        "{e:?}"
    );
    assert_eq!(e.fault(), Fault::Host);
    let wire = store_fault(e);
    assert!(wire.is(ErrorCode::InternalError), "{wire:?}");

    let e = core
        .read(|_r| -> Result<(), StoreError> { panic!("a bug in a read") })
        .await
        .unwrap_err();
    assert!(
        matches!(&e, StoreError::Panicked { what: "read", .. }),
        "{e:?}"
    );
    assert_eq!(core.store_panics(), 2);
    // The host loop's own panic count is a separate matter.
    assert_eq!(
        core.stats.panics.load(std::sync::atomic::Ordering::Relaxed),
        0
    );

    // The writer is usable again: the panicking transaction was rolled back.
    let accepted = core
        .accept_event("inbox".into(), event("d1"))
        .await
        .unwrap();
    assert!(!accepted.duplicate);
}

#[tokio::test]
async fn accepting_events_nudges_the_loop_unless_every_one_was_a_duplicate() {
    let (core, _dir) = core();
    let first = core
        .accept_event("inbox".into(), event("d1"))
        .await
        .unwrap();
    assert!(!first.duplicate);
    assert!(take_nudge(&core).await);

    let again = core
        .accept_event("inbox".into(), event("d1"))
        .await
        .unwrap();
    assert_eq!(again.event_id, first.event_id);
    assert!(again.duplicate);
    assert!(!take_nudge(&core).await);

    // A batch with one new delivery among duplicates, and the cursor written with it.
    let cursor = IngressCursor {
        extension: "notes".into(),
        cursor: "7".into(),
    };
    let batch = core
        .accept_events("inbox".into(), vec![event("d1"), event("d2")], Some(cursor))
        .await
        .unwrap();
    assert_eq!(
        batch.iter().map(|a| a.duplicate).collect::<Vec<_>>(),
        [true, false]
    );
    assert!(take_nudge(&core).await);
    let stored = core
        .read(|r| r.ingress_cursor("notes", "inbox"))
        .await
        .unwrap();
    assert_eq!(stored.as_deref(), Some("7"));

    // Only the cursor moves: nothing to route.
    let none = core
        .accept_events(
            "inbox".into(),
            Vec::new(),
            Some(IngressCursor {
                extension: "notes".into(),
                cursor: "8".into(),
            }),
        )
        .await
        .unwrap();
    assert!(none.is_empty());
    assert!(!take_nudge(&core).await);
}

#[tokio::test]
async fn a_wait_sees_only_events_after_it_was_made() {
    let (core, _dir) = core();
    let before = core
        .accept_event("inbox".into(), event("d1"))
        .await
        .unwrap();
    let id = core
        .create_wait("notes".into(), "f".into(), "s".into(), None)
        .await
        .unwrap();
    let wait = core.read(move |r| r.wait(id)).await.unwrap().unwrap();
    assert_eq!(wait.cursor_event_id, before.event_id);
}

#[tokio::test]
async fn timers_and_emissions_nudge_the_loop_and_a_store_refusal_keeps_its_class() {
    let (core, _dir) = core();
    let _ = take_nudge(&core).await;
    let timer = core
        .create_timer("notes".into(), "every".into(), "1s".into(), Some(5))
        .await
        .unwrap();
    assert!(take_nudge(&core).await);
    let t = core.read(move |r| r.timer(timer)).await.unwrap().unwrap();
    assert_eq!(t.next_at_ms, Some(5));

    core.plan_emission("notes".into(), "mail".into(), None, serde_json::json!({}))
        .await
        .unwrap();
    assert!(take_nudge(&core).await);

    // A payload past the depth limit: the store refuses it as the caller's value, and
    // nothing is nudged.
    let mut deep = serde_json::json!(1);
    for _ in 0..100 {
        deep = serde_json::json!([deep]);
    }
    let e = core
        .plan_emission("notes".into(), "mail".into(), None, deep)
        .await
        .unwrap_err();
    assert!(!take_nudge(&core).await);
    assert_eq!(e.fault(), Fault::Invalid, "{e}");
    assert!(store_fault(e).is(ErrorCode::InvalidParams));
}

#[tokio::test]
async fn with_no_extension_running_no_name_has_an_owner() {
    let (core, _dir) = core();
    assert_eq!(
        core.owner(Some("notes"), Capability::Recurrences, "every"),
        Err(OwnerError::NotRunning {
            ext: "notes".into()
        })
    );
    assert_eq!(
        core.owner(None, Capability::Recurrences, "every"),
        Err(OwnerError::NoOwner {
            kind: Capability::Recurrences,
            name: "every".into()
        })
    );
    assert!(!core.declares("notes", Capability::Ingress, "inbox"));
}
