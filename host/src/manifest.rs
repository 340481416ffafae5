//! The package manifest, `conduit-extension.toml`: reading it, validating it, and turning its
//! `command` into a program the host can spawn.
//!
//! ```toml
//! name = "notes"             # required; 1–63 chars, [a-z0-9][a-z0-9-]*
//! version = "0.1.0"          # required; MAJOR.MINOR.PATCH with an optional -prerelease
//! protocol = 1               # required; an integer or a list of integers
//! command = ["./conduit-notes", "--flag"]   # required; a non-empty argv
//! description = "..."        # optional, at most 200 characters
//! [capabilities]             # optional; the shape of `conduit_protocol::Capabilities`
//! work_kinds = [{ name = "triage", trigger = true }]
//! methods = ["echo", "check.sleep"]
//! [limits]                   # optional; asks, the operator decides (docs/operations.md)
//! memory = "256MiB"          # bytes, or a size with a unit; also cpu, tasks, open_files
//! [sandbox]                  # optional; paths beyond the defaults, granted by the operator
//! read = ["~/.config/notes"] # absolute, or under the home folder with `~/`
//! write = ["/var/cache/notes"]
//! ```
//!
//! Unlike the wire types, which ignore unknown fields so the protocol can grow, the manifest
//! refuses unknown keys: it is written by hand, and a misspelt key silently ignored would be a
//! capability the operator believes is declared but is not.
//!
//! Invariant: a [`Manifest`] value has passed every rule below; every [`ManifestError`] names the
//! file, the field, what is wrong and how to fix it. Nothing here spawns or reads beyond the
//! manifest file and the metadata of the program it names.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Component, Path, PathBuf};

use conduit_protocol::Capabilities;
use conduit_protocol::handshake::WorkKind;
use conduit_supervisor::limits::{LimitKey, LimitSet};

/// The manifest's file name inside a package folder.
pub const MANIFEST_FILE: &str = "conduit-extension.toml";

/// The largest manifest accepted, in bytes (64 KiB): a manifest is a few hundred bytes of
/// TOML, and a bigger one is a mistake (or an attempt to make the installer and the checker
/// parse megabytes).
pub const MAX_MANIFEST_BYTES: usize = 64 * 1024;

/// Reads at most one byte more than [`MAX_MANIFEST_BYTES`] of a manifest file, so that a huge
/// one is refused by [`Manifest::parse`] without being read whole.
pub fn read_capped(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_MANIFEST_BYTES as u64 + 1)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The longest package name (it becomes a folder name, a log file name and a label).
pub const MAX_NAME_LEN: usize = 63;

/// The longest description, in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 200;

/// The top-level keys a manifest may have.
pub const TOP_LEVEL_KEYS: &[&str] = &[
    "name",
    "version",
    "protocol",
    "command",
    "description",
    "capabilities",
    "limits",
    "sandbox",
];

/// The keys of `[limits]` (see `conduit_supervisor::limits`).
pub const LIMIT_KEYS: &[&str] = &["memory", "cpu", "tasks", "open_files"];

/// The keys of `[sandbox]`.
pub const SANDBOX_KEYS: &[&str] = &["read", "write"];

/// The keys of `[capabilities]`.
pub const CAPABILITY_KEYS: &[&str] = &[
    "work_kinds",
    "recurrences",
    "dependency_filters",
    "emissions",
    "ingress",
    "methods",
];

/// The keys of one `work_kinds` entry.
pub const WORK_KIND_KEYS: &[&str] = &["name", "trigger"];

/// A validated package manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// The package's name: 1–63 characters of `[a-z0-9-]`, not starting with `-`.
    pub name: String,
    /// `MAJOR.MINOR.PATCH`, optionally `-prerelease`.
    pub version: String,
    /// The protocol versions the package speaks, as written (duplicates refused).
    pub protocol: Vec<u32>,
    /// The argv that starts the extension; never empty.
    pub command: Vec<String>,
    pub description: Option<String>,
    /// What the package declares it serves; the handshake must declare the same.
    pub capabilities: Capabilities,
    /// The limits the package asks for (the operator decides; see
    /// `conduit_supervisor::limits::resolve`).
    pub limits: LimitSet,
    /// Paths beyond the sandbox's defaults the package asks for, as written (`/abs` or `~/rel`).
    pub sandbox: SandboxAsk,
}

