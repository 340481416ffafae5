//! Telemetry against a real daemon: spans reach an OTLP/HTTP collector on loopback; a collector
//! that hangs or a closed port costs only counted drops; `/v1/metrics` parses with Prometheus's
//! own text parser and moves by exactly the calls made; JSON logs are one object a line.
//! `bench_export_cost` (ignored; `make bench-telemetry`) prints what export costs 1,000 calls.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use conduit_host::client::Client;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use prost::Message;
use serde_json::{Value, json};
use support::PATIENCE;
use support::fixture::{Fixture, stage_examples};

/// A fixture with the echo example installed.
fn with_echo() -> Fixture {
    let f = Fixture::new();
    let echo = stage_examples(&f)
        .into_iter()
        .find(|p| p.ends_with("echo"))
        .expect("the echo example is staged");
    f.install(&echo);
    f
}

fn socket(f: &Fixture) -> PathBuf {
    f.state().join("run/conduit.sock")
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// `n` echo calls through the management API, each checked.
async fn echo_calls(c: &Client, n: usize) {
    for i in 0..n {
        let v = c
            .post(
                "/v1/extensions/echo/call",
                Some(&json!({"method": "echo", "params": {"text": i.to_string()}})),
            )
            .await
            .unwrap_or_else(|e| panic!("call {i} failed: {e:#}"));
        assert_eq!(v["result"]["text"], i.to_string(), "{v}");
    }
}

fn client(f: &Fixture, rt: &tokio::runtime::Runtime) -> Client {
    rt.block_on(Client::connect(&socket(f)))
        .expect("the daemon answers")
}

/// What the test collector received: every decoded export request.
#[derive(Default)]
struct Got {
    traces: Vec<ExportTraceServiceRequest>,
    metrics: Vec<ExportMetricsServiceRequest>,
}
type Received = Arc<Mutex<Got>>;

/// A minimal OTLP/HTTP collector: HTTP/1.1, `POST /v1/traces` or `POST /v1/metrics` with a
/// protobuf body, answered 200 with an empty response.
fn collector() -> (String, Received) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let got: Received = Arc::default();
    let g = got.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            let g = g.clone();
            std::thread::spawn(move || serve(s, &g));
        }
    });
    (url, got)
}

fn serve(s: TcpStream, got: &Received) {
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let request_line = line.trim().to_owned();
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; len];
        r.read_exact(&mut body).unwrap();
        let mut g = got.lock().unwrap();
        match request_line.as_str() {
            "POST /v1/traces HTTP/1.1" => g
                .traces
                .push(ExportTraceServiceRequest::decode(&body[..]).expect("an OTLP protobuf body")),
            "POST /v1/metrics HTTP/1.1" => g.metrics.push(
                ExportMetricsServiceRequest::decode(&body[..]).expect("an OTLP protobuf body"),
            ),
            other => panic!("the collector got `{other}`"),
        }
        drop(g);
        let _ = w.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
        );
    }
}

fn text(v: &Option<AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    }
}

fn attr(kvs: &[KeyValue], key: &str) -> Option<String> {
    kvs.iter()
        .find(|kv| kv.key == key)
        .map(|kv| text(&kv.value))
}

fn health(c: &Client, rt: &tokio::runtime::Runtime) -> Value {
    rt.block_on(c.get("/v1/health")).expect("health answers")
}

