//! The session against a peer that writes raw bytes: malformed and oversized messages get the
//! right error where their id is known, and the session goes on; a peer that stops reading
//! makes senders wait instead of growing memory.

use std::time::Duration;

use conduit_rpc::testing::TestHandler;
use conduit_rpc::{Session, SessionConfig};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// A session serving `TestHandler` on one end of a duplex; the test holds the other end raw.
fn raw_peer(
    config: SessionConfig,
) -> (
    Session,
    tokio::io::WriteHalf<tokio::io::DuplexStream>,
    BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>,
) {
    let (a, b) = tokio::io::duplex(1 << 20);
    let (ar, aw) = tokio::io::split(a);
    let (br, bw) = tokio::io::split(b);
    let session = Session::new(br, bw, TestHandler::default(), config);
    (session, aw, BufReader::new(ar))
}

async fn next_json(r: &mut BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>) -> Value {
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(5), r.read_line(&mut line))
        .await
        .expect("an answer")
        .unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

#[tokio::test]
async fn malformed_lines_get_their_error_and_the_session_goes_on() {
    let (_s, mut w, mut r) = raw_peer(SessionConfig::default());
    let cases: &[(&str, Value, i64)] = &[
        ("this is not json", Value::Null, -32700),
        (
            r#"{"jsonrpc":"1.0","id":3,"method":"echo"}"#,
            json!(3),
            -32600,
        ),
        (r#"{"jsonrpc":"2.0","id":4,"method":7}"#, json!(4), -32600),
        (
            r#"[{"jsonrpc":"2.0","id":5,"method":"echo"}]"#,
            Value::Null,
            -32600,
        ),
        (
            r#"{"jsonrpc":"2.0","id":"s","method":"nope"}"#,
            json!("s"),
            -32601,
        ),
        ("   ", Value::Null, -32700),
    ];
    for (line, id, code) in cases {
        w.write_all(format!("{line}\n").as_bytes()).await.unwrap();
        let v = next_json(&mut r).await;
        assert_eq!(
            (&v["id"], v["error"]["code"].as_i64().unwrap()),
            (id, *code),
            "{line} → {v}"
        );
    }
    // A response to nothing, and a malformed response, are never answered; the next request is.
    w.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":99,\"result\":1}\n{\"jsonrpc\":\"2.0\",\"id\":98,\"result\":1,\"error\":{\"code\":1,\"message\":\"x\"}}\n").await.unwrap();
    w.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"echo\",\"params\":{\"ok\":true}}\n")
        .await
        .unwrap();
    let v = next_json(&mut r).await;
    assert_eq!(
        (v["id"].clone(), v["result"].clone()),
        (json!(6), json!({"ok": true}))
    );
}

#[tokio::test]
async fn an_oversized_request_is_answered_message_too_large_by_id_and_the_next_is_served() {
    let max = 4096;
    let (_s, mut w, mut r) = raw_peer(SessionConfig {
        max_message_bytes: max,
        ..SessionConfig::default()
    });
    // Exactly at the cap: served.
    let head = r#"{"jsonrpc":"2.0","id":1,"method":"echo","params":""#;
    let at = format!("{head}{}\"}}", "a".repeat(max - head.len() - 2));
    assert_eq!(at.len(), max);
    w.write_all(format!("{at}\n").as_bytes()).await.unwrap();
    assert_eq!(next_json(&mut r).await["id"], 1);
    // One byte over: refused by id, unread.
    let over = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"echo","params":"{}"}}"#,
        "a".repeat(max)
    );
    w.write_all(format!("{over}\n").as_bytes()).await.unwrap();
    let v = next_json(&mut r).await;
    assert_eq!(
        (v["id"].as_i64(), v["error"]["code"].as_i64()),
        (Some(2), Some(-32004)),
        "{v}"
    );
    assert_eq!(v["error"]["data"]["limit"], max);
    w.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"echo\",\"params\":1}\n")
        .await
        .unwrap();
    assert_eq!(next_json(&mut r).await["result"], 1);
}

