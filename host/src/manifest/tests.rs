//! Every manifest rule at its edge: the last accepted value and the first refused one, and that
//! each refusal names the field.

use std::path::{Path, PathBuf};

use conduit_protocol::Capabilities;
use conduit_protocol::handshake::WorkKind;

use super::{MANIFEST_FILE, Manifest, ManifestError};

const GOOD: &str = r#"
name = "notes"
version = "0.1.0"
protocol = 1
command = ["./conduit-notes", "--flag"]
"#;

fn parse(text: &str) -> Result<Manifest, ManifestError> {
    Manifest::parse(text, Path::new("/pkg/conduit-extension.toml"))
}

/// The good manifest with `key = value` replacing (or adding) one top-level line.
fn with(key: &str, value: &str) -> String {
    let mut out: Vec<String> = GOOD
        .lines()
        .filter(|l| !l.starts_with(&format!("{key} =")))
        .map(str::to_owned)
        .collect();
    // Top-level keys must come before any table, so insert after the blank first line.
    out.insert(1, format!("{key} = {value}"));
    out.join("\n")
}

fn without(key: &str) -> String {
    GOOD.lines()
        .filter(|l| !l.starts_with(&format!("{key} =")))
        .collect::<Vec<_>>()
        .join("\n")
}

#[track_caller]
fn refused(text: &str, field: &str, says: &str) -> String {
    let err = parse(text).expect_err("should be refused");
    let msg = err.to_string();
    assert_eq!(err.field().as_deref(), Some(field), "{msg}");
    assert!(
        msg.contains("/pkg/conduit-extension.toml"),
        "names the file: {msg}"
    );
    assert!(msg.contains(says), "expected {says:?} in: {msg}");
    msg
}

#[test]
fn a_minimal_manifest_parses() {
    let m = parse(GOOD).unwrap();
    assert_eq!(m.name, "notes");
    assert_eq!(m.version, "0.1.0");
    assert_eq!(m.protocol, [1]);
    assert_eq!(m.command, ["./conduit-notes", "--flag"]);
    assert_eq!(m.description, None);
    assert_eq!(m.capabilities, Capabilities::default());
}

#[test]
fn name_length_edges() {
    assert!(parse(&with("name", &format!("\"{}\"", "a".repeat(63)))).is_ok());
    assert!(parse(&with("name", "\"a\"")).is_ok());
    refused(
        &with("name", &format!("\"{}\"", "a".repeat(64))),
        "name",
        "64 characters long, over the limit of 63",
    );
    refused(&with("name", "\"\""), "name", "is empty");
}

#[test]
fn name_characters() {
    assert!(parse(&with("name", "\"0-mail-triage-2\"")).is_ok());
    assert!(
        parse(&with("name", "\"a-\"")).is_ok(),
        "[a-z0-9][a-z0-9-]* allows a trailing dash"
    );
    refused(&with("name", "\"-notes\""), "name", "starts with `-`");
    refused(&with("name", "\"Notes\""), "name", "contains 'N'");
    refused(&with("name", "\"my_notes\""), "name", "contains '_'");
    refused(&with("name", "\"no tes\""), "name", "contains ' '");
    refused(&with("name", "\"notés\""), "name", "contains 'é'");
    refused(
        &with("name", "7"),
        "name",
        "must be a string, not an integer",
    );
    refused(&without("name"), "name", "is required");
    // The daemon's own table in settings.toml keeps its name; a longer one is fine.
    refused(&with("name", "\"retention\""), "name", "is reserved");
    assert!(parse(&with("name", "\"retention-tool\"")).is_ok());
}

#[test]
fn version_is_semver_core_with_optional_prerelease() {
    for ok in [
        "0.0.0",
        "1.2.3",
        "10.20.30",
        "1.0.0-rc.1",
        "1.0.0-alpha-2.0",
        "1.0.0-0",
    ] {
        assert!(
            parse(&with("version", &format!("\"{ok}\""))).is_ok(),
            "{ok}"
        );
    }
    for (bad, says) in [
        ("1.2", "2 dot-separated numbers instead of 3"),
        ("1.2.3.4", "4 dot-separated numbers"),
        ("01.2.3", "leading zero"),
        ("1.x.3", "MINOR \"x\", which is not a number"),
        ("1..3", "MINOR \"\""),
        ("1.2.3-", "empty prerelease identifier"),
        ("1.2.3-rc..1", "empty prerelease identifier"),
        ("1.2.3-01", "leading zero"),
        ("1.2.3-rc_1", "characters other than"),
        ("1.2.3+build.5", "build metadata"),
        ("v1.2.3", "MAJOR \"v1\""),
        ("", "MAJOR"),
    ] {
        refused(&with("version", &format!("\"{bad}\"")), "version", says);
    }
    refused(
        &with("version", "1.0"),
        "version",
        "must be a string, not a float",
    );
    refused(&without("version"), "version", "is required");
}