/// What a package's `[sandbox]` asks for; nothing is granted until the operator says so.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SandboxAsk {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub write: Vec<String>,
}

impl SandboxAsk {
    pub fn is_empty(&self) -> bool {
        self.read.is_empty() && self.write.is_empty()
    }

    /// The paths, with `~/` taken as under `home`.
    pub fn expand(&self, home: Option<&Path>) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let one = |p: &String| -> Option<PathBuf> {
            match p.strip_prefix("~/") {
                Some(rel) => home.map(|h| h.join(rel)),
                None => Some(PathBuf::from(p)),
            }
        };
        (
            self.read.iter().filter_map(one).collect(),
            self.write.iter().filter_map(one).collect(),
        )
    }
}

/// The program and arguments [`Manifest::resolve_command`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedCommand {
    /// An absolute path to an executable file.
    pub program: PathBuf,
    pub args: Vec<String>,
}

/// Why a manifest could not be used. Each variant names the file, and the field where there is
/// one, so the message alone tells an author where to look.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// The file could not be read (most often: it does not exist).
    #[error("cannot read {}: {source}; {hint}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
        hint: &'static str,
    },
    /// Larger than [`MAX_MANIFEST_BYTES`].
    #[error(
        "{} is larger than {} ({MAX_MANIFEST_BYTES} bytes), the limit for a manifest; a manifest holds only the package's name, version, command and capabilities, so keep other data in files of the package",
        path.display(), human_kib(MAX_MANIFEST_BYTES)
    )]
    TooLarge { path: PathBuf },
    /// Not valid TOML (or not UTF-8).
    #[error("{} is not valid TOML: {message}", path.display())]
    Syntax { path: PathBuf, message: String },
    /// A key the manifest does not know (often a misspelling).
    #[error(
        "{}: unknown key `{key}`{}; the known keys are {}. Check the spelling, or remove it",
        path.display(), in_table(table), known.join(", ")
    )]
    UnknownKey {
        path: PathBuf,
        key: String,
        /// Where the key is (`""` for the top level, `capabilities`, `capabilities.work_kinds[0]`).
        table: String,
        known: &'static [&'static str],
    },
    /// A required field is absent.
    #[error("{}: `{field}` is required: {fix}", path.display())]
    Missing {
        path: PathBuf,
        field: &'static str,
        fix: &'static str,
    },
    /// A field is present but breaks its rule.
    #[error("{}: `{field}` {problem}; {fix}", path.display())]
    Invalid {
        path: PathBuf,
        field: String,
        problem: String,
        fix: String,
    },
    /// `command`'s program cannot be used.
    #[error("{}: `command` program `{program}` {problem}; {fix}", path.display())]
    Command {
        path: PathBuf,
        program: String,
        problem: String,
        fix: String,
    },
}

fn human_kib(n: usize) -> String {
    format!("{} KiB", n / 1024)
}

fn in_table(table: &str) -> String {
    if table.is_empty() {
        String::new()
    } else {
        format!(" in `{table}`")
    }
}

impl ManifestError {
    /// The field the error is about, if it is about one (for `--json` output and tests).
    pub fn field(&self) -> Option<String> {
        match self {
            ManifestError::UnknownKey { key, table, .. } if table.is_empty() => Some(key.clone()),
            ManifestError::UnknownKey { key, table, .. } => Some(format!("{table}.{key}")),
            ManifestError::Missing { field, .. } => Some((*field).to_owned()),
            ManifestError::Invalid { field, .. } => Some(field.clone()),
            ManifestError::Command { .. } => Some("command".to_owned()),
            ManifestError::Read { .. }
            | ManifestError::Syntax { .. }
            | ManifestError::TooLarge { .. } => None,
        }
    }
}