#[tokio::test]
async fn an_answer_over_the_cap_is_replaced_by_message_too_large() {
    let (_s, mut w, mut r) = raw_peer(SessionConfig {
        max_message_bytes: 4096,
        ..SessionConfig::default()
    });
    w.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"big\",\"params\":{\"bytes\":5000}}\n")
        .await
        .unwrap();
    let v = next_json(&mut r).await;
    assert_eq!(
        (v["id"].as_i64(), v["error"]["code"].as_i64()),
        (Some(1), Some(-32004)),
        "{v}"
    );
}

/// Answers gathered for a burst and an answer too large to gather (written from a buffer of
/// its own after what was gathered) all arrive whole, each once.
#[tokio::test]
async fn a_large_answer_among_gathered_ones_arrives_whole() {
    let (_s, mut w, mut r) = raw_peer(SessionConfig::default());
    let mut burst = String::new();
    for id in 1..=3 {
        burst +=
            &format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"echo\",\"params\":[{id}]}}\n");
    }
    burst += "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"big\",\"params\":{\"bytes\":200000}}\n";
    for id in 5..=7 {
        burst +=
            &format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"echo\",\"params\":[{id}]}}\n");
    }
    w.write_all(burst.as_bytes()).await.unwrap();
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..7 {
        let v = next_json(&mut r).await;
        let id = v["id"].as_i64().unwrap();
        assert!(seen.insert(id, v).is_none(), "answered twice: {id}");
    }
    for id in [1, 2, 3, 5, 6, 7] {
        assert_eq!(seen[&id]["result"], json!([id]), "{id}");
    }
    assert_eq!(seen[&4]["result"].as_str().map(str::len), Some(200_000));
}

#[tokio::test]
async fn a_peer_that_stops_reading_makes_senders_wait_within_the_queue_bound() {
    // A tiny pipe and an 8 KiB queue: the other side never reads.
    let (_unread, b) = tokio::io::duplex(1024);
    let (br, bw) = tokio::io::split(b);
    let session = Session::new(
        br,
        bw,
        TestHandler::default(),
        SessionConfig {
            write_queue_bytes: 8 * 1024,
            ..SessionConfig::default()
        },
    );
    let peer = session.peer();
    let payload = "x".repeat(1000);
    let mut sent = 0;
    loop {
        match tokio::time::timeout(Duration::from_millis(200), peer.notify("note", &payload)).await
        {
            Ok(Ok(())) => sent += 1,
            Ok(Err(e)) => panic!("{e}"),
            Err(_) => break, // waiting: the queue is full
        }
        assert!(
            sent < 100,
            "sent {sent} KiB into a pipe nobody reads: the queue is not bounded"
        );
    }
    // Frames are about 1 KiB: the 8 KiB queue holds about 7, counting the one the writer is
    // stuck on (its bytes stay counted until written).
    assert!(
        (6..=9).contains(&sent),
        "sent {sent} frames of 1 KiB into an 8 KiB queue"
    );
}

