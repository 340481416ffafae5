//! The docs' claims that a reader acts on, checked against the tree and the real `conduit`
//! binary: the examples that README.md, examples/README.md and operations.md §2 list are the
//! ones `scripts/stage-examples.sh` stages; the state-directory tree of operations.md §1 is what
//! a daemon makes; `ext status --help` and operations.md §8 name every state that exits 1; the
//! time to `unresponsive` in operations.md §6 follows from the constants; and docs/perf-log/ is
//! indexed and docs/performance.md stays a reference.
//!
//! Not checked here: the figures themselves (the benchmarks print them) and prose.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use conduit_supervisor::State;
use support::fixture::{Fixture, walk};
use support::{PATIENCE, profile_dir, stage_rust_example, workspace_root};

fn read(rel: &str) -> String {
    let path = workspace_root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The text of `doc` from the heading line starting with `from` to the next heading of the same
/// level (or the end).
fn section<'a>(doc: &'a str, from: &str) -> &'a str {
    let start = doc
        .find(&format!("\n{from}"))
        .unwrap_or_else(|| panic!("no heading `{from}`"))
        + 1;
    let level = from.split(' ').next().unwrap();
    let rest = &doc[start + from.len()..];
    let end = rest
        .find(&format!("\n{level} "))
        .map_or(doc.len(), |i| start + from.len() + i + 1);
    &doc[start..end]
}

fn set<'a>(names: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
    names.into_iter().map(str::to_owned).collect()
}

/// Every folder under examples/ that is a package (it has a manifest).
fn example_packages() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for e in std::fs::read_dir(workspace_root().join("examples")).unwrap() {
        let p = e.unwrap().path();
        if p.join("conduit-extension.toml").is_file() {
            out.insert(p.file_name().unwrap().to_str().unwrap().to_owned());
        }
    }
    out
}

/// The names of an `ext list` table's `ready` rows in `text`.
fn listed_ready(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (name, version, state) = (w.next()?, w.next()?, w.next()?);
            let semver = version.split('.').count() == 3
                && version.split('.').all(|p| p.parse::<u32>().is_ok());
            (semver && state == "ready").then(|| name.to_owned())
        })
        .collect()
}

#[test]
fn the_examples_the_docs_list_are_the_examples_there_are_and_staged() {
    let examples = example_packages();
    assert!(examples.len() >= 2, "examples/ holds {examples:?}");

    // What `make run` and operations.md §2 install: everything the script stages.
    let out = tempfile::tempdir().unwrap();
    let profile = profile_dir();
    let run = Command::new(workspace_root().join("scripts/stage-examples.sh"))
        .arg(profile.file_name().unwrap())
        .arg(out.path())
        .env("CARGO_TARGET_DIR", profile.parent().unwrap())
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "stage-examples.sh failed (build the workspace first: `cargo build --workspace`):\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let staged: BTreeSet<String> = std::fs::read_dir(out.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_str().unwrap().to_owned())
        .collect();
    assert_eq!(staged, examples, "scripts/stage-examples.sh stages these");

    let readme = read("README.md");
    let row = readme
        .lines()
        .find(|l| l.starts_with("| `examples/` |"))
        .expect("README.md's table has a row for `examples/`");
    let cells: Vec<&str> = row.split('|').collect();
    let in_row = set(cells[2].split('`').skip(1).step_by(2));
    assert_eq!(
        in_row, examples,
        "README.md's `examples/` row names these (every backquoted word of its second cell)"
    );
    let transcript = section(&readme, "```text\nThe daemon runs");
    assert_eq!(
        listed_ready(transcript),
        examples,
        "README.md's `make run` transcript lists these in `ext list`"
    );

    let ex = read("examples/README.md");
    let in_table = set(ex
        .lines()
        .filter_map(|l| l.strip_prefix("| `")?.split_once("/` |").map(|(n, _)| n)));
    assert_eq!(in_table, examples, "examples/README.md's table lists these");

    let ops = read("docs/operations.md");
    let quick = section(&ops, "## 2. Quick start");
    let comment = quick
        .lines()
        .find(|l| l.starts_with("scripts/stage-examples.sh"))
        .and_then(|l| l.split_once('#'))
        .expect("operations.md §2 stages the examples with a comment naming them")
        .1;
    assert_eq!(
        set(comment.split(',').map(str::trim)),
        examples,
        "operations.md §2's stage-examples.sh comment names these"
    );
    let started = quick
        .split("started=")
        .nth(1)
        .and_then(|s| s.lines().next())
        .expect("operations.md §2 shows the daemon's `started=` line");
    assert_eq!(
        set(started.split_whitespace()),
        examples,
        "operations.md §2's `started=` line names these"
    );
    assert_eq!(
        listed_ready(quick),
        examples,
        "operations.md §2's `ext list` shows these"
    );
}

