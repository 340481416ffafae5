//! The operator's retention settings: the `[retention]` table of `<state>/settings.toml`, what
//! each key means, its default, its bounds, and the one parser of its values.
//!
//! ```toml
//! [retention]
//! interval = "10m"             # how often the daemon sweeps
//! [retention.artifacts]
//! max_age = "30d"              # content no live record needs, unused this long, is removed
//! max_bytes = "2GiB"           # past this, the oldest such content goes first
//! grace = "1h"                 # content stored or mentioned this recently always stays
//! [retention.logs]
//! max_age = "30d"              # logs of earlier runs and removed packages, by age
//! max_bytes = "256MiB"         # and by the size of logs/
//! ```
//!
//! `conduit config set retention.KEY=VALUE` writes it (`packages::settings` owns the file);
//! every key and value, from the command line or written by hand, goes through [`KEYS`] and
//! [`parse`], so both are refused with the same message naming the key, the form it takes and
//! an example.
//!
//! Invariant: a [`RetentionSettings`] holds only values that passed [`parse`]; what it does not
//! hold is the key's default.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use conduit_supervisor::limits::parse_bytes;
use serde::Serialize;

/// The table's name in `settings.toml`, and the prefix of every key `conduit config` takes. No
/// package may take this name (the manifest's name rule reserves it).
pub const TABLE: &str = "retention";

/// The sub-tables of `[retention]`: the first part of a two-part key.
const SECTIONS: [&str; 2] = ["artifacts", "logs"];

const SECOND: u64 = 1;
const MINUTE: u64 = 60;
const HOUR: u64 = 3600;
const DAY: u64 = 86_400;
const WEEK: u64 = 7 * DAY;

/// What a key takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// A whole number of s, m, h, d or w, from `min` to `max` seconds.
    Duration { min: u64, max: u64 },
    /// A size, `256MiB`, `2GiB`, `500MB` or bytes, up to `max`.
    Bytes { max: u64 },
}

/// One retention setting.
#[derive(Clone, Copy, Debug)]
pub struct Key {
    /// Its name under `retention.` (`artifacts.max_age`).
    pub name: &'static str,
    /// What it decides, for `--help` and `config show`.
    pub what: &'static str,
    form: Form,
    default: Value,
}

/// A setting's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value {
    Duration(Duration),
    Bytes(u64),
}

impl fmt::Display for Value {
    /// The form the file and `config show` write: `30d`, `10m`, `2GiB`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Duration(d) => f.write_str(&format_duration(*d)),
            Value::Bytes(b) => f.write_str(&format_size(*b)),
        }
    }
}

const TIB: u64 = 1 << 40;

/// Every retention setting, with its default, bounds and meaning. The defaults keep a year of
/// normal use on a small disk (docs/operations.md, "Retention", says why these).
pub const KEYS: &[Key] = &[
    Key {
        name: "interval",
        what: "how often the running daemon sweeps (`conduit gc` sweeps now)",
        form: Form::Duration {
            min: SECOND,
            max: DAY,
        },
        default: Value::Duration(Duration::from_secs(10 * MINUTE)),
    },
    Key {
        name: "artifacts.max_age",
        what: "artifact content no live record needs is removed once nothing stored, mentioned or needed it for this long",
        form: Form::Duration {
            min: SECOND,
            max: 36_500 * DAY,
        },
        default: Value::Duration(Duration::from_secs(30 * DAY)),
    },
    Key {
        name: "artifacts.max_bytes",
        what: "the budget of kept artifact content: past it, content no live record needs goes, oldest first",
        form: Form::Bytes { max: 1024 * TIB },
        default: Value::Bytes(2 << 30),
    },
    Key {
        name: "artifacts.grace",
        what: "artifact content stored or mentioned this recently is never removed, whatever the budget",
        form: Form::Duration { min: 0, max: WEEK },
        default: Value::Duration(Duration::from_secs(HOUR)),
    },
    Key {
        name: "logs.max_age",
        what: "logs of earlier runs (`<name>.log.1`) and of removed packages are removed once unchanged this long",
        form: Form::Duration {
            min: SECOND,
            max: 36_500 * DAY,
        },
        default: Value::Duration(Duration::from_secs(30 * DAY)),
    },
    Key {
        name: "logs.max_bytes",
        what: "the budget of logs/: past it, those logs go, oldest first (a package's current log is never removed)",
        form: Form::Bytes { max: 1024 * TIB },
        default: Value::Bytes(256 << 20),
    },
];

/// Why a retention setting cannot be used.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    #[error("unknown setting `{key}`; the settings are {}", all_keys())]
    UnknownKey { key: String },
    #[error("`{key}` cannot be {value:?}: {problem}; e.g. `conduit config set {key}={example}`")]
    BadValue {
        key: String,
        value: String,
        problem: String,
        example: String,
    },
}

