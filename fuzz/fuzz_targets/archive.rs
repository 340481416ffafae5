//! Fuzz target: unpacking a package archive (`host/src/packages/archive.rs`).
//!
//! Input: the archive. Input that starts with the gzip magic is used as it is (a `.tar.gz`, so
//! the gzip layer is fuzzed too); anything else is taken as tar bytes and gzipped first, so the
//! fuzzer can mutate tar headers without breaking a checksum on every try.
//!
//! Each run unpacks into `<sandbox>/outer/stage/dest` with a budget of 1 MiB and 64 entries,
//! then checks, whether the unpack succeeded or not:
//! - nothing panics;
//! - nothing was written outside `dest`: the sandbox holds exactly `outer/input.tar.gz`,
//!   `outer/stage` and `outer/stage/dest` besides what is under `dest`;
//! - under `dest` there are only folders and regular files: no symlink, device or fifo, no
//!   setuid, setgid or sticky bit, modes 0644 or 0755 only;
//! - the files' total size is within the budget;
//! - a package root, when one is returned, is `dest` or a folder directly in it, and holds the
//!   manifest.
#![no_main]

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use conduit_host::manifest::MANIFEST_FILE;
use conduit_host::packages::fuzzing::extract;
use libfuzzer_sys::fuzz_target;

const MAX_BYTES: u64 = 1 << 20;
const MAX_ENTRIES: u64 = 64;

/// Walks `dir`, checking every entry; returns the total size of its files.
fn walk(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let meta = fs::symlink_metadata(entry.path()).unwrap();
        let mode = meta.permissions().mode() & 0o7777;
        if meta.is_dir() {
            assert_eq!(
                mode,
                0o755,
                "folder {} has mode {mode:o}",
                entry.path().display()
            );
            total += walk(&entry.path());
        } else if meta.is_file() {
            assert!(
                mode == 0o644 || mode == 0o755,
                "file {} has mode {mode:o}",
                entry.path().display()
            );
            total += meta.len();
        } else {
            panic!("{} is {:?}", entry.path().display(), meta.file_type());
        }
    }
    total
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

fuzz_target!(|data: &[u8]| {
    let gz;
    let bytes = if data.starts_with(&[0x1f, 0x8b]) {
        data
    } else {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(data).unwrap();
        gz = enc.finish().unwrap();
        &gz[..]
    };
    let sandbox = tempfile::tempdir().unwrap();
    let outer = sandbox.path().join("outer");
    let stage = outer.join("stage");
    fs::create_dir_all(&stage).unwrap();
    let archive = outer.join("input.tar.gz");
    fs::write(&archive, bytes).unwrap();
    let dest = stage.join("dest");

    let result = extract(&archive, &dest, MAX_BYTES, MAX_ENTRIES);

    assert_eq!(names(sandbox.path()), ["outer"]);
    assert_eq!(names(&outer), ["input.tar.gz", "stage"]);
    let staged = names(&stage);
    assert!(
        staged.is_empty() || staged == ["dest"],
        "written beside dest: {staged:?}"
    );
    if dest.exists() {
        let total = walk(&dest);
        assert!(
            total <= MAX_BYTES,
            "{total} bytes unpacked, over the budget"
        );
    }
    if let Ok(root) = result {
        assert!(
            root == dest || root.parent() == Some(&dest),
            "package root {} is not dest or a folder in it",
            root.display()
        );
        assert!(
            fs::symlink_metadata(root.join(MANIFEST_FILE))
                .unwrap()
                .is_file()
        );
    }
});