#[test]
fn spans_of_calls_and_passes_reach_an_otlp_collector() {
    let (url, got) = collector();
    let mut f = with_echo();
    // An extension that exits at once, for the restart spans.
    f.install(&f.misbehave("crasher", "exit-at-start"));
    // One whose trigger calls back (a read, and a write the host refuses) inside its
    // in-transaction call.
    f.install(&f.core_ext("reent", "reentrant"));
    f.start_daemon_with(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_ref()),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=test".as_ref(),
        ),
    ]);
    f.wait_state("echo", "ready", PATIENCE);
    f.wait_state("reent", "ready", PATIENCE);
    let rt = rt();
    let c = client(&f, &rt);
    rt.block_on(echo_calls(&c, 3));
    f.push("feed", "r1", "job.run", "{}");
    let start = Instant::now();
    loop {
        let reqs = got.lock().unwrap().traces.clone();
        let mut calls = Vec::new();
        let mut passes = Vec::new();
        let mut restarts = Vec::new();
        let mut callbacks = Vec::new();
        for req in &reqs {
            for rs in &req.resource_spans {
                let res = &rs.resource.as_ref().unwrap().attributes;
                assert_eq!(attr(res, "service.name").as_deref(), Some("conduit"));
                assert_eq!(
                    attr(res, "service.version").as_deref(),
                    Some(env!("CARGO_PKG_VERSION"))
                );
                assert_eq!(attr(res, "deployment.environment").as_deref(), Some("test"));
                for ss in &rs.scope_spans {
                    for s in &ss.spans {
                        match s.name.as_str() {
                            "extension.call" => calls.push(s.clone()),
                            "host_loop.pass" => passes.push(s.clone()),
                            "extension.restart" => restarts.push(s.clone()),
                            "extension.callback" => callbacks.push(s.clone()),
                            _ => {}
                        }
                    }
                }
            }
        }
        let echo: Vec<_> = calls
            .iter()
            .filter(|s| attr(&s.attributes, "method").as_deref() == Some("echo"))
            .collect();
        let trigger: Vec<_> = calls
            .iter()
            .filter(|s| attr(&s.attributes, "method").as_deref() == Some("work_kind.trigger"))
            .collect();
        let callback = |m: &str| {
            callbacks
                .iter()
                .find(|s| attr(&s.attributes, "method").as_deref() == Some(m))
                .cloned()
        };
        let (read, write) = (callback("state.events"), callback("ingress.push"));
        if let (Some(read), Some(write)) = (&read, &write)
            && echo.len() >= 3
            && !passes.is_empty()
            && !restarts.is_empty()
            && !trigger.is_empty()
        {
            // The in-transaction call, with its flag, its id and its outcome.
            let a = &trigger[0].attributes;
            assert_eq!(attr(a, "extension").as_deref(), Some("reent"));
            assert_eq!(attr(a, "in_transaction").as_deref(), Some("true"), "{a:?}");
            assert_eq!(attr(a, "outcome").as_deref(), Some("ok"), "{a:?}");
            assert!(
                attr(a, "request_id").is_some_and(|id| id.parse::<i64>().is_ok()),
                "{a:?}"
            );
            // Its callbacks: inside the transaction; the read served, the write refused
            // with reentrant_write (-32006), each with the extension's request id.
            for (s, outcome) in [(read, "ok"), (write, "error")] {
                let a = &s.attributes;
                assert_eq!(attr(a, "extension").as_deref(), Some("reent"), "{a:?}");
                assert_eq!(attr(a, "direction").as_deref(), Some("extension_to_host"));
                assert_eq!(attr(a, "in_transaction").as_deref(), Some("true"), "{a:?}");
                assert_eq!(attr(a, "outcome").as_deref(), Some(outcome), "{a:?}");
                assert!(attr(a, "request_id").is_some(), "{a:?}");
                assert!(attr(a, "duration_us").is_some(), "{a:?}");
            }
            assert_eq!(
                attr(&write.attributes, "error_code").as_deref(),
                Some("-32006")
            );
            // Each echo call carries the id the session gave it, and no two share one.
            let mut ids: Vec<i64> = echo
                .iter()
                .map(|s| {
                    attr(&s.attributes, "request_id")
                        .and_then(|id| id.parse().ok())
                        .unwrap_or_else(|| panic!("no request_id: {:?}", s.attributes))
                })
                .collect();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(ids.len(), echo.len(), "{ids:?}");
            let a = &restarts[0].attributes;
            assert_eq!(attr(a, "extension").as_deref(), Some("crasher"));
            for key in ["cause", "delay_ms", "failures", "state"] {
                assert!(
                    attr(a, key).is_some(),
                    "`{key}` missing from a restart: {a:?}"
                );
            }
            for s in &echo {
                let a = &s.attributes;
                assert_eq!(attr(a, "extension").as_deref(), Some("echo"));
                assert_eq!(attr(a, "direction").as_deref(), Some("host_to_extension"));
                assert_eq!(attr(a, "in_transaction").as_deref(), Some("false"));
                assert_eq!(attr(a, "outcome").as_deref(), Some("ok"));
                assert!(attr(a, "duration_us").is_some(), "{a:?}");
                assert!(s.end_time_unix_nano >= s.start_time_unix_nano);
            }
            let a = &passes[0].attributes;
            for key in [
                "pass",
                "duration_us",
                "routed",
                "calls",
                "fallbacks",
                "errors",
            ] {
                assert!(attr(a, key).is_some(), "`{key}` missing from a pass: {a:?}");
            }
            assert_eq!(echo.len(), 3, "one span per call");
            break;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "the collector got {} call spans for echo, {} pass spans, {} restart spans, {} trigger spans, {} callback spans{}",
            echo.len(),
            passes.len(),
            restarts.len(),
            trigger.len(),
            callbacks.len(),
            f.context()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let h = health(&c, &rt);
    assert_eq!(h["telemetry"]["export"], "otlp-http", "{h}");
    assert!(h["telemetry"]["exported"].as_u64().unwrap() >= 4, "{h}");
    assert_eq!(f.stop_daemon(), Some(0));
}

/// Drive the daemon with export pointed at `url` and wait until drops are counted; the API
/// answers every call and every health request meanwhile.
fn only_drops(url: &str, calls: usize) {
    let mut f = with_echo();
    f.start_daemon_with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_ref())]);
    f.wait_state("echo", "ready", PATIENCE);
    let rt = rt();
    let c = client(&f, &rt);
    rt.block_on(echo_calls(&c, calls));
    let start = Instant::now();
    loop {
        let h = health(&c, &rt);
        if h["telemetry"]["dropped"].as_u64().unwrap() > 0 {
            assert_eq!(h["telemetry"]["exported"], 0, "{h}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "no drops counted: {h}{}",
            f.context()
        );
        rt.block_on(echo_calls(&c, 1));
        std::thread::sleep(Duration::from_millis(100));
    }
    let m = rt.block_on(c.get_text("/v1/metrics")).unwrap();
    assert!(m.contains("conduit_telemetry_spans_dropped_total"), "{m}");
    assert_eq!(f.stop_daemon(), Some(0));
}

