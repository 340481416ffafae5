//! The session's behaviour, over an in-memory duplex and over real pipes to a real child
//! process (`rpc-test-peer`). Every scenario runs on both.

use std::process::Stdio;
use std::time::{Duration, Instant};

use conduit_protocol::ErrorCode;
use conduit_rpc::testing::TestHandler;
use conduit_rpc::{CallError, CallOptions, CloseReason, Peer, Session, SessionConfig};
use serde_json::{Value, json};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

enum Other {
    Memory(Session, #[allow(dead_code)] TestHandler),
    Process(Child),
}

struct Pair {
    host: Session,
    other: Option<Other>,
}

impl Pair {
    fn peer(&self) -> Peer {
        self.host.peer()
    }

    /// End the other side abruptly: drop its session, or SIGKILL the child.
    async fn kill_other(&mut self) {
        match self.other.take() {
            Some(Other::Memory(s, _)) => drop(s),
            Some(Other::Process(mut c)) => {
                c.start_kill().unwrap();
                let _ = c.wait().await;
            }
            None => {}
        }
    }
}

fn host_config(test: &str) -> SessionConfig {
    // A well-behaved session keeps at most 64 calls in flight, so it never meets the peer's
    // overload rule; the overload test lifts that to reach it.
    let max_outgoing = if test.contains("overloaded") {
        2000
    } else {
        64
    };
    SessionConfig {
        max_outgoing,
        ..SessionConfig::named("test-peer")
    }
}

fn memory(config: SessionConfig) -> Pair {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let (ar, aw) = tokio::io::split(a);
    let (br, bw) = tokio::io::split(b);
    let handler = TestHandler::default();
    let other = Session::new(br, bw, handler.clone(), SessionConfig::named("host"));
    let host = Session::new(ar, aw, TestHandler::default(), config);
    Pair {
        host,
        other: Some(Other::Memory(other, handler)),
    }
}

fn process(config: SessionConfig) -> Pair {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rpc-test-peer"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn rpc-test-peer");
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let host = Session::new(stdout, stdin, TestHandler::default(), config);
    Pair {
        host,
        other: Some(Other::Process(child)),
    }
}

macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod memory { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::memory(super::host_config(stringify!($name)))).await } )* }
        mod process { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::process(super::host_config(stringify!($name)))).await } )* }
    };
}

both!(
    a_thousand_concurrent_calls_all_get_their_own_answer,
    the_65th_request_is_refused_overloaded_while_64_are_held,
    cancellation_reaches_the_handler_and_the_caller_gets_cancelled,
    a_deadline_yields_deadline_exceeded_and_the_other_side_sees_cancel,
    a_handler_can_call_back_while_its_request_is_pending,
    the_peer_going_away_fails_every_pending_call_at_once,
    unknown_methods_get_method_not_found,
    a_panicking_handler_is_answered_internal_error_and_frees_its_slot,
    params_that_do_not_serialize_fail_the_call_and_send_nothing,
);

async fn stats(peer: &Peer) -> Value {
    peer.call("stats", &json!({}), Some(Duration::from_secs(5)))
        .await
        .unwrap()
}

/// How long a test waits for a condition before it gives up (only a failing test waits this
/// long; the suite runs on busy machines).
const PATIENCE: Duration = Duration::from_secs(30);