#[test]
fn protocol_is_an_integer_or_a_list() {
    assert_eq!(parse(&with("protocol", "2")).unwrap().protocol, [2]);
    assert_eq!(parse(&with("protocol", "[1, 2]")).unwrap().protocol, [1, 2]);
    assert_eq!(
        parse(&with("protocol", "4294967295")).unwrap().protocol,
        [u32::MAX]
    );
    refused(&with("protocol", "4294967296"), "protocol", "is 4294967296");
    refused(
        &with("protocol", "0"),
        "protocol",
        "is 0; protocol versions are whole numbers from 1",
    );
    refused(&with("protocol", "-1"), "protocol", "is -1");
    refused(&with("protocol", "[]"), "protocol", "is an empty list");
    refused(
        &with("protocol", "[1, 1]"),
        "protocol[1]",
        "repeats version 1",
    );
    refused(
        &with("protocol", "[1, \"2\"]"),
        "protocol[1]",
        "must be an integer, not a string",
    );
    refused(
        &with("protocol", "\"1\""),
        "protocol",
        "must be an integer, not a string",
    );
    refused(&without("protocol"), "protocol", "is required");
}

#[test]
fn command_is_a_non_empty_argv() {
    assert_eq!(
        parse(&with("command", "[\"python3\"]")).unwrap().command,
        ["python3"]
    );
    refused(&with("command", "[]"), "command", "is an empty list");
    refused(
        &with("command", "\"./run --flag\""),
        "command",
        "is a string, but must be a list",
    );
    refused(&with("command", "[\"\"]"), "command[0]", "is empty");
    refused(
        &with("command", "[\"./x\", 1]"),
        "command[1]",
        "must be a string, not an integer",
    );
    refused(&without("command"), "command", "is required");
}

#[test]
fn description_length_edges() {
    let at_limit = "é".repeat(200); // counted in characters, not bytes
    assert_eq!(
        parse(&with("description", &format!("\"{at_limit}\"")))
            .unwrap()
            .description
            .as_deref(),
        Some(at_limit.as_str())
    );
    refused(
        &with("description", &format!("\"{}\"", "a".repeat(201))),
        "description",
        "201 characters long, over the limit of 200",
    );
    refused(
        &with("description", "[\"a\"]"),
        "description",
        "must be a string, not a list",
    );
}

#[test]
fn unknown_keys_are_named_with_the_known_ones() {
    let msg = refused(&with("protocl", "1"), "protocl", "unknown key `protocl`");
    assert!(
        msg.contains("name, version, protocol, command, description, capabilities"),
        "{msg}"
    );

    let text = format!("{GOOD}\n[capabilities]\nmethod = [\"echo\"]\n");
    let msg = refused(
        &text,
        "capabilities.method",
        "unknown key `method` in `capabilities`",
    );
    assert!(msg.contains("methods"), "lists the known keys: {msg}");

    let text =
        format!("{GOOD}\n[capabilities]\nwork_kinds = [{{ name = \"t\", triger = true }}]\n");
    refused(
        &text,
        "capabilities.work_kinds[0].triger",
        "unknown key `triger`",
    );
}

#[test]
fn capabilities_have_the_protocol_shape() {
    let text = format!(
        "{GOOD}\n[capabilities]\n\
         work_kinds = [{{ name = \"triage\", trigger = true }}, {{ name = \"archive\" }}]\n\
         recurrences = [\"digest\"]\ndependency_filters = [\"reply\"]\nemissions = [\"summary\"]\n\
         ingress = [\"mail\"]\nmethods = [\"echo\", \"check.sleep\"]\n"
    );
    let caps = parse(&text).unwrap().capabilities;
    assert_eq!(
        caps.work_kinds,
        [
            WorkKind::new("triage", true),
            WorkKind::new("archive", false),
        ]
    );
    assert_eq!(caps.recurrences, ["digest"]);
    assert_eq!(caps.dependency_filters, ["reply"]);
    assert_eq!(caps.emissions, ["summary"]);
    assert_eq!(caps.ingress, ["mail"]);
    assert_eq!(caps.methods, ["echo", "check.sleep"]);
}

