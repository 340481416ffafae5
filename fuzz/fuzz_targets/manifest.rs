//! Fuzz target: parsing and validating a package manifest (`host/src/manifest.rs`), and
//! resolving its `command` inside a package folder.
//!
//! Input: the manifest text (inputs that are not UTF-8 are skipped: `Manifest::load` refuses
//! them before parsing). Checked:
//! - nothing panics;
//! - an accepted manifest obeys every documented rule (name, version, protocol list, argv,
//!   description length, capability names non-blank and listed once);
//! - an accepted manifest written back as TOML is accepted again, unchanged;
//! - every refusal names the manifest's path, and names the field when it is about one (an
//!   unknown key may be the empty key `""`, which TOML allows);
//! - a `command` program with a `/` resolves only to an executable file inside the package
//!   folder (the fixture folder holds a link that leads out of it, a folder and a plain file).
#![no_main]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use conduit_host::manifest::{MAX_DESCRIPTION_CHARS, MAX_NAME_LEN, Manifest, ManifestError};
use libfuzzer_sys::fuzz_target;

/// A package folder shared by every run: `bin/tool` (executable), `data.txt` (not executable),
/// `sub/` (a folder) and `out` (a link to `/bin/sh`, outside the folder).
fn package() -> &'static Path {
    static DIR: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &DIR.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("bin")).unwrap();
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("bin/tool"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(
            root.join("bin/tool"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::fs::write(root.join("data.txt"), "x").unwrap();
        std::os::unix::fs::symlink("/bin/sh", root.join("out")).unwrap();
        (dir, root)
    })
    .1
}

fn check_accepted(m: &Manifest) {
    let name = &m.name;
    assert!(
        !name.is_empty() && name.len() <= MAX_NAME_LEN,
        "name {name:?}"
    );
    assert!(
        name.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
        "name {name:?}"
    );
    assert!(!name.starts_with('-'), "name {name:?}");
    let v = semver::Version::parse(&m.version).expect("an accepted version is semver");
    assert!(
        v.build.is_empty(),
        "version {:?} has build metadata",
        m.version
    );
    assert!(!m.protocol.is_empty() && m.protocol.iter().all(|&p| p >= 1));
    assert_eq!(
        m.protocol.iter().collect::<BTreeSet<_>>().len(),
        m.protocol.len()
    );
    assert!(!m.command.is_empty() && !m.command[0].is_empty());
    assert!(m.command.iter().all(|a| !a.contains('\0')));
    if let Some(d) = &m.description {
        assert!(d.chars().count() <= MAX_DESCRIPTION_CHARS);
    }
    let c = &m.capabilities;
    for list in [
        &c.recurrences,
        &c.dependency_filters,
        &c.emissions,
        &c.ingress,
        &c.methods,
    ] {
        assert!(
            list.iter().all(|s| !s.trim().is_empty()),
            "blank name in {list:?}"
        );
        assert_eq!(
            list.iter().collect::<BTreeSet<_>>().len(),
            list.len(),
            "{list:?}"
        );
    }
    assert!(c.work_kinds.iter().all(|k| !k.name.trim().is_empty()));
}

/// The manifest as TOML, from its validated fields.
fn render(m: &Manifest) -> String {
    let mut t = toml::Table::new();
    t.insert("name".into(), m.name.clone().into());
    t.insert("version".into(), m.version.clone().into());
    let protocol: Vec<toml::Value> = m.protocol.iter().map(|&p| i64::from(p).into()).collect();
    t.insert("protocol".into(), protocol.into());
    let command: Vec<toml::Value> = m.command.iter().map(|a| a.clone().into()).collect();
    t.insert("command".into(), command.into());
    if let Some(d) = &m.description {
        t.insert("description".into(), d.clone().into());
    }
    let caps = toml::Value::try_from(&m.capabilities).expect("capabilities serialize");
    if caps.as_table().is_some_and(|c| !c.is_empty()) {
        t.insert("capabilities".into(), caps);
    }
    toml::to_string(&t).expect("a table serializes")
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("/packages/fuzzed/conduit-extension.toml");
    match Manifest::parse(text, path) {
        Ok(m) => {
            check_accepted(&m);
            let again = render(&m);
            match Manifest::parse(&again, path) {
                Ok(m2) => assert_eq!(m, m2, "changed when written back:\n{again}"),
                Err(e) => panic!("refused when written back: {e}\n{again}"),
            }
            if m.command[0].contains('/') {
                let dir = package();
                if let Ok(resolved) = m.resolve_command(dir) {
                    assert!(
                        resolved.program.starts_with(dir),
                        "{:?} resolved outside the package to {}",
                        m.command[0],
                        resolved.program.display()
                    );
                    assert_eq!(
                        resolved.program.canonicalize().unwrap(),
                        dir.join("bin/tool"),
                        "the only executable file inside is bin/tool"
                    );
                    assert_eq!(resolved.args, m.command[1..]);
                }
            }
        }
        Err(e) => {
            let shown = e.to_string();
            assert!(
                shown.contains(&path.display().to_string()),
                "no path in: {shown}"
            );
            match &e {
                ManifestError::Syntax { .. } | ManifestError::Read { .. } => {}
                // TOML allows an empty quoted key (`"" = 1`): then the field is that empty key.
                ManifestError::UnknownKey { key, .. } if key.is_empty() => {
                    assert!(e.field().is_some(), "no field in: {shown}");
                }
                _ => assert!(
                    e.field().is_some_and(|f| !f.is_empty()),
                    "no field in: {shown}"
                ),
            }
        }
    }
});