#[test]
fn a_collector_that_never_answers_costs_only_dropped_spans() {
    // Accepts connections and never reads or answers: every export waits for its timeout, so
    // the queue fills and its oldest spans are dropped while the calls go on.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let held = Arc::new(Mutex::new(Vec::new()));
    let h = held.clone();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            h.lock().unwrap().push(s);
        }
    });
    only_drops(&url, conduit_host::telemetry::otlp::QUEUE_CAPACITY + 200);
}

#[test]
fn a_closed_port_costs_only_dropped_spans() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    only_drops(&format!("http://127.0.0.1:{port}"), 50);
}

/// The number in a metric data point.
fn number(v: &Option<number_data_point::Value>) -> f64 {
    match v {
        Some(number_data_point::Value::AsDouble(d)) => *d,
        Some(number_data_point::Value::AsInt(i)) => *i as f64,
        None => f64::NAN,
    }
}

#[test]
fn metrics_reach_an_otlp_collector_with_exact_cumulative_counts() {
    let (url, got) = collector();
    let mut f = with_echo();
    f.start_daemon_with(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_ref()),
        ("OTEL_TRACES_EXPORTER", "none".as_ref()),
        ("OTEL_METRIC_EXPORT_INTERVAL", "200".as_ref()),
        ("OTEL_SERVICE_NAME", "conduit-test".as_ref()),
    ]);
    f.wait_state("echo", "ready", PATIENCE);
    let rt = rt();
    let c = client(&f, &rt);
    rt.block_on(echo_calls(&c, 5));
    // Only a snapshot taken once the five calls were answered can count all five: one the
    // exporter gathered while they ran (a busy machine makes that likely) is passed over.
    let answered_ns = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let is_echo = |attrs: &[KeyValue]| {
        attr(attrs, "extension").as_deref() == Some("echo")
            && attr(attrs, "method").as_deref() == Some("echo")
    };
    let start = Instant::now();
    loop {
        let (calls, hist) = {
            let g = got.lock().unwrap();
            let mut found = (None, None);
            // The newest request that has both.
            for req in g.metrics.iter().rev() {
                let rm = &req.resource_metrics[0];
                let res = &rm.resource.as_ref().unwrap().attributes;
                assert_eq!(attr(res, "service.name").as_deref(), Some("conduit-test"));
                assert_eq!(
                    attr(res, "service.version").as_deref(),
                    Some(env!("CARGO_PKG_VERSION"))
                );
                let mut calls = None;
                let mut hist = None;
                for m in &rm.scope_metrics[0].metrics {
                    match (m.name.as_str(), &m.data) {
                        ("conduit_extension_calls", Some(metric::Data::Sum(sum))) => {
                            assert!(sum.is_monotonic);
                            calls = sum
                                .data_points
                                .iter()
                                .find(|p| {
                                    is_echo(&p.attributes)
                                        && attr(&p.attributes, "outcome").as_deref() == Some("ok")
                                        && p.time_unix_nano >= answered_ns
                                })
                                .map(|p| number(&p.value));
                        }
                        (
                            "conduit_extension_call_duration_seconds",
                            Some(metric::Data::Histogram(h)),
                        ) => {
                            hist = h
                                .data_points
                                .iter()
                                .find(|p| is_echo(&p.attributes))
                                .map(|p| {
                                    (
                                        p.count,
                                        p.bucket_counts.iter().sum::<u64>(),
                                        p.explicit_bounds.len(),
                                        p.bucket_counts.len(),
                                    )
                                });
                        }
                        _ => {}
                    }
                }
                if calls.is_some() && hist.is_some() {
                    found = (calls, hist);
                    break;
                }
            }
            found
        };
        if let (Some(calls), Some((count, in_buckets, bounds, buckets))) = (calls, hist) {
            // Cumulative and exact: the five calls, in the sum and in the histogram.
            assert_eq!(calls, 5.0);
            assert_eq!((count, in_buckets), (5, 5));
            assert_eq!(buckets, bounds + 1);
            break;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "no metrics with the echo calls in {} requests{}",
            got.lock().unwrap().metrics.len(),
            f.context()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let h = health(&c, &rt);
    assert_eq!(h["telemetry"]["export"], "off", "traces are off: {h}");
    assert_eq!(h["telemetry"]["metrics"]["export"], "otlp-http", "{h}");
    assert!(
        h["telemetry"]["metrics"]["exported"].as_u64().unwrap() >= 1,
        "{h}"
    );
    assert_eq!(f.stop_daemon(), Some(0));
    assert!(got.lock().unwrap().traces.is_empty(), "spans were exported");
}

/// Export metrics every 200 ms to `url`, where they cannot arrive: drops are counted, the API
/// answers throughout and the calls go on.
fn only_metric_drops(url: &str, reason: &str) {
    let mut f = with_echo();
    f.start_daemon_with(&[
        (
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            format!("{url}/v1/metrics").as_ref(),
        ),
        ("OTEL_METRIC_EXPORT_INTERVAL", "200".as_ref()),
    ]);
    f.wait_state("echo", "ready", PATIENCE);
    let rt = rt();
    let c = client(&f, &rt);
    let start = Instant::now();
    loop {
        rt.block_on(echo_calls(&c, 5));
        let h = health(&c, &rt);
        let m = &h["telemetry"]["metrics"];
        assert_eq!(m["exported"], 0, "{h}");
        if m[format!("dropped_{reason}")].as_u64().unwrap() > 0 {
            assert!(m["dropped"].as_u64().unwrap() > 0, "{h}");
            break;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "no `{reason}` drops counted: {h}{}",
            f.context()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = rt.block_on(c.get_text("/v1/metrics")).unwrap();
    let samples = parse_prometheus(&text);
    assert!(
        sample(
            &samples,
            "conduit_telemetry_metric_exports_dropped_total",
            &[("reason", reason)]
        )
        .unwrap()
            >= 1.0,
        "{text}"
    );
    assert_eq!(
        sample(
            &samples,
            "conduit_telemetry_export_enabled",
            &[("signal", "metrics")]
        ),
        Some(1.0)
    );
    assert_eq!(f.stop_daemon(), Some(0));
}

#[test]
fn a_metrics_collector_that_never_answers_costs_only_dropped_snapshots() {
    // Each attempt waits its 10 s; every 200 ms interval that passes meanwhile is a snapshot
    // not taken, counted at once.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let held = Arc::new(Mutex::new(Vec::new()));
    let h = held.clone();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            h.lock().unwrap().push(s);
        }
    });
    only_metric_drops(&url, "busy");
}

