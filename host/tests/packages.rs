//! The package store through its public API: installs from folders and real `.tar.gz` archives
//! (hostile ones included, written header by header where the `tar` crate refuses to build
//! them), upgrades, tamper detection, enable/disable and remove.
//!
//! Every refused install is checked to leave the state directory exactly as it was: a recursive
//! listing with each file's sha256 and mode, taken before and after.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use conduit_host::packages::{
    self, FileChange, InstallChange, InstallError, InstallOptions, PackageError, UnsafeEntry,
    VerifyError,
};
use conduit_host::state_dir::StateDir;
use flate2::Compression;
use flate2::write::GzEncoder;
use sha2::{Digest, Sha256};

// ---------------------------------------------------------------------------------------------
// Fixtures

struct Fixture {
    tmp: tempfile::TempDir,
    state: StateDir,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let state = StateDir::open(tmp.path().join("state")).unwrap();
    Fixture { tmp, state }
}

impl Fixture {
    /// A package folder `src/<dir>` with a manifest, an executable and a data file.
    fn folder(&self, dir: &str, name: &str, version: &str) -> PathBuf {
        let root = self.tmp.path().join("src").join(dir);
        write_package(&root, name, version);
        root
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join(rel)
    }

    fn install(&self, source: &Path) -> Result<packages::InstallOutcome, InstallError> {
        packages::install(&self.state, source, &InstallOptions::default())
    }

    fn snapshot(&self) -> BTreeMap<String, String> {
        snapshot(self.state.path())
    }

    /// Asserts that `source` is refused, that the state directory did not change, and returns
    /// the error.
    fn refused(&self, source: &Path, opts: &InstallOptions) -> InstallError {
        let before = self.snapshot();
        let err = packages::install(&self.state, source, opts)
            .expect_err("the install should be refused");
        // Shown with `--nocapture`, and with any failure: the message is half of what is tested.
        eprintln!("refused: {err}");
        let after = self.snapshot();
        assert_eq!(
            before, after,
            "a refused install changed the state directory ({err})"
        );
        err
    }
}

fn manifest(name: &str, version: &str) -> String {
    format!(
        "name = \"{name}\"\nversion = \"{version}\"\nprotocol = 1\ncommand = [\"./bin/run\"]\ndescription = \"a test package\"\n"
    )
}

fn write_package(root: &Path, name: &str, version: &str) {
    fs::create_dir_all(root.join("bin")).unwrap();
    fs::write(root.join("conduit-extension.toml"), manifest(name, version)).unwrap();
    fs::write(root.join("bin/run"), "#!/bin/sh\nexec cat\n").unwrap();
    fs::set_permissions(root.join("bin/run"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(root.join("data.txt"), format!("data of {name} {version}\n")).unwrap();
}

/// Every path under `root` with what it is: `dir MODE`, `file MODE SHA256` or `link TARGET`.
fn snapshot(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_owned()];
    while let Some(dir) = todo.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            let meta = fs::symlink_metadata(&path).unwrap();
            let mode = meta.permissions().mode() & 0o7777;
            let what = if meta.is_dir() {
                todo.push(path.clone());
                format!("dir {mode:o}")
            } else if meta.is_symlink() {
                format!("link {}", fs::read_link(&path).unwrap().display())
            } else {
                format!(
                    "file {mode:o} {}",
                    hex::encode(Sha256::digest(fs::read(&path).unwrap()))
                )
            };
            out.insert(rel, what);
        }
    }
    out
}

/// How one archive entry is written.
enum Entry<'a> {
    File(&'a str, &'a [u8], u32),
    Dir(&'a str),
    Symlink(&'a str, &'a str),
    Hardlink(&'a str, &'a str),
    Fifo(&'a str),
    CharDevice(&'a str),
    /// A header whose name bytes are written as given, bypassing the `tar` crate's checks.
    RawFile(&'a [u8], &'a [u8]),
    /// A regular-file header declaring `size` bytes, followed by none.
    LyingSize(&'a str, u64),
    /// A GNU long-name header carrying a name of `len` bytes, then a small file.
    LongName(usize),
}

/// A `.tar.gz` of `entries` at `path`.
fn targz(path: &Path, entries: &[Entry<'_>]) -> PathBuf {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let gz = GzEncoder::new(fs::File::create(path).unwrap(), Compression::fast());
    let mut b = tar::Builder::new(gz);
    for entry in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(0);
        match entry {
            Entry::File(name, data, mode) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(data.len() as u64);
                h.set_mode(*mode);
                b.append_data(&mut h, name, *data).unwrap();
            }
            Entry::Dir(name) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_size(0);
                h.set_mode(0o755);
                b.append_data(&mut h, name, &[][..]).unwrap();
            }
            Entry::Symlink(name, target) | Entry::Hardlink(name, target) => {
                let ty = if matches!(entry, Entry::Symlink(..)) {
                    tar::EntryType::Symlink
                } else {
                    tar::EntryType::Link
                };
                h.set_entry_type(ty);
                h.set_size(0);
                h.set_mode(0o777);
                b.append_link(&mut h, name, target).unwrap();
            }
            Entry::Fifo(name) | Entry::CharDevice(name) => {
                let ty = if matches!(entry, Entry::Fifo(..)) {
                    tar::EntryType::Fifo
                } else {
                    tar::EntryType::Char
                };
                h.set_entry_type(ty);
                h.set_size(0);
                h.set_mode(0o644);
                b.append_data(&mut h, name, &[][..]).unwrap();
            }
            Entry::RawFile(name, data) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                let slot = &mut h.as_old_mut().name;
                slot.fill(0);
                slot[..name.len()].copy_from_slice(name);
                h.set_cksum();
                b.append(&h, *data).unwrap();
            }
            Entry::LyingSize(name, size) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_path(name).unwrap();
                h.set_size(*size);
                h.set_mode(0o644);
                h.set_cksum();
                // The header alone, no data: the installer must refuse on the header.
                b.get_mut().write_all(h.as_bytes()).unwrap();
            }
            Entry::LongName(len) => {
                h.set_entry_type(tar::EntryType::GNULongName);
                h.set_path("././@LongLink").unwrap();
                h.set_size(*len as u64);
                h.set_mode(0o644);
                h.set_cksum();
                // Many short components, so that a name of ordinary length also fits the file
                // system's limit on one component.
                let mut name = "abcdefghi/".repeat(len / 10 + 1).into_bytes();
                name.truncate(*len);
                *name.last_mut().unwrap() = b'z';
                b.append(&h, &name[..]).unwrap();
                let mut f = tar::Header::new_gnu();
                f.set_entry_type(tar::EntryType::Regular);
                f.set_path("short").unwrap();
                f.set_size(1);
                f.set_mode(0o644);
                f.set_cksum();
                b.append(&f, &b"x"[..]).unwrap();
            }
        }
    }
    b.into_inner().unwrap().finish().unwrap();
    path.to_owned()
}