fn all_keys() -> String {
    KEYS.iter()
        .map(|k| format!("{TABLE}.{}", k.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The key named `full` (`retention.artifacts.max_age`), or why there is none.
pub fn key(full: &str) -> Result<&'static Key, SettingError> {
    full.strip_prefix(TABLE)
        .and_then(|rest| rest.strip_prefix('.'))
        .and_then(|short| KEYS.iter().find(|k| k.name == short))
        .ok_or_else(|| SettingError::UnknownKey {
            key: full.to_owned(),
        })
}

impl Key {
    /// Its full name, `retention.<name>`.
    pub fn full_name(&self) -> String {
        format!("{TABLE}.{}", self.name)
    }

    /// Its default value.
    pub fn default_value(&self) -> Value {
        self.default
    }

    /// The form it takes and its bounds, in words.
    pub fn accepts(&self) -> String {
        match self.form {
            Form::Duration { min, max } => format!(
                "a whole number and a unit (s, m, h, d or w), {} to {}",
                format_duration(Duration::from_secs(min)),
                format_duration(Duration::from_secs(max))
            ),
            Form::Bytes { max } => format!(
                "a size such as 512MiB, 2GiB or 500MB (or a number of bytes), 0 to {}",
                format_size(max)
            ),
        }
    }

    /// Reads `text` as this key's value: the one parser of every retention value.
    pub fn parse(&self, text: &str) -> Result<Value, SettingError> {
        let bad = |problem: String| SettingError::BadValue {
            key: self.full_name(),
            value: text.to_owned(),
            problem,
            example: self.default.to_string(),
        };
        match self.form {
            Form::Duration { min, max } => {
                let d = parse_duration(text).ok_or_else(|| bad(self.accepts()))?;
                if d.as_secs() < min || d.as_secs() > max {
                    return Err(bad(format!("out of range: {}", self.accepts())));
                }
                Ok(Value::Duration(d))
            }
            Form::Bytes { max } => {
                let n = parse_bytes(text).ok_or_else(|| bad(self.accepts()))?;
                if n > max {
                    return Err(bad(format!("out of range: {}", self.accepts())));
                }
                Ok(Value::Bytes(n))
            }
        }
    }
}

/// A size as written back to the file: exact, so it reads back the same (`2GiB`, `256MiB`,
/// `400000`).
pub fn format_size(n: u64) -> String {
    for (unit, size) in [
        ("TiB", TIB),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ] {
        if n >= size && n.is_multiple_of(size) {
            return format!("{}{unit}", n / size);
        }
    }
    n.to_string()
}

/// `30d`, `12h`, `10m`, `90s`, `2w`: a whole number and a unit.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit())?;
    let (num, unit) = (&t[..split], t[split..].trim());
    let n: u64 = num.parse().ok()?;
    let unit = match unit {
        "s" => SECOND,
        "m" => MINUTE,
        "h" => HOUR,
        "d" => DAY,
        "w" => WEEK,
        _ => return None,
    };
    n.checked_mul(unit).map(Duration::from_secs)
}

/// A duration in the largest unit that holds it exactly, up to days: `30d`, `14d`, `90s`, `0s`
/// (weeks are read, but written as days, as most people write them).
pub fn format_duration(d: Duration) -> String {
    let s = d.as_secs();
    for (unit, size) in [("d", DAY), ("h", HOUR), ("m", MINUTE)] {
        if s >= size && s.is_multiple_of(size) {
            return format!("{}{unit}", s / size);
        }
    }
    format!("{s}s")
}

/// What the operator set, by key; a key not set takes its default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetentionSettings {
    set: BTreeMap<&'static str, Value>,
}

/// Artifact content's limits, resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ArtifactLimits {
    #[serde(serialize_with = "secs")]
    pub max_age: Duration,
    pub max_bytes: u64,
    #[serde(serialize_with = "secs")]
    pub grace: Duration,
}

/// The logs' limits, resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LogLimits {
    #[serde(serialize_with = "secs")]
    pub max_age: Duration,
    pub max_bytes: u64,
}

/// Every retention setting in force (the operator's, else the default).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Retention {
    #[serde(serialize_with = "secs")]
    pub interval: Duration,
    pub artifacts: ArtifactLimits,
    pub logs: LogLimits,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_secs())
}

impl Default for Retention {
    fn default() -> Self {
        RetentionSettings::default().resolved()
    }
}

/// One setting as `config show` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Entry {
    pub key: String,
    pub value: String,
    pub default: String,
    /// `operator` (set in settings.toml) or `default`.
    pub source: &'static str,
    pub what: &'static str,
}