#[test]
fn metrics_to_a_closed_port_cost_only_dropped_snapshots() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    only_metric_drops(&format!("http://127.0.0.1:{port}"), "export_failed");
}

/// Parse the exposition with the Prometheus client's own parser; returns every sample as
/// `{name, labels, value}`.
fn parse_prometheus(text: &str) -> Vec<Value> {
    let script = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = []
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        out.append({"name": s.name, "labels": s.labels, "value": s.value, "type": fam.type})
print(json.dumps(out))
"#;
    let mut child = std::process::Command::new("python3")
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect(
            "python3 runs (the parser is the `prometheus_client` package; .ci/run installs it)",
        );
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the Prometheus parser refused the text: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn sample(samples: &[Value], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|s| s["name"] == name && labels.iter().all(|(k, v)| s["labels"][k] == *v))
        .map(|s| s["value"].as_f64().unwrap())
}

fn scrape(c: &Client, rt: &tokio::runtime::Runtime) -> Vec<Value> {
    parse_prometheus(&rt.block_on(c.get_text("/v1/metrics")).unwrap())
}

/// The sum of every sample of `name` (over all labels).
fn total(samples: &[Value], name: &str) -> f64 {
    samples
        .iter()
        .filter(|s| s["name"] == name)
        .map(|s| s["value"].as_f64().unwrap())
        .sum()
}

