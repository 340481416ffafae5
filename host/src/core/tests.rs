//! The core's operations on a real store in a temporary directory, with no extension running.

use std::sync::Arc;

use conduit_protocol::{CheckedPayload, ErrorCode};
use conduit_store::{Fault, Store, StoreError};
use conduit_supervisor::Supervisor;

use super::Core;
use super::fault::store_fault;
use super::group_commit::{Incoming, IngressCursor};
use super::ops::OwnerError;
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

fn event(delivery_id: &str) -> Incoming {
    Incoming {
        delivery_id: delivery_id.to_owned(),
        kind: "note".to_owned(),
        payload: CheckedPayload::from_value(&serde_json::json!({ "n": 1 })).unwrap(),
    }
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

/// Holds the store's writer on a thread of its own until the returned sender is used or
/// dropped: what queues meanwhile waits for one commit.
fn hold_writer(core: &Core) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let store = core.store.clone();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (held, holding) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        store
            .write(|_| {
                held.send(()).unwrap();
                let _ = released.recv();
                Ok(())
            })
            .unwrap();
    });
    holding.recv().unwrap();
    (release, thread)
}

/// Queue one submission from its own task, and wait until it is queued, so submissions queue
/// in the order this is called.
async fn submit(
    core: &Arc<Core>,
    events: Vec<Incoming>,
    cursor: Option<IngressCursor>,
) -> tokio::task::JoinHandle<Result<Vec<conduit_store::Accepted>, StoreError>> {
    let before = core.group.queued();
    let c = core.clone();
    let task = tokio::spawn(async move { c.accept_events("inbox".into(), events, cursor).await });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while core.group.queued() == before {
        assert!(std::time::Instant::now() < deadline, "never queued");
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    task
}

fn commits(core: &Core) -> u64 {
    core.timings
        .ingress
        .commits
        .load(std::sync::atomic::Ordering::Relaxed)
}

#[tokio::test]
async fn callers_that_queue_while_the_writer_is_busy_share_one_commit_in_their_order() {
    let (core, _dir) = core();
    let (release, holder) = hold_writer(&core);
    let mut tasks = Vec::new();
    for i in 0..20 {
        tasks.push(submit(&core, vec![event(&format!("d{i}"))], None).await);
    }
    // The same delivery twice in the batch, and a poll's events with its cursor.
    tasks.push(submit(&core, vec![event("d3")], None).await);
    let cursor = IngressCursor {
        extension: "notes".into(),
        cursor: "c1".into(),
    };
    tasks.push(submit(&core, vec![event("p1"), event("p2")], Some(cursor)).await);
    assert_eq!(core.group.queued(), 22, "all wait behind the held writer");
    release.send(()).unwrap();
    holder.join().unwrap();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap().unwrap());
    }
    assert_eq!(commits(&core), 1, "one transaction for the 22 callers");
    // Ids follow the order of arrival; the repeated delivery is the first's, a duplicate.
    let ids: Vec<i64> = answers[..20].iter().map(|a| a[0].event_id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    assert!(answers[..20].iter().all(|a| !a[0].duplicate));
    assert_eq!(answers[20][0].event_id, ids[3]);
    assert!(answers[20][0].duplicate);
    assert!(
        answers[21]
            .iter()
            .all(|a| !a.duplicate && a.event_id > ids[19])
    );
    let stored = core
        .read(|r| r.ingress_cursor("notes", "inbox"))
        .await
        .unwrap();
    assert_eq!(stored.as_deref(), Some("c1"));
    // One nudge for the commit; each new event stamped for acknowledgement-to-routing.
    assert!(take_nudge(&core).await);
    assert_eq!(core.timings.waiting(), 22);
}