impl RetentionSettings {
    /// Sets `full_key` to `value` (`default` unsets it); nothing changes on an error.
    pub fn apply(&mut self, full_key: &str, value: &str) -> Result<(), SettingError> {
        let k = key(full_key)?;
        if value == "default" {
            self.set.remove(k.name);
            return Ok(());
        }
        let v = k.parse(value)?;
        self.set.insert(k.name, v);
        Ok(())
    }

    /// Back to the default for `full_key`.
    pub fn unset(&mut self, full_key: &str) -> Result<(), SettingError> {
        let k = key(full_key)?;
        self.set.remove(k.name);
        Ok(())
    }

    fn get(&self, name: &str) -> Value {
        self.set.get(name).copied().unwrap_or_else(|| {
            KEYS.iter()
                .find(|k| k.name == name)
                .map(|k| k.default)
                .expect("every name asked for is in KEYS")
        })
    }

    fn duration(&self, name: &str) -> Duration {
        match self.get(name) {
            Value::Duration(d) => d,
            Value::Bytes(_) => unreachable!("`{name}` is a duration in KEYS"),
        }
    }

    fn bytes(&self, name: &str) -> u64 {
        match self.get(name) {
            Value::Bytes(b) => b,
            Value::Duration(_) => unreachable!("`{name}` is a size in KEYS"),
        }
    }

    /// Every setting in force.
    pub fn resolved(&self) -> Retention {
        Retention {
            interval: self.duration("interval"),
            artifacts: ArtifactLimits {
                max_age: self.duration("artifacts.max_age"),
                max_bytes: self.bytes("artifacts.max_bytes"),
                grace: self.duration("artifacts.grace"),
            },
            logs: LogLimits {
                max_age: self.duration("logs.max_age"),
                max_bytes: self.bytes("logs.max_bytes"),
            },
        }
    }

    /// Every key with its value in force, its default and where the value comes from.
    pub fn entries(&self) -> Vec<Entry> {
        KEYS.iter()
            .map(|k| Entry {
                key: k.full_name(),
                value: self.get(k.name).to_string(),
                default: k.default.to_string(),
                source: if self.set.contains_key(k.name) {
                    "operator"
                } else {
                    "default"
                },
                what: k.what,
            })
            .collect()
    }

    /// Reads the `[retention]` table as written by hand or by [`RetentionSettings::to_table`]:
    /// `interval`, `[retention.artifacts]`, `[retention.logs]`. The error names the key and
    /// what it takes.
    pub fn from_table(t: &toml::Table) -> Result<RetentionSettings, String> {
        let mut out = RetentionSettings::default();
        let mut visit = |prefix: &str, t: &toml::Table| -> Result<(), String> {
            for (k, v) in t {
                let name = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                let full = format!("{TABLE}.{name}");
                if prefix.is_empty() && SECTIONS.contains(&k.as_str()) {
                    if v.is_table() {
                        continue; // read below
                    }
                    return Err(format!("`{full}` must be a table ([{full}]) of settings"));
                }
                if v.is_table() {
                    return Err(format!(
                        "`{full}` is not a setting; the settings are {}",
                        all_keys()
                    ));
                }
                let text = match v {
                    toml::Value::String(s) => s.clone(),
                    toml::Value::Integer(i) => i.to_string(),
                    other => other.to_string(),
                };
                out.apply(&full, &text).map_err(|e| e.to_string())?;
            }
            Ok(())
        };
        visit("", t)?;
        for section in SECTIONS {
            if let Some(toml::Value::Table(sub)) = t.get(section) {
                visit(section, sub)?;
            }
        }
        Ok(out)
    }