#[test]
fn metrics_parse_as_prometheus_text_and_count_exactly_the_calls_made() {
    let mut f = with_echo();
    f.install(&f.core_ext("sink", "ok"));
    f.start_daemon();
    f.wait_state("echo", "ready", PATIENCE);
    f.wait_state("sink", "ready", PATIENCE);
    let rt = rt();
    let c = client(&f, &rt);
    let echo = [("extension", "echo")];
    let ok = [("extension", "echo"), ("method", "echo"), ("outcome", "ok")];
    let err = [
        ("extension", "echo"),
        ("method", "no.such"),
        ("outcome", "error"),
    ];
    let em = [("extension", "echo"), ("method", "echo")];
    let dir = |d| [("extension", "echo"), ("direction", d)];
    let before = scrape(&c, &rt);
    assert_eq!(sample(&before, "conduit_extension_up", &echo), Some(1.0));
    assert_eq!(
        sample(
            &before,
            "conduit_extension_state",
            &[("extension", "echo"), ("state", "ready")]
        ),
        Some(1.0)
    );
    for signal in ["traces", "metrics"] {
        assert_eq!(
            sample(
                &before,
                "conduit_telemetry_export_enabled",
                &[("signal", signal)]
            ),
            Some(0.0)
        );
    }
    let get = |s: &[Value], name, labels: &[(&str, &str)]| sample(s, name, labels).unwrap_or(0.0);
    let ok_before = get(&before, "conduit_extension_calls_total", &ok);
    let count_before = get(
        &before,
        "conduit_extension_call_duration_seconds_count",
        &em,
    );
    let bytes_in_before = get(&before, "conduit_extension_bytes_total", &dir("in"));
    let bytes_out_before = get(&before, "conduit_extension_bytes_total", &dir("out"));
    let events_before = get(&before, "conduit_events_total", &[]);
    let unrouted_before = get(&before, "conduit_events_unrouted", &[]);
    let work_before = total(&before, "conduit_work");
    let new = [("outcome", "new")];
    let new_before = get(&before, "conduit_ingress_events_total", &new);
    let timed_before = get(&before, "conduit_ingress_ack_to_route_seconds_count", &[]);

    rt.block_on(echo_calls(&c, 7));
    let v = rt
        .block_on(c.post(
            "/v1/extensions/echo/call",
            Some(&json!({"method": "no.such", "params": {}})),
        ))
        .unwrap();
    assert_eq!(v["error"]["name"], "method_not_found", "{v}");
    // Three events of a kind no package owns (routed to no Work) and one the sink routes into
    // a Work of its own.
    for d in ["u1", "u2", "u3"] {
        f.push("api", d, "nobody.x", "{}");
    }
    f.push("api", "j1", "job.run", r#"{"group":"g1"}"#);
    let after = f.wait_until("every event routed, its Work in the metrics", || {
        let s = scrape(&c, &rt);
        (total(&s, "conduit_work") >= work_before + 1.0
            && get(&s, "conduit_events_unrouted", &[]) == 0.0)
            .then_some(s)
    });
    assert_eq!(unrouted_before, 0.0);
    assert_eq!(
        get(&after, "conduit_events_total", &[]),
        events_before + 4.0
    );
    assert_eq!(total(&after, "conduit_work"), work_before + 1.0);

    // `conduit metrics` prints the same exposition.
    let run = f.conduit(&["metrics"]);
    assert_eq!(run.code(), Some(0), "{}", run.context());
    let after = parse_prometheus(&String::from_utf8(run.out.stdout.clone()).unwrap());
    assert_eq!(
        sample(&after, "conduit_extension_calls_total", &ok),
        Some(ok_before + 7.0)
    );
    assert_eq!(
        sample(&after, "conduit_extension_calls_total", &err),
        Some(1.0)
    );
    // The histogram: exactly the seven calls, every one in a bucket.
    let count = get(&after, "conduit_extension_call_duration_seconds_count", &em);
    assert_eq!(count, count_before + 7.0);
    let mut inf = em.to_vec();
    inf.push(("le", "+Inf"));
    assert_eq!(
        sample(
            &after,
            "conduit_extension_call_duration_seconds_bucket",
            &inf
        ),
        Some(count)
    );
    assert!(get(&after, "conduit_extension_call_duration_seconds_sum", &em) > 0.0);
    // The group commit: four new events, each timed from its acknowledgement to the routing
    // decision about it (every one was routed above); every write timed, wait and hold.
    assert_eq!(
        get(&after, "conduit_ingress_events_total", &new),
        new_before + 4.0
    );
    assert_eq!(
        get(&after, "conduit_ingress_ack_to_route_seconds_count", &[]),
        timed_before + 4.0
    );
    // At least one commit; the sink's ingress polls commit their cursors too.
    let commits = get(&after, "conduit_ingress_commits_total", &[]);
    assert!(commits >= 1.0, "{commits}");
    let holds = get(&after, "conduit_store_writer_hold_seconds_count", &[]);
    assert_eq!(
        get(&after, "conduit_store_writer_wait_seconds_count", &[]),
        holds
    );
    assert!(holds >= commits + 1.0, "the routing's writes are timed too");
    assert_eq!(
        sample(
            &after,
            "conduit_store_writer_hold_seconds_bucket",
            &[("le", "+Inf")]
        ),
        Some(holds)
    );
    let max_hold = [("measure", "writer_hold"), ("quantile", "1")];
    assert!(sample(&after, "conduit_latency_quantile_seconds", &max_hold).unwrap() > 0.0);
    assert_eq!(sample(&after, "conduit_ingress_queued", &[]), Some(0.0));
    let p99 = [
        ("extension", "echo"),
        ("method", "echo"),
        ("quantile", "0.99"),
    ];
    assert!(sample(&after, "conduit_extension_call_latency_seconds", &p99).unwrap() > 0.0);
    // Nothing is in flight once every call has been answered; nothing was refused.
    for d in ["host_to_extension", "extension_to_host"] {
        assert_eq!(
            sample(&after, "conduit_extension_in_flight", &dir(d)),
            Some(0.0)
        );
        assert_eq!(
            sample(&after, "conduit_extension_overloaded_total", &dir(d)),
            Some(0.0)
        );
    }
    // Eight requests out and eight answers in, each at least this long.
    let smallest = r#"{"jsonrpc":"2.0","id":1,"result":{}}"#.len() as f64 + 1.0;
    assert!(
        get(&after, "conduit_extension_bytes_total", &dir("out"))
            >= bytes_out_before + 8.0 * smallest
    );
    assert!(
        get(&after, "conduit_extension_bytes_total", &dir("in"))
            >= bytes_in_before + 8.0 * smallest
    );
    assert_eq!(
        sample(&after, "conduit_extension_degraded", &echo),
        Some(0.0)
    );
    assert_eq!(
        sample(&after, "conduit_extension_degraded_seconds_total", &echo),
        Some(0.0)
    );
    assert!(sample(&after, "conduit_host_loop_passes_total", &[]).unwrap() >= 1.0);
    assert!(sample(&after, "conduit_host_loop_pass_seconds_total", &[]).unwrap() > 0.0);
    assert!(sample(&after, "conduit_host_loop_in_transaction_calls_total", &[]).unwrap() >= 1.0);
    assert_eq!(
        sample(
            &after,
            "conduit_telemetry_spans_dropped_total",
            &[("reason", "queue_full")]
        ),
        Some(0.0)
    );
    assert_eq!(f.stop_daemon(), Some(0));
}

#[test]
fn in_flight_calls_and_degraded_time_show_in_the_metrics() {
    let mut f = Fixture::new();
    f.install(&f.core_ext("hung", "hang"));
    f.start_daemon();
    f.wait_state("hung", "ready", PATIENCE);
    let rt = rt();
    let c = client(&f, &rt);
    let hung = [("extension", "hung")];
    let out = [("extension", "hung"), ("direction", "host_to_extension")];
    // Seen at 1 right after `ready` on a loaded machine (a request of the start still counted):
    // what is in flight before this test's call is not its subject, so wait for it to settle.
    let before = f.wait_until("nothing in flight once ready", || {
        let s = scrape(&c, &rt);
        (sample(&s, "conduit_extension_in_flight", &out) == Some(0.0)).then_some(s)
    });
    assert_eq!(
        sample(&before, "conduit_extension_degraded", &hung),
        Some(0.0)
    );
    // With no event yet the host loop calls nothing: one call through the API, which the
    // extension never answers, is the one request in flight until its deadline.
    let socket = socket(&f);
    let pending = std::thread::spawn(move || {
        let rt = crate::rt();
        let c = rt.block_on(Client::connect(&socket)).unwrap();
        rt.block_on(c.post(
            "/v1/extensions/hung/call",
            Some(&json!({"method": "work_kind.trigger", "params": {}, "timeout_ms": 2000})),
        ))
        .unwrap()
    });
    f.wait_until("the pending call in the metrics", || {
        (sample(&scrape(&c, &rt), "conduit_extension_in_flight", &out) == Some(1.0)).then_some(())
    });
    let answer = pending.join().unwrap();
    assert_eq!(answer["error"]["name"], "deadline_exceeded", "{answer}");
    let after_call = scrape(&c, &rt);
    assert_eq!(
        sample(&after_call, "conduit_extension_in_flight", &out),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &after_call,
            "conduit_extension_calls_total",
            &[
                ("extension", "hung"),
                ("method", "work_kind.trigger"),
                ("outcome", "error")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(&after_call, "conduit_extension_degraded", &hung),
        Some(0.0)
    );
    // Its trigger never answers: the call misses its deadline and the extension is degraded.
    f.push("feed", "h1", "job.run", "{}");
    let first = f.wait_until("the extension degraded in the metrics", || {
        let s = scrape(&c, &rt);
        (sample(&s, "conduit_extension_degraded", &hung) == Some(1.0)).then_some(s)
    });
    let t1 = sample(&first, "conduit_extension_degraded_seconds_total", &hung).unwrap();
    // The time grows while it stays degraded (its probes never answer either).
    let later = f.wait_until("degraded time to grow", || {
        let s = scrape(&c, &rt);
        let t = sample(&s, "conduit_extension_degraded_seconds_total", &hung).unwrap();
        (t > t1).then_some(t)
    });
    assert!(later > t1);
    // The miss is marked (degraded) just before its fallback is counted, so a scrape can fall
    // between the two: wait for the count.
    f.wait_until("the missed trigger's fallback in the metrics", || {
        let s = scrape(&c, &rt);
        (sample(&s, "conduit_host_loop_fallbacks_total", &[]).unwrap() >= 1.0).then_some(())
    });
    assert_eq!(f.stop_daemon(), Some(0));
}

/// Every string in a log line's fields and spans, with where it was.
fn strings<'a>(v: &'a Value, at: String, out: &mut Vec<(String, &'a str)>) {
    match v {
        Value::String(s) => out.push((at, s)),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, v)| strings(v, format!("{at}[{i}]"), out)),
        Value::Object(o) => o
            .iter()
            .for_each(|(k, v)| strings(v, format!("{at}.{k}"), out)),
        _ => {}
    }
}