#[test]
fn capability_lists_are_checked() {
    let caps = |body: &str| format!("{GOOD}\n[capabilities]\n{body}\n");
    refused(
        &caps("methods = \"echo\""),
        "capabilities.methods",
        "must be a list of strings, not a string",
    );
    refused(
        &caps("methods = [\"echo\", \"echo\"]"),
        "capabilities.methods[1]",
        "repeats \"echo\"",
    );
    refused(
        &caps("methods = [\"\"]"),
        "capabilities.methods[0]",
        "is empty",
    );
    refused(
        &caps("methods = [\"$/cancel\"]"),
        "capabilities.methods[0]",
        "reserved for notifications",
    );
    refused(
        &caps("methods = [\"work_kind.trigger\"]"),
        "capabilities.methods[0]",
        "one of the protocol's own methods",
    );
    refused(
        &caps("recurrences = [1]"),
        "capabilities.recurrences[0]",
        "must be a string, not an integer",
    );
    refused(
        &caps("work_kinds = [\"triage\"]"),
        "capabilities.work_kinds[0]",
        "must be a table, not a string",
    );
    refused(
        &caps("work_kinds = [{ trigger = true }]"),
        "capabilities.work_kinds[0].name",
        "is missing",
    );
    refused(
        &caps("work_kinds = [{ name = \"t\", trigger = \"yes\" }]"),
        "capabilities.work_kinds[0].trigger",
        "must be true or false",
    );
    refused(
        &caps("work_kinds = [{ name = \"t\" }, { name = \"t\" }]"),
        "capabilities.work_kinds[1].name",
        "repeats the work kind",
    );
    refused(
        &with("capabilities", "1"),
        "capabilities",
        "must be a table",
    );
}

