//! The write path: a sender that finds nothing queued writes its frame itself, and hands the
//! rest of a frame the pipe did not take to the writer task. Frames must still go out whole
//! and in order, the bounds must still hold, and a broken pipe must end the session as before.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use conduit_protocol::ErrorCode;
use conduit_rpc::testing::TestHandler;
use conduit_rpc::{CallError, CallOptions, CloseReason, Session, SessionConfig, SessionCounters};
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;

/// How long a test waits for a condition before it gives up (only a failing test waits this
/// long; the suite runs on busy machines).
const PATIENCE: Duration = Duration::from_secs(30);

/// Wait until `done` holds, polling; only a failing test reaches the [`PATIENCE`] ceiling.
async fn eventually(what: &str, done: impl Fn() -> bool) {
    let poll = async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    if tokio::time::timeout(PATIENCE, poll).await.is_err() {
        panic!("timed out waiting for {what}");
    }
}

/// A read half that never yields anything and never ends, for sessions only written to.
fn silent() -> (tokio::io::DuplexStream, tokio::io::DuplexStream) {
    tokio::io::duplex(64)
}

/// The padding of frame `seq` of sender `task`: mostly small, every fifth larger than a pipe's
/// buffer (64 KiB), so that some writes are partial.
fn pad(task: usize, seq: usize) -> String {
    let len = if (task + seq).is_multiple_of(5) {
        100_000 + task * 13
    } else {
        (task * 7919 + seq * 104_729) % 3000
    };
    "x".repeat(len)
}

/// Every line of `bytes` as JSON (a line that does not parse is two frames interleaved).
fn lines(bytes: &[u8]) -> Vec<Value> {
    bytes
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| {
            serde_json::from_slice(l).unwrap_or_else(|e| {
                panic!(
                    "a line is not one JSON message ({e}): {}…",
                    String::from_utf8_lossy(&l[..l.len().min(200)])
                )
            })
        })
        .collect()
}