/// The entries of a good package, under `prefix` (`""` or `"pkg/"`).
fn good_entries<'a>(prefix: &str, manifest: &'a str, names: &'a mut Vec<String>) -> Vec<Entry<'a>> {
    names.clear();
    for n in ["conduit-extension.toml", "bin/run", "data.txt"] {
        names.push(format!("{prefix}{n}"));
    }
    vec![
        Entry::File(&names[0], manifest.as_bytes(), 0o644),
        Entry::File(&names[1], b"#!/bin/sh\nexec cat\n", 0o755),
        Entry::File(&names[2], b"data\n", 0o644),
    ]
}

fn installed(f: &Fixture, name: &str) -> PathBuf {
    packages::package_dir(&f.state, name)
}

// ---------------------------------------------------------------------------------------------
// Installing

#[test]
fn install_from_a_folder_records_every_file() {
    let f = fixture();
    let src = f.folder("notes", "notes", "0.1.0");
    let out = f.install(&src).unwrap();
    assert_eq!(out.change, InstallChange::Installed);
    assert_eq!(out.to_string(), "installed notes 0.1.0");

    let rec = &out.record;
    assert_eq!(
        (rec.name.as_str(), rec.version.as_str(), rec.enabled),
        ("notes", "0.1.0", true)
    );
    assert_eq!(rec.source, src);
    assert_eq!(rec.manifest.command, ["./bin/run"]);
    assert!(rec.installed_at_ms > 1_600_000_000_000);
    assert_eq!(
        rec.files.keys().collect::<Vec<_>>(),
        ["bin/run", "conduit-extension.toml", "data.txt"]
    );
    let run = &rec.files["bin/run"];
    assert!(run.executable);
    assert_eq!(run.size, "#!/bin/sh\nexec cat\n".len() as u64);
    assert_eq!(
        run.sha256,
        hex::encode(Sha256::digest(b"#!/bin/sh\nexec cat\n"))
    );
    assert!(!rec.files["data.txt"].executable);

    let dir = installed(&f, "notes");
    assert_eq!(
        fs::read_to_string(dir.join("data.txt")).unwrap(),
        "data of notes 0.1.0\n"
    );
    assert_eq!(
        fs::metadata(dir.join("bin/run"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        // Installed read-only: the source's mode without its write bits.
        0o555
    );
    assert_eq!(
        fs::metadata(dir.join("data.txt"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o444
    );

    assert_eq!(packages::get(&f.state, "notes").unwrap(), *rec);
    assert_eq!(packages::list(&f.state).unwrap(), std::slice::from_ref(rec));
    packages::verify(&f.state, "notes").unwrap();
    assert_eq!(
        fs::read_dir(f.state.tmp_dir()).unwrap().count(),
        0,
        "staging was left behind"
    );
}

#[test]
fn the_registry_is_json_with_the_documented_fields() {
    let f = fixture();
    f.install(&f.folder("notes", "notes", "0.1.0")).unwrap();
    let text = fs::read_to_string(f.state.packages_dir().join(packages::REGISTRY_FILE)).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json, serde_json::json!({"format": 2}));
    let text = fs::read_to_string(record_file(&f, "notes")).unwrap();
    let rec: serde_json::Value = serde_json::from_str(&text).unwrap();
    for key in [
        "name",
        "version",
        "installed_at_ms",
        "enabled",
        "source",
        "manifest",
        "files",
    ] {
        assert!(!rec[key].is_null(), "record lacks `{key}`: {rec}");
    }
    assert_eq!(rec["manifest"]["protocol"], serde_json::json!([1]));
    assert_eq!(rec["files"]["bin/run"]["executable"], true);
}

fn record_file(f: &Fixture, name: &str) -> PathBuf {
    f.state
        .packages_dir()
        .join(packages::RECORDS_DIR)
        .join(format!("{name}.json"))
}

/// Inode and modification time: a file replaced or rewritten has other ones.
fn identity(path: &Path) -> (u64, i64, i64) {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(path).unwrap();
    (m.ino(), m.mtime(), m.mtime_nsec())
}

#[test]
fn a_change_writes_only_the_changed_package_s_record() {
    let f = fixture();
    f.install(&f.folder("a", "alpha", "0.1.0")).unwrap();
    f.install(&f.folder("b", "beta", "0.1.0")).unwrap();
    let alpha = identity(&record_file(&f, "alpha"));
    let registry = identity(&f.state.packages_dir().join(packages::REGISTRY_FILE));
    let beta = identity(&record_file(&f, "beta"));

    f.install(&f.folder("c", "gamma", "0.1.0")).unwrap();
    packages::set_enabled(&f.state, "beta", false).unwrap();
    assert_eq!(
        identity(&record_file(&f, "alpha")),
        alpha,
        "alpha's record was rewritten"
    );
    assert_eq!(
        identity(&f.state.packages_dir().join(packages::REGISTRY_FILE)),
        registry,
        "registry.json was rewritten"
    );
    assert_ne!(
        identity(&record_file(&f, "beta")),
        beta,
        "beta's change was not written"
    );

    packages::remove(&f.state, "gamma").unwrap();
    assert!(!record_file(&f, "gamma").exists());
    let names: Vec<String> = packages::list(&f.state)
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, ["alpha", "beta"]);
    assert!(!packages::get(&f.state, "beta").unwrap().enabled);
}

#[test]
fn a_single_file_registry_is_read_and_rewritten_one_file_per_package_on_the_next_change() {
    let f = fixture();
    f.install(&f.folder("a", "alpha", "0.1.0")).unwrap();
    f.install(&f.folder("b", "beta", "0.1.0")).unwrap();
    let before = packages::list(&f.state).unwrap();
    // The store as format 1 wrote it: every record inside registry.json, no record files.
    let mut all = serde_json::Map::new();
    for rec in &before {
        let text = fs::read_to_string(record_file(&f, &rec.name)).unwrap();
        all.insert(rec.name.clone(), serde_json::from_str(&text).unwrap());
    }
    fs::remove_dir_all(f.state.packages_dir().join(packages::RECORDS_DIR)).unwrap();
    fs::write(
        f.state.packages_dir().join(packages::REGISTRY_FILE),
        serde_json::to_string_pretty(&serde_json::json!({"format": 1, "packages": all})).unwrap(),
    )
    .unwrap();
    assert_eq!(packages::list(&f.state).unwrap(), before);
    assert_eq!(packages::get(&f.state, "beta").unwrap(), before[1]);
    packages::verify(&f.state, "alpha").unwrap();

    // The first change rewrites the store in format 2 and loses nothing.
    assert!(packages::set_enabled(&f.state, "alpha", false).unwrap());
    let text = fs::read_to_string(f.state.packages_dir().join(packages::REGISTRY_FILE)).unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&text).unwrap(),
        serde_json::json!({"format": 2})
    );
    assert!(record_file(&f, "alpha").is_file() && record_file(&f, "beta").is_file());
    let after = packages::list(&f.state).unwrap();
    assert_eq!(after.len(), 2);
    assert!(!after[0].enabled);
    assert_eq!(after[1], before[1]);
}

