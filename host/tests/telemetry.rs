//! Telemetry against a real daemon: spans reach an OTLP/HTTP collector on loopback; a collector
//! that hangs or a closed port costs only counted drops; `/v1/metrics` parses with Prometheus's
//! own text parser and moves by exactly the calls made; JSON logs are one object a line.
//! `bench_export_cost` (ignored; `make bench-telemetry`) prints what export costs 1,000 calls.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conduit_host::client::Client;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
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
type Received = Arc<Mutex<Vec<ExportTraceServiceRequest>>>;

/// A minimal OTLP/HTTP collector: HTTP/1.1, `POST /v1/traces` with a protobuf body, answered
/// 200 with an empty `ExportTraceServiceResponse`.
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
        assert_eq!(request_line, "POST /v1/traces HTTP/1.1");
        got.lock()
            .unwrap()
            .push(ExportTraceServiceRequest::decode(&body[..]).expect("an OTLP protobuf body"));
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
    f.start_daemon_with(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_ref()),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=test".as_ref(),
        ),
    ]);
    f.wait_state("echo", "ready", PATIENCE);
    let rt = rt();
    let c = client(&f, &rt);
    rt.block_on(echo_calls(&c, 3));
    let start = Instant::now();
    loop {
        let reqs = got.lock().unwrap().clone();
        let mut calls = Vec::new();
        let mut passes = Vec::new();
        let mut restarts = Vec::new();
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
        if echo.len() >= 3 && !passes.is_empty() && !restarts.is_empty() {
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
            for key in ["duration_us", "routed", "calls", "fallbacks", "errors"] {
                assert!(attr(a, key).is_some(), "`{key}` missing from a pass: {a:?}");
            }
            assert_eq!(echo.len(), 3, "one span per call");
            break;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "the collector got {} call spans for echo, {} pass spans, {} restart spans{}",
            echo.len(),
            passes.len(),
            restarts.len(),
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

#[test]
fn metrics_parse_as_prometheus_text_and_count_exactly_the_calls_made() {
    let mut f = with_echo();
    f.start_daemon();
    f.wait_state("echo", "ready", PATIENCE);
    let rt = rt();
    let c = client(&f, &rt);
    let ok = [("extension", "echo"), ("method", "echo"), ("outcome", "ok")];
    let err = [
        ("extension", "echo"),
        ("method", "no.such"),
        ("outcome", "error"),
    ];
    let before = parse_prometheus(&rt.block_on(c.get_text("/v1/metrics")).unwrap());
    assert_eq!(
        sample(&before, "conduit_extension_up", &[("extension", "echo")]),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &before,
            "conduit_extension_state",
            &[("extension", "echo"), ("state", "ready")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(&before, "conduit_telemetry_export_enabled", &[]),
        Some(0.0)
    );
    let ok_before = sample(&before, "conduit_extension_calls_total", &ok).unwrap_or(0.0);
    rt.block_on(echo_calls(&c, 7));
    let v = rt
        .block_on(c.post(
            "/v1/extensions/echo/call",
            Some(&json!({"method": "no.such", "params": {}})),
        ))
        .unwrap();
    assert_eq!(v["error"]["name"], "method_not_found", "{v}");
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
    let p99 = [
        ("extension", "echo"),
        ("method", "echo"),
        ("quantile", "0.99"),
    ];
    assert!(sample(&after, "conduit_extension_call_latency_seconds", &p99).unwrap() > 0.0);
    assert!(sample(&after, "conduit_host_loop_passes_total", &[]).unwrap() >= 1.0);
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
fn json_logs_are_one_object_a_line_with_plain_values() {
    let mut f = with_echo();
    f.start_daemon_with(&[("CONDUIT_LOG_FORMAT", "json".as_ref())]);
    f.wait_state("echo", "ready", PATIENCE);
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
    assert_eq!(running["fields"]["started"], "echo", "{running}");
    assert!(running["fields"]["pid"].is_u64(), "{running}");
    // A bad format is refused by name, before anything runs.
    let run = f.conduit(&["--log-format", "yaml", "ext", "list"]);
    assert_eq!(run.code(), Some(2), "{}", run.context());
    let mut cmd = f.command(&["ext", "list"]);
    let out = cmd.env("CONDUIT_LOG_FORMAT", "yaml").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("CONDUIT_LOG_FORMAT is `yaml`"), "{err}");
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
            "OTEL_EXPORTER_OTLP_PROTOCOL is `grpc`",
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
    assert!(got.lock().unwrap().is_empty(), "spans were exported");
}

/// The process's user + system CPU time in clock ticks (`/proc/<pid>/stat` fields 14 and 15).
fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// What export costs: 1,000 echo calls through the API with export off, against a collector
/// that never answers, and against a closed port. Prints the figures; asserts only that every
/// call was answered. `make bench-telemetry`.
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
                Some(u) => f.start_daemon_with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", u.as_ref())]),
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
    for name in ["off", "hung", "closed"] {
        let mut v: Vec<f64> = results
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, d)| d.as_secs_f64() * 1e3)
            .collect();
        v.sort_by(f64::total_cmp);
        eprintln!(
            "export={name}: median {:.1} ms of {ROUNDS} rounds (min {:.1}, max {:.1})",
            v[v.len() / 2],
            v[0],
            v[v.len() - 1]
        );
    }
}