#[tokio::test]
async fn the_counters_count_every_byte_and_each_overloaded_refusal() {
    let counters = std::sync::Arc::new(conduit_rpc::SessionCounters::default());
    let (s, mut w, mut r) = raw_peer(SessionConfig {
        max_concurrent: 1,
        counters: counters.clone(),
        ..SessionConfig::default()
    });
    let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    // One request held (the limit), then one past it: refused with `overloaded`.
    let hold = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"hold\"}\n";
    let over = "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"echo\",\"params\":{}}\n";
    w.write_all(hold.as_bytes()).await.unwrap();
    w.write_all(over.as_bytes()).await.unwrap();
    let mut refusal = String::new();
    tokio::time::timeout(Duration::from_secs(5), r.read_line(&mut refusal))
        .await
        .expect("an answer")
        .unwrap();
    let v: Value = serde_json::from_str(&refusal).unwrap();
    assert_eq!(v["id"], 2, "{v}");
    assert_eq!(
        v["error"]["code"],
        conduit_protocol::ErrorCode::Overloaded.number(),
        "{v}"
    );
    assert_eq!(load(&counters.refused_overloaded), 1);
    assert_eq!(load(&counters.bytes_in), (hold.len() + over.len()) as u64);
    // The writer counts after its write returns, which the reader here may beat.
    settles(|| load(&counters.bytes_out), refusal.len() as u64).await;
    // A call the other way: its request out, its answer in, counted exactly.
    let peer = s.peer();
    let call = tokio::spawn(async move {
        peer.call::<_, Value>("ping", &json!({"n": 1}), Some(Duration::from_secs(5)))
            .await
    });
    let mut req = String::new();
    tokio::time::timeout(Duration::from_secs(5), r.read_line(&mut req))
        .await
        .expect("the request")
        .unwrap();
    let id = serde_json::from_str::<Value>(&req).unwrap()["id"].clone();
    let answer = format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"pong\":1}}}}\n");
    w.write_all(answer.as_bytes()).await.unwrap();
    assert_eq!(call.await.unwrap().unwrap(), json!({"pong": 1}));
    settles(
        || load(&counters.bytes_out),
        (refusal.len() + req.len()) as u64,
    )
    .await;
    assert_eq!(
        load(&counters.bytes_in),
        (hold.len() + over.len() + answer.len()) as u64
    );
    assert_eq!(load(&counters.refused_overloaded), 1);
}

/// Wait (at most 5 s) until `get` returns `want`.
async fn settles(get: impl Fn() -> u64, want: u64) {
    let end = std::time::Instant::now() + Duration::from_secs(5);
    while get() != want {
        assert!(
            std::time::Instant::now() < end,
            "{} never became {want}",
            get()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A request enters the incoming table only when its handler does not answer at once; either
/// way its id is taken while it runs and free once it is answered: a second request with the
/// id of one still running is refused `invalid_request` (the first one unharmed, and still
/// cancellable), and an id answered at once is free again at once.
#[tokio::test]
async fn an_id_is_taken_while_its_request_runs_and_free_once_it_is_answered() {
    let (s, mut w, mut r) = raw_peer(SessionConfig::default());
    let peer = s.peer();
    // Answered at once, twice with the same id: both served.
    for _ in 0..2 {
        w.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"echo\",\"params\":{\"n\":1}}\n")
            .await
            .unwrap();
        let v = next_json(&mut r).await;
        assert_eq!((&v["id"], &v["result"]["n"]), (&json!(1), &json!(1)), "{v}");
    }
    assert_eq!(peer.incoming_in_flight(), 0);
    // Running (a sleep), then the same id again: refused, the first still counted.
    w.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"sleep\",\"params\":{\"ms\":60000}}\n")
        .await
        .unwrap();
    w.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"echo\",\"params\":{}}\n")
        .await
        .unwrap();
    let v = next_json(&mut r).await;
    assert_eq!(v["id"], json!(2), "{v}");
    assert_eq!(v["error"]["code"], json!(-32600), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already in use"),
        "{v}"
    );
    assert_eq!(peer.incoming_in_flight(), 1);
    // The first is still there to cancel; once answered, its id is free again.
    w.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"$/cancel\",\"params\":{\"id\":2}}\n")
        .await
        .unwrap();
    let v = next_json(&mut r).await;
    assert_eq!(
        (&v["id"], &v["error"]["code"]),
        (&json!(2), &json!(-32001)),
        "{v}"
    );
    w.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"echo\",\"params\":{\"n\":2}}\n")
        .await
        .unwrap();
    let v = next_json(&mut r).await;
    assert_eq!((&v["id"], &v["result"]["n"]), (&json!(2), &json!(2)), "{v}");
    assert_eq!(peer.incoming_in_flight(), 0);
}
