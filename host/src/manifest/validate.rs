//! The rule of each manifest field, one method of [`Validator`] each (the `[limits]` and
//! `[sandbox]` asks are in `limits.rs`), and the messages' shared pieces.
//!
//! Every check returns a [`ManifestError`] that names the field, what is wrong and how to fix it.

use std::collections::BTreeSet;
use std::fmt;
use std::path::Path;

use conduit_protocol::Capabilities;
use conduit_protocol::handshake::WorkKind;

use super::error::ManifestError;
use super::types::{
    CAPABILITY_KEYS, MAX_DESCRIPTION_CHARS, MAX_NAME_LEN, RESERVED_NAMES, WORK_KIND_KEYS,
};

/// Shared context for the field checks: the path every error names.
pub(super) struct Validator<'a> {
    pub(super) path: &'a Path,
}

impl Validator<'_> {
    pub(super) fn invalid(
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

    pub(super) fn known_keys(
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

    pub(super) fn required_string(
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

    pub(super) fn name(&self, name: &str) -> Result<(), ManifestError> {
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
        if RESERVED_NAMES.contains(&name) {
            return Err(self.invalid(
                "name",
                format!(
                    "\"{name}\" is reserved: settings.toml holds the daemon's own [{name}] table under it"
                ),
                "give the package another name (e.g. \"{name}-tool\")",
            ));
        }
        Ok(())
    }

    pub(super) fn version(&self, version: &str) -> Result<(), ManifestError> {
        let fix =
            "use MAJOR.MINOR.PATCH with an optional -prerelease, e.g. \"0.1.0\" or \"1.2.0-rc.1\"";
        match semver_problem(version) {
            None => Ok(()),
            Some(problem) => Err(self.invalid("version", format!("\"{version}\" {problem}"), fix)),
        }
    }

    pub(super) fn protocol(&self, value: Option<&toml::Value>) -> Result<Vec<u32>, ManifestError> {
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

    pub(super) fn command(
        &self,
        value: Option<&toml::Value>,
    ) -> Result<Vec<String>, ManifestError> {
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

    pub(super) fn description(&self, value: &toml::Value) -> Result<String, ManifestError> {
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

    pub(super) fn capabilities(&self, value: &toml::Value) -> Result<Capabilities, ManifestError> {
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

    pub(super) fn work_kinds(&self, value: &toml::Value) -> Result<Vec<WorkKind>, ManifestError> {
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
            out.push(WorkKind::new(name, trigger));
        }
        Ok(out)
    }

    pub(super) fn name_list(
        &self,
        value: &toml::Value,
        key: &str,
    ) -> Result<Vec<String>, ManifestError> {
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
pub(super) fn semver_problem(v: &str) -> Option<String> {
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
pub(super) fn kind(v: &toml::Value) -> Kind<'_> {
    Kind(v)
}

pub(super) struct Kind<'a>(&'a toml::Value);

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
