//! Extensions started on demand, stopped when idle, kept waiting work through a disable, and
//! upgraded without a gap: the real daemon, driven through the CLI and the API, with
//! `fixtures/core_ext.py` and the `echo` example.

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::PATIENCE;
use support::fixture::{Fixture, kill};
use support::http;

const ON_DEMAND: &str = r#"start = "on-demand""#;

fn socket(f: &Fixture) -> PathBuf {
    f.state().join("run/conduit.sock")
}

fn passes(f: &Fixture) -> u64 {
    http::get(&socket(f), "/v1/health")["host_loop"]["passes"]
        .as_u64()
        .unwrap()
}

/// Wait until the host loop has made `n` more passes.
fn wait_passes(f: &Fixture, n: u64) {
    let from = passes(f);
    f.wait_until(&format!("{n} host loop passes"), || {
        (passes(f) >= from + n).then_some(())
    });
}

fn event(f: &Fixture, id: i64) -> Value {
    f.all_events()
        .into_iter()
        .find(|e| e["id"] == id)
        .unwrap_or_else(|| panic!("no event {id}{}", f.context()))
}

/// Wait until event `id` is routed; the event.
fn routed(f: &Fixture, id: i64) -> Value {
    f.wait_until(&format!("event {id} to be routed"), || {
        let e = event(f, id);
        e.get("routed_at_ms").is_some().then_some(e)
    })
}