#[test]
fn a_damaged_record_is_reported_with_what_to_do() {
    let f = fixture();
    f.install(&f.folder("notes", "notes", "0.1.0")).unwrap();
    fs::write(record_file(&f, "notes"), "{ not json").unwrap();
    let err = packages::list(&f.state).unwrap_err();
    assert!(
        matches!(&err, PackageError::Corrupt { path, .. } if path.ends_with("notes.json")),
        "{err:?}"
    );
    assert!(err.to_string().contains("reinstall"), "{err}");
    let err = packages::verify(&f.state, "notes").unwrap_err();
    assert!(err.to_string().contains("damaged"), "{err}");
}

#[test]
fn install_from_an_archive_with_the_package_at_the_top() {
    let f = fixture();
    let m = manifest("notes", "0.1.0");
    let mut names = Vec::new();
    let mut entries = vec![Entry::Dir("./"), Entry::Dir("./bin")];
    entries.extend(good_entries("./", &m, &mut names));
    let archive = targz(&f.path("notes.tar.gz"), &entries);
    let out = f.install(&archive).unwrap();
    assert_eq!(out.change, InstallChange::Installed);
    assert_eq!(out.record.source, archive);
    assert!(out.record.files["bin/run"].executable);
    assert_eq!(
        fs::read_to_string(installed(&f, "notes").join("data.txt")).unwrap(),
        "data\n"
    );
    packages::verify(&f.state, "notes").unwrap();
}

#[test]
fn install_from_an_archive_with_a_single_top_folder() {
    let f = fixture();
    let m = manifest("notes", "0.1.0");
    let mut names = Vec::new();
    let archive = targz(
        &f.path("notes-0.1.0.tgz"),
        &good_entries("notes-0.1.0/", &m, &mut names),
    );
    let out = f.install(&archive).unwrap();
    assert_eq!(out.record.files.len(), 3);
    assert!(
        installed(&f, "notes")
            .join("conduit-extension.toml")
            .is_file()
    );
    assert!(!installed(&f, "notes").join("notes-0.1.0").exists());
}

#[test]
fn links_to_files_inside_are_installed_as_copies() {
    let f = fixture();
    let m = manifest("notes", "0.1.0");
    let mut names = Vec::new();
    let mut entries = good_entries("pkg/", &m, &mut names);
    entries.push(Entry::Symlink("pkg/bin/run-link", "run"));
    entries.push(Entry::Symlink("pkg/up", "bin/../data.txt"));
    entries.push(Entry::Hardlink("pkg/data-hard", "pkg/data.txt"));
    // A link to a link to a file.
    entries.push(Entry::Symlink("pkg/chain", "up"));
    let archive = targz(&f.path("links.tar.gz"), &entries);
    let rec = f.install(&archive).unwrap().record;
    let dir = installed(&f, "notes");
    for (path, from) in [
        ("bin/run-link", "bin/run"),
        ("up", "data.txt"),
        ("data-hard", "data.txt"),
        ("chain", "data.txt"),
    ] {
        let meta = fs::symlink_metadata(dir.join(path)).unwrap();
        assert!(meta.is_file(), "{path} should be a regular file");
        assert_eq!(rec.files[path], rec.files[from], "{path}");
    }
    packages::verify(&f.state, "notes").unwrap();

    // The same from a folder.
    let src = f.folder("linked", "linked", "0.1.0");
    symlink("data.txt", src.join("alias")).unwrap();
    symlink("../data.txt", src.join("bin/alias")).unwrap();
    let rec = f.install(&src).unwrap().record;
    assert_eq!(rec.files["alias"], rec.files["data.txt"]);
    assert_eq!(rec.files["bin/alias"], rec.files["data.txt"]);
    assert!(
        fs::symlink_metadata(installed(&f, "linked").join("alias"))
            .unwrap()
            .is_file()
    );
}

// ---------------------------------------------------------------------------------------------
// Upgrade, reinstall, downgrade

#[test]
fn reinstall_keeps_the_enabled_flag_and_replaces_the_files() {
    let f = fixture();
    let src = f.folder("notes", "notes", "0.1.0");
    f.install(&src).unwrap();
    assert!(packages::set_enabled(&f.state, "notes", false).unwrap());
    fs::write(src.join("data.txt"), "edited\n").unwrap();
    fs::write(src.join("new.txt"), "new\n").unwrap();

    // Other content under the same version is refused without `force`, naming what changed.
    let err = f.refused(&src, &InstallOptions::default());
    assert!(
        matches!(&err, InstallError::Changed { changes, .. } if changes == &["2 files differ: data.txt changed, new.txt added"]),
        "{err:?}"
    );
    let forced = InstallOptions {
        force: true,
        ..InstallOptions::default()
    };
    let out = packages::install(&f.state, &src, &forced).unwrap();
    assert_eq!(out.change, InstallChange::Reinstalled);
    assert_eq!(
        out.to_string(),
        "reinstalled notes 0.1.0 (2 files differ: data.txt changed, new.txt added)"
    );
    assert_eq!(out.previous.as_deref(), Some("0.1.0"));
    assert!(
        !out.record.enabled,
        "a reinstall must keep the package disabled"
    );
    assert!(!packages::get(&f.state, "notes").unwrap().enabled);
    assert_eq!(
        fs::read_to_string(installed(&f, "notes").join("data.txt")).unwrap(),
        "edited\n"
    );
    assert!(out.record.files.contains_key("new.txt"));
    packages::verify(&f.state, "notes").unwrap();
}