#[tokio::test]
async fn a_submission_the_store_refuses_fails_alone_and_takes_its_cursor_with_it() {
    let (core, dir) = core();
    // A store refusal of one row: a trigger, as a constraint the store did not expect.
    rusqlite::Connection::open(dir.path().join("conduit.db"))
        .unwrap()
        .execute_batch(
            "CREATE TRIGGER refuse_bad BEFORE INSERT ON events WHEN NEW.delivery_id = 'bad' \
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;",
        )
        .unwrap();
    let (release, holder) = hold_writer(&core);
    let a = submit(&core, vec![event("a")], None).await;
    let cursor = IngressCursor {
        extension: "notes".into(),
        cursor: "9".into(),
    };
    let poll = submit(&core, vec![event("x"), event("bad")], Some(cursor)).await;
    let c = submit(&core, vec![event("c")], None).await;
    release.send(()).unwrap();
    holder.join().unwrap();
    let (a, poll, c) = (a.await.unwrap(), poll.await.unwrap(), c.await.unwrap());
    assert!(!a.unwrap()[0].duplicate);
    let e = poll.unwrap_err();
    assert!(e.to_string().contains("refused by the test"), "{e}");
    assert_eq!(e.fault(), Fault::Store);
    assert!(!c.unwrap()[0].duplicate);
    assert_eq!(commits(&core), 1);
    let refused = core
        .timings
        .ingress
        .refused
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(refused, 2, "the refused submission's two events");
    let stored: Vec<String> = core
        .read(|r| r.list_events(None, None, 10))
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event.delivery_id)
        .collect();
    assert_eq!(stored, ["a", "c"]);
    let cursor = core
        .read(|r| r.ingress_cursor("notes", "inbox"))
        .await
        .unwrap();
    assert_eq!(cursor, None, "the cursor moves only with its events");
}

#[test]
fn a_pass_that_leaves_a_full_page_of_due_timers_or_emissions_asks_for_the_next_at_once() {
    use super::host_loop::{HostLoop, PASS_LIMIT};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The supervisor starts its tasks on the runtime it is made in.
    let _entered = rt.enter();
    let (core, _dir) = core();
    let limit = PASS_LIMIT as usize;
    // Two pages and a half of due timers, a page and one of planned emissions; no extension
    // runs, so each gets its fallback (rescheduled, failed) and leaves the due and planned sets.
    rt.block_on(async {
        for _ in 0..limit * 5 / 2 {
            core.create_timer("notes".into(), "every".into(), "1s".into(), Some(5))
                .await
                .unwrap();
        }
        for _ in 0..=limit {
            core.plan_emission("notes".into(), "mail".into(), None, serde_json::json!({}))
                .await
                .unwrap();
        }
    });
    let shutdown = tokio_util::sync::CancellationToken::new();
    let host_loop = HostLoop::new(
        core.clone(),
        rt.handle().clone(),
        std::time::Duration::from_secs(3600),
        shutdown,
    );
    let passes: Vec<_> = (0..4)
        .map(|_| {
            let r = host_loop.pass();
            assert!(r.errors.is_empty(), "{r:?}");
            (r.timers_fired, r.emissions_failed, r.more)
        })
        .collect();
    assert_eq!(
        passes,
        [
            (limit, limit, true),
            (limit, 1, true),
            (limit / 2, 0, false),
            (0, 0, false)
        ]
    );
}

#[test]
fn every_active_wait_is_reached_a_page_a_pass_however_many_there_are() {
    use super::host_loop::{HostLoop, PASS_LIMIT};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _entered = rt.enter();
    let (core, _dir) = core();
    let limit = PASS_LIMIT as usize;
    // Two pages and a half of active waits, then one event after them all: each wait has one
    // event to match (no extension runs, so each gets the filter's fallback and moves past it).
    rt.block_on(async {
        for i in 0..limit * 5 / 2 {
            core.create_wait("notes".into(), "f".into(), format!("s{i}"), None)
                .await
                .unwrap();
        }
        core.accept_event("src".into(), event("after-the-waits"))
            .await
            .unwrap();
    });
    let host_loop = HostLoop::new(
        core.clone(),
        rt.handle().clone(),
        std::time::Duration::from_secs(3600),
        tokio_util::sync::CancellationToken::new(),
    );
    let passes: Vec<_> = (0..4)
        .map(|_| {
            let r = host_loop.pass();
            assert!(r.errors.is_empty(), "{r:?}");
            (r.waits_checked, r.more)
        })
        .collect();
    // Before: every pass read the same first page, and waits past it never saw the event.
    assert_eq!(
        passes,
        [(limit, true), (limit, true), (limit / 2, false), (0, false)]
    );
}