/// Each sender's `seq`s in the order they arrived must be 0, 1, 2, … `per_task - 1`.
fn assert_in_order(messages: &[Value], tasks: usize, per_task: usize) {
    let mut seen: HashMap<u64, Vec<u64>> = HashMap::new();
    for m in messages {
        let p = &m["params"];
        seen.entry(p["task"].as_u64().unwrap())
            .or_default()
            .push(p["seq"].as_u64().unwrap());
    }
    assert_eq!(seen.len(), tasks, "every sender's frames arrived");
    for (task, seqs) in seen {
        let want: Vec<u64> = (0..per_task as u64).collect();
        assert_eq!(
            seqs, want,
            "sender {task}'s frames, in the order they arrived"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_callers_on_a_real_pipe_never_interleave_their_frames() {
    let (to_peer, from_host) = pipe::pipe().unwrap();
    let (to_host, from_peer) = pipe::pipe().unwrap();
    let host = Session::new(
        from_peer,
        to_peer,
        TestHandler::default(),
        SessionConfig::named("pipe"),
    );
    // The other side: parses every line; answers each request with its params, keeps each
    // notification's sender and sequence number.
    let other = tokio::spawn(async move {
        let mut to_host = to_host;
        let mut from_host = BufReader::new(from_host);
        let mut notes = Vec::new();
        let mut line = Vec::new();
        loop {
            line.clear();
            if from_host.read_until(b'\n', &mut line).await.unwrap() == 0 {
                return notes;
            }
            let mut m = lines(&line);
            assert_eq!(m.len(), 1, "one message per line");
            let m = m.pop().unwrap();
            if m.get("id").is_some() {
                let answer = json!({"jsonrpc": "2.0", "id": m["id"], "result": m["params"]});
                let mut frame = serde_json::to_vec(&answer).unwrap();
                frame.push(b'\n');
                to_host.write_all(&frame).await.unwrap();
            } else {
                notes.push(m);
            }
        }
    });
    let (tasks, per_task) = (16, 12);
    let mut callers = Vec::new();
    for task in 0..tasks {
        let peer = host.peer();
        callers.push(tokio::spawn(async move {
            for seq in 0..per_task {
                let params = json!({"task": task, "seq": seq, "pad": pad(task, seq)});
                peer.notify("note", &params).await?;
                let raw = RawValue::from_string(params.to_string()).unwrap();
                let answer = peer
                    .request(
                        "echo",
                        &raw,
                        CallOptions::within(Some(Duration::from_secs(20))),
                    )
                    .await?;
                assert_eq!(answer.get(), raw.get(), "caller {task} got its own answer");
            }
            Ok::<_, CallError>(())
        }));
    }
    for (i, c) in callers.into_iter().enumerate() {
        c.await
            .unwrap()
            .unwrap_or_else(|e| panic!("caller {i}: {e}"));
    }
    // Closing the session closes the pipe: the other side reads to the end.
    host.close(Duration::from_secs(1)).await;
    let notes = tokio::time::timeout(PATIENCE, other)
        .await
        .expect("the other side reads to the end")
        .unwrap();
    assert_in_order(&notes, tasks, per_task);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_reading_a_real_pipe_gets_the_queue_and_the_held_bound_refuses() {
    let (to_peer, from_host) = pipe::pipe().unwrap();
    let (_keep, read) = silent();
    let frame = 8 * 1024;
    let config = SessionConfig {
        max_message_bytes: 16 * 1024,
        write_queue_bytes: 32 * 1024,
        max_held_bytes: 64 * 1024,
        ..SessionConfig::named("unread")
    };
    let host = Session::new(read, to_peer, TestHandler::default(), config);
    let peer = host.peer();
    let params = |seq: usize| json!({"task": 0, "seq": seq, "pad": "x".repeat(frame - 80)});
    // Nobody reads: the pipe's buffer (64 KiB) fills, then the queue (32 KiB); then a sender
    // waits for room.
    let mut seq = 0;
    loop {
        match tokio::time::timeout(
            Duration::from_millis(200),
            peer.notify("note", &params(seq)),
        )
        .await
        {
            Ok(Ok(())) => seq += 1,
            Ok(Err(e)) => panic!("{e}"),
            Err(_) => break,
        }
        assert!(
            seq < 40,
            "{seq} frames of 8 KiB went into a pipe nobody reads"
        );
    }
    assert!(seq >= 4, "only {seq} frames went out before senders waited");
    // Senders that wait hold their bytes: a few more, and the next is refused at once.
    let mut waiting: Vec<Waiting> = Vec::new();
    let refused = loop {
        let (p, frame_params) = (peer.clone(), params(seq));
        let mut next: Waiting = Box::pin(async move { p.notify("note", &frame_params).await });
        match tokio::time::timeout(Duration::from_millis(50), &mut next).await {
            Err(_) => {
                waiting.push(next);
                seq += 1;
            }
            Ok(Ok(())) => panic!("a frame went out into a full pipe"),
            Ok(Err(e)) => break e,
        }
        assert!(waiting.len() < 20, "the held-bytes bound never refused");
    };
    assert!(refused.is(ErrorCode::Overloaded), "{refused}");
    // A call of the same size is refused at once too.
    let same = RawValue::from_string(params(seq).to_string()).unwrap();
    let err = peer
        .request(
            "echo",
            &same,
            CallOptions::within(Some(Duration::from_secs(20))),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, CallError::Overloaded { .. }),
        "a call is refused at once too: {err:?}"
    );
    // Now read: everything accepted arrives, whole and in order, the waiting ones included.
    let reader = tokio::spawn(async move {
        let mut all = Vec::new();
        let mut from_host = from_host;
        tokio::io::AsyncReadExt::read_to_end(&mut from_host, &mut all)
            .await
            .unwrap();
        all
    });
    tokio::time::timeout(PATIENCE, futures::future::try_join_all(waiting))
        .await
        .expect("the waiting senders get room once the peer reads")
        .unwrap();
    drop(peer);
    host.close(Duration::from_secs(5)).await;
    let all = tokio::time::timeout(PATIENCE, reader)
        .await
        .unwrap()
        .unwrap();
    assert_in_order(&lines(&all), 1, seq);
}

/// A sender waiting for room.
type Waiting = Pin<Box<dyn Future<Output = Result<(), CallError>> + Send>>;

/// A write half that takes at most `max` bytes a write and would block every other poll (and
/// wakes its caller at once, as a pipe that drains does).
struct Trickle {
    got: Arc<Mutex<Vec<u8>>>,
    max: usize,
    block_next: bool,
}

impl AsyncWrite for Trickle {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let block = self.block_next;
        self.block_next = !block;
        if block {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let n = buf.len().min(self.max);
        self.got.lock().unwrap().extend_from_slice(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_the_pipe_takes_a_few_bytes_at_a_time_keep_their_order() {
    let got = Arc::new(Mutex::new(Vec::new()));
    let counters = Arc::new(SessionCounters::default());
    let (_keep, read) = silent();
    let host = Session::new(
        read,
        Trickle {
            got: got.clone(),
            max: 7,
            block_next: false,
        },
        TestHandler::default(),
        SessionConfig {
            counters: counters.clone(),
            ..SessionConfig::named("trickle")
        },
    );
    let (tasks, per_task) = (8, 40);
    let mut senders = Vec::new();
    for task in 0..tasks {
        let peer = host.peer();
        senders.push(tokio::spawn(async move {
            for seq in 0..per_task {
                let len = (task * 31 + seq * 17) % 200;
                peer.notify(
                    "note",
                    &json!({"task": task, "seq": seq, "pad": "y".repeat(len)}),
                )
                .await?;
            }
            Ok::<_, CallError>(())
        }));
    }
    for s in senders {
        s.await.unwrap().unwrap();
    }
    // Every frame is accepted; wait until the last is written.
    eventually("every frame to be written", || {
        got.lock().unwrap().iter().filter(|b| **b == b'\n').count() == tasks * per_task
    })
    .await;
    let written = got.lock().unwrap().clone();
    assert_in_order(&lines(&written), tasks, per_task);
    // Written bytes are counted once each, by whichever task wrote them.
    eventually("bytes_out to count every written byte", || {
        counters.bytes_out.load(Ordering::Relaxed) == written.len() as u64
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_pipe_on_a_write_ends_the_session_as_the_peer_closing() {
    // A pipe closed before the first write (tokio does not know yet that it is writable, so
    // the writer task meets the error), and one closed after a write went through (the
    // caller's own write meets it).
    for written_first in [false, true] {
        let (to_peer, from_host) = pipe::pipe().unwrap();
        let (_keep, read) = silent();
        let host = Session::new(
            read,
            to_peer,
            TestHandler::default(),
            SessionConfig::named("gone"),
        );
        if written_first {
            host.peer().notify("first", &json!(1)).await.unwrap();
            let mut from_host = BufReader::new(from_host);
            let mut line = String::new();
            tokio::time::timeout(PATIENCE, from_host.read_line(&mut line))
                .await
                .expect("the first frame arrives")
                .unwrap();
            assert!(line.contains("first"), "{line}");
        } else {
            drop(from_host);
        }
        let one = RawValue::from_string("1".into()).unwrap();
        let err = host
            .peer()
            .request(
                "echo",
                &one,
                CallOptions::within(Some(Duration::from_secs(20))),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                CallError::Closed {
                    reason: CloseReason::PeerClosed,
                    ..
                }
            ),
            "written first: {written_first}: {err:?}"
        );
        let reason = tokio::time::timeout(PATIENCE, host.wait()).await.unwrap();
        assert_eq!(reason, CloseReason::PeerClosed);
        // And after it, nothing more is sent.
        let err = host.peer().notify("more", &json!(1)).await.unwrap_err();
        assert!(matches!(err, CallError::Closed { .. }), "{err:?}");
    }
}

/// A write half whose writes fail.
struct Failing;

impl AsyncWrite for Failing {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, _: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Ready(Err(io::Error::other("the disk is on fire")))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_other_write_error_ends_the_session_as_broken() {
    let (_keep, read) = silent();
    let host = Session::new(
        read,
        Failing,
        TestHandler::default(),
        SessionConfig::named("failing"),
    );
    // Accepted, as a queued frame would be; the write fails and ends the session.
    host.peer().notify("note", &json!(1)).await.unwrap();
    let want = CloseReason::Broken("the disk is on fire".into());
    let reason = tokio::time::timeout(PATIENCE, host.wait()).await.unwrap();
    assert_eq!(reason, want);
    let err = host.peer().notify("more", &json!(1)).await.unwrap_err();
    assert!(
        matches!(&err, CallError::Closed { reason, .. } if *reason == want),
        "{err:?}"
    );
}

/// A peer may reuse a request's id as soon as it has the answer (some clients number every
/// request 1): the answers the reader writes itself free their id before the next request is
/// read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_reuses_an_id_as_soon_as_it_has_the_answer_is_never_refused() {
    let (to_ext, from_host) = pipe::pipe().unwrap();
    let (to_host, from_ext) = pipe::pipe().unwrap();
    let ext = Session::new(
        from_host,
        to_host,
        TestHandler::default(),
        SessionConfig::named("reuse"),
    );
    let mut to_ext = to_ext;
    let mut from_ext = BufReader::new(from_ext);
    let mut line = Vec::new();
    for i in 0..2000 {
        let req = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"echo\",\"params\":{{\"i\":{i}}}}}\n"
        );
        to_ext.write_all(req.as_bytes()).await.unwrap();
        line.clear();
        let read = tokio::time::timeout(PATIENCE, from_ext.read_until(b'\n', &mut line))
            .await
            .expect("an answer within the patience")
            .unwrap();
        assert!(read > 0, "the session ended");
        let m = lines(&line).pop().unwrap();
        assert_eq!(m["result"]["i"], i, "request {i} with the reused id 1: {m}");
    }
    drop(to_ext);
    ext.close(Duration::from_secs(1)).await;
}

/// One write: the thread that made it, and its bytes.
type Write = (std::thread::ThreadId, Vec<u8>);

/// A write half that keeps each write apart, with the thread that made it, to count them. One
/// made [`Writes::shut`] takes nothing until it is opened, then everything.
#[derive(Clone, Default)]
struct Writes(Arc<Mutex<WritesState>>);

#[derive(Default)]
struct WritesState {
    writes: Vec<Write>,
    shut: bool,
    waiting: Option<std::task::Waker>,
}

impl Writes {
    fn shut() -> Self {
        let w = Writes::default();
        w.0.lock().unwrap().shut = true;
        w
    }

    fn open(&self) {
        let mut st = self.0.lock().unwrap();
        st.shut = false;
        if let Some(w) = st.waiting.take() {
            w.wake();
        }
    }

    fn all(&self) -> Vec<Vec<u8>> {
        let st = self.0.lock().unwrap();
        st.writes.iter().map(|(_, b)| b.clone()).collect()
    }

    /// How many lines (frames) were written, in any number of writes.
    fn frames(&self) -> usize {
        let st = self.0.lock().unwrap();
        st.writes
            .iter()
            .map(|(_, b)| b.iter().filter(|c| **c == b'\n').count())
            .sum()
    }

    /// The thread that wrote the frame containing `needle`.
    fn writer_of(&self, needle: &str) -> Option<std::thread::ThreadId> {
        let st = self.0.lock().unwrap();
        st.writes
            .iter()
            .find(|(_, b)| String::from_utf8_lossy(b).contains(needle))
            .map(|(t, _)| *t)
    }
}

impl AsyncWrite for Writes {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut st = self.0.lock().unwrap();
        if st.shut {
            st.waiting = Some(cx.waker().clone());
            return Poll::Pending;
        }
        st.writes.push((std::thread::current().id(), buf.to_vec()));
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Requests read together whose handlers answer at once are answered together: the reader
/// gathers their answers (and its own refusals) and writes them in one write before it waits
/// to read again — one system call and one wake-up of the peer for the burst, not one each.
/// A request read alone is still answered before the reader waits, and a handler that cannot
/// answer at once is answered when it can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_to_requests_read_together_go_out_in_one_write() {
    let (mut to_ext, from_host) = tokio::io::duplex(1 << 20);
    let writes = Writes::default();
    let ext = Session::new(
        from_host,
        writes.clone(),
        TestHandler::default(),
        SessionConfig::named("gather"),
    );
    let answered = |n: usize| {
        let writes = writes.clone();
        move || writes.frames() == n
    };
    // One request alone: answered without any other to wait for.
    to_ext
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"echo\",\"params\":[0]}\n")
        .await
        .unwrap();
    eventually("the lone request's answer", answered(1)).await;
    // A burst in one write: 63 echoes (answered at once), one unknown method and one garbage
    // line (refused by the reader), and a sleep (answered later, by its own task).
    let mut burst = String::new();
    for i in 1..=63 {
        burst +=
            &format!("{{\"jsonrpc\":\"2.0\",\"id\":{i},\"method\":\"echo\",\"params\":[{i}]}}\n");
    }
    burst += "{\"jsonrpc\":\"2.0\",\"id\":64,\"method\":\"nope\"}\n";
    burst += "not json\n";
    burst += "{\"jsonrpc\":\"2.0\",\"id\":65,\"method\":\"sleep\",\"params\":{\"ms\":1}}\n";
    to_ext.write_all(burst.as_bytes()).await.unwrap();
    eventually("every answer of the burst", answered(1 + 63 + 2 + 1)).await;

    let all = writes.all();
    let messages = lines(&all.concat());
    let by_id: HashMap<String, &Value> =
        messages.iter().map(|m| (m["id"].to_string(), m)).collect();
    for i in 0..=63 {
        assert_eq!(by_id[&i.to_string()]["result"], json!([i]), "echo {i}");
    }
    assert_eq!(by_id["64"]["error"]["code"], -32601, "unknown method");
    assert_eq!(by_id["null"]["error"]["code"], -32700, "garbage line");
    assert_eq!(by_id["65"]["result"]["slept_ms"], 1, "the sleeper");
    // The lone answer, the burst's (one write, or a few if the burst came in pieces), the
    // sleeper's: far fewer writes than the 66 answers they carried.
    assert!(
        all.len() <= 6,
        "{} writes for {} answers: {:?}",
        all.len(),
        messages.len(),
        all.iter().map(Vec::len).collect::<Vec<_>>()
    );
    drop(to_ext);
    ext.close(Duration::from_secs(1)).await;
}

/// Calls made while others await their answers are left to the writer task, which writes all
/// that were made meanwhile at once: a caller keeping 64 in flight costs one write per burst,
/// not one per call. The first call, alone, is written by its caller at once.
#[tokio::test(flavor = "current_thread")]
async fn calls_made_while_others_wait_go_out_together() {
    let writes = Writes::default();
    let (_keep, read) = silent();
    let host = Session::new(
        read,
        writes.clone(),
        TestHandler::default(),
        SessionConfig::named("burst"),
    );
    let peer = host.peer();
    let params = RawValue::from_string("[1]".into()).unwrap();
    // Never answered: each gives up at its deadline, far past the test's own checks.
    let calls: Vec<_> = (0..64)
        .map(|_| {
            peer.request(
                "echo",
                &params,
                CallOptions::within(Some(Duration::from_secs(60))),
            )
        })
        .collect();
    let mut all = Box::pin(futures::future::join_all(calls));
    // Poll them all once (each call is made), then let the writer task run.
    assert!(futures::poll!(all.as_mut()).is_pending());
    eventually("all 64 calls to be written", || writes.frames() == 64).await;
    let n = writes.all().len();
    assert!(n <= 3, "{n} writes for 64 calls made together");
    assert_eq!(writes.frames(), 64);
    drop(all);
    host.close(Duration::from_secs(1)).await;
}

/// A call from a thread that blocks on a multi-thread runtime's handle (as the host loop's
/// in-transaction calls do) is written by that thread even while other calls wait: waking the
/// writer task from there would wake a parked worker, a thread wake-up more for a call that
/// holds the database's writer.
#[test]
fn a_call_from_a_thread_blocking_on_the_runtime_writes_itself() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let writes = Writes::default();
    let (_keep, read) = silent();
    let host = rt.block_on(async {
        Session::new(
            read,
            writes.clone(),
            TestHandler::default(),
            SessionConfig::named("blocking"),
        )
    });
    let peer = host.peer();
    // One call waits in a task of the runtime, so the next one is not alone.
    let waiting = rt.spawn({
        let peer = peer.clone();
        async move {
            let p = RawValue::from_string("\"first\"".into()).unwrap();
            peer.request(
                "echo",
                &p,
                CallOptions::within(Some(Duration::from_secs(60))),
            )
            .await
        }
    });
    let since = std::time::Instant::now();
    while writes.writer_of("first").is_none() {
        assert!(
            since.elapsed() < PATIENCE,
            "the first call was never written"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let p = RawValue::from_string("\"second\"".into()).unwrap();
    let handle = rt.handle().clone();
    // Given up at its deadline (the peer never answers); only who wrote it is looked at.
    let _ = handle.block_on(peer.request(
        "echo",
        &p,
        CallOptions::within(Some(Duration::from_millis(200))),
    ));
    assert_eq!(
        writes.writer_of("second"),
        Some(std::thread::current().id()),
        "the blocking thread wrote its own call"
    );
    waiting.abort();
    rt.block_on(host.close(Duration::from_secs(1)));
}

/// Answers the reader gathers while its write queue has no room for them — some gathered before
/// the room ran out, the rest each alone — wait in the requests' own tasks (holding their slots)
/// instead of being dropped or making the reader wait, and every request is answered once when
/// the peer reads again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_with_no_room_to_gather_wait_in_their_own_tasks_and_all_arrive() {
    let (mut to_ext, from_host) = tokio::io::duplex(1 << 20);
    let gate = Writes::shut();
    let ext = Session::new(
        from_host,
        gate.clone(),
        TestHandler::default(),
        SessionConfig {
            write_queue_bytes: 8 * 1024,
            ..SessionConfig::named("no-room")
        },
    );
    let peer = ext.peer();
    let n = 40;
    let pad = "p".repeat(1000);
    let mut burst = String::new();
    for i in 0..n {
        burst += &format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{i},\"method\":\"echo\",\"params\":{{\"i\":{i},\"pad\":\"{pad}\"}}}}\n"
        );
    }
    to_ext.write_all(burst.as_bytes()).await.unwrap();
    // About 8 KiB of answers fit the queue; the rest wait, each in its request's task.
    eventually("answers to wait in their requests' tasks", || {
        peer.incoming_in_flight() >= n - 10
    })
    .await;
    assert!(gate.all().is_empty());
    gate.open();
    eventually("every request to be answered", || gate.frames() == n).await;
    let mut ids: Vec<i64> = lines(&gate.all().concat())
        .iter()
        .map(|m| {
            assert_eq!(m["result"]["i"], m["id"], "{m}");
            m["id"].as_i64().unwrap()
        })
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..n as i64).collect::<Vec<_>>(), "each answered once");
    eventually("every slot to be freed", || peer.incoming_in_flight() == 0).await;
    drop(to_ext);
    ext.close(Duration::from_secs(1)).await;
}