#[test]
fn json_logs_are_one_object_a_line_with_plain_values_and_span_fields() {
    let mut f = with_echo();
    // A crash loop and a hung in-transaction call, for warnings of every kind.
    f.install(&f.misbehave("crasher", "exit-at-start"));
    f.install(&f.core_ext("hung", "hang"));
    f.start_daemon_with(&[
        ("CONDUIT_LOG_FORMAT", "json".as_ref()),
        // The call and pass spans are `debug`: enabled here, so lines inside them carry them.
        (
            "CONDUIT_LOG",
            "info,conduit_host=debug,conduit_supervisor=debug,conduit_rpc=debug".as_ref(),
        ),
    ]);
    f.wait_state("echo", "ready", PATIENCE);
    f.wait_state("hung", "ready", PATIENCE);
    f.push("feed", "h1", "job.run", "{}");
    let fallback = |l: &Value| {
        l["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("fallback"))
    };
    f.wait_until("a fallback in the log", || {
        let log = std::fs::read_to_string(f.daemon_log()).ok()?;
        log.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .any(|l| fallback(&l))
            .then_some(())
    });
    assert_eq!(f.stop_daemon(), Some(0));
    let log = std::fs::read_to_string(f.daemon_log()).unwrap();
    let lines: Vec<Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(lines.iter().all(Value::is_object));
    let running = lines
        .iter()
        .find(|l| l["fields"]["message"] == "conduit daemon running")
        .unwrap_or_else(|| panic!("no start line in\n{log}"));
    assert_eq!(running["level"], "INFO");
    assert!(
        running["fields"]["started"]
            .as_str()
            .unwrap()
            .split(' ')
            .any(|n| n == "echo"),
        "{running}"
    );
    assert!(running["fields"]["pid"].is_u64(), "{running}");
    // The fallback was decided inside a host-loop pass: the line carries that span and its
    // fields, as fields.
    let fb = lines
        .iter()
        .find(|l| fallback(l))
        .unwrap_or_else(|| panic!("no fallback line in\n{log}"));
    assert_eq!(fb["level"], "WARN", "{fb}");
    assert_eq!(fb["span"]["name"], "host_loop.pass", "{fb}");
    assert!(fb["span"]["pass"].is_u64(), "{fb}");
    assert!(
        fb["spans"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s["name"] == "host_loop.pass")),
        "{fb}"
    );
    // Values are printed plainly: no `Some(…)`, no Debug-quoted strings, in any line.
    let mut all = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        for key in ["fields", "span", "spans"] {
            strings(&l[key], format!("line {i}: {key}"), &mut all);
        }
    }
    assert!(all.len() > 20, "too few values to tell: {log}");
    for (at, v) in all {
        assert!(
            !(v.contains("Some(") || v.len() > 1 && v.starts_with('"') && v.ends_with('"')),
            "{at} is printed with Debug: {v}"
        );
    }
    // A bad format is refused by name, before anything runs.
    let run = f.conduit(&["--log-format", "yaml", "ext", "list"]);
    assert_eq!(run.code(), Some(2), "{}", run.context());
    let mut cmd = f.command(&["ext", "list"]);
    let out = cmd.env("CONDUIT_LOG_FORMAT", "yaml").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("CONDUIT_LOG_FORMAT is `yaml`"), "{err}");
}