#[test]
fn syntax_errors_name_the_file_and_the_place() {
    let err = parse("name = \"notes\"\nversion = \n").unwrap_err();
    assert!(matches!(err, ManifestError::Syntax { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("/pkg/conduit-extension.toml is not valid TOML"),
        "{msg}"
    );
    assert!(msg.contains("line 2"), "says where: {msg}");
}

#[test]
fn load_reports_a_missing_manifest_with_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let err = Manifest::load(dir.path()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("conduit-extension.toml"), "{msg}");
    assert!(
        msg.contains("a package is a folder that holds a conduit-extension.toml"),
        "{msg}"
    );
}

mod resolve {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn package(command: &str) -> (tempfile::TempDir, Manifest) {
        let dir = tempfile::tempdir().unwrap();
        let text = with("command", command);
        std::fs::write(dir.path().join(MANIFEST_FILE), &text).unwrap();
        let m = Manifest::load(dir.path()).unwrap();
        (dir, m)
    }

    fn write_exe(path: &Path, mode: u32) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_relative_program_is_inside_the_folder() {
        let (dir, m) = package("[\"./bin/tool\", \"--x\"]");
        write_exe(&dir.path().join("bin/tool"), 0o755);
        let r = m.resolve_command(dir.path()).unwrap();
        assert!(r.program.is_absolute());
        assert_eq!(
            r.program,
            dir.path().canonicalize().unwrap().join("bin/tool")
        );
        assert_eq!(r.args, ["--x"]);
        // `..` that comes back into the folder is fine.
        let (dir, m) = package("[\"bin/../bin/tool\"]");
        write_exe(&dir.path().join("bin/tool"), 0o755);
        assert!(m.resolve_command(dir.path()).is_ok());
    }

    #[test]
    fn a_missing_or_non_executable_program_is_refused() {
        let (dir, m) = package("[\"./tool\"]");
        let msg = m.resolve_command(dir.path()).unwrap_err().to_string();
        assert!(
            msg.contains("`command` program `./tool` does not exist"),
            "{msg}"
        );
        assert!(msg.contains("build or copy the program"), "{msg}");

        write_exe(&dir.path().join("tool"), 0o644);
        let msg = m.resolve_command(dir.path()).unwrap_err().to_string();
        assert!(msg.contains("is not executable"), "{msg}");
        assert!(msg.contains("chmod +x"), "{msg}");

        let (dir, m) = package("[\"./sub\"]");
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let msg = m.resolve_command(dir.path()).unwrap_err().to_string();
        assert!(msg.contains("is not a file"), "{msg}");
    }

    #[test]
    fn a_program_outside_the_folder_is_refused() {
        let (dir, m) = package("[\"../tool\"]");
        let msg = m.resolve_command(dir.path()).unwrap_err().to_string();
        assert!(msg.contains("leads out of the package folder"), "{msg}");

        let (dir, m) = package("[\"./a/../../tool\"]");
        assert!(
            m.resolve_command(dir.path())
                .unwrap_err()
                .to_string()
                .contains("leads out")
        );

        let (dir, m) = package("[\"/bin/sh\"]");
        let msg = m.resolve_command(dir.path()).unwrap_err().to_string();
        assert!(msg.contains("is an absolute path"), "{msg}");

        let outside = tempfile::tempdir().unwrap();
        write_exe(&outside.path().join("tool"), 0o755);
        let (dir, m) = package("[\"./link\"]");
        std::os::unix::fs::symlink(outside.path().join("tool"), dir.path().join("link")).unwrap();
        let msg = m.resolve_command(dir.path()).unwrap_err().to_string();
        assert!(
            msg.contains("is a link that leads out of the package folder"),
            "{msg}"
        );
    }

    #[test]
    fn a_bare_name_is_looked_up_on_path() {
        let (dir, m) = package("[\"sh\", \"-c\", \"true\"]");
        let r = m.resolve_command(dir.path()).unwrap();
        assert!(
            r.program.is_absolute() && r.program.ends_with("sh"),
            "{r:?}"
        );

        let (dir, m) = package("[\"conduit-no-such-program-here\"]");
        let msg = m.resolve_command(dir.path()).unwrap_err().to_string();
        assert!(msg.contains("was not found on PATH"), "{msg}");
    }
}

#[test]
fn limits_are_asks_in_the_limits_own_units_and_bounds() {
    let m = parse(&format!(
        "{GOOD}\n[limits]\nmemory = \"256MiB\"\ncpu = 0.5\ntasks = 32\nopen_files = 16\n"
    ))
    .unwrap();
    assert_eq!(m.limits.memory, Some(256 << 20));
    assert_eq!(m.limits.cpu, Some(0.5));
    assert_eq!((m.limits.tasks, m.limits.open_files), (Some(32), Some(16)));
    let bytes = parse(&format!("{GOOD}\n[limits]\nmemory = 16777216\n")).unwrap();
    assert_eq!(bytes.limits.memory, Some(16 << 20));
    let msg = refused(
        &format!("{GOOD}\n[limits]\nopen_files = 15\n"),
        "limits.open_files",
        "below the least, 16",
    );
    assert!(msg.contains("16 to 1048576"), "{msg}");
    refused(
        &format!("{GOOD}\n[limits]\nmemory = \"lots\"\n"),
        "limits.memory",
        "not a size",
    );
    refused(
        &format!("{GOOD}\n[limits]\ncpu = true\n"),
        "limits.cpu",
        "must be a number",
    );
    let e = parse(&format!("{GOOD}\n[limits]\ndisk = 1\n")).unwrap_err();
    assert_eq!(e.field().as_deref(), Some("limits.disk"));
}

#[test]
fn sandbox_paths_are_absolute_or_under_home_and_the_sandbox_cannot_be_turned_off() {
    let m = parse(&format!(
        "{GOOD}\n[sandbox]\nread = [\"~/.config/notes\", \"/srv/notes\"]\nwrite = [\"/var/cache/notes\"]\n"
    ))
    .unwrap();
    let (read, write) = m.sandbox.expand(Some(Path::new("/home/op")));
    assert_eq!(
        read,
        [
            PathBuf::from("/home/op/.config/notes"),
            PathBuf::from("/srv/notes")
        ]
    );
    assert_eq!(write, [PathBuf::from("/var/cache/notes")]);
    for bad in ["relative/path", "~/../etc", "/srv/../etc", "~/"] {
        refused(
            &format!("{GOOD}\n[sandbox]\nread = [\"{bad}\"]\n"),
            "sandbox.read[0]",
            "not an absolute path",
        );
    }
    let msg = refused(&with("sandbox", "\"off\""), "sandbox", "must be a table");
    assert!(msg.contains("only the operator can"), "{msg}");
}

#[test]
fn the_dev_table_says_how_to_build_and_what_to_ignore() {
    use super::{MAX_DEV_BUILD_BYTES, MAX_DEV_IGNORE};
    assert!(parse(GOOD).unwrap().dev.is_empty());
    let table = |body: &str| format!("{GOOD}\n[dev]\n{body}\n");
    let m = parse(&table(
        "build = \"cargo build --release\"\nignore = [\"dist\"]",
    ))
    .unwrap();
    assert_eq!(m.dev.build.as_deref(), Some("cargo build --release"));
    assert_eq!(m.dev.ignore, vec!["dist".to_owned()]);
    // The build at its edge: the most bytes taken, one more refused.
    let long = |n: usize| table(&format!("build = \"{}\"", "x".repeat(n)));
    assert!(parse(&long(MAX_DEV_BUILD_BYTES)).is_ok());
    refused(
        &long(MAX_DEV_BUILD_BYTES + 1),
        "dev.build",
        "more than the most, 4096",
    );
    refused(&table("build = \"  \""), "dev.build", "is empty");
    refused(
        &table("build = [\"cargo\"]"),
        "dev.build",
        "must be a string",
    );
    // The ignore list at its edge.
    let names = |n: usize| {
        let list: Vec<String> = (0..n).map(|i| format!("\"d{i}\"")).collect();
        table(&format!("ignore = [{}]", list.join(", ")))
    };
    assert_eq!(
        parse(&names(MAX_DEV_IGNORE)).unwrap().dev.ignore.len(),
        MAX_DEV_IGNORE
    );
    refused(
        &names(MAX_DEV_IGNORE + 1),
        "dev.ignore",
        "more than the most",
    );
    refused(
        &table("ignore = [\"a/b\"]"),
        "dev.ignore[0]",
        "not a file or folder name",
    );
    refused(&table("ignore = [\"..\"]"), "dev.ignore[0]", "not a file");
    refused(&table("ignore = \"dist\""), "dev.ignore", "must be a list");
    refused(&table("watch = []"), "dev.watch", "build, ignore");
    refused(&with("dev", "true"), "dev", "must be a table");
}

#[test]
fn the_lifecycle_asks_when_it_starts_and_when_an_idle_run_stops() {
    use conduit_supervisor::lifecycle::{IDLE_STOP_MAX, IDLE_STOP_MIN, StartMode};
    use std::time::Duration;
    let m = parse(GOOD).unwrap();
    assert_eq!(m.lifecycle, conduit_supervisor::Lifecycle::default());
    let table = |body: &str| format!("{GOOD}\n[lifecycle]\n{body}\n");
    let m = parse(&table("start = \"on-demand\"\nidle_stop_after = \"10m\"")).unwrap();
    assert_eq!(m.lifecycle.start, StartMode::OnDemand);
    assert_eq!(m.lifecycle.idle_stop_after, Some(Duration::from_secs(600)));
    // At its edges: 1s and 30d are taken, a millisecond less or a day more are not.
    let idle = |v: &str| parse(&table(&format!("idle_stop_after = \"{v}\"")));
    assert_eq!(
        idle("1s").unwrap().lifecycle.idle_stop_after,
        Some(IDLE_STOP_MIN)
    );
    assert_eq!(
        idle("30d").unwrap().lifecycle.idle_stop_after,
        Some(IDLE_STOP_MAX)
    );
    assert_eq!(idle("off").unwrap().lifecycle.idle_stop_after, None);
    refused(
        &table("idle_stop_after = \"999ms\""),
        "lifecycle.idle_stop_after",
        "below the least, 1s",
    );
    refused(
        &table("idle_stop_after = \"31d\""),
        "lifecycle.idle_stop_after",
        "above the most, 30d",
    );
    refused(
        &table("idle_stop_after = 600"),
        "lifecycle.idle_stop_after",
        "must be a string, not an integer",
    );
    refused(
        &table("start = \"sometimes\""),
        "lifecycle.start",
        "\"on-demand\"",
    );
    refused(
        &table("stop = \"never\""),
        "lifecycle.stop",
        "start, idle_stop_after",
    );
    refused(
        &with("lifecycle", "\"on-demand\""),
        "lifecycle",
        "must be a table",
    );
}