#[test]
fn upgrade_replaces_the_old_version_entirely() {
    let f = fixture();
    let old = f.folder("v1", "notes", "0.1.0");
    fs::write(old.join("only-in-v1.txt"), "old\n").unwrap();
    f.install(&old).unwrap();
    packages::set_enabled(&f.state, "notes", false).unwrap();

    let out = f.install(&f.folder("v2", "notes", "0.10.0")).unwrap();
    assert_eq!(
        out.change,
        InstallChange::Upgraded {
            from: "0.1.0".into(),
            to: "0.10.0".into()
        }
    );
    assert_eq!(out.to_string(), "upgraded notes from 0.1.0 to 0.10.0");
    assert!(!out.record.enabled, "an upgrade keeps the enabled flag");
    assert!(!installed(&f, "notes").join("only-in-v1.txt").exists());
    assert!(!out.record.files.contains_key("only-in-v1.txt"));
    assert_eq!(packages::list(&f.state).unwrap().len(), 1);
    packages::verify(&f.state, "notes").unwrap();
    assert_eq!(
        fs::read_dir(f.state.tmp_dir()).unwrap().count(),
        0,
        "the old version was left in tmp/"
    );
}

#[test]
fn a_prerelease_is_lower_than_its_release() {
    let f = fixture();
    f.install(&f.folder("rc", "notes", "1.0.0-rc.1")).unwrap();
    let out = f.install(&f.folder("final", "notes", "1.0.0")).unwrap();
    assert!(
        matches!(out.change, InstallChange::Upgraded { .. }),
        "{:?}",
        out.change
    );
}