    /// The `[retention]` table holding what the operator set; `None` when nothing is.
    pub fn to_table(&self) -> Option<toml::Table> {
        if self.set.is_empty() {
            return None;
        }
        let mut t = toml::Table::new();
        for (name, v) in &self.set {
            let (section, key) = match name.split_once('.') {
                Some((s, k)) => (Some(s), k),
                None => (None, *name),
            };
            let slot = match section {
                None => &mut t,
                Some(s) => t
                    .entry(s)
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                    .as_table_mut()
                    .expect("sections are tables"),
            };
            slot.insert(key.to_owned(), toml::Value::String(v.to_string()));
        }
        Some(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_package_can_take_the_tables_name() {
        assert!(crate::manifest::RESERVED_NAMES.contains(&TABLE));
    }

    #[test]
    fn the_defaults_are_documented_and_within_their_own_bounds() {
        let r = Retention::default();
        assert_eq!(r.interval, Duration::from_secs(600));
        assert_eq!(r.artifacts.max_age, Duration::from_secs(30 * DAY));
        assert_eq!(r.artifacts.max_bytes, 2 << 30);
        assert_eq!(r.artifacts.grace, Duration::from_secs(3600));
        assert_eq!(r.logs.max_bytes, 256 << 20);
        for k in KEYS {
            assert_eq!(
                k.parse(&k.default.to_string()).unwrap(),
                k.default,
                "{}",
                k.name
            );
        }
        // Sizes are written back exactly, so a round trip through the file changes nothing.
        for (n, text) in [
            (400_000, "400000"),
            (2 << 30, "2GiB"),
            (1536, "1536"),
            (0, "0"),
        ] {
            assert_eq!(format_size(n), text);
            assert_eq!(parse_bytes(text), Some(n));
        }
    }

    #[test]
    fn values_are_taken_at_their_bounds_and_refused_one_past_them() {
        let mut s = RetentionSettings::default();
        s.apply("retention.interval", "1s").unwrap();
        s.apply("retention.interval", "1d").unwrap();
        s.apply("retention.interval", "86400s").unwrap();
        let e = s.apply("retention.interval", "86401s").unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
        let e = s.apply("retention.interval", "0s").unwrap_err();
        assert!(e.to_string().contains("1s to 1d"), "{e}");
        s.apply("retention.artifacts.grace", "0s").unwrap();
        s.apply("retention.artifacts.grace", "1w").unwrap();
        assert!(s.apply("retention.artifacts.grace", "8d").is_err());
        s.apply("retention.artifacts.max_bytes", "0").unwrap();
        s.apply("retention.artifacts.max_bytes", "1024TiB").unwrap();
        let e = s
            .apply("retention.artifacts.max_bytes", "1025TiB")
            .unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
    }

    #[test]
    fn a_bad_value_names_the_key_the_form_and_an_example() {
        let mut s = RetentionSettings::default();
        let e = s
            .apply("retention.artifacts.max_age", "30x")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "`retention.artifacts.max_age` cannot be \"30x\": a whole number and a unit (s, m, h, d or w), 1s to 36500d; e.g. `conduit config set retention.artifacts.max_age=30d`"
        );
        let e = s
            .apply("retention.logs.max_bytes", "lots")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`retention.logs.max_bytes`")
                && e.contains("512MiB")
                && e.contains("retention.logs.max_bytes=256MiB"),
            "{e}"
        );
        let e = s
            .apply("retention.artifacts.size", "1")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("unknown setting `retention.artifacts.size`; the settings are retention.interval, retention.artifacts.max_age"),
            "{e}"
        );
        assert!(s.apply("interval", "1m").is_err(), "the prefix is needed");
        assert_eq!(s, RetentionSettings::default(), "nothing changed");
        for bad in ["", "d", "1.5d", "-1d", "1 day", "10", "1y"] {
            assert!(parse_duration(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn settings_round_trip_through_the_table_and_default_unsets() {
        let mut s = RetentionSettings::default();
        s.apply("retention.interval", "5m").unwrap();
        s.apply("retention.artifacts.max_bytes", "10GiB").unwrap();
        s.apply("retention.logs.max_age", "14d").unwrap();
        let t = s.to_table().unwrap();
        let text = toml::to_string(&toml::Table::from_iter([(
            TABLE.to_owned(),
            toml::Value::Table(t.clone()),
        )]))
        .unwrap();
        assert!(text.contains("[retention.artifacts]"), "{text}");
        assert_eq!(RetentionSettings::from_table(&t).unwrap(), s);
        let r = s.resolved();
        assert_eq!(r.interval, Duration::from_secs(300));
        assert_eq!(r.artifacts.max_bytes, 10 << 30);
        assert_eq!(r.artifacts.max_age, Duration::from_secs(30 * DAY));
        let shown = s.entries();
        assert_eq!(shown.len(), KEYS.len());
        assert_eq!(
            (shown[0].value.as_str(), shown[0].source),
            ("5m", "operator")
        );
        s.apply("retention.interval", "default").unwrap();
        s.unset("retention.artifacts.max_bytes").unwrap();
        s.unset("retention.logs.max_age").unwrap();
        assert_eq!(s.to_table(), None);
        // Hand-written: integers for sizes, and a key that does not exist.
        let t: toml::Table = "interval = \"1h\"\n[artifacts]\nmax_bytes = 1048576\n"
            .parse()
            .unwrap();
        assert_eq!(
            RetentionSettings::from_table(&t)
                .unwrap()
                .resolved()
                .artifacts
                .max_bytes,
            1 << 20
        );
        let t: toml::Table = "[artifacts]\nkeep = \"1d\"\n".parse().unwrap();
        let e = RetentionSettings::from_table(&t).unwrap_err();
        assert!(
            e.starts_with("unknown setting `retention.artifacts.keep`"),
            "{e}"
        );
        let t: toml::Table = "logs = 3\n".parse().unwrap();
        assert!(
            RetentionSettings::from_table(&t)
                .unwrap_err()
                .contains("must be a table")
        );
    }
}
