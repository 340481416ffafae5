//! The Python and Node SDKs through the real `conduit`: their examples pass `conduit ext check`,
//! run a notes-like workload under the daemon, store artifacts under the daemon's digest (on
//! its bulk pipe and as JSON chunks, without a digest of their own unless asked; a wrong one
//! refused),
//! report a handler's exception as a non-retryable error. The examples get their SDK when
//! staged (`scripts/stage-examples.sh`, through `scripts/vendor-sdk.sh`), the repository keeps
//! no copy of it, and `conduit ext new` skeletons carry exactly what staging copies; skeletons
//! of every language pass `ext check` as generated, and their own test commands (`python3 -B -m
//! unittest`, `node --test`, `cargo test`: tests written with the SDK's test kit) pass in the
//! scratch folder they were generated into.
//!
//! A test whose interpreter (`python3`, `node`) is missing says so on stderr and passes without
//! checking; `.ci/run` installs both.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use support::fixture::Fixture;
use support::{PATIENCE, Run, workspace_root};

fn have(program: &str) -> bool {
    let ok = Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("SKIPPED: `{program}` is not installed, so this test checks nothing");
    }
    ok
}

fn conduit(args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_conduit"))
        .args(args)
        .env_remove("CONDUIT_LOG")
        .output()
        .expect("the conduit binary runs");
    Run {
        cmd: format!("conduit {}", args.join(" ")),
        out,
    }
}

#[track_caller]
fn passes_check(pkg: &Path) {
    let run = conduit(&["ext", "check", pkg.to_str().unwrap()]);
    run.expect_code(0);
    assert!(
        run.stdout().contains(": every rule passed"),
        "{}",
        run.context()
    );
}