fn push(f: &Fixture, delivery: &str, kind: &str) -> i64 {
    f.push("test", delivery, kind, r#"{"group":"g"}"#)["event_id"]
        .as_i64()
        .unwrap()
}

fn install(f: &Fixture, pkg: &Path) -> support::Run {
    let run = f.conduit(&[
        "ext",
        "install",
        "--no-wait",
        "--force",
        pkg.to_str().unwrap(),
    ]);
    assert_eq!(run.code(), Some(0), "{}{}", run.context(), f.context());
    run
}

#[test]
fn an_on_demand_extension_is_idle_until_an_event_of_its_kind_starts_it() {
    let mut f = Fixture::new();
    let pkg = f.lifecycle_ext("lazy", "ok", "0.1.0", ON_DEMAND);
    let run = install(&f, &pkg);
    assert!(
        run.stderr().contains("its handshake at install passed"),
        "{}",
        run.context()
    );
    // The dry handshake at install was kept: what it serves is known without running it.
    let kept: Value = serde_json::from_slice(
        &std::fs::read(f.state().join("packages/.handshakes/lazy.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(kept["by"], "install");
    assert_eq!(kept["capabilities"]["work_kinds"][0]["name"], "job");

    f.start_daemon();
    // Supervised (once the first reload is applied) and idle since then.
    let s = f.wait_for("lazy", PATIENCE, |s| s["idle_since_ms"].is_i64());
    assert_eq!(s["state"], "idle", "{s:#}");
    assert_eq!(s["start"], "on-demand");
    assert!(s["pid"].is_null() && s["idle_since_ms"].is_i64(), "{s:#}");
    assert_eq!(
        (s["demand_starts"].as_u64(), s["idle_stops"].as_u64()),
        (Some(0), Some(0))
    );
    // Idle is no trouble: `ext status` exits 0, the health and doctor count it as idle, the
    // overview (`conduit top`, `conduit web`) lists it as such.
    f.conduit(&["ext", "status", "lazy"]).expect_code(0);
    let health = http::get(&socket(&f), "/v1/health");
    assert_eq!(health["status"], "ok", "{health:#}");
    assert_eq!(health["extensions"]["idle"], 1, "{health:#}");
    let overview = http::get(&socket(&f), "/v1/overview?filter=lazy");
    let row = &overview["extensions"]["rows"][0];
    assert_eq!(row["state"], "idle", "{overview:#}");
    assert_eq!(
        overview["extensions"]["by_state"]["idle"], 1,
        "{overview:#}"
    );
    let doctor: Value =
        serde_json::from_str(f.conduit(&["doctor", "--json"]).stdout().as_str()).unwrap();
    let ext = doctor["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "extensions"))
        .unwrap_or_else(|| panic!("no extensions check: {doctor:#}"));
    assert_eq!(ext["status"], "ok", "{doctor:#}");
    assert!(
        ext["found"]
            .as_str()
            .unwrap()
            .contains("1 idle (on demand)"),
        "{doctor:#}"
    );
    // Passes come and go without a need: it stays idle.
    wait_passes(&f, 3);
    assert_eq!(f.status("lazy")["state"], "idle");

    let id = push(&f, "d1", "job.created");
    let e = routed(&f, id);
    assert!(e["work_id"].is_i64(), "routed to a Work: {e:#}");
    let s = f.wait_state("lazy", "ready", PATIENCE);
    assert_eq!(s["demand_starts"], 1, "{s:#}");
    assert_eq!(s["restarts"], 0);
    assert_eq!(
        s["start_reason"],
        format!("started by event {id} of kind job.created")
    );
    assert!(s["idle_since_ms"].is_null());
    let list = f.conduit(&["ext", "list"]);
    assert!(
        list.stdout()
            .lines()
            .any(|l| l.starts_with("lazy") && l.contains("ready") && l.contains("on-demand")),
        "{}",
        list.context()
    );
    // The daemon kept the handshake of the run it started too.
    let kept: Value = serde_json::from_slice(
        &std::fs::read(f.state().join("packages/.handshakes/lazy.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(kept["capabilities"]["recurrences"][0], "tick");
}

#[test]
fn a_due_timer_starts_it_and_fires_with_its_answer() {
    let mut f = Fixture::new();
    install(&f, &f.lifecycle_ext("ticker", "ok", "0.1.0", ON_DEMAND));
    f.start_daemon();
    assert_eq!(f.status("ticker")["state"], "idle");
    // Its recurrence is known while it is idle: the timer is taken.
    let t = f.json(&["timers", "add", "tick", "every 3600000", "--json"]);
    let id = t["timer_id"].as_i64().unwrap();
    let timer = f.wait_until("the timer to fire", || {
        let t = f.json(&["timers", "show", &id.to_string(), "--json"]);
        t["last_fired_at_ms"].is_i64().then_some(t)
    });
    // The extension's answer (an hour later), not the fallback's minute.
    assert_eq!(
        timer["next_at_ms"].as_i64().unwrap() - timer["last_fired_at_ms"].as_i64().unwrap(),
        3_600_000,
        "{timer:#}"
    );
    let s = f.wait_state("ticker", "ready", PATIENCE);
    assert_eq!(
        s["start_reason"],
        format!("started by timer {id} of recurrence tick")
    );
    assert_eq!(s["demand_starts"], 1);
}

#[test]
fn an_idle_run_stops_as_idle_and_the_next_event_starts_it_again() {
    let mut f = Fixture::new();
    let lifecycle = format!("{ON_DEMAND}\nidle_stop_after = \"1s\"");
    install(&f, &f.lifecycle_ext("napper", "ok", "0.1.0", &lifecycle));
    f.start_daemon();
    let first = push(&f, "d1", "job");
    assert!(routed(&f, first)["work_id"].is_i64());
    let ready = f.wait_state("napper", "ready", PATIENCE);
    let pid = ready["pid"].as_i64().unwrap();
    let s = f.wait_state("napper", "idle", PATIENCE);
    assert_eq!(s["idle_stops"], 1, "{s:#}");
    assert_eq!(s["restarts"], 0, "an idle stop is no restart: {s:#}");
    assert_eq!(s["idle_stop_after_ms"], 1000);
    assert!(s["pid"].is_null() && s["idle_since_ms"].is_i64());
    let exit = &s["recent_exits"][0];
    assert_eq!(exit["pid"], pid);
    assert_eq!(exit["cause"], "stopped-by-host");
    assert!(
        exit["summary"]
            .as_str()
            .unwrap()
            .contains("1s without calls"),
        "{exit:#}"
    );
    assert!(
        support::fixture::wait_gone(pid as u32, PATIENCE).is_empty(),
        "its process is gone"
    );
    let metrics = f.conduit(&["metrics"]);
    for line in [
        "conduit_extension_idle_stops_total{extension=\"napper\"} 1",
        "conduit_extension_demand_starts_total{extension=\"napper\"} 1",
        "conduit_extension_on_demand{extension=\"napper\"} 1",
        "conduit_extension_state{extension=\"napper\",state=\"idle\"} 1",
    ] {
        assert!(
            metrics.stdout().contains(line),
            "{line}{}",
            metrics.context()
        );
    }

    let second = push(&f, "d2", "job");
    assert!(routed(&f, second)["work_id"].is_i64());
    let s = f.wait_for("napper", PATIENCE, |s| s["demand_starts"] == 2);
    assert_eq!(s["restarts"], 0);
    assert_eq!(
        s["start_reason"],
        format!("started by event {second} of kind job")
    );
}

#[test]
fn a_call_a_wait_an_emission_and_an_ingress_source_each_start_it() {
    let mut f = Fixture::new();
    let lifecycle = format!("{ON_DEMAND}\nidle_stop_after = \"1s\"");
    install(&f, &f.lifecycle_ext("lazy", "ok", "0.1.0", &lifecycle));
    // One that declares an ingress source: being polled is a need, so it starts at once.
    let fed = f.lifecycle_ext("fed", "ok", "0.1.0", ON_DEMAND);
    let manifest = fed.join("conduit-extension.toml");
    let text = std::fs::read_to_string(&manifest)
        .unwrap()
        .replace("\"job\", \"no-ingress\"", "\"feed.job\"")
        .replace(
            "{ name = \"job\", trigger = true }",
            "{ name = \"feed.job\", trigger = true }",
        )
        .replace("methods = [", "ingress = [\"feed\"]\nmethods = [");
    std::fs::write(&manifest, text).unwrap();
    install(&f, &fed);
    f.start_daemon();
    f.wait_for("lazy", PATIENCE, |s| s["idle_since_ms"].is_i64());

    // A management call starts it and is answered once it is ready.
    let run = f.conduit(&["ext", "call", "lazy", "open-streams", r#"{"n":0}"#]);
    run.expect_code(0);
    assert_eq!(run.stdout().trim(), "[]", "{}", run.context());
    let s = f.status("lazy");
    assert_eq!(
        s["start_reason"], "started by a management call of `open-streams`",
        "{s:#}"
    );
    assert_eq!(s["demand_starts"], 1, "{s:#}");

    // Idle again; a wait of its filter with an event to look at starts it, and is satisfied.
    f.wait_for("lazy", PATIENCE, |s| s["idle_stops"] == 1);
    let wait = f.json(&[
        "waits",
        "add",
        "match",
        "dora",
        "--extension",
        "lazy",
        "--json",
    ])["wait_id"]
        .as_i64()
        .unwrap();
    f.push("test", "m1", "chat", r#"{"text":"hello dora"}"#);
    let shown = f.wait_until("the wait to be satisfied", || {
        let w = f.json(&["waits", "show", &wait.to_string(), "--json"]);
        (w["state"] == "satisfied").then_some(w)
    });
    assert!(shown["satisfied_by_event_id"].is_i64(), "{shown:#}");
    let s = f.wait_for("lazy", PATIENCE, |s| s["demand_starts"] == 2);
    assert_eq!(
        s["start_reason"],
        format!("started by wait {wait} of filter match"),
        "{s:#}"
    );
    assert_eq!(s["restarts"], 0, "{s:#}");

    // Idle again; a planned emission of it to commit starts it, and is committed.
    f.wait_for("lazy", PATIENCE, |s| s["idle_stops"] == 2);
    let em = f.json(&[
        "emissions",
        "add",
        "note",
        r#"{"n":1}"#,
        "--extension",
        "lazy",
        "--json",
    ])["emission_id"]
        .as_i64()
        .unwrap();
    f.wait_until("the emission to be committed", || {
        let (_, e) = http::request(&socket(&f), "GET", &format!("/v1/emissions/{em}"), None);
        (e["state"] == "committed").then_some(())
    });
    let s = f.wait_for("lazy", PATIENCE, |s| s["demand_starts"] == 3);
    assert_eq!(
        s["start_reason"],
        format!("started by emission {em} (note) to commit"),
        "{s:#}"
    );

    let s = f.wait_for("fed", PATIENCE, |s| s["demand_starts"] == 1);
    assert_eq!(
        s["start_reason"], "started to poll its ingress source feed",
        "{s:#}"
    );
}

/// An artifact stream left open keeps the run from its idle stop: three times its idle time
/// pass (a host-loop pass each second) and it is still ready, not stopped once.
#[test]
fn an_open_artifact_stream_keeps_it_from_its_idle_stop() {
    let mut f = Fixture::new();
    let lifecycle = format!("{ON_DEMAND}\nidle_stop_after = \"1s\"");
    install(&f, &f.lifecycle_ext("streamer", "ok", "0.1.0", &lifecycle));
    f.start_daemon();
    f.wait_for("streamer", PATIENCE, |s| s["idle_since_ms"].is_i64());
    let run = f.conduit(&["ext", "call", "streamer", "open-streams", r#"{"n":1}"#]);
    run.expect_code(0);
    let pid = f.status("streamer")["pid"].as_i64().unwrap();
    let from = Instant::now();
    while from.elapsed() < Duration::from_secs(3) {
        wait_passes(&f, 1);
    }
    let s = f.status("streamer");
    assert_eq!(
        (
            s["state"].as_str(),
            s["pid"].as_i64(),
            s["idle_stops"].as_u64()
        ),
        (Some("ready"), Some(pid), Some(0)),
        "{s:#}"
    );
}

#[test]
fn ext_set_makes_a_running_extension_on_demand_with_an_idle_stop() {
    let mut f = Fixture::new();
    install(&f, &f.lifecycle_ext("switch", "ok", "0.1.0", ""));
    f.start_daemon();
    let s = f.wait_state("switch", "ready", PATIENCE);
    assert_eq!(s["start"], "always");
    let set = f.json(&[
        "ext",
        "set",
        "switch",
        "start=on-demand",
        "idle_stop_after=1s",
        "--json",
    ]);
    assert_eq!(
        (set["start"].as_str(), set["idle_stop_after"].as_str()),
        (Some("on-demand"), Some("1s"))
    );
    // Replaced under its new settings; then, with nothing to do, idle.
    let s = f.wait_for("switch", PATIENCE, |s| {
        s["state"] == "idle" && s["start"] == "on-demand"
    });
    assert_eq!(s["idle_stop_after_ms"], 1000, "{s:#}");
    let bad = f.conduit(&["ext", "set", "switch", "idle_stop_after=500ms"]);
    bad.expect_code(2);
    assert!(
        bad.stderr().contains("below the least, 1s"),
        "{}",
        bad.context()
    );
    let id = push(&f, "d1", "job");
    assert!(routed(&f, id)["work_id"].is_i64());
}

#[test]
fn a_sigkill_while_events_wait_for_an_on_demand_start_loses_none() {
    let mut f = Fixture::new();
    // It sleeps a second before it reads anything: the events wait for its start.
    install(
        &f,
        &f.lifecycle_ext("slow", "slow-start", "0.1.0", ON_DEMAND),
    );
    f.start_daemon();
    let sock = socket(&f);
    let mut accepted = Vec::new();
    for i in 0..30 {
        let payload = json!({ "group": format!("g{}", i % 4) });
        accepted.push(http::push(&sock, "test", &format!("d{i}"), "job", payload));
    }
    let waiting = f
        .all_events()
        .iter()
        .filter(|e| e.get("routed_at_ms").is_none())
        .count();
    assert!(waiting > 0, "every event was routed before the kill");
    kill(f.daemon_pid(), nix::sys::signal::Signal::SIGKILL);
    let _ = f.daemon.take().unwrap().wait();

    f.start_daemon();
    let events = f.wait_until("every event to be routed", || {
        let all = f.all_events();
        all.iter()
            .all(|e| e.get("routed_at_ms").is_some())
            .then_some(all)
    });
    let mut in_works: HashMap<i64, usize> = HashMap::new();
    for w in f.json(&["work", "list", "--limit", "200", "--json"])["work"]
        .as_array()
        .unwrap()
    {
        for id in w["event_ids"].as_array().unwrap() {
            *in_works.entry(id.as_i64().unwrap()).or_default() += 1;
        }
    }
    for id in &accepted {
        let e = events.iter().find(|e| e["id"] == *id);
        assert!(e.is_some(), "event {id} lost{}", f.context());
        assert!(
            e.unwrap()["work_id"].is_i64(),
            "event {id} routed to no Work"
        );
        assert_eq!(
            in_works.get(id),
            Some(&1),
            "event {id} not in exactly one Work"
        );
    }
}

/// A package whose trigger hangs until `<state>/data/flaky/answer` exists: once a first event
/// has made it degraded (that one gets the trigger's fallback), the events of its kind wait
/// until then. Two such events.
fn flaky(f: &mut Fixture) -> (i64, i64) {
    install(f, &f.lifecycle_ext("flaky", "hang-until-file", "0.1.0", ""));
    f.start_daemon();
    f.wait_state("flaky", "ready", PATIENCE);
    push(f, "w0", "job");
    f.wait_for("flaky", PATIENCE, |s| {
        s["health"]["condition"] == "degraded"
    });
    let (a, b) = (push(f, "w1", "job"), push(f, "w2", "job"));
    wait_passes(f, 2);
    for id in [a, b] {
        assert!(
            event(f, id).get("routed_at_ms").is_none(),
            "{}",
            f.context()
        );
    }
    (a, b)
}

#[test]
fn disable_keeps_the_events_that_wait_and_enable_routes_them() {
    let mut f = Fixture::new();
    let (a, b) = flaky(&mut f);
    // A timer of its recurrence waits too (it is degraded, so nothing fires it).
    let timer = f.json(&["timers", "add", "tick", "every 3600000", "--json"])["timer_id"]
        .as_i64()
        .unwrap();
    let run = f.conduit(&["ext", "disable", "flaky"]);
    run.expect_code(0);
    assert!(
        run.stdout().contains("flaky disabled")
            && run
                .stdout()
                .contains("2 events and 1 timer wait for it, kept"),
        "{}",
        run.context()
    );
    wait_passes(&f, 3);
    for id in [a, b] {
        let e = event(&f, id);
        assert!(
            e.get("routed_at_ms").is_none(),
            "event {id} was routed while its extension was disabled: {e:#}{}",
            f.context()
        );
    }
    // `events list` says what they wait for, and a push of its kind says it will wait too.
    let list = f.conduit(&["events", "list"]);
    let waiting = list
        .stdout()
        .lines()
        .filter(|l| l.contains("waits for flaky (disabled)"))
        .count();
    assert_eq!(waiting, 2, "{}", list.context());
    let late = f.conduit(&[
        "events",
        "push",
        "--source",
        "test",
        "--delivery-id",
        "w3",
        "--kind",
        "job",
        "--payload",
        "{}",
        "--json",
    ]);
    late.expect_code(0);
    let c = serde_json::from_str::<Value>(&late.stdout()).unwrap()["event_id"]
        .as_i64()
        .unwrap();
    assert!(
        late.stderr().contains(
            "`flaky` does, but is disabled, so it waits until `conduit ext enable flaky`"
        ),
        "{}",
        late.context()
    );
    let show = |id: i64| f.json(&["timers", "show", &id.to_string(), "--json"]);
    assert!(
        show(timer)["last_fired_at_ms"].is_null(),
        "the timer fired while its extension was disabled: {:#}",
        show(timer)
    );
    let pending = f.json(&["ext", "disable", "flaky", "--json"]);
    assert_eq!(pending["pending"]["events"], 3, "{pending:#}");
    assert_eq!(pending["pending"]["timers"], 1, "{pending:#}");
    std::fs::write(f.state().join("data/flaky/answer"), "").unwrap();
    f.conduit(&["ext", "enable", "flaky"]).expect_code(0);
    for id in [a, b, c] {
        assert!(routed(&f, id)["work_id"].is_i64(), "{}", f.context());
    }
    // Taken up with the extension's own answer, not the fallback's minute.
    let fired = f.wait_until("the timer to fire", || {
        let t = show(timer);
        t["last_fired_at_ms"].is_i64().then_some(t)
    });
    assert_eq!(
        fired["next_at_ms"].as_i64().unwrap() - fired["last_fired_at_ms"].as_i64().unwrap(),
        3_600_000,
        "{fired:#}"
    );
}

#[test]
fn drop_pending_drops_them_with_a_log_line_and_a_count_and_remove_asks_first() {
    let mut f = Fixture::new();
    let (a, b) = flaky(&mut f);
    let out = f.json(&["ext", "disable", "--drop-pending", "flaky", "--json"]);
    assert_eq!(out["dropped"]["events"], 2, "{out:#}");
    assert_eq!(out["pending"]["events"], 0, "{out:#}");
    for id in [a, b] {
        let e = event(&f, id);
        assert!(
            e.get("routed_at_ms").is_some() && e.get("work_id").is_none(),
            "{e:#}"
        );
    }
    let log = std::fs::read_to_string(f.daemon_log()).unwrap();
    assert!(
        log.contains("dropped the work that waited for a disabled extension")
            && log.contains("events=2"),
        "{}",
        f.context()
    );
    let metrics = f.conduit(&["metrics"]);
    assert!(
        metrics
            .stdout()
            .contains("conduit_pending_dropped_total{record=\"event\"} 2"),
        "{}",
        metrics.context()
    );
    // Remove asks the same question: one more event waits now.
    let c = push(&f, "w3", "job");
    let refused = f.conduit(&["ext", "remove", "flaky"]);
    refused.expect_code(2);
    assert!(
        refused.stderr().contains("1 event waits for `flaky`")
            && refused.stderr().contains("--drop-pending"),
        "{}",
        refused.context()
    );
    assert!(event(&f, c).get("routed_at_ms").is_none());
    let removed = f.conduit(&["ext", "remove", "--drop-pending", "flaky"]);
    removed.expect_code(0);
    assert!(
        removed
            .stdout()
            .contains("dropped 1 event (routed to no Work)"),
        "{}",
        removed.context()
    );
}

/// The `echo` example as package `up` at `version`; with `slow`, its command sleeps a second
/// before it starts (a slow cold start, to see the overlap).
fn echo_version(f: &Fixture, version: &str, slow: bool) -> PathBuf {
    let staged =
        support::stage_rust_example("echo", &f.dir.path().join(format!("stage-{version}")))
            .expect("the echo example is a package");
    let manifest = std::fs::read_to_string(staged.join("conduit-extension.toml")).unwrap();
    let table: toml::Table = manifest.parse().unwrap();
    let program = table["command"][0].as_str().unwrap().to_owned();
    let command = if slow {
        format!(r#"["sh", "-c", "sleep 1; exec {program}"]"#)
    } else {
        format!(r#"["{program}"]"#)
    };
    let mut out = String::new();
    for line in manifest.lines() {
        if line.starts_with("name") {
            out.push_str("name = \"up\"\n");
        } else if line.starts_with("version") {
            out.push_str(&format!("version = \"{version}\"\n"));
        } else if line.starts_with("command") {
            out.push_str(&format!("command = {command}\n"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    std::fs::write(staged.join("conduit-extension.toml"), out).unwrap();
    staged
}

/// One call's latency and its failure, if it failed.
type Call = (Duration, Option<String>);

/// Calls `echo` of `up` through the API every 20 ms until stopped: every call, in order.
struct Load {
    stop: Arc<AtomicBool>,
    calls: Arc<Mutex<Vec<Call>>>,
    task: std::thread::JoinHandle<()>,
}

impl Load {
    fn start(f: &Fixture) -> Load {
        let (stop, calls) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(Mutex::new(Vec::new())),
        );
        let (s, c, sock) = (stop.clone(), calls.clone(), socket(f));
        let task = std::thread::spawn(move || {
            let mut n = 0;
            while !s.load(Ordering::Relaxed) {
                n += 1;
                let body = json!({"method": "echo", "params": {"text": format!("call {n}")}, "timeout_ms": 10_000});
                let t = Instant::now();
                let (code, v) = http::request(&sock, "POST", "/v1/extensions/up/call", Some(&body));
                let took = t.elapsed();
                let failed = (code != 200 || v["result"]["text"] != format!("call {n}"))
                    .then(|| format!("call {n}: {code} {v}"));
                c.lock().unwrap().push((took, failed));
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Load { stop, calls, task }
    }

    fn count(&self) -> usize {
        self.calls.lock().unwrap().len()
    }

    fn wait_for_calls(&self, f: &Fixture, n: usize) {
        let from = self.count();
        f.wait_until(&format!("{n} more calls"), || {
            (self.count() >= from + n).then_some(())
        });
    }

    fn finish(self) -> Vec<Call> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.join().unwrap();
        Arc::try_unwrap(self.calls).unwrap().into_inner().unwrap()
    }
}

#[test]
fn an_upgrade_under_load_fails_no_call_and_keeps_every_call_short() {
    let mut f = Fixture::new();
    install(&f, &echo_version(&f, "0.1.0", false));
    f.start_daemon();
    let old = f.wait_state("up", "ready", PATIENCE);
    let old_pid = old["pid"].as_i64().unwrap();
    let load = Load::start(&f);
    load.wait_for_calls(&f, 25);
    let before = load.count();
    let longest_before = load
        .calls
        .lock()
        .unwrap()
        .iter()
        .map(|c| c.0)
        .max()
        .unwrap();

    // The install waits until the new version serves; meanwhile `ext status` shows both.
    let new_pkg = echo_version(&f, "0.2.0", true);
    let installer = {
        let mut cmd = f.command(&["ext", "install", new_pkg.to_str().unwrap()]);
        std::thread::spawn(move || cmd.output().unwrap())
    };
    let overlap = f.wait_until("both versions in `ext status`", || {
        let s = f.status("up");
        (s["overlap"]["phase"] == "starting").then_some(s)
    });
    assert_eq!(overlap["version"], "0.1.0", "{overlap:#}");
    assert_eq!(overlap["state"], "ready");
    assert_eq!(overlap["overlap"]["status"]["version"], "0.2.0");
    let out = installer.join().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        f.context()
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("beside the running one"), "{stderr}");
    let new = f.wait_for("up", PATIENCE, |s| {
        s["version"] == "0.2.0" && s["state"] == "ready" && s["overlap"].is_null()
    });
    load.wait_for_calls(&f, 25);
    let calls = load.finish();
    let failed: Vec<&String> = calls.iter().filter_map(|c| c.1.as_ref()).collect();
    assert!(
        failed.is_empty(),
        "{} of {} calls failed: {failed:?}{}",
        failed.len(),
        calls.len(),
        f.context()
    );
    assert!(calls.len() > before + 25);
    // No call waits for the new version: none longer than the old one's longest call plus
    // the new one's cold start (spawn to accepted handshake, a second of which it sleeps).
    let cold = Duration::from_millis(new["spawn_to_ready_ms"].as_u64().unwrap());
    let longest = calls.iter().map(|c| c.0).max().unwrap();
    assert!(
        longest <= longest_before + cold,
        "a call took {longest:?}; the bound is {longest_before:?} + {cold:?}"
    );
    assert_ne!(new["pid"], old_pid);
    assert!(
        support::fixture::wait_gone(old_pid as u32, PATIENCE).is_empty(),
        "the old version was stopped"
    );
}

#[test]
fn a_new_version_that_crashes_at_start_leaves_the_old_one_serving() {
    let mut f = Fixture::new();
    install(&f, &echo_version(&f, "0.1.0", false));
    f.start_daemon();
    let old = f.wait_state("up", "ready", PATIENCE);
    let load = Load::start(&f);
    load.wait_for_calls(&f, 25);
    let broken = f.misbehave("up", "exit-at-start");
    let manifest = std::fs::read_to_string(broken.join("conduit-extension.toml")).unwrap();
    std::fs::write(
        broken.join("conduit-extension.toml"),
        manifest.replace("version = \"0.1.0\"", "version = \"0.2.0\""),
    )
    .unwrap();
    let run = f.conduit(&["ext", "install", broken.to_str().unwrap()]);
    run.expect_code(1);
    assert!(
        run.stderr()
            .contains("`up` 0.2.0 is crash-looping, not ready"),
        "{}",
        run.context()
    );
    assert!(
        run.stderr()
            .contains("rolled back to up 0.1.0, which is ready"),
        "{}",
        run.context()
    );
    load.wait_for_calls(&f, 25);
    let calls = load.finish();
    let failed: Vec<&String> = calls.iter().filter_map(|c| c.1.as_ref()).collect();
    assert!(
        failed.is_empty(),
        "{} of {} calls failed: {failed:?}{}",
        failed.len(),
        calls.len(),
        f.context()
    );
    // The same process served throughout.
    let s = f.status("up");
    assert_eq!(s["version"], "0.1.0");
    assert_eq!(s["state"], "ready");
    assert_eq!(s["pid"], old["pid"], "{s:#}");
    assert_eq!(s["restarts"], 0);
}