#[test]
fn downgrade_is_refused_unless_allowed() {
    let f = fixture();
    f.install(&f.folder("v2", "notes", "0.2.0")).unwrap();
    let v1 = f.folder("v1", "notes", "0.1.0");
    let err = f.refused(&v1, &InstallOptions::default());
    assert!(matches!(err, InstallError::Downgrade { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "refusing to downgrade `notes` from 0.2.0 to 0.1.0; pass --allow-downgrade to install the older version anyway"
    );

    // From an archive too, where the version is known only after unpacking.
    let m = manifest("notes", "0.1.0");
    let mut names = Vec::new();
    let archive = targz(&f.path("v1.tar.gz"), &good_entries("", &m, &mut names));
    let err = f.refused(&archive, &InstallOptions::default());
    assert!(matches!(err, InstallError::Downgrade { .. }), "{err:?}");

    let opts = InstallOptions {
        allow_downgrade: true,
        ..Default::default()
    };
    let out = packages::install(&f.state, &v1, &opts).unwrap();
    assert_eq!(
        out.change,
        InstallChange::Downgraded {
            from: "0.2.0".into(),
            to: "0.1.0".into()
        }
    );
    assert_eq!(packages::get(&f.state, "notes").unwrap().version, "0.1.0");
}

// ---------------------------------------------------------------------------------------------
// Refusals that change nothing

#[test]
fn a_bad_manifest_is_refused_before_anything_changes() {
    let f = fixture();
    f.install(&f.folder("good", "notes", "0.1.0")).unwrap();

    let bad = f.folder("bad", "notes", "0.2.0");
    fs::write(
        bad.join("conduit-extension.toml"),
        "name = \"notes\"\nversion = \"two\"\nprotocol = 1\ncommand = [\"./bin/run\"]\n",
    )
    .unwrap();
    let err = f.refused(&bad, &InstallOptions::default());
    assert!(matches!(err, InstallError::Manifest { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("version") && msg.contains("conduit-extension.toml"),
        "{msg}"
    );

    let missing = f.path("src/empty");
    fs::create_dir_all(&missing).unwrap();
    let err = f.refused(&missing, &InstallOptions::default());
    assert!(err.to_string().contains("conduit-extension.toml"), "{err}");

    // An archive's bad manifest is named inside the archive, not inside staging.
    let m = "name = \"Notes!\"\nversion = \"0.1.0\"\nprotocol = 1\ncommand = [\"./bin/run\"]\n";
    let mut names = Vec::new();
    let archive = targz(
        &f.path("bad.tar.gz"),
        &good_entries("notes/", m, &mut names),
    );
    let err = f.refused(&archive, &InstallOptions::default());
    let msg = err.to_string();
    assert!(matches!(err, InstallError::Manifest { .. }), "{err:?}");
    assert!(
        msg.contains("bad.tar.gz/notes/conduit-extension.toml"),
        "{msg}"
    );
    assert!(
        !msg.contains("install-"),
        "the message names staging: {msg}"
    );
}

#[test]
fn a_command_missing_from_the_package_is_refused() {
    let f = fixture();
    let src = f.folder("nocmd", "notes", "0.1.0");
    fs::remove_file(src.join("bin/run")).unwrap();
    let err = f.refused(&src, &InstallOptions::default());
    assert!(matches!(err, InstallError::Command { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("`./bin/run` is not a file in the package"),
        "{err}"
    );

    let src = f.folder("noexec", "notes", "0.1.0");
    fs::set_permissions(src.join("bin/run"), fs::Permissions::from_mode(0o644)).unwrap();
    let err = f.refused(&src, &InstallOptions::default());
    assert!(err.to_string().contains("is not executable"), "{err}");
}

#[test]
fn sources_that_are_not_packages_are_refused() {
    let f = fixture();
    let err = f.refused(&f.path("nowhere"), &InstallOptions::default());
    assert!(err.to_string().contains("does not exist"), "{err}");
    fs::write(f.path("plain.txt"), "hello").unwrap();
    let err = f.refused(&f.path("plain.txt"), &InstallOptions::default());
    assert!(
        err.to_string().contains("neither a package folder nor"),
        "{err}"
    );
    // gzip, but not a tar inside.
    let mut gz = GzEncoder::new(
        fs::File::create(f.path("junk.tar.gz")).unwrap(),
        Compression::fast(),
    );
    gz.write_all(&[7u8; 2000]).unwrap();
    gz.finish().unwrap();
    let err = f.refused(&f.path("junk.tar.gz"), &InstallOptions::default());
    assert!(
        matches!(err, InstallError::CorruptArchive { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("not a valid .tar.gz"), "{err}");

    // A good archive cut short, as by an interrupted download.
    let m = manifest("notes", "0.1.0");
    let mut names = Vec::new();
    let big: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
    let mut entries = good_entries("", &m, &mut names);
    entries.push(Entry::File("big", &big, 0o644));
    let archive = targz(&f.path("cut.tar.gz"), &entries);
    let len = fs::metadata(&archive).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&archive)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let err = f.refused(&archive, &InstallOptions::default());
    assert!(
        matches!(err, InstallError::CorruptArchive { .. }),
        "{err:?}"
    );
}

/// Installs `entries` (plus a good package under `pkg/`) over an installed package and checks
/// the refusal names `entry` and matches `problem`.
fn check_hostile(
    entries: Vec<Entry<'_>>,
    entry: &str,
    problem: fn(&UnsafeEntry) -> bool,
) -> String {
    let f = fixture();
    f.install(&f.folder("good", "notes", "0.1.0")).unwrap();
    let m = manifest("notes", "0.2.0");
    let mut names = Vec::new();
    let mut all = good_entries("pkg/", &m, &mut names);
    all.extend(entries);
    let archive = targz(&f.path("hostile/evil.tar.gz"), &all);
    let err = f.refused(&archive, &InstallOptions::default());
    match &err {
        InstallError::Unsafe {
            entry: e,
            problem: p,
            origin,
        } => {
            assert_eq!(e, entry);
            assert!(problem(p), "unexpected problem {p:?}");
            assert_eq!(origin, &archive);
        }
        other => panic!("expected Unsafe, got {other:?}"),
    }
    // Nothing escaped next to the archive or the state either.
    assert_eq!(
        snapshot(&f.path("hostile")).keys().collect::<Vec<_>>(),
        ["evil.tar.gz"],
        "something was written outside staging"
    );
    assert!(
        !f.path("escaped").exists() && !f.tmp.path().parent().unwrap().join("escaped").exists()
    );
    let msg = err.to_string();
    assert!(msg.contains("evil.tar.gz") && msg.contains(entry), "{msg}");
    msg
}

#[test]
fn an_entry_with_dot_dot_is_refused() {
    let msg = check_hostile(
        vec![Entry::RawFile(b"pkg/../../escaped", b"pwned")],
        "pkg/../../escaped",
        |p| *p == UnsafeEntry::ParentDir,
    );
    assert!(msg.contains("`..`"), "{msg}");
    check_hostile(
        vec![Entry::RawFile(b"../escaped", b"pwned")],
        "../escaped",
        |p| *p == UnsafeEntry::ParentDir,
    );
}

#[test]
fn an_absolute_entry_is_refused() {
    let target = std::env::temp_dir().join("conduit-test-absolute-escaped");
    let name = target.to_str().unwrap().to_owned();
    let msg = check_hostile(
        vec![Entry::RawFile(name.as_bytes(), b"pwned")],
        &name,
        |p| *p == UnsafeEntry::AbsolutePath,
    );
    assert!(msg.contains("absolute path"), "{msg}");
    assert!(!target.exists());
}

#[test]
fn a_symlink_that_escapes_is_refused() {
    let msg = check_hostile(
        vec![Entry::Symlink("pkg/passwd", "/etc/passwd")],
        "pkg/passwd",
        |p| matches!(p, UnsafeEntry::LinkEscapes { .. }),
    );
    assert!(
        msg.contains("`/etc/passwd`, which is outside the package"),
        "{msg}"
    );
    check_hostile(
        vec![Entry::Symlink("pkg/up", "../../../escaped")],
        "pkg/up",
        |p| matches!(p, UnsafeEntry::LinkEscapes { .. }),
    );
    // The classic: a link to a folder outside, then a file written through it.
    check_hostile(
        vec![
            Entry::Symlink("pkg/out", ".."),
            Entry::File("pkg/out/escaped", b"pwned", 0o644),
        ],
        "pkg/out",
        |p| {
            matches!(
                p,
                UnsafeEntry::LinkEscapes { .. } | UnsafeEntry::LinkToFolder { .. }
            )
        },
    );
}

#[test]
fn a_hardlink_that_escapes_is_refused() {
    check_hostile(
        vec![Entry::Hardlink("pkg/shadow", "../../etc/shadow")],
        "pkg/shadow",
        |p| matches!(p, UnsafeEntry::LinkEscapes { .. }),
    );
    check_hostile(
        vec![Entry::Hardlink("pkg/passwd", "/etc/passwd")],
        "pkg/passwd",
        |p| matches!(p, UnsafeEntry::LinkEscapes { .. }),
    );
}

#[test]
fn links_to_nothing_to_folders_and_in_loops_are_refused() {
    check_hostile(
        vec![Entry::Symlink("pkg/dangling", "nope")],
        "pkg/dangling",
        |p| matches!(p, UnsafeEntry::LinkDangling { .. }),
    );
    check_hostile(
        vec![Entry::Symlink("pkg/bindir", "bin")],
        "pkg/bindir",
        |p| matches!(p, UnsafeEntry::LinkToFolder { .. }),
    );
    check_hostile(
        vec![Entry::Symlink("pkg/a", "b"), Entry::Symlink("pkg/b", "a")],
        "pkg/a",
        |p| *p == UnsafeEntry::LinkLoop,
    );
}

#[test]
fn devices_fifos_and_duplicates_are_refused() {
    check_hostile(vec![Entry::Fifo("pkg/pipe")], "pkg/pipe", |p| {
        *p == UnsafeEntry::Special { kind: "fifo" }
    });
    check_hostile(vec![Entry::CharDevice("pkg/null")], "pkg/null", |p| {
        *p == UnsafeEntry::Special {
            kind: "character device",
        }
    });
    check_hostile(
        vec![Entry::File("pkg/data.txt", b"second", 0o644)],
        "pkg/data.txt",
        |p| *p == UnsafeEntry::Duplicate,
    );
}

#[test]
fn a_folder_with_links_out_or_special_files_is_refused() {
    let f = fixture();
    f.install(&f.folder("good", "notes", "0.1.0")).unwrap();
    let outside = f.path("secret.txt");
    fs::write(&outside, "secret").unwrap();

    let src = f.folder("escape", "notes", "0.2.0");
    symlink(&outside, src.join("secret")).unwrap();
    let err = f.refused(&src, &InstallOptions::default());
    assert!(
        matches!(&err, InstallError::Unsafe { entry, problem: UnsafeEntry::LinkEscapes { .. }, .. } if entry == "secret"),
        "{err:?}"
    );

    let src = f.folder("relative-escape", "notes", "0.2.0");
    symlink("../../../secret.txt", src.join("bin/secret")).unwrap();
    let err = f.refused(&src, &InstallOptions::default());
    assert!(
        matches!(&err, InstallError::Unsafe { entry, problem: UnsafeEntry::LinkEscapes { .. }, .. } if entry == "bin/secret"),
        "{err:?}"
    );

    let src = f.folder("dirlink", "notes", "0.2.0");
    symlink("bin", src.join("bin2")).unwrap();
    let err = f.refused(&src, &InstallOptions::default());
    assert!(
        matches!(
            &err,
            InstallError::Unsafe {
                problem: UnsafeEntry::LinkToFolder { .. },
                ..
            }
        ),
        "{err:?}"
    );

    let src = f.folder("fifo", "notes", "0.2.0");
    nix::unistd::mkfifo(
        &src.join("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let err = f.refused(&src, &InstallOptions::default());
    assert!(
        matches!(
            &err,
            InstallError::Unsafe {
                problem: UnsafeEntry::Special { kind: "fifo" },
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn a_package_too_large_or_with_too_many_entries_is_refused() {
    let f = fixture();
    f.install(&f.folder("good", "notes", "0.1.0")).unwrap();
    let small = InstallOptions {
        max_total_bytes: 64 * 1024,
        max_entries: 20,
        ..Default::default()
    };

    // Compresses to almost nothing; unpacks past the limit.
    let m = manifest("notes", "0.2.0");
    let mut names = Vec::new();
    let zeros = vec![0u8; 1 << 20];
    let mut entries = good_entries("", &m, &mut names);
    entries.push(Entry::File("zeros", &zeros, 0o644));
    let archive = targz(&f.path("bomb.tar.gz"), &entries);
    let err = f.refused(&archive, &small);
    assert!(
        matches!(err, InstallError::TooLarge { limit: 65536, .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("more than 64 KiB, the limit"),
        "{err}"
    );
    assert!(err.to_string().contains("bomb"), "{err}");

    // A header that claims a huge file is refused on the header, without reading on.
    let mut names = Vec::new();
    let mut entries = good_entries("", &m, &mut names);
    entries.push(Entry::LyingSize("huge", 1 << 40));
    let archive = targz(&f.path("liar.tar.gz"), &entries);
    let err = f.refused(&archive, &InstallOptions::default());
    assert!(matches!(err, InstallError::TooLarge { .. }), "{err:?}");

    let many: Vec<String> = (0..50).map(|i| format!("f{i}")).collect();
    let mut names = Vec::new();
    let mut entries = good_entries("", &m, &mut names);
    entries.extend(many.iter().map(|n| Entry::File(n, b"x", 0o644)));
    let archive = targz(&f.path("many.tar.gz"), &entries);
    let err = f.refused(&archive, &small);
    assert!(
        matches!(err, InstallError::TooManyEntries { limit: 20, .. }),
        "{err:?}"
    );

    // Links count too: many links to one big file would multiply it.
    let big = vec![1u8; 40 * 1024];
    let mut names = Vec::new();
    let mut entries = good_entries("", &m, &mut names);
    entries.push(Entry::File("big", &big, 0o644));
    entries.push(Entry::Hardlink("big2", "big"));
    let archive = targz(&f.path("links.tar.gz"), &entries);
    let err = f.refused(&archive, &small);
    assert!(matches!(err, InstallError::TooLarge { .. }), "{err:?}");

    // And folders.
    let src = f.folder("bigdir", "notes", "0.2.0");
    fs::write(src.join("zeros"), &zeros).unwrap();
    let err = f.refused(&src, &small);
    assert!(matches!(err, InstallError::TooLarge { .. }), "{err:?}");
}

#[test]
fn a_giant_header_is_refused_without_reading_it_into_memory() {
    let f = fixture();
    let m = manifest("notes", "0.1.0");
    let mut names = Vec::new();
    let mut entries = good_entries("", &m, &mut names);
    entries.push(Entry::LongName(4 << 20));
    let archive = targz(&f.path("longname.tar.gz"), &entries);
    let err = f.refused(&archive, &InstallOptions::default());
    assert!(
        matches!(err, InstallError::CorruptArchive { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("headers are larger than 1024 KiB"),
        "{err}"
    );

    // A long name of an ordinary length is fine.
    let mut names = Vec::new();
    let mut entries = good_entries("", &m, &mut names);
    entries.push(Entry::LongName(300));
    let archive = targz(&f.path("long-ok.tar.gz"), &entries);
    let rec = f.install(&archive).unwrap().record;
    assert!(
        rec.files.keys().any(|k| k.len() == 300),
        "{:?}",
        rec.files.keys()
    );
}

#[test]
fn scratch_left_by_a_killed_install_is_swept_by_the_next() {
    let f = fixture();
    let tmp = f.state.tmp_dir();
    fs::create_dir_all(tmp.join("install-dead/pkg")).unwrap();
    fs::write(tmp.join("install-dead/pkg/file"), "x").unwrap();
    fs::write(tmp.join("registry-dead"), "{").unwrap();
    fs::create_dir_all(tmp.join("kept-install-x/previous")).unwrap();
    fs::write(tmp.join("someone-elses"), "keep me").unwrap();
    f.install(&f.folder("notes", "notes", "0.1.0")).unwrap();
    let mut left: Vec<String> = fs::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, ["kept-install-x", "someone-elses"]);
}

#[test]
fn a_command_path_may_climb_but_not_leave() {
    let f = fixture();
    let src = f.folder("climb", "notes", "0.1.0");
    let m = "name = \"notes\"\nversion = \"0.1.0\"\nprotocol = 1\ncommand = [\"bin/../bin/run\"]\n";
    fs::write(src.join("conduit-extension.toml"), m).unwrap();
    f.install(&src).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Tampering

fn tampered(f: &Fixture) -> Vec<FileChange> {
    match packages::verify(&f.state, "notes") {
        Err(VerifyError::Tampered(t)) => {
            assert_eq!(t.name, "notes");
            t.changes
        }
        other => panic!("expected a tamper error, got {other:?}"),
    }
}

#[test]
fn verify_names_a_changed_file() {
    let f = fixture();
    let src = f.folder("notes", "notes", "0.1.0");
    f.install(&src).unwrap();
    let run = installed(&f, "notes").join("bin/run");
    fs::write(&run, "#!/bin/sh\nrm -rf ~\n").unwrap();
    let changes = tampered(&f);
    assert!(
        matches!(&changes[..], [FileChange::Modified { path, .. }] if path == "bin/run"),
        "{changes:?}"
    );

    let msg = packages::verify(&f.state, "notes").unwrap_err().to_string();
    assert!(
        msg.starts_with("package `notes` was modified after install: bin/run changed (sha256 "),
        "{msg}"
    );
    assert!(
        msg.ends_with(&format!(
            "; reinstall it with `conduit ext install {}`",
            src.display()
        )),
        "{msg}"
    );

    // Reinstalling heals it.
    f.install(&src).unwrap();
    packages::verify(&f.state, "notes").unwrap();

    // Same size, same contents, but no longer executable: a change too.
    fs::set_permissions(&run, fs::Permissions::from_mode(0o644)).unwrap();
    let msg = packages::verify(&f.state, "notes").unwrap_err().to_string();
    assert!(msg.contains("bin/run lost its executable bit"), "{msg}");
}

#[test]
fn verify_names_missing_added_and_replaced_files() {
    let f = fixture();
    f.install(&f.folder("notes", "notes", "0.1.0")).unwrap();
    let dir = installed(&f, "notes");
    fs::remove_file(dir.join("data.txt")).unwrap();
    fs::write(dir.join("bin/extra"), "new").unwrap();
    fs::remove_file(dir.join("conduit-extension.toml")).unwrap();
    symlink("/etc/passwd", dir.join("conduit-extension.toml")).unwrap();
    fs::create_dir(dir.join("empty-folders-are-fine")).unwrap();

    let changes = tampered(&f);
    assert_eq!(
        changes,
        [
            FileChange::Added {
                path: "bin/extra".into()
            },
            FileChange::NotAFile {
                path: "conduit-extension.toml".into(),
                kind: "symlink"
            },
            FileChange::Missing {
                path: "data.txt".into()
            },
        ]
    );
    let msg = packages::verify(&f.state, "notes").unwrap_err().to_string();
    assert!(
        msg.contains(
            "bin/extra was added, conduit-extension.toml is now a symlink, data.txt is missing"
        ),
        "{msg}"
    );

    // The whole folder gone: every file missing.
    fs::remove_dir_all(&dir).unwrap();
    let changes = tampered(&f);
    assert_eq!(changes.len(), 3);
    assert!(
        changes
            .iter()
            .all(|c| matches!(c, FileChange::Missing { .. })),
        "{changes:?}"
    );
}

fn verified_file(f: &Fixture) -> PathBuf {
    f.state
        .packages_dir()
        .join(packages::VERIFIED_DIR)
        .join("notes.json")
}

/// Writes `text` over `path` keeping its size and putting its modification time back, as a
/// tamperer covering their tracks would; only the status-change time moves.
fn rewrite_keeping_mtime(path: &Path, text: &str) {
    let meta = fs::metadata(path).unwrap();
    assert_eq!(
        meta.len(),
        text.len() as u64,
        "the test needs a same-size rewrite"
    );
    let mtime = meta.modified().unwrap();
    let file = fs::OpenOptions::new().write(true).open(path).unwrap();
    (&file).write_all(text.as_bytes()).unwrap();
    file.set_modified(mtime).unwrap();
}

#[test]
fn verify_catches_a_same_size_rewrite_with_the_old_modification_time() {
    let f = fixture();
    f.install(&f.folder("notes", "notes", "0.1.0")).unwrap();
    // The install kept the files' stats; the first check uses them.
    assert!(verified_file(&f).is_file());
    packages::verify(&f.state, "notes").unwrap();

    let data = installed(&f, "notes").join("data.txt");
    let old = fs::read_to_string(&data).unwrap();
    let forged: String = old.chars().rev().collect();
    assert_ne!(old, forged);
    rewrite_keeping_mtime(&data, &forged);
    let changes = tampered(&f);
    assert!(
        matches!(&changes[..], [FileChange::Modified { path, .. }] if path == "data.txt"),
        "{changes:?}"
    );
}

#[test]
fn verify_hashes_in_full_without_kept_stats_and_keeps_them_again() {
    let f = fixture();
    f.install(&f.folder("notes", "notes", "0.1.0")).unwrap();
    fs::remove_file(verified_file(&f)).unwrap();
    packages::verify(&f.state, "notes").unwrap();
    assert!(
        verified_file(&f).is_file(),
        "a passing full check keeps the stats"
    );

    // Damaged kept stats are no shortcut: the full check runs and finds the change.
    fs::write(verified_file(&f), "{ not json").unwrap();
    fs::write(
        installed(&f, "notes").join("bin/run"),
        "#!/bin/sh
echo changed
",
    )
    .unwrap();
    let changes = tampered(&f);
    assert!(
        matches!(&changes[..], [FileChange::Modified { path, .. }] if path == "bin/run"),
        "{changes:?}"
    );
    // A removed package leaves no kept stats behind.
    packages::remove(&f.state, "notes").unwrap();
    assert!(!verified_file(&f).exists());
}

#[test]
fn kept_stats_of_another_install_are_not_trusted() {
    let f = fixture();
    let src = f.folder("notes", "notes", "0.1.0");
    f.install(&src).unwrap();
    let stale = fs::read(verified_file(&f)).unwrap();
    // A reinstall is another record: stats kept for the earlier one must not pass it, even when
    // they are put back by hand.
    f.install(&src).unwrap();
    fs::write(verified_file(&f), &stale).unwrap();
    packages::verify(&f.state, "notes").unwrap();
    assert_ne!(
        fs::read(verified_file(&f)).unwrap(),
        stale,
        "the full check kept fresh stats"
    );
}

#[test]
fn verify_of_an_unknown_package_says_so() {
    let f = fixture();
    let err = packages::verify(&f.state, "ghost").unwrap_err();
    assert!(
        matches!(err, VerifyError::Package(PackageError::NotInstalled { .. })),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("no package named `ghost` is installed"),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// Enable, disable, remove, list

#[test]
fn enable_and_disable() {
    let f = fixture();
    f.install(&f.folder("notes", "notes", "0.1.0")).unwrap();
    assert!(packages::get(&f.state, "notes").unwrap().enabled);
    assert!(
        !packages::set_enabled(&f.state, "notes", true).unwrap(),
        "already enabled"
    );
    assert!(packages::set_enabled(&f.state, "notes", false).unwrap());
    assert!(!packages::get(&f.state, "notes").unwrap().enabled);
    assert!(packages::set_enabled(&f.state, "notes", true).unwrap());
    assert!(packages::get(&f.state, "notes").unwrap().enabled);
    let err = packages::set_enabled(&f.state, "ghost", true).unwrap_err();
    assert!(matches!(err, PackageError::NotInstalled { .. }), "{err:?}");
}

#[test]
fn remove_deletes_the_folder_and_the_record() {
    let f = fixture();
    f.install(&f.folder("notes", "notes", "0.1.0")).unwrap();
    f.install(&f.folder("echo", "echo", "1.0.0")).unwrap();
    assert_eq!(
        packages::list(&f.state)
            .unwrap()
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>(),
        ["echo", "notes"]
    );

    let rec = packages::remove(&f.state, "notes").unwrap();
    assert_eq!(rec.version, "0.1.0");
    assert!(!installed(&f, "notes").exists());
    assert!(installed(&f, "echo").is_dir());
    assert_eq!(packages::list(&f.state).unwrap().len(), 1);
    let err = packages::get(&f.state, "notes").unwrap_err();
    assert_eq!(
        err.to_string(),
        "no package named `notes` is installed; `conduit ext list` shows the installed ones"
    );
    let err = packages::remove(&f.state, "notes").unwrap_err();
    assert!(matches!(err, PackageError::NotInstalled { .. }), "{err:?}");
    assert_eq!(fs::read_dir(f.state.tmp_dir()).unwrap().count(), 0);

    // Installing again after a remove is a fresh install.
    let out = f.install(&f.folder("notes", "notes", "0.1.0")).unwrap();
    assert_eq!(out.change, InstallChange::Installed);
}

#[test]
fn an_empty_store_lists_nothing() {
    let f = fixture();
    assert!(packages::list(&f.state).unwrap().is_empty());
}

#[test]
fn a_damaged_registry_is_reported_with_what_to_do() {
    let f = fixture();
    fs::write(
        f.state.packages_dir().join(packages::REGISTRY_FILE),
        "{ not json",
    )
    .unwrap();
    let err = packages::list(&f.state).unwrap_err();
    assert!(matches!(err, PackageError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("reinstall"), "{err}");

    fs::write(
        f.state.packages_dir().join(packages::REGISTRY_FILE),
        r#"{"format": 99, "packages": []}"#,
    )
    .unwrap();
    let err = packages::list(&f.state).unwrap_err();
    assert!(err.to_string().contains("upgrade conduit"), "{err}");
}

#[test]
fn concurrent_installs_of_one_package_serialise() {
    let f = fixture();
    let srcs: Vec<PathBuf> = (1..=4)
        .map(|i| f.folder(&format!("v{i}"), "notes", &format!("0.{i}.0")))
        .collect();
    let opts = InstallOptions {
        allow_downgrade: true,
        ..Default::default()
    };
    std::thread::scope(|s| {
        for src in &srcs {
            let (state, opts) = (&f.state, &opts);
            s.spawn(move || packages::install(state, src, opts).unwrap());
        }
    });
    let rec = packages::get(&f.state, "notes").unwrap();
    packages::verify(&f.state, "notes").unwrap();
    assert!(["0.1.0", "0.2.0", "0.3.0", "0.4.0"].contains(&rec.version.as_str()));
    assert_eq!(fs::read_dir(f.state.tmp_dir()).unwrap().count(), 0);
}

#[test]
fn an_upgrade_keeps_the_previous_version_for_a_rollback_and_remove_drops_it() {
    let f = fixture();
    f.install(&f.folder("v1", "notes", "0.1.0")).unwrap();
    assert!(packages::previous(&f.state, "notes").unwrap().is_none());
    let out = f.install(&f.folder("v2", "notes", "0.2.0")).unwrap();
    assert_eq!(out.previous.as_deref(), Some("0.1.0"));
    let kept = f.state.packages_dir().join("notes.previous");
    assert!(kept.join("conduit-extension.toml").is_file());
    assert_eq!(
        packages::previous(&f.state, "notes")
            .unwrap()
            .unwrap()
            .version,
        "0.1.0"
    );

    // A rollback swaps the two, and both verify.
    let back = packages::rollback(&f.state, "notes").unwrap();
    assert_eq!(
        (back.to.version.as_str(), back.from.version.as_str()),
        ("0.1.0", "0.2.0")
    );
    assert_eq!(packages::get(&f.state, "notes").unwrap().version, "0.1.0");
    packages::verify(&f.state, "notes").unwrap();
    let again = packages::rollback(&f.state, "notes").unwrap();
    assert_eq!(again.to.version, "0.2.0");
    packages::verify(&f.state, "notes").unwrap();

    // A third install keeps only the version it replaced.
    f.install(&f.folder("v3", "notes", "0.3.0")).unwrap();
    assert_eq!(
        packages::previous(&f.state, "notes")
            .unwrap()
            .unwrap()
            .version,
        "0.2.0"
    );

    packages::remove(&f.state, "notes").unwrap();
    assert!(!kept.exists(), "remove deletes the kept version too");
    let err = packages::rollback(&f.state, "notes").unwrap_err();
    assert!(matches!(err, PackageError::NotInstalled { .. }), "{err:?}");
    f.install(&f.folder("v1", "notes", "0.1.0")).unwrap();
    let err = packages::rollback(&f.state, "notes").unwrap_err();
    assert!(matches!(err, PackageError::NoPrevious { .. }), "{err:?}");
}
