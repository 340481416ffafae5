//! Failures injected in the middle of an install's swap: the state directory must come out as
//! it went in. (The public-API tests live in `host/tests/packages.rs`; these need the test hook
//! in `install.rs`, which only unit tests can arm.)

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::install::FAIL_AT;
use super::*;
use crate::state_dir::StateDir;

fn write_package(root: &Path, version: &str) {
    fs::create_dir_all(root.join("bin")).unwrap();
    fs::write(
        root.join("conduit-extension.toml"),
        format!(
            "name = \"notes\"\nversion = \"{version}\"\nprotocol = 1\ncommand = [\"./bin/run\"]\n"
        ),
    )
    .unwrap();
    fs::write(root.join("bin/run"), format!("#!/bin/sh\n# {version}\n")).unwrap();
    fs::set_permissions(root.join("bin/run"), fs::Permissions::from_mode(0o755)).unwrap();
}

fn snapshot(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_owned()];
    while let Some(dir) = todo.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            let meta = fs::symlink_metadata(&path).unwrap();
            let what = if meta.is_dir() {
                todo.push(path.clone());
                "dir".to_owned()
            } else {
                format!(
                    "{:o} {}",
                    meta.permissions().mode(),
                    hex::encode(Sha256::digest(fs::read(&path).unwrap()))
                )
            };
            out.insert(rel, what);
        }
    }
    out
}

/// Arms the hook for the duration of `f`, on this thread only.
fn failing_at<T>(step: &'static str, f: impl FnOnce() -> T) -> T {
    FAIL_AT.with(|c| c.set(Some(step)));
    let out = f();
    FAIL_AT.with(|c| c.set(None));
    out
}

#[test]
fn a_registry_write_failure_rolls_back_a_fresh_install() {
    let tmp = tempfile::tempdir().unwrap();
    let state = StateDir::open(tmp.path().join("state")).unwrap();
    let src = tmp.path().join("src");
    write_package(&src, "0.1.0");

    let before = snapshot(state.path());
    let err = failing_at("before-registry-save", || {
        install(&state, &src, &InstallOptions::default())
    })
    .unwrap_err();
    assert!(err.to_string().contains("injected failure"), "{err}");
    assert_eq!(before, snapshot(state.path()));
    assert!(list(&state).unwrap().is_empty());
}

#[test]
fn a_registry_write_failure_rolls_back_an_upgrade() {
    let tmp = tempfile::tempdir().unwrap();
    let state = StateDir::open(tmp.path().join("state")).unwrap();
    let v1 = tmp.path().join("v1");
    write_package(&v1, "0.1.0");
    install(&state, &v1, &InstallOptions::default()).unwrap();
    let v2 = tmp.path().join("v2");
    write_package(&v2, "0.2.0");

    let before = snapshot(state.path());
    let err = failing_at("before-registry-save", || {
        install(&state, &v2, &InstallOptions::default())
    })
    .unwrap_err();
    assert!(
        matches!(err, InstallError::Package(PackageError::Io { .. })),
        "{err:?}"
    );
    assert_eq!(before, snapshot(state.path()));
    assert_eq!(get(&state, "notes").unwrap().version, "0.1.0");
    verify(&state, "notes").unwrap();

    // With the fault gone the same install goes through.
    install(&state, &v2, &InstallOptions::default()).unwrap();
    assert_eq!(get(&state, "notes").unwrap().version, "0.2.0");
}

#[test]
fn a_record_keeps_the_lifecycle_and_a_handshake_counts_only_for_its_install() {
    use conduit_protocol::Capabilities;
    use conduit_supervisor::StartMode;
    let tmp = tempfile::tempdir().unwrap();
    let state = StateDir::open(tmp.path().join("state")).unwrap();
    let src = tmp.path().join("src");
    write_package(&src, "0.1.0");
    let manifest = src.join("conduit-extension.toml");
    let mut text = fs::read_to_string(&manifest).unwrap();
    text.push_str("\n[capabilities]\nrecurrences = [\"tick\"]\n\n[lifecycle]\nstart = \"on-demand\"\nidle_stop_after = \"90s\"\n");
    fs::write(&manifest, text).unwrap();
    let rec = install(&state, &src, &InstallOptions::default())
        .unwrap()
        .record;
    let read = get(&state, "notes").unwrap();
    assert_eq!(read.manifest.lifecycle, rec.manifest.lifecycle);
    assert_eq!(read.manifest.lifecycle.start, StartMode::OnDemand);
    assert_eq!(
        read.manifest.lifecycle.idle_stop_after,
        Some(std::time::Duration::from_secs(90))
    );
    // No handshake kept yet: the manifest's capabilities stand in.
    assert_eq!(
        handshakes::capabilities(&state, &read).recurrences,
        ["tick"]
    );
    let mut said = Capabilities::default();
    said.recurrences = vec!["tock".into()];
    let mut kept = handshakes::HandshakeRecord {
        version: read.version.clone(),
        installed_at_ms: read.installed_at_ms,
        protocol_version: 1,
        capabilities: said,
        at_ms: 0,
        by: "install".into(),
    };
    handshakes::record(&state, "notes", &kept).unwrap();
    assert_eq!(
        handshakes::capabilities(&state, &read).recurrences,
        ["tock"]
    );
    // A handshake of another install of it does not count.
    kept.installed_at_ms += 1;
    handshakes::record(&state, "notes", &kept).unwrap();
    assert_eq!(
        handshakes::capabilities(&state, &read).recurrences,
        ["tick"]
    );
    remove(&state, "notes").unwrap();
    assert!(handshakes::recorded(&state, "notes").is_none());
}