/// Runs a generated project's own test command in its folder; it must pass.
#[track_caller]
fn own_tests_pass(dir: &Path, program: &str, args: &[&str], env: &[(&str, &Path)]) {
    let mut cmd = Command::new(program);
    cmd.args(args).current_dir(dir).env_remove("CONDUIT_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("the test command runs");
    assert!(
        out.status.success(),
        "`{program} {}` failed in {}:\n{}\n{}",
        args.join(" "),
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The source of `examples/NAME` (not a package: a Python or Node example gets its SDK when
/// staged).
fn example(name: &str) -> PathBuf {
    workspace_root().join("examples").join(name)
}

/// `examples/NAME` staged into `into`, as `make stage` leaves it.
fn staged(name: &str, into: &Path) -> PathBuf {
    support::stage_example(name, into)
}

// ---- the examples pass `ext check` ---------------------------------------------------------

#[test]
fn the_node_echo_example_passes_the_check() {
    if have("node") {
        let tmp = tempfile::tempdir().unwrap();
        passes_check(&staged("node-echo", tmp.path()));
    }
}

#[test]
fn the_node_notes_example_passes_the_check() {
    if have("node") {
        let tmp = tempfile::tempdir().unwrap();
        passes_check(&staged("node-notes", tmp.path()));
    }
}

#[test]
fn the_python_echo_example_is_built_on_the_sdk_and_passes_the_check() {
    if !have("python3") {
        return;
    }
    let src = std::fs::read_to_string(example("python-echo/echo.py")).unwrap();
    assert!(src.contains("from conduit_extension import"), "{src}");
    assert!(
        src.lines().count() <= 30,
        "the echo example is {} lines",
        src.lines().count()
    );
    let tmp = tempfile::tempdir().unwrap();
    passes_check(&staged("python-echo", tmp.path()));
}

#[test]
fn the_node_echo_example_is_at_most_30_lines() {
    let src = std::fs::read_to_string(example("node-echo/echo.mjs")).unwrap();
    assert!(src.contains("from \"conduit-extension\""), "{src}");
    assert!(
        src.lines().count() <= 30,
        "the echo example is {} lines",
        src.lines().count()
    );
}

// ---- the SDK a package carries --------------------------------------------------------

/// Copies the SDK of `lang` (`python`, `node`) into the package folder `pkg`, where the package
/// imports it from: `scripts/vendor-sdk.sh`, what staging uses.
fn vendor_sdk(lang: &str, pkg: &Path) {
    let out = Command::new(workspace_root().join("scripts/vendor-sdk.sh"))
        .arg(lang)
        .arg(pkg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/vendor-sdk.sh {lang} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every file below `dir`, as (path relative to `dir`, content), sorted.
fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = support::fixture::walk(dir)
        .into_iter()
        .filter(|p| p.is_file())
        .map(|p| {
            let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
            (rel, std::fs::read(&p).unwrap())
        })
        .collect();
    files.sort();
    files
}

#[track_caller]
fn same_tree(got: &Path, want: &Path, what: &str) {
    let (got, want) = (tree(got), tree(want));
    let names = |t: &[(String, Vec<u8>)]| t.iter().map(|f| f.0.clone()).collect::<Vec<_>>();
    assert_eq!(names(&got), names(&want), "{what}: not the same files");
    for ((name, a), (_, b)) in got.iter().zip(&want) {
        assert!(a == b, "{what}: {name} differs");
    }
}

/// What `conduit ext new` writes is the SDK staging copies, file for file: a module added to an
/// SDK and not to the list built into `conduit` (host/src/cli/ext_new.rs) fails here.
#[test]
fn a_skeleton_carries_exactly_the_sdk_that_staging_copies() {
    let tmp = tempfile::tempdir().unwrap();
    for (lang, sdk) in [
        ("python", "conduit_extension"),
        ("node", "node_modules/conduit-extension"),
    ] {
        let skeleton = tmp.path().join(format!("new-{lang}"));
        ext_new("greeter", lang, &skeleton).expect_code(0);
        let vendored = tmp.path().join(format!("vendored-{lang}"));
        vendor_sdk(lang, &vendored);
        same_tree(
            &skeleton.join(sdk),
            &vendored.join(sdk),
            &format!(
                "the {lang} skeleton's SDK (host/src/cli/ext_new.rs) against scripts/vendor-sdk.sh {lang}"
            ),
        );
    }
}

// ---- the test kits name the checker's rules -------------------------------------------------

/// Every rule id a test kit reports (the Rust kit's `rules`, the Python and Node kits' `RULES`)
/// is one of `conduit ext check`'s, with the same section of docs/protocol.md.
#[test]
fn the_test_kits_name_the_checkers_rules() {
    let root = workspace_root();
    let checker: std::collections::HashSet<&str> = conduit_host::check::RULES
        .iter()
        .map(|(id, _)| *id)
        .collect();
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    let mut named: Vec<(String, String, &str)> = Vec::new();
    // Rust: `id: "handshake",` then `section: "§4, §4.2",`.
    let rust = read("extensions/sdk-testing/src/error.rs");
    let mut lines = rust.lines().map(str::trim);
    while let Some(l) = lines.next() {
        if let Some(id) = l.strip_prefix("id: \"").and_then(|r| r.strip_suffix("\",")) {
            let sec = lines.next().unwrap_or_default();
            let sec = sec
                .trim_start_matches("section: \"")
                .trim_end_matches("\",");
            named.push((id.to_owned(), sec.to_owned(), "the Rust kit"));
        }
    }
    // Python and Node: `"handshake": "§4, §4.2",` inside RULES.
    for (path, who) in [
        (
            "extensions/python/conduit_extension/testing.py",
            "the Python kit",
        ),
        ("extensions/node/testing.js", "the Node kit"),
    ] {
        let text = read(path);
        let table = text
            .split("RULES = ")
            .nth(1)
            .unwrap()
            .split('}')
            .next()
            .unwrap();
        for l in table.lines().map(str::trim) {
            if let Some((id, sec)) = l.split_once(": \"§") {
                let id = id.trim_matches('"');
                let sec = format!("§{}", sec.trim_end_matches("\",").trim_end_matches('"'));
                named.push((id.to_owned(), sec, who));
            }
        }
    }
    assert!(named.len() >= 17, "{named:?}");
    let doc = std::fs::read_to_string(root.join("docs/protocol.md")).unwrap();
    for (id, sec, who) in &named {
        assert!(
            checker.contains(id.as_str()),
            "{who} names `{id}`, which `conduit ext check` does not have"
        );
        let row = format!("| `{id}` | {sec} |");
        assert!(
            doc.contains(&row),
            "{who}: `{id}` is {sec}, but docs/protocol.md's table has no row {row}"
        );
    }
}

/// The SDK examples are staged with their SDK, a copy of extensions/, and the repository keeps
/// no copy of an SDK under examples/ (`duplicates` would find every line of it twice).
#[test]
fn the_sdk_examples_get_their_sdk_at_staging_and_no_copy_is_committed() {
    let tmp = tempfile::tempdir().unwrap();
    let root = workspace_root();
    for (name, sdk, src) in [
        (
            "python-echo",
            "conduit_extension",
            "extensions/python/conduit_extension",
        ),
        (
            "node-echo",
            "node_modules/conduit-extension/lib",
            "extensions/node/lib",
        ),
        (
            "node-notes",
            "node_modules/conduit-extension/lib",
            "extensions/node/lib",
        ),
    ] {
        let pkg = staged(name, tmp.path());
        let copy = pkg.join(sdk);
        let mut want = tree(&root.join(src));
        want.retain(|(f, _)| !f.contains("__pycache__"));
        let got = tree(&copy);
        assert_eq!(
            got.iter().map(|f| &f.0).collect::<Vec<_>>(),
            want.iter().map(|f| &f.0).collect::<Vec<_>>(),
            "{name}: the staged SDK is not {src}"
        );
        assert!(got == want, "{name}: the staged SDK differs from {src}");
    }
    let tracked = Command::new("git")
        .args(["ls-files", "examples"])
        .current_dir(&root)
        .output();
    match tracked {
        Ok(out) if out.status.success() => {
            let copies: Vec<_> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| l.contains("/conduit_extension/") || l.contains("/node_modules/"))
                .map(str::to_owned)
                .collect();
            assert!(
                copies.is_empty(),
                "committed SDK copies under examples/ (staging puts them there): {copies:?}"
            );
        }
        _ => eprintln!("SKIPPED the committed-copy half: not a git checkout, or no git"),
    }
}

// ---- under the daemon ----------------------------------------------------------------------

/// A notes-like Python package on the vendored SDK: work kind `pynote` grouped by thread, a
/// push-only source, a method whose handler raises, and `export`, which streams `size` bytes
/// as an artifact and answers what was stored and whether the bulk pipe carried it.
fn python_package(f: &Fixture) -> PathBuf {
    let pkg = f.dir.path().join("src/py-notes");
    vendor_sdk("python", &pkg);
    std::fs::write(
        pkg.join("notes.py"),
        r#"from conduit_extension import Extension

ext = Extension("py-notes", "0.1.0")
ext.declare_ingress("py-inbox")


@ext.work_kind("pynote")
def group(ctx, p):
    groups = {}
    for e in p["inputs"]:
        key = "thread:%s" % e["payload"].get("thread", e["id"])
        g = groups.setdefault(key, {"key": key, "event_ids": [], "start": True})
        g["event_ids"].append(e["id"])
    return {"groups": list(groups.values())}


@ext.method("fail")
def fail(ctx, params):
    return {}["missing"]


@ext.method("export")
def export(ctx, params):
    data = bytes(range(256)) * (params["size"] // 256)
    with ctx.host.artifact("export.bin", size=len(data), verify=params.get("verify", False),
                           json_chunks=params.get("json_chunks", False)) as w:
        for i in range(0, len(data), 4096):
            w.write(data[i:i + 4096])
        return dict(w.finish(sha256=params.get("sha256")), bulk=w.is_bulk, hashing=w.is_hashing)


ext.run()
"#,
    )
    .unwrap();
    std::fs::write(
        pkg.join("conduit-extension.toml"),
        "name = \"py-notes\"\nversion = \"0.1.0\"\nprotocol = 1\ncommand = [\"python3\", \"-B\", \"notes.py\"]\n\n\
         [capabilities]\nwork_kinds = [{ name = \"pynote\", trigger = true }]\ningress = [\"py-inbox\"]\nmethods = [\"fail\", \"export\", \"check.sleep\"]\n",
    )
    .unwrap();
    pkg
}

fn routed(f: &Fixture, id: i64) -> Option<Value> {
    f.all_events()
        .into_iter()
        .find(|e| e["id"] == id && e.get("routed_at_ms").is_some())
}

fn work_keys(f: &Fixture) -> Vec<(String, Vec<i64>)> {
    f.json(&["work", "list", "--json"])["work"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["key"].as_str().unwrap().to_owned(),
                w["event_ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|i| i.as_i64().unwrap())
                    .collect(),
            )
        })
        .collect()
}

/// `conduit ext call` of a method whose handler throws: exit 1 and `internal_error`, which is
/// not retryable (never `overloaded`).
#[track_caller]
fn handler_exception_is_not_retryable(f: &Fixture, name: &str, method: &str, params: &str) {
    let run = f.conduit(&["ext", "call", name, method, params]);
    assert_eq!(run.code(), Some(1), "{}{}", run.context(), f.context());
    let v = run.json();
    assert_eq!(v["error"]["code"], -32603, "{v:#}");
    assert_eq!(v["error"]["name"], "internal_error", "{v:#}");
    if let Some(r) = v["error"].get("retryable") {
        assert_eq!(r, false, "{v:#}");
    }
    // The extension survived its handler's failure.
    assert_eq!(f.status(name)["state"], "ready");
}

/// A Node package on the SDK of this checkout: `export` streams `size` bytes as an artifact
/// and answers what was stored and whether the bulk pipe carried it.
fn node_package(f: &Fixture) -> PathBuf {
    let pkg = f.dir.path().join("src/node-export");
    vendor_sdk("node", &pkg);
    std::fs::write(
        pkg.join("export.mjs"),
        r#"import { Extension } from "conduit-extension";

const ext = new Extension("node-export", "0.1.0");
ext.method("export", async (ctx, params) => {
  const data = Buffer.alloc(params.size);
  for (let i = 0; i < data.length; i++) data[i] = i % 256;
  const w = await ctx.host.artifact("export.bin", { size: data.length, verify: params.verify, jsonChunks: params.json_chunks });
  try {
    for (let i = 0; i < data.length; i += 4096) await w.write(data.subarray(i, i + 4096));
    return { ...(await w.finish({ sha256: params.sha256 })), bulk: w.isBulk, hashing: w.isHashing };
  } catch (e) {
    w.abort();
    throw e;
  }
});
ext.run();
"#,
    )
    .unwrap();
    std::fs::write(
        pkg.join("conduit-extension.toml"),
        "name = \"node-export\"\nversion = \"0.1.0\"\nprotocol = 1\ncommand = [\"node\", \"export.mjs\"]\n\n\
         [capabilities]\nmethods = [\"export\", \"check.sleep\"]\n",
    )
    .unwrap();
    pkg
}

/// With `tool` present: the package `build` makes, installed and ready under a daemon, exports
/// 750 KiB (several 256 KiB frames) on the bulk pipe and as JSON chunks without a digest, and
/// once verifying end to end: each is stored under the digest the host computed, which the SDK
/// returns, holding exactly those bytes, and the SDK hashed only when asked (docs/protocol.md
/// §8). A wrong digest passed as known is refused `artifact_invalid`, and nothing is stored.
#[track_caller]
fn exports_under_the_hosts_digest(tool: &str, build: fn(&Fixture) -> PathBuf, name: &str) {
    if !have(tool) {
        return;
    }
    let mut f = Fixture::new();
    f.install(&build(&f));
    f.start_daemon();
    f.wait_state(name, "ready", PATIENCE);
    let size = 256 * 3000;
    let want: Vec<u8> = (0..size).map(|i| (i % 256) as u8).collect();
    use sha2::Digest as _;
    let digest = hex::encode(sha2::Sha256::digest(&want));
    let export = |params: Value| {
        let run = f.conduit(&[
            "ext",
            "call",
            name,
            "export",
            &params.to_string(),
            "--timeout-ms",
            "60000",
        ]);
        (run.code(), run.json(), run.context())
    };
    for (params, bulk, hashing) in [
        (serde_json::json!({ "size": size }), true, false),
        (
            serde_json::json!({ "size": size, "json_chunks": true }),
            false,
            false,
        ),
        (
            serde_json::json!({ "size": size, "verify": true }),
            true,
            true,
        ),
    ] {
        let (code, v, context) = export(params.clone());
        assert_eq!(code, Some(0), "{context}{}", f.context());
        assert_eq!(v["bulk"], bulk, "{params}: {v:#}");
        assert_eq!(v["hashing"], hashing, "{params}: {v:#}");
        assert_eq!(v["size"], size, "{v:#}");
        assert_eq!(
            v["sha256"], digest,
            "{params}: the host's digest, returned: {v:#}"
        );
        assert_eq!(v["artifact_id"], format!("sha256:{digest}"), "{v:#}");
        let out = f.dir.path().join("export.bin");
        let get = f.conduit(&[
            "artifacts",
            "get",
            &format!("sha256:{digest}"),
            "-o",
            out.to_str().unwrap(),
        ]);
        assert_eq!(get.code(), Some(0), "{}", get.context());
        assert!(
            std::fs::read(&out).unwrap() == want,
            "the stored bytes differ"
        );
    }
    // A wrong known digest: refused, and nothing more is stored.
    let stored = || std::fs::read_dir(f.state().join("artifacts/sha256")).map_or(0, |d| d.count());
    let before = stored();
    let wrong = hex::encode(sha2::Sha256::digest(b"other bytes"));
    let (code, v, context) = export(serde_json::json!({ "size": size, "sha256": wrong }));
    assert_eq!(code, Some(1), "{context}");
    assert_eq!(v["error"]["code"], -32009, "artifact_invalid: {v:#}");
    assert_eq!(stored(), before, "a refused artifact was kept");
}

#[test]
fn the_python_sdk_stores_artifacts_under_the_daemons_digest() {
    exports_under_the_hosts_digest("python3", python_package, "py-notes");
}

#[test]
fn the_node_sdk_stores_artifacts_under_the_daemons_digest() {
    exports_under_the_hosts_digest("node", node_package, "node-export");
}

#[test]
fn both_sdks_run_a_notes_workload_under_the_daemon() {
    if !have("python3") || !have("node") {
        return;
    }
    let mut f = Fixture::new();
    f.install(&staged("node-notes", &f.dir.path().join("staged")));
    f.install(&python_package(&f));
    f.start_daemon();
    f.wait_state("node-notes", "ready", PATIENCE);
    f.wait_state("py-notes", "ready", PATIENCE);

    let push = |src: &str, d: &str, kind: &str, payload: &str| {
        f.push(src, d, kind, payload)["event_id"].as_i64().unwrap()
    };
    // Node: notes of one thread share a Work; an edit alone only queues.
    let a = push(
        "node-inbox",
        "n1",
        "node-note.posted",
        r#"{"thread":"t-1","text":"one"}"#,
    );
    let b = push(
        "node-inbox",
        "n2",
        "node-note.edited",
        r#"{"thread":"t-1","text":"two"}"#,
    );
    let c = push(
        "node-inbox",
        "n3",
        "node-note.posted",
        r#"{"thread":"t-2","text":"three"}"#,
    );
    // Python: grouped by thread too.
    let p = push("py-inbox", "p1", "pynote.posted", r#"{"thread":"x"}"#);
    let q = push("py-inbox", "p2", "pynote.posted", r#"{"thread":"x"}"#);
    for id in [a, b, c, p, q] {
        f.wait_until("routing", || routed(&f, id));
    }
    let keys = work_keys(&f);
    let has = |key: &str, ids: &[i64]| {
        keys.iter()
            .any(|(k, e)| k == key && ids.iter().all(|i| e.contains(i)))
    };
    assert!(has("thread:t-1", &[a, b]), "{keys:?}");
    assert!(has("thread:t-2", &[c]), "{keys:?}");
    assert!(has("thread:x", &[p, q]), "{keys:?}");

    // node-notes serves the other three in-transaction calls too.
    let t = f.json(&["timers", "add", "node-digest", "every 15m", "--json"]);
    let timer = f.wait_until("the timer to fire", || {
        let t = support::http::get(
            &f.state().join("run/conduit.sock"),
            &format!("/v1/timers/{}", t["timer_id"]),
        );
        t["last_fired_at_ms"].is_i64().then_some(t)
    });
    assert_eq!(
        timer["next_at_ms"].as_i64().unwrap() - timer["last_fired_at_ms"].as_i64().unwrap(),
        15 * 60 * 1000
    );
    let w = f.json(&["waits", "add", "node-mentions", "dora", "--json"]);
    let hit = push(
        "node-inbox",
        "n4",
        "node-note.posted",
        r#"{"thread":"t-3","text":"thanks @Dora!"}"#,
    );
    let wait = f.wait_until("the wait to be satisfied", || {
        let w = support::http::get(
            &f.state().join("run/conduit.sock"),
            &format!("/v1/waits/{}", w["wait_id"]),
        );
        (w["state"] == "satisfied").then_some(w)
    });
    assert_eq!(wait["satisfied_by_event_id"], hit);
    let em = f.json(&[
        "emissions",
        "add",
        "node-annotation",
        r#"{"text":"a plan #db"}"#,
        "--json",
    ]);
    let committed = f.wait_until("the emission to commit", || {
        let e = support::http::get(
            &f.state().join("run/conduit.sock"),
            &format!("/v1/emissions/{}", em["emission_id"]),
        );
        (e["state"] == "committed").then_some(e)
    });
    assert_eq!(committed["records"][0]["kind"], "annotation");
    assert_eq!(
        committed["records"][0]["body"]["commit_id"],
        em["commit_id"]
    );
    assert_eq!(committed["records"][0]["body"]["tags"][0], "db");

    for name in ["node-notes", "py-notes"] {
        let s = f.status(name);
        assert!(
            s["calls"]["work_kind.trigger"]["count"]
                .as_u64()
                .unwrap_or(0)
                >= 1,
            "{s:#}"
        );
    }
    let health = support::http::get(&f.state().join("run/conduit.sock"), "/v1/health");
    assert_eq!(health["host_loop"]["fallbacks"], 0, "{health:#}");

    // A handler's exception, in each SDK.
    handler_exception_is_not_retryable(&f, "py-notes", "fail", "{}");
    handler_exception_is_not_retryable(
        &f,
        "node-notes",
        "work_kind.trigger",
        r#"{"kind":"node-note","inputs":[null]}"#,
    );
    assert_eq!(f.stop_daemon(), Some(0), "{}", f.context());
}

// ---- `conduit ext new` ---------------------------------------------------------------------

fn ext_new(name: &str, lang: &str, dir: &Path) -> Run {
    conduit(&[
        "ext",
        "new",
        name,
        "--lang",
        lang,
        "--dir",
        dir.to_str().unwrap(),
    ])
}

#[test]
fn a_python_skeleton_passes_the_check_as_generated() {
    if !have("python3") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("greeter");
    ext_new("greeter", "python", &dir).expect_code(0);
    assert!(dir.join("README.md").is_file());
    assert!(dir.join("conduit_extension/__init__.py").is_file());
    passes_check(&dir);
    // -B: checking it wrote no bytecode into the package folder.
    assert!(!dir.join("conduit_extension/__pycache__").exists());
    own_tests_pass(&dir, "python3", &["-B", "-m", "unittest", "-v"], &[]);
    assert!(!dir.join("__pycache__").exists(), "the tests ran with -B");
}

#[test]
fn a_node_skeleton_passes_the_check_as_generated() {
    if !have("node") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("greeter");
    let run = conduit(&[
        "ext",
        "new",
        "greeter",
        "--lang",
        "node",
        "--dir",
        dir.to_str().unwrap(),
        "--json",
    ]);
    run.expect_code(0);
    let v = run.json();
    assert_eq!(v["lang"], "node");
    assert_eq!(v["package_dir"], dir.to_str().unwrap());
    assert!(
        dir.join("node_modules/conduit-extension/index.d.ts")
            .is_file()
    );
    passes_check(&dir);
    own_tests_pass(&dir, "node", &["--test"], &[]);
}

/// Builds the crate against the SDK of this checkout (offline, with the workspace's lock file
/// so the versions are the ones already downloaded) in a target folder of its own that later
/// runs reuse, stages it with its own `stage.sh`, and checks the staged folder.
#[test]
fn a_rust_skeleton_passes_the_check_once_staged() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("greeter");
    ext_new("greeter", "rust", &dir).expect_code(0);
    for f in ["Cargo.toml", "src/main.rs", "stage.sh", "README.md"] {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
    std::fs::copy(workspace_root().join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ext-new-rust-target");
    let out = Command::new("sh")
        .arg(dir.join("stage.sh"))
        .env("PROFILE", "dev")
        .env("CARGO_TARGET_DIR", &target)
        .env("CARGO_NET_OFFLINE", "true")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "stage.sh failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    passes_check(&dir.join("package"));
    own_tests_pass(
        &dir,
        "cargo",
        &["test", "--offline"],
        &[("CARGO_TARGET_DIR", &target)],
    );
}

#[test]
fn ext_new_refuses_a_bad_name_and_a_folder_in_use() {
    let tmp = tempfile::tempdir().unwrap();
    let run = ext_new("Bad_Name", "python", &tmp.path().join("x"));
    run.expect_code(2);
    assert!(run.stderr().contains("name"), "{}", run.context());
    assert!(!tmp.path().join("x").exists());
    std::fs::write(tmp.path().join("keep.txt"), "mine").unwrap();
    let run = ext_new("fine", "node", tmp.path());
    run.expect_code(2);
    assert!(run.stderr().contains("not empty"), "{}", run.context());
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("keep.txt")).unwrap(),
        "mine"
    );
}

// ---- what the SDKs cost (a benchmark, not a test: it only prints) --------------------------

/// One extension process driven over its pipes: spawn → `initialize` answered (cold start),
/// then sequential `echo` round trips, without and with `params._meta.remaining_ms`.
fn measure(argv: &[&str], cwd: &Path, rounds: usize) -> (f64, f64, f64) {
    use std::io::{BufRead, BufReader, Write};
    use std::time::Instant;
    let t0 = Instant::now();
    let mut child = Command::new(argv[0])
        .args(&argv[1..])
        .current_dir(cwd)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let mut ask = |stdin: &mut std::process::ChildStdin, text: &str| {
        stdin.write_all(text.as_bytes()).unwrap();
        stdin.flush().unwrap();
        line.clear();
        stdout.read_line(&mut line).unwrap();
        assert!(line.contains("result"), "{line}");
    };
    ask(
        &mut stdin,
        "{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{\"protocol_versions\":[1],\"host\":{\"name\":\"bench\",\"version\":\"0\"}}}\n",
    );
    let cold = t0.elapsed().as_secs_f64() * 1e3;
    let mut p50 = |meta: &str, base: usize| {
        let mut us: Vec<f64> = (0..rounds)
            .map(|i| {
                let t = Instant::now();
                ask(
                    &mut stdin,
                    &format!(
                        "{{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"echo\",\"params\":{{\"text\":\"hello\"{meta}}}}}\n",
                        base + i
                    ),
                );
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        us.sort_by(|a, b| a.partial_cmp(b).unwrap());
        us[us.len() / 2]
    };
    let plain = p50("", 1);
    let with_meta = p50(",\"_meta\":{\"remaining_ms\":30000}", 1 + rounds);
    drop(stdin);
    let _ = child.wait();
    (cold, plain, with_meta)
}

/// `cargo nextest run -p conduit-host --test sdks --run-ignored only -E 'test(/bench/)'
/// --no-capture` (docs/performance.md, "SDK echo and cold start").
#[test]
#[ignore = "a benchmark: prints numbers, asserts nothing about them"]
fn bench_sdk_echo_and_cold_start() {
    let tmp = tempfile::tempdir().unwrap();
    let rust = support::stage_rust_example("echo", tmp.path()).unwrap();
    let rounds = 2000;
    let cases: Vec<(&str, Vec<&str>, PathBuf)> = vec![
        ("rust (examples/echo)", vec!["./conduit-echo"], rust),
        (
            "python (examples/python-echo)",
            vec!["python3", "-B", "echo.py"],
            staged("python-echo", tmp.path()),
        ),
        (
            "node (examples/node-echo)",
            vec!["node", "echo.mjs"],
            staged("node-echo", tmp.path()),
        ),
    ];
    println!(
        "| extension | cold start (spawn → initialize answered) | echo p50 | echo p50 with `_meta.remaining_ms` |"
    );
    println!("|---|---|---|---|");
    for (name, argv, dir) in cases {
        let mut colds = Vec::new();
        let mut last = (0.0, 0.0);
        for _ in 0..5 {
            let (cold, plain, meta) = measure(&argv, &dir, rounds);
            colds.push(cold);
            last = (plain, meta);
        }
        colds.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "| {name} | {:.1} ms (median of 5) | {:.1} µs | {:.1} µs |",
            colds[2], last.0, last.1
        );
    }
}

/// An installed SDK package imports its vendored SDK at every start; `-B` keeps the interpreter
/// from writing bytecode into the installed folder, so a restart never finds a file that was
/// not installed. Three operator restarts, each a new process that answers.
#[test]
fn the_python_sdk_package_survives_three_restarts() {
    if !have("python3") {
        return;
    }
    let mut f = Fixture::new();
    f.install(&staged("python-echo", &f.dir.path().join("staged")));
    f.start_daemon();
    let mut pid = f.wait_state("python-echo", "ready", PATIENCE)["pid"].clone();
    for round in 1..=3 {
        let run = f.conduit(&["ext", "restart", "python-echo"]);
        assert_eq!(run.code(), Some(0), "{}{}", run.context(), f.context());
        let s = f.wait_for("python-echo", PATIENCE, |s| {
            s["state"] == "ready" && s["pid"].is_i64() && s["pid"] != pid
        });
        pid = s["pid"].clone();
        let run = f.conduit(&["ext", "call", "python-echo", "echo", r#"{"text":"again"}"#]);
        assert_eq!(
            run.code(),
            Some(0),
            "round {round}{}{}",
            run.context(),
            f.context()
        );
        assert_eq!(run.json()["text"], "again");
    }
    let installed = f.state().join("packages/python-echo");
    assert!(
        installed.join("conduit_extension/__init__.py").is_file(),
        "the installed package is not where this test looks{}",
        f.context()
    );
    let cached: Vec<_> = support::fixture::walk(&installed)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("__pycache__"))
        .collect();
    assert!(
        cached.is_empty(),
        "bytecode in the installed package: {cached:?}"
    );
    assert_eq!(f.stop_daemon(), Some(0), "{}", f.context());
}