/// Polls until the other side's handler has started `n` `hold` requests.
async fn wait_holding(peer: &Peer, n: u64) {
    let start = Instant::now();
    while stats(peer).await["holds_started"].as_u64().unwrap() < n {
        assert!(start.elapsed() < PATIENCE, "the holds never started");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn a_thousand_concurrent_calls_all_get_their_own_answer(pair: Pair) {
    let peer = pair.peer();
    let calls = (0..1000).map(|i| {
        let peer = peer.clone();
        async move {
            let v: Value = peer
                .call(
                    "echo",
                    &json!({ "n": i, "pad": "x".repeat(i % 97) }),
                    Some(Duration::from_secs(20)),
                )
                .await?;
            Ok::<_, CallError>((i, v))
        }
    });
    for res in futures::future::join_all(calls).await {
        let (i, v) = res.expect("call failed");
        assert_eq!(v["n"], i);
        assert_eq!(v["pad"].as_str().unwrap().len(), i % 97);
    }
}

async fn the_65th_request_is_refused_overloaded_while_64_are_held(pair: Pair) {
    let peer = pair.peer();
    let held: Vec<_> = (0..64)
        .map(|_| {
            let peer = peer.clone();
            // A hold that arrives while our probe below is being served is itself refused:
            // send it again until all 64 are held.
            tokio::spawn(async move {
                loop {
                    match peer.call::<_, Value>("hold", &json!({}), None).await {
                        Err(e) if e.is(ErrorCode::Overloaded) => {
                            tokio::time::sleep(Duration::from_millis(1)).await
                        }
                        other => return other,
                    }
                }
            })
        })
        .collect();
    // Once all 64 are being served, the next request is refused at once.
    let start = Instant::now();

    let err = loop {
        match peer
            .call::<_, Value>("echo", &json!(1), Some(PATIENCE))
            .await
        {
            Ok(_) => assert!(start.elapsed() < PATIENCE, "never refused"),
            Err(e) => break e,
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(err.is(ErrorCode::Overloaded), "{err}");
    assert!(ErrorCode::Overloaded.is_retryable());
    // Free one slot: the next request is served again.
    held[0].abort();
    let start = Instant::now();
    loop {
        match peer
            .call::<_, Value>("echo", &json!(2), Some(PATIENCE))
            .await
        {
            Ok(v) => break assert_eq!(v, json!(2)),
            Err(e) if e.is(ErrorCode::Overloaded) && start.elapsed() < PATIENCE => {
                tokio::time::sleep(Duration::from_millis(5)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
    for h in held {
        h.abort();
    }
}

async fn cancellation_reaches_the_handler_and_the_caller_gets_cancelled(pair: Pair) {
    let peer = pair.peer();
    let token = CancellationToken::new();
    let call = {
        let (peer, token) = (peer.clone(), token.clone());
        tokio::spawn(async move {
            let params = serde_json::value::to_raw_value(&json!({})).unwrap();
            peer.request(
                "hold",
                &params,
                CallOptions::within(Some(Duration::from_secs(10))).cancelled_by(&token),
            )
            .await
        })
    };
    wait_holding(&peer, 1).await;
    let t = Instant::now();
    token.cancel();
    let err = call.await.unwrap().unwrap_err();
    assert!(err.is(ErrorCode::Cancelled), "{err}");
    // Not the call's 10 s deadline; the margin is for a busy machine.
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(
        stats(&peer).await["cancels_seen"],
        1,
        "the handler saw its cancellation"
    );
}

async fn a_deadline_yields_deadline_exceeded_and_the_other_side_sees_cancel(pair: Pair) {
    let peer = pair.peer();
    let t = Instant::now();
    let err = peer
        .call::<_, Value>("hold", &json!({}), Some(Duration::from_millis(100)))
        .await
        .unwrap_err();
    let took = t.elapsed();
    assert!(matches!(err, CallError::DeadlineExceeded { .. }), "{err}");
    assert!(err.is(ErrorCode::DeadlineExceeded));
    // The deadline is the feature: never before it, and soon after it (the handler never
    // answers); the upper margin is for a busy machine.
    assert!(
        took >= Duration::from_millis(100) && took < Duration::from_secs(5),
        "{took:?}"
    );
    let start = Instant::now();
    while stats(&peer).await["cancels_seen"] != 1 {
        assert!(
            start.elapsed() < PATIENCE,
            "the other side never saw $/cancel"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        peer.outgoing_in_flight(),
        0,
        "the timed-out call left the pending table"
    );
}

async fn a_handler_can_call_back_while_its_request_is_pending(pair: Pair) {
    let peer = pair.peer();
    let v: Value = peer
        .call(
            "callback",
            &json!({ "via": "host" }),
            Some(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    assert_eq!(v, json!({ "via": "host" }));
    // Many at once, each holding a slot on both sides while its callback runs: no deadlock.
    let calls = (0..200).map(|i| {
        let peer = peer.clone();
        async move {
            peer.call::<_, Value>("callback", &json!(i), Some(Duration::from_secs(20)))
                .await
        }
    });
    for (i, r) in futures::future::join_all(calls)
        .await
        .into_iter()
        .enumerate()
    {
        assert_eq!(r.unwrap(), json!(i));
    }
}

async fn the_peer_going_away_fails_every_pending_call_at_once(mut pair: Pair) {
    let peer = pair.peer();
    let pending: Vec<_> = (0..10)
        .map(|_| {
            let peer = peer.clone();
            tokio::spawn(async move {
                peer.call::<_, Value>("hold", &json!({}), Some(Duration::from_secs(30)))
                    .await
            })
        })
        .collect();
    let start = Instant::now();
    while peer.outgoing_in_flight() < 10 {
        assert!(start.elapsed() < PATIENCE);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    wait_holding(&peer, 10).await;
    let t = Instant::now();
    pair.kill_other().await;
    for p in pending {
        let err = p.await.unwrap().unwrap_err();
        assert!(
            matches!(
                err,
                CallError::Closed {
                    reason: CloseReason::PeerClosed,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.is(ErrorCode::ExtensionExited));
    }
    // Not the calls' 30 s deadline; the margin is for a busy machine.
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}, far over what EOF needs",
        t.elapsed()
    );
    assert_eq!(pair.host.wait().await, CloseReason::PeerClosed);
    // A call after the end fails at once too.
    let err = peer
        .call::<_, Value>("echo", &json!(1), None)
        .await
        .unwrap_err();
    assert!(matches!(err, CallError::Closed { .. }), "{err}");
}

async fn a_panicking_handler_is_answered_internal_error_and_frees_its_slot(pair: Pair) {
    let peer = pair.peer();
    // Panics while running, and panics while making the future (before any wrapper around
    // the future exists): both answered, neither takes the session down.
    for method in ["panic", "panic-early"] {
        for _ in 0..70 {
            let err = peer
                .call::<_, Value>(method, &json!({}), Some(Duration::from_secs(5)))
                .await
                .unwrap_err();
            assert!(err.is(ErrorCode::InternalError), "{method}: {err}");
        }
    }
    // 140 panics later, all 64 slots are still free.
    let v: Value = peer
        .call("echo", &json!(1), Some(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(v, json!(1));
}

async fn unknown_methods_get_method_not_found(pair: Pair) {
    let err = pair
        .peer()
        .call::<_, Value>("no.such", &json!({}), None)
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::MethodNotFound), "{err}");
    assert!(err.to_string().contains("no.such"));
}

/// Params are serialized straight into the request's frame: a value serde cannot write as
/// JSON fails the call at once, and nothing of it reaches the peer (the next call is answered
/// as if it had never been).
async fn params_that_do_not_serialize_fail_the_call_and_send_nothing(pair: Pair) {
    let peer = pair.peer();
    // A map whose keys are not strings has no JSON form.
    let bad = std::collections::BTreeMap::from([(vec![1u8], 1)]);
    let err = peer
        .call::<_, Value>("echo", &bad, Some(Duration::from_secs(10)))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CallError::BadResult { detail, .. } if detail.contains("params do not serialize")),
        "{err:?}"
    );
    let back: Value = peer
        .call("echo", &json!({"after": 1}), Some(Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(back, json!({"after": 1}));
}

#[tokio::test]
async fn graceful_close_lets_running_requests_finish_and_closes_the_write_half() {
    let Pair { host, other } = memory(host_config("close"));
    let Some(Other::Memory(ext, _)) = other else {
        unreachable!()
    };
    // The extension side calls the host's `sleep`; the host closes with a grace long enough.
    let ext_peer = ext.peer();
    let call = tokio::spawn(async move {
        ext_peer
            .call::<_, Value>("sleep", &json!({ "ms": 50 }), None)
            .await
    });
    // Close once the host is serving the call, not after a guessed time.
    let host_peer = host.peer();
    let start = Instant::now();
    while host_peer.incoming_in_flight() < 1 {
        assert!(
            start.elapsed() < PATIENCE,
            "the call never reached the host"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let reason = host.close(Duration::from_secs(2)).await;
    assert_eq!(reason, CloseReason::Local);
    assert_eq!(call.await.unwrap().unwrap(), json!({ "slept_ms": 50 }));
    assert_eq!(
        ext.wait().await,
        CloseReason::PeerClosed,
        "the other side sees EOF"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_flooding_each_other_with_large_calls_do_not_lock_up() {
    // Each side makes 64 calls at a time of 1 MiB to the other, four rounds each, so both write
    // queues (32 MiB) fill while both readers answer echo inline. A reader that waited for
    // queue space would stop reading, and the two would wait on each other for ever (before
    // the fix: 128 of 130 calls failed and the pair never answered again).
    async fn echo(req: conduit_rpc::Request) -> conduit_rpc::HandlerResult {
        Ok(req
            .params
            .unwrap_or_else(|| serde_json::value::RawValue::from_string("null".into()).unwrap()))
    }
    let (a, b) = tokio::io::duplex(64 * 1024);
    let (ar, aw) = tokio::io::split(a);
    let (br, bw) = tokio::io::split(b);
    // 64 MiB of calls per side is past the default held-bytes bound (48 MiB), which would
    // refuse some with `overloaded`: lifted here, where the point is that nothing locks up.
    // Each call's deadline is a ceiling for a lock-up, not a speed bound: 512 MiB through a
    // debug build takes seconds when the machine is quiet and tens of seconds when it is not.
    let config = |name: &str| SessionConfig {
        max_held_bytes: 256 << 20,
        ..SessionConfig::named(name)
    };
    let left = Session::new(ar, aw, echo, config("left"));
    let right = Session::new(br, bw, echo, config("right"));
    let payload = std::sync::Arc::new(
        serde_json::value::RawValue::from_string(format!("\"{}\"", "x".repeat(1024 * 1024)))
            .unwrap(),
    );
    let mut tasks = Vec::new();
    for peer in [left.peer(), right.peer()] {
        for _ in 0..64 {
            let (peer, payload) = (peer.clone(), payload.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..4 {
                    peer.request(
                        "echo",
                        &**payload,
                        CallOptions::within(Some(Duration::from_secs(120))),
                    )
                    .await?;
                }
                Ok::<_, CallError>(())
            }));
        }
    }
    for (i, t) in tasks.into_iter().enumerate() {
        t.await
            .unwrap()
            .unwrap_or_else(|e| panic!("caller {i}: {e}"));
    }
    let small = serde_json::value::RawValue::from_string("1".into()).unwrap();
    let v = left
        .peer()
        .request(
            "echo",
            &small,
            CallOptions::within(Some(Duration::from_secs(5))),
        )
        .await
        .unwrap();
    assert_eq!(v.get(), "1");
}

/// Params (a JSON string) that make a notification of `method` exactly `frame` bytes long,
/// with its newline.
fn notification_params(method: &str, frame: usize) -> Box<serde_json::value::RawValue> {
    let empty = serde_json::value::RawValue::from_string("\"\"".into()).unwrap();
    let mut probe = Vec::new();
    conduit_protocol::message::write_notification(&mut probe, method, &empty);
    let fill = frame - (probe.len() + 1);
    serde_json::value::RawValue::from_string(format!("\"{}\"", "x".repeat(fill))).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_held_bytes_bound_a_call_fails_at_once_with_overloaded() {
    // A peer that never reads: the writer's first write blocks, so every byte sent stays held.
    let (a, _unread) = tokio::io::duplex(1024);
    let (ar, aw) = tokio::io::split(a);
    let config = SessionConfig {
        write_queue_bytes: 4096,
        max_held_bytes: 8192,
        max_message_bytes: 4096,
        ..SessionConfig::named("held")
    };
    let host = Session::new(ar, aw, TestHandler::default(), config);
    let peer = host.peer();
    let quick = Duration::from_secs(5);
    // The whole queue, then exactly the rest of the bound: the second waits for room.
    tokio::time::timeout(
        quick,
        peer.notify("fill", &notification_params("fill", 4096)),
    )
    .await
    .expect("the first notification is queued at once")
    .unwrap();
    let waiting = {
        let peer = peer.clone();
        tokio::spawn(async move {
            peer.notify("wait", &notification_params("wait", 4096))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !waiting.is_finished(),
        "at the bound a sender waits for room"
    );
    // One byte past the bound: refused at once, whether a call or a notification.
    let t = Instant::now();
    let one = serde_json::value::RawValue::from_string("1".into()).unwrap();
    let err = peer
        .request(
            "echo",
            &one,
            CallOptions::within(Some(Duration::from_secs(20))),
        )
        .await
        .unwrap_err();
    assert!(err.is(ErrorCode::Overloaded), "{err}");
    assert!(
        matches!(
            err,
            CallError::Overloaded {
                held: 8192,
                limit: 8192,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("8192-byte bound"),
        "the error names the bound: {err}"
    );
    let err = peer.notify("more", &json!(1)).await.unwrap_err();
    assert!(err.is(ErrorCode::Overloaded), "{err}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // A sender that gives up gives its bytes back: the same frame is accepted again.
    waiting.abort();
    let _ = waiting.await;
    let again = {
        let peer = peer.clone();
        tokio::spawn(async move {
            peer.notify("wait", &notification_params("wait", 4096))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!again.is_finished(), "it waits for room instead of failing");
    again.abort();
}