/// The daemon's text log as a terminal gets it: run `conduit daemon run` with its stderr on a
/// pseudo-terminal (made by Python's `pty`, which the tests already need), read until it says
/// it is running, stop it with SIGTERM, and return what it wrote.
fn daemon_log_on_a_terminal(f: &Fixture, no_color: Option<&str>) -> String {
    let script = r#"
import os, pty, select, signal, subprocess, sys, time
master, slave = pty.openpty()
p = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave)
os.close(slave)
out, end = b"", time.time() + 60
while b"conduit daemon running" not in out and time.time() < end:
    r, _, _ = select.select([master], [], [], 0.2)
    if r:
        try:
            out += os.read(master, 65536)
        except OSError:
            break
    if p.poll() is not None:
        break
p.send_signal(signal.SIGTERM)
try:
    p.wait(30)
except subprocess.TimeoutExpired:
    p.kill()
    p.wait()
sys.stdout.write(out.decode("utf-8", "replace"))
"#;
    let mut cmd = std::process::Command::new("python3");
    cmd.arg("-c")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_conduit"))
        .args(["daemon", "run"])
        .env("CONDUIT_STATE_DIR", f.state())
        .env_remove("CONDUIT_LOG")
        .env_remove("CONDUIT_LOG_FORMAT")
        .env_remove("JOURNAL_STREAM")
        .env_remove("NO_COLOR");
    if let Some(v) = no_color {
        cmd.env("NO_COLOR", v);
    }
    let out = cmd.output().expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("conduit daemon running"),
        "no start line: {text}"
    );
    text
}