impl Manifest {
    /// Read and validate `dir/conduit-extension.toml`.
    pub fn load(dir: &Path) -> Result<Manifest, ManifestError> {
        let path = dir.join(MANIFEST_FILE);
        let read_err = |source: std::io::Error| {
            let hint = match source.kind() {
                std::io::ErrorKind::NotFound => {
                    "a package is a folder that holds a conduit-extension.toml; check the path"
                }
                std::io::ErrorKind::InvalidData => "the manifest must be UTF-8 text",
                _ => "check the file's permissions",
            };
            ManifestError::Read {
                path: path.clone(),
                source,
                hint,
            }
        };
        let bytes = read_capped(&path).map_err(read_err)?;
        if bytes.len() > MAX_MANIFEST_BYTES {
            return Err(ManifestError::TooLarge { path });
        }
        let text = String::from_utf8(bytes)
            .map_err(|e| read_err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
        Manifest::parse(&text, &path)
    }

    /// Validate manifest text; `path` is only used in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Manifest, ManifestError> {
        if text.len() > MAX_MANIFEST_BYTES {
            return Err(ManifestError::TooLarge {
                path: path.to_owned(),
            });
        }
        let table: toml::Table =
            text.parse()
                .map_err(|e: toml::de::Error| ManifestError::Syntax {
                    path: path.to_owned(),
                    message: e.to_string().trim_end().to_owned(),
                })?;
        let v = Validator { path };
        v.known_keys(&table, "", TOP_LEVEL_KEYS)?;

        let name = v.required_string(&table, "name", "add `name = \"my-package\"`")?;
        v.name(&name)?;
        let version = v.required_string(&table, "version", "add `version = \"0.1.0\"`")?;
        v.version(&version)?;
        let protocol = v.protocol(table.get("protocol"))?;
        let command = v.command(table.get("command"))?;
        let description = match table.get("description") {
            None => None,
            Some(d) => Some(v.description(d)?),
        };
        let capabilities = match table.get("capabilities") {
            None => Capabilities::default(),
            Some(c) => v.capabilities(c)?,
        };
        let limits = match table.get("limits") {
            None => LimitSet::default(),
            Some(l) => v.limits(l)?,
        };
        let sandbox = match table.get("sandbox") {
            None => SandboxAsk::default(),
            Some(sb) => v.sandbox(sb)?,
        };
        Ok(Manifest {
            name,
            version,
            protocol,
            command,
            description,
            capabilities,
            limits,
            sandbox,
        })
    }

    /// The program to spawn and its arguments, for a package in `dir`.
    ///
    /// A program containing `/` is relative to the package folder and must stay inside it (no
    /// absolute path, no `..` that leaves it, no symlink that points out of it); it must be an
    /// executable file. A bare name is looked up on `PATH`.
    pub fn resolve_command(&self, dir: &Path) -> Result<ResolvedCommand, ManifestError> {
        let path = dir.join(MANIFEST_FILE);
        let program = &self.command[0];
        let err = |problem: String, fix: &str| ManifestError::Command {
            path: path.clone(),
            program: program.clone(),
            problem,
            fix: fix.to_owned(),
        };
        let resolved = if program.contains('/') {
            let rel = Path::new(program);
            if rel.is_absolute() {
                return Err(err(
                    "is an absolute path".into(),
                    "name a file inside the package folder (e.g. \"./bin/tool\") or a bare program name looked up on PATH (e.g. \"python3\")",
                ));
            }
            if escapes(rel) {
                return Err(err(
                    "leads out of the package folder".into(),
                    "the program must be a file inside the package folder; remove the `..`",
                ));
            }
            let dir = dir.canonicalize().map_err(|e| {
                err(
                    format!("cannot be looked up: the package folder is unreadable ({e})"),
                    "check the package folder's path and permissions",
                )
            })?;
            let full = dir.join(rel);
            let real = full.canonicalize().map_err(|e| {
                err(
                    format!("does not exist in {} ({e})", dir.display()),
                    "build or copy the program into the package folder, or fix `command`",
                )
            })?;
            if !real.starts_with(&dir) {
                return Err(err(
                    format!(
                        "is a link that leads out of the package folder, to {}",
                        real.display()
                    ),
                    "put the program itself inside the package folder",
                ));
            }
            real
        } else {
            match find_on_path(program) {
                Some(p) => p,
                None => {
                    return Err(err(
                        "was not found on PATH".into(),
                        "install it, or name a file in the package folder with a path such as \"./tool\"",
                    ));
                }
            }
        };
        check_executable(&resolved).map_err(|problem| {
            err(
                problem,
                "make it an executable file (chmod +x), or fix `command`",
            )
        })?;
        Ok(ResolvedCommand {
            program: resolved,
            args: self.command[1..].to_vec(),
        })
    }
}