/// The paths operations.md §1's tree names, relative to the state directory, `<name>` and
/// `<hex>` as written; folders end in `/`.
fn documented_tree() -> BTreeSet<String> {
    let ops = read("docs/operations.md");
    let block = section(&ops, "### The state directory");
    let tree = block
        .split("```text\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("operations.md §1 draws the state directory in a ```text block");
    let mut out = BTreeSet::new();
    let mut parents: Vec<String> = Vec::new();
    for line in tree.lines().skip(1) {
        let Some(at) = line.find("├── ").or_else(|| line.find("└── ")) else {
            continue; // a description's second line
        };
        let depth = line[..at].chars().count() / 4;
        // The name is the first word (`conduit.db-wal, -shm` two); the description follows.
        let rest = line[at..].chars().skip(4).collect::<String>();
        let mut words = rest.split_whitespace();
        let mut entry = words.next().unwrap_or_default().to_owned();
        while entry.ends_with(',') {
            entry = format!("{entry} {}", words.next().unwrap_or_default());
        }
        parents.truncate(depth);
        // `conduit.db-wal, -shm`: the second name is the first with another suffix.
        let mut names: Vec<String> = Vec::new();
        for part in entry.split(", ") {
            match part.strip_prefix('-') {
                Some(suffix) => {
                    let first = &names[0];
                    names.push(format!("{}-{suffix}", &first[..first.rfind('-').unwrap()]));
                }
                None => names.push(part.to_owned()),
            }
        }
        let base = if depth == 0 {
            String::new()
        } else {
            parents[depth - 1].clone()
        };
        for name in &names {
            let full = format!("{base}{name}");
            // Every folder on the way (`logs/<name>.log` implies `logs/`).
            for (i, _) in full.match_indices('/') {
                out.insert(full[..=i].to_owned());
            }
            out.insert(full);
        }
        if names[0].ends_with('/') {
            parents.push(format!("{base}{}", names[0]));
        }
    }
    out
}

/// The paths of a real state directory in the same notation: `name` becomes `<name>`, a digest
/// `<hex>`; the inside of a package's, an extension's own and a staging folder is not listed.
fn real_tree(state: &Path, name: &str) -> BTreeSet<String> {
    let opaque = |rel: &str| {
        [
            "packages/<name>/",
            "packages/<name>.previous/",
            "data/<name>/",
            "run/tmp/<name>/",
            "tmp/",
        ]
        .iter()
        .any(|o| rel.starts_with(o) && rel != *o)
    };
    let mut out = BTreeSet::new();
    for p in walk(state) {
        let rel = p.strip_prefix(state).unwrap();
        let mut parts: Vec<String> = Vec::new();
        for c in rel.components() {
            let c = c.as_os_str().to_str().unwrap();
            let generic = if c == name {
                "<name>".to_owned()
            } else if let Some(rest) = c.strip_prefix(&format!("{name}.")) {
                format!("<name>.{rest}")
            } else if c.len() == 64 && c.bytes().all(|b| b.is_ascii_hexdigit()) {
                "<hex>".to_owned()
            } else {
                c.to_owned()
            };
            parts.push(generic);
        }
        let mut rel = parts.join("/");
        if p.is_dir() && !p.is_symlink() {
            rel.push('/');
        }
        if !opaque(&rel) {
            out.insert(rel);
        }
    }
    out
}

#[test]
fn the_state_directory_tree_in_operations_md_is_what_a_daemon_makes() {
    let documented = documented_tree();
    let mut f = Fixture::new();
    let pkg = stage_rust_example("notes", &f.dir.path().join("staged"))
        .expect("examples/notes is a package");
    // An older version first, so the real one is an upgrade and `notes.previous/` is kept.
    let old = f.dir.path().join("old/notes");
    std::fs::create_dir_all(&old).unwrap();
    for entry in std::fs::read_dir(&pkg).unwrap() {
        let e = entry.unwrap();
        std::fs::copy(e.path(), old.join(e.file_name())).unwrap();
    }
    let manifest = old.join("conduit-extension.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(
        &manifest,
        text.replacen("version = \"0.1.0\"", "version = \"0.0.1\"", 1),
    )
    .unwrap();
    f.install(&old);
    f.install(&pkg);
    f.conduit(&["ext", "set", "notes", "limits.memory=256MiB"])
        .expect_code(0);
    f.start_daemon();
    f.wait_state("notes", "ready", PATIENCE);
    // An artifact, so that `artifacts/sha256/<hex>` exists.
    f.conduit(&["ext", "call", "notes", "export", "{}"])
        .expect_code(0);

    let real = real_tree(&f.state(), "notes");
    let undocumented: Vec<&String> = real.difference(&documented).collect();
    let missing: Vec<&String> = documented.difference(&real).collect();
    assert!(
        undocumented.is_empty() && missing.is_empty(),
        "operations.md §1's state directory tree differs from a real one (a daemon running one \
         upgraded package with a setting and an artifact):\n  in the state directory, not in \
         the doc: {undocumented:?}\n  in the doc, not in the state directory: {missing:?}\n  \
         documented: {documented:?}{}",
        f.context()
    );
}

#[test]
fn ext_status_help_and_operations_md_name_every_state_and_condition_it_exits_on() {
    let f = Fixture::new();
    let help = f.conduit(&["ext", "status", "--help"]);
    help.expect_code(0);
    let help = help.stdout();
    let codes = help
        .split("Exit codes:")
        .nth(1)
        .expect("`ext status --help` has an `Exit codes:` paragraph");
    let ops = read("docs/operations.md");
    let row = section(&ops, "## 8. Exit codes")
        .lines()
        .find(|l| l.starts_with("| `ext status [NAME]` |"))
        .expect("operations.md §8 has a row for `ext status [NAME]`");
    let names = State::ALL
        .iter()
        .map(|s| s.as_str())
        .chain(["degraded", "unresponsive"]);
    for name in names {
        assert!(
            codes.contains(name),
            "`ext status --help` does not say how `{name}` exits:\n{codes}"
        );
        assert!(
            row.contains(name),
            "operations.md §8's `ext status` row does not say how `{name}` exits:\n{row}"
        );
    }
}

#[test]
fn the_time_to_unresponsive_in_operations_md_follows_from_the_constants() {
    use conduit_host::core::health::{DEFAULT_UNRESPONSIVE_AFTER, probe_interval_ms};
    let n = DEFAULT_UNRESPONSIVE_AFTER;
    let intervals: Vec<i64> = (1..n).map(probe_interval_ms).collect();
    let deadline_ms = conduit_protocol::IN_TRANSACTION_DEADLINE.as_millis() as i64;
    let pass_ms = conduit_host::daemon::POLL_INTERVAL.as_millis() as i64;
    // The missed call and every probe wait out their deadline; the probes come their interval
    // after the failure before them; each probe, and the restart, waits for the next pass.
    let least = i64::from(n) * deadline_ms + intervals.iter().sum::<i64>();
    let most = least + i64::from(n) * pass_ms;
    let ops = read("docs/operations.md");
    let text = section(&ops, "### Degraded and unresponsive extensions").replace('\n', " ");
    let claim = format!(
        "between {} and {} s after its first missed call",
        least / 1000,
        most / 1000
    );
    assert!(
        text.contains(&claim),
        "operations.md §6 should say \"{claim}\" (from {n} failures, {deadline_ms} ms deadlines, \
         probes after {intervals:?} ms, passes every {pass_ms} ms)"
    );
    let sum = intervals
        .iter()
        .map(|i| (i / 1000).to_string())
        .collect::<Vec<_>>()
        .join(" + ");
    let probes = format!("{sum} = {} s", intervals.iter().sum::<i64>() / 1000);
    assert!(
        text.contains(&probes),
        "operations.md §6 should give the probes' intervals as \"{probes}\""
    );
}

#[test]
fn every_perf_log_entry_is_indexed_and_performance_md_stays_a_reference() {
    let dir = workspace_root().join("docs/perf-log");
    let index = read("docs/perf-log/README.md");
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap() != "README.md")
        .collect();
    entries.sort();
    assert!(!entries.is_empty(), "docs/perf-log/ holds no entry");
    for p in &entries {
        let name = p.file_name().unwrap().to_str().unwrap();
        assert!(
            index.contains(&format!("]({name})")),
            "docs/perf-log/{name} is not listed in docs/perf-log/README.md: add its line at the \
             top of its date"
        );
    }
    // Listed newest first, and only files that are there.
    let mut dates = Vec::new();
    for line in index.lines().filter(|l| l.contains("](20")) {
        let target = line.split("](").nth(1).unwrap().split(')').next().unwrap();
        assert!(
            dir.join(target).is_file(),
            "docs/perf-log/README.md lists {target}, which is not in the folder"
        );
        dates.push(target[..10].to_owned());
    }
    let mut newest_first = dates.clone();
    newest_first.sort_by(|a, b| b.cmp(a));
    assert_eq!(
        dates, newest_first,
        "docs/perf-log/README.md lists its entries newest first"
    );

    let perf = read("docs/performance.md");
    let lines = perf.lines().count();
    assert!(
        lines < 400,
        "docs/performance.md has {lines} lines: it is the reference of where each figure stands; \
         put runs in docs/perf-log/ and keep it under 400"
    );
    for doc in std::fs::read_dir(workspace_root().join("docs")).unwrap() {
        let p = doc.unwrap().path();
        if p.extension().is_some_and(|e| e == "md") {
            let text = std::fs::read_to_string(&p).unwrap();
            for h in text.lines().filter(|l| l.starts_with('#')) {
                let title = h.trim_start_matches('#').trim_start();
                assert!(
                    !title.starts_with("Since "),
                    "{}: heading `{h}`: a doc says how things are now; a dated run goes to \
                     docs/perf-log/",
                    p.display()
                );
            }
        }
    }
}