#[test]
fn text_logs_are_coloured_on_a_terminal_unless_no_color_is_set() {
    let f = with_echo();
    // On a terminal, levels are coloured.
    let coloured = daemon_log_on_a_terminal(&f, None);
    assert!(
        coloured.contains("\x1b["),
        "no colour on a terminal: {coloured:?}"
    );
    // NO_COLOR (any non-empty value) turns every escape off.
    let plain = daemon_log_on_a_terminal(&f, Some("1"));
    assert!(
        !plain.contains('\x1b'),
        "colour despite NO_COLOR: {plain:?}"
    );
    assert!(plain.contains("INFO"), "{plain}");
}

#[test]
fn bad_export_settings_are_refused_by_name() {
    let f = Fixture::new();
    for (var, value, says) in [
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "https://collector:4318",
            "plain `http://`",
        ),
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "collector:4318",
            "must be an `http://host:port` URL",
        ),
        (
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "grpc",
            "OTEL_EXPORTER_OTLP_PROTOCOL is `grpc`; this build exports `http/protobuf` only",
        ),
        (
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
            "grpc",
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL is `grpc`",
        ),
        (
            "OTEL_METRIC_EXPORT_INTERVAL",
            "99",
            "OTEL_METRIC_EXPORT_INTERVAL is `99`",
        ),
        (
            "OTEL_METRICS_EXPORTER",
            "prometheus",
            "OTEL_METRICS_EXPORTER is `prometheus`",
        ),
    ] {
        let mut cmd = f.command(&["daemon", "run"]);
        cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        let out = cmd.env(var, value).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{var}={value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{var}={value}: {err}");
    }
}

#[test]
fn otel_sdk_disabled_turns_export_off_whatever_else_is_set() {
    let (url, got) = collector();
    let mut f = with_echo();
    f.start_daemon_with(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_ref()),
        ("OTEL_SDK_DISABLED", "true".as_ref()),
    ]);
    f.wait_state("echo", "ready", PATIENCE);
    let rt = rt();
    let c = client(&f, &rt);
    rt.block_on(echo_calls(&c, 3));
    let h = health(&c, &rt);
    assert_eq!(h["telemetry"]["export"], "off", "{h}");
    assert_eq!(h["telemetry"]["queued"], 0, "{h}");
    assert_eq!(f.stop_daemon(), Some(0));
    let g = got.lock().unwrap();
    assert!(
        g.traces.is_empty() && g.metrics.is_empty(),
        "something was exported"
    );
}

/// The process's user + system CPU time in clock ticks (`/proc/<pid>/stat` fields 14 and 15).
fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// What export costs: 1,000 echo calls through the API with export off, against a collector
/// that never answers, and against a closed port (spans, and metrics every second). Prints the
/// figures and the ratio of each median to export off; asserts only that every call was
/// answered. `make bench-telemetry`.
#[test]
#[ignore = "a benchmark: run with `make bench-telemetry`"]
fn bench_export_cost() {
    // Interleaved rounds, so a burst of load elsewhere on the machine hits every setting.
    const ROUNDS: usize = 7;
    let hung = TcpListener::bind("127.0.0.1:0").unwrap();
    let hung_url = format!("http://{}", hung.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in hung.incoming().flatten() {
            held.push(s);
        }
    });
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let closed_url = format!("http://127.0.0.1:{closed}");
    let mut results = Vec::new();
    for round in 0..ROUNDS {
        for (name, url) in [
            ("off", None),
            ("hung", Some(&hung_url)),
            ("closed", Some(&closed_url)),
        ] {
            let mut f = with_echo();
            match url {
                None => f.start_daemon(),
                Some(u) => f.start_daemon_with(&[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", u.as_ref()),
                    ("OTEL_METRIC_EXPORT_INTERVAL", "1000".as_ref()),
                ]),
            }
            f.wait_state("echo", "ready", PATIENCE);
            let rt = rt();
            let c = client(&f, &rt);
            rt.block_on(echo_calls(&c, 100));
            let cpu0 = cpu_ticks(f.daemon_pid());
            let t = Instant::now();
            rt.block_on(echo_calls(&c, 1000));
            let took = t.elapsed();
            let cpu1 = cpu_ticks(f.daemon_pid());
            let h = health(&c, &rt);
            eprintln!(
                "round {round} export={name}: 1000 calls in {:.1} ms, daemon CPU {} ticks, log {} bytes; telemetry {}",
                took.as_secs_f64() * 1e3,
                cpu1 - cpu0,
                std::fs::metadata(f.daemon_log())
                    .map(|m| m.len())
                    .unwrap_or(0),
                h["telemetry"]
            );
            results.push((name, took));
            assert_eq!(f.stop_daemon(), Some(0));
        }
    }
    let median = |name: &str| {
        let mut v: Vec<f64> = results
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, d)| d.as_secs_f64() * 1e3)
            .collect();
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    let (off, _, _) = median("off");
    for name in ["off", "hung", "closed"] {
        let (m, lo, hi) = median(name);
        eprintln!(
            "export={name}: median {m:.1} ms of {ROUNDS} rounds (min {lo:.1}, max {hi:.1}); {:.2}x export off (the bound is 1.2x)",
            m / off
        );
    }
}
