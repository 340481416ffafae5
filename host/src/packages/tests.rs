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

/// A development install copies nothing, is not checked, never replaces (or is replaced by) an
/// install from the store or a dev install of another folder, and its remove takes the record
/// alone.
#[test]
fn a_dev_install_points_at_the_folder_and_never_touches_it() {
    let tmp = tempfile::tempdir().unwrap();
    let state = StateDir::open(tmp.path().join("state")).unwrap();
    let src = tmp.path().join("src");
    write_package(&src, "1.0.0");
    let before = snapshot(&src);
    let rec = install_dev(&state, &src).unwrap();
    assert!(rec.dev && rec.files.is_empty() && rec.enabled);
    assert_eq!(rec.source, src.canonicalize().unwrap());
    assert_eq!(files_dir(&state, &rec), rec.source);
    assert!(!package_dir(&state, "notes").exists(), "nothing copied");
    assert_eq!(
        verify(&state, "notes").unwrap(),
        Checked::DevInstall {
            source: rec.source.clone()
        }
    );
    // Edited on purpose: still not a tamper.
    fs::write(src.join("bin/run"), "#!/bin/sh\n# edited\n").unwrap();
    assert!(matches!(
        verify_read_only(&state, "notes"),
        Ok(Checked::DevInstall { .. })
    ));
    // Again from the same folder: a later install time (the daemon restarts it).
    let again = install_dev(&state, &src).unwrap();
    assert!(again.installed_at_ms > rec.installed_at_ms);
    // Another folder, or an install from the store, is refused while it is there.
    let other = tmp.path().join("other");
    write_package(&other, "1.0.0");
    let err = install_dev(&state, &other).unwrap_err().to_string();
    assert!(err.contains("development install from"), "{err}");
    let err = install(&state, &other, &InstallOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("is a development install"), "{err}");
    // Removed: the record goes, the author's folder stays as it is.
    let after_edit = snapshot(&src);
    assert_ne!(after_edit, before);
    remove(&state, "notes").unwrap();
    assert!(matches!(
        get(&state, "notes"),
        Err(PackageError::NotInstalled { .. })
    ));
    assert_eq!(snapshot(&src), after_edit);
    // An install from the store is not replaced by a dev install.
    install(&state, &other, &InstallOptions::default()).unwrap();
    let err = install_dev(&state, &src).unwrap_err().to_string();
    assert!(err.contains("installed from the package store"), "{err}");
    assert!(!get(&state, "notes").unwrap().dev);
}