/// Whether a relative path climbs above its starting folder at any point.
fn escapes(rel: &Path) -> bool {
    let mut depth = 0i32;
    for c in rel.components() {
        match c {
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return true;
                }
            }
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return true,
        }
    }
    false
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .filter(|d| d.is_absolute())
        .map(|d| d.join(program))
        .find(|p| check_executable(p).is_ok())
}

fn check_executable(p: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(p).map_err(|e| format!("cannot be read ({e})"))?;
    if !meta.is_file() {
        return Err(format!("{} is not a file", p.display()));
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(format!("{} is not executable", p.display()));
    }
    Ok(())
}

/// Shared context for the field checks: the path every error names.
struct Validator<'a> {
    path: &'a Path,
}

impl Validator<'_> {
    fn invalid(
        &self,
        field: impl Into<String>,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> ManifestError {
        ManifestError::Invalid {
            path: self.path.to_owned(),
            field: field.into(),
            problem: problem.into(),
            fix: fix.into(),
        }
    }

    fn known_keys(
        &self,
        table: &toml::Table,
        at: &str,
        known: &'static [&'static str],
    ) -> Result<(), ManifestError> {
        match table.keys().find(|k| !known.contains(&k.as_str())) {
            Some(key) => Err(ManifestError::UnknownKey {
                path: self.path.to_owned(),
                key: key.clone(),
                table: at.to_owned(),
                known,
            }),
            None => Ok(()),
        }
    }

    fn required_string(
        &self,
        table: &toml::Table,
        field: &'static str,
        fix: &'static str,
    ) -> Result<String, ManifestError> {
        match table.get(field) {
            None => Err(ManifestError::Missing {
                path: self.path.to_owned(),
                field,
                fix,
            }),
            Some(toml::Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(self.invalid(
                field,
                format!("must be a string, not {}", kind(other)),
                format!("write it in quotes, e.g. {fix}"),
            )),
        }
    }

    fn name(&self, name: &str) -> Result<(), ManifestError> {
        let fix = "use 1 to 63 lowercase letters, digits and `-`, starting with a letter or digit (e.g. \"notes\" or \"mail-triage\")";
        if name.is_empty() {
            return Err(self.invalid("name", "is empty", fix));
        }
        if let Some(c) = name
            .chars()
            .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
        {
            return Err(self.invalid("name", format!("contains {c:?}, which is not allowed"), fix));
        }
        if name.starts_with('-') {
            return Err(self.invalid("name", "starts with `-`", fix));
        }
        // Every character is ASCII by now, so bytes are characters.
        if name.len() > MAX_NAME_LEN {
            return Err(self.invalid(
                "name",
                format!(
                    "is {} characters long, over the limit of {MAX_NAME_LEN}",
                    name.len()
                ),
                fix,
            ));
        }
        Ok(())
    }

    fn version(&self, version: &str) -> Result<(), ManifestError> {
        let fix =
            "use MAJOR.MINOR.PATCH with an optional -prerelease, e.g. \"0.1.0\" or \"1.2.0-rc.1\"";
        match semver_problem(version) {
            None => Ok(()),
            Some(problem) => Err(self.invalid("version", format!("\"{version}\" {problem}"), fix)),
        }
    }

    fn protocol(&self, value: Option<&toml::Value>) -> Result<Vec<u32>, ManifestError> {
        let fix = format!(
            "write the protocol versions the package speaks, e.g. `protocol = {}` or `protocol = [1, 2]`",
            conduit_protocol::PROTOCOL_VERSION
        );
        let one = |v: &toml::Value, field: String| -> Result<u32, ManifestError> {
            match v {
                toml::Value::Integer(n) if *n >= 1 && *n <= i64::from(u32::MAX) => Ok(*n as u32),
                toml::Value::Integer(n) => Err(self.invalid(
                    field,
                    format!("is {n}; protocol versions are whole numbers from 1"),
                    fix.clone(),
                )),
                other => Err(self.invalid(
                    field,
                    format!("must be an integer, not {}", kind(other)),
                    fix.clone(),
                )),
            }
        };
        match value {
            None => Err(ManifestError::Missing {
                path: self.path.to_owned(),
                field: "protocol",
                fix: "add `protocol = 1` (the protocol versions the package speaks)",
            }),
            Some(toml::Value::Array(items)) => {
                if items.is_empty() {
                    return Err(self.invalid("protocol", "is an empty list", fix));
                }
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    let n = one(item, format!("protocol[{i}]"))?;
                    if out.contains(&n) {
                        return Err(self.invalid(
                            format!("protocol[{i}]"),
                            format!("repeats version {n}"),
                            "list each version once",
                        ));
                    }
                    out.push(n);
                }
                Ok(out)
            }
            Some(v) => Ok(vec![one(v, "protocol".into())?]),
        }
    }

    fn command(&self, value: Option<&toml::Value>) -> Result<Vec<String>, ManifestError> {
        let fix = "write the argv that starts the extension, e.g. `command = [\"./conduit-notes\"]` or `command = [\"python3\", \"echo.py\"]`";
        let items = match value {
            None => {
                return Err(ManifestError::Missing {
                    path: self.path.to_owned(),
                    field: "command",
                    fix: "add `command = [\"./my-extension\"]` (the argv that starts the extension)",
                });
            }
            Some(toml::Value::Array(items)) => items,
            Some(toml::Value::String(_)) => {
                return Err(self.invalid(
                    "command",
                    "is a string, but must be a list (an argv; no shell parses it)",
                    fix,
                ));
            }
            Some(other) => {
                return Err(self.invalid(
                    "command",
                    format!("must be a list of strings, not {}", kind(other)),
                    fix,
                ));
            }
        };
        if items.is_empty() {
            return Err(self.invalid("command", "is an empty list", fix));
        }
        let mut argv = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match item {
                toml::Value::String(s) if s.contains('\0') => {
                    return Err(self.invalid(
                        format!("command[{i}]"),
                        "contains a NUL byte",
                        "remove it",
                    ));
                }
                toml::Value::String(s) => argv.push(s.clone()),
                other => {
                    return Err(self.invalid(
                        format!("command[{i}]"),
                        format!("must be a string, not {}", kind(other)),
                        "quote every element of `command`",
                    ));
                }
            }
        }
        if argv[0].is_empty() {
            return Err(self.invalid("command[0]", "is empty", "name the program to run"));
        }
        Ok(argv)
    }

    fn limits(&self, value: &toml::Value) -> Result<LimitSet, ManifestError> {
        let Some(table) = value.as_table() else {
            return Err(self.invalid(
                "limits",
                format!("must be a table, not {}", kind(value)),
                "write `[limits]` with keys memory, cpu, tasks, open_files",
            ));
        };
        self.known_keys(table, "limits", LIMIT_KEYS)?;
        let mut set = LimitSet::default();
        for (k, v) in table {
            let key = LimitKey::from_name(k).expect("known_keys passed");
            let text = match v {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                other => {
                    return Err(self.invalid(
                        format!("limits.{k}"),
                        format!("must be a number or a string, not {}", kind(other)),
                        format!("use {}", key.rule()),
                    ));
                }
            };
            let parsed = conduit_supervisor::limits::parse_value(key, &text).map_err(|e| {
                self.invalid(
                    format!("limits.{k}"),
                    format!("is {text:?}: {}", e.problem),
                    format!("use {}", key.rule()),
                )
            })?;
            set.put(parsed);
        }
        Ok(set)
    }

    fn sandbox(&self, value: &toml::Value) -> Result<SandboxAsk, ManifestError> {
        let Some(table) = value.as_table() else {
            return Err(self.invalid(
                "sandbox",
                format!("must be a table of paths, not {}", kind(value)),
                "a package cannot turn its sandbox off (only the operator can, with `conduit ext set NAME sandbox=off`); declare the paths it needs as `[sandbox]` read = [...] and write = [...]",
            ));
        };
        self.known_keys(table, "sandbox", SANDBOX_KEYS)?;
        let mut ask = SandboxAsk::default();
        for (k, v) in table {
            let field = format!("sandbox.{k}");
            let fix = "list absolute paths or paths under the home folder, e.g. [\"~/.config/notes\", \"/var/cache/notes\"]";
            let Some(items) = v.as_array() else {
                return Err(self.invalid(
                    field,
                    format!("must be a list of paths, not {}", kind(v)),
                    fix,
                ));
            };
            let mut out = Vec::new();
            for (i, item) in items.iter().enumerate() {
                let Some(p) = item.as_str() else {
                    return Err(self.invalid(
                        format!("{field}[{i}]"),
                        format!("must be a string, not {}", kind(item)),
                        fix,
                    ));
                };
                let rel = p.strip_prefix("~/").unwrap_or(p);
                let absolute = p.starts_with('/') || p.starts_with("~/");
                if !absolute
                    || rel.is_empty()
                    || Path::new(rel)
                        .components()
                        .any(|c| c == Component::ParentDir)
                {
                    return Err(self.invalid(
                        format!("{field}[{i}]"),
                        format!(
                            "is {p:?}, which is not an absolute path or one under `~/` without `..`"
                        ),
                        fix,
                    ));
                }
                out.push(p.to_owned());
            }
            if k == "read" {
                ask.read = out;
            } else {
                ask.write = out;
            }
        }
        Ok(ask)
    }

    fn description(&self, value: &toml::Value) -> Result<String, ManifestError> {
        let toml::Value::String(s) = value else {
            return Err(self.invalid(
                "description",
                format!("must be a string, not {}", kind(value)),
                "write it in quotes",
            ));
        };
        let n = s.chars().count();
        if n > MAX_DESCRIPTION_CHARS {
            return Err(self.invalid(
                "description",
                format!("is {n} characters long, over the limit of {MAX_DESCRIPTION_CHARS}"),
                "shorten it to one sentence; put longer text in the package's README",
            ));
        }
        Ok(s.clone())
    }

    fn capabilities(&self, value: &toml::Value) -> Result<Capabilities, ManifestError> {
        let toml::Value::Table(table) = value else {
            return Err(self.invalid(
                "capabilities",
                format!("must be a table, not {}", kind(value)),
                "write it as a `[capabilities]` section",
            ));
        };
        self.known_keys(table, "capabilities", CAPABILITY_KEYS)?;
        let mut caps = Capabilities::default();
        if let Some(v) = table.get("work_kinds") {
            caps.work_kinds = self.work_kinds(v)?;
        }
        for (key, list) in [
            ("recurrences", &mut caps.recurrences),
            ("dependency_filters", &mut caps.dependency_filters),
            ("emissions", &mut caps.emissions),
            ("ingress", &mut caps.ingress),
            ("methods", &mut caps.methods),
        ] {
            if let Some(v) = table.get(key) {
                *list = self.name_list(v, key)?;
            }
        }
        for (i, m) in caps.methods.iter().enumerate() {
            let field = format!("capabilities.methods[{i}]");
            if conduit_protocol::methods::is_reserved(m) {
                let (why, fix) = if m.starts_with("$/") {
                    (
                        format!("\"{m}\" starts with `$/`, which is reserved for notifications"),
                        "rename the method",
                    )
                } else {
                    (
                        format!("\"{m}\" is one of the protocol's own methods"),
                        "declare it through its capability list (work_kinds, recurrences, …), not `methods`; custom names must not reuse protocol names",
                    )
                };
                return Err(self.invalid(field, why, fix));
            }
        }
        Ok(caps)
    }

    fn work_kinds(&self, value: &toml::Value) -> Result<Vec<WorkKind>, ManifestError> {
        let fix = "write `work_kinds = [{ name = \"triage\", trigger = true }]`";
        let toml::Value::Array(items) = value else {
            return Err(self.invalid(
                "capabilities.work_kinds",
                format!("must be a list, not {}", kind(value)),
                fix,
            ));
        };
        let mut out: Vec<WorkKind> = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let at = format!("capabilities.work_kinds[{i}]");
            let toml::Value::Table(t) = item else {
                return Err(self.invalid(at, format!("must be a table, not {}", kind(item)), fix));
            };
            self.known_keys(t, &at, WORK_KIND_KEYS)?;
            let name = match t.get("name") {
                Some(toml::Value::String(s)) if !s.trim().is_empty() => s.clone(),
                Some(toml::Value::String(_)) => {
                    return Err(self.invalid(format!("{at}.name"), "is empty", fix));
                }
                Some(other) => {
                    return Err(self.invalid(
                        format!("{at}.name"),
                        format!("must be a string, not {}", kind(other)),
                        fix,
                    ));
                }
                None => return Err(self.invalid(format!("{at}.name"), "is missing", fix)),
            };
            let trigger = match t.get("trigger") {
                None => false,
                Some(toml::Value::Boolean(b)) => *b,
                Some(other) => {
                    return Err(self.invalid(
                        format!("{at}.trigger"),
                        format!("must be true or false, not {}", kind(other)),
                        fix,
                    ));
                }
            };
            if out.iter().any(|k| k.name == name) {
                return Err(self.invalid(
                    format!("{at}.name"),
                    format!("repeats the work kind \"{name}\""),
                    "declare each work kind once",
                ));
            }
            out.push(WorkKind { name, trigger });
        }
        Ok(out)
    }

    fn name_list(&self, value: &toml::Value, key: &str) -> Result<Vec<String>, ManifestError> {
        let field = format!("capabilities.{key}");
        let fix = format!("write a list of names, e.g. `{key} = [\"name\"]`");
        let toml::Value::Array(items) = value else {
            return Err(self.invalid(
                field,
                format!("must be a list of strings, not {}", kind(value)),
                fix,
            ));
        };
        let mut seen = BTreeSet::new();
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let at = format!("{field}[{i}]");
            match item {
                toml::Value::String(s) if s.trim().is_empty() => {
                    return Err(self.invalid(at, "is empty", fix));
                }
                toml::Value::String(s) if !seen.insert(s.clone()) => {
                    return Err(self.invalid(
                        at,
                        format!("repeats \"{s}\""),
                        "list each name once",
                    ));
                }
                toml::Value::String(s) => out.push(s.clone()),
                other => {
                    return Err(self.invalid(
                        at,
                        format!("must be a string, not {}", kind(other)),
                        fix,
                    ));
                }
            }
        }
        Ok(out)
    }
}

/// What is wrong with a version string, or `None` if it is `MAJOR.MINOR.PATCH[-pre]` as
/// semver defines it (numbers without leading zeros; dot-separated prerelease identifiers of
/// `[0-9A-Za-z-]`, numeric ones without leading zeros). Build metadata (`+…`) is refused: two
/// builds of one version would be indistinguishable to the host.
fn semver_problem(v: &str) -> Option<String> {
    if v.contains('+') {
        return Some("has build metadata (`+…`), which conduit does not accept".into());
    }
    let (core, pre) = match v.split_once('-') {
        Some((c, p)) => (c, Some(p)),
        None => (v, None),
    };
    let parts: Vec<&str> = core.split('.').collect();
    if parts.len() != 3 {
        return Some(format!(
            "has {} dot-separated numbers instead of 3",
            parts.len()
        ));
    }
    for (part, what) in parts.iter().zip(["MAJOR", "MINOR", "PATCH"]) {
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return Some(format!("has {what} \"{part}\", which is not a number"));
        }
        if part.len() > 1 && part.starts_with('0') {
            return Some(format!("has {what} \"{part}\" with a leading zero"));
        }
        if part.parse::<u64>().is_err() {
            return Some(format!("has {what} \"{part}\", which is too large"));
        }
    }
    if let Some(pre) = pre {
        for ident in pre.split('.') {
            if ident.is_empty() {
                return Some("has an empty prerelease identifier".into());
            }
            if !ident
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            {
                return Some(format!(
                    "has prerelease identifier \"{ident}\" with characters other than [0-9A-Za-z-]"
                ));
            }
            if ident.len() > 1
                && ident.starts_with('0')
                && ident.bytes().all(|b| b.is_ascii_digit())
            {
                return Some(format!(
                    "has numeric prerelease identifier \"{ident}\" with a leading zero"
                ));
            }
        }
    }
    None
}

/// A TOML value's kind, for messages ("must be a string, not an integer").
fn kind(v: &toml::Value) -> Kind<'_> {
    Kind(v)
}

struct Kind<'a>(&'a toml::Value);

impl fmt::Display for Kind<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            toml::Value::String(_) => "a string",
            toml::Value::Integer(_) => "an integer",
            toml::Value::Float(_) => "a float",
            toml::Value::Boolean(_) => "a boolean",
            toml::Value::Datetime(_) => "a date-time",
            toml::Value::Array(_) => "a list",
            toml::Value::Table(_) => "a table",
        })
    }
}

#[cfg(test)]
mod tests;
