//! The operator's settings per package, `<state>/settings.toml`: the limits the operator sets,
//! whether the package's declared sandbox paths are granted, and whether its sandbox is off.
//!
//! ```toml
//! [notes]
//! sandbox = "off"          # "on" (the default) or "off": an operator's choice, never a package's
//! grant = true             # grant the paths the package's [sandbox] declares
//! start = "on-demand"     # "always" or "on-demand": wins over the package's [lifecycle]
//! idle_stop_after = "30s"  # a duration or "off": wins over the package's [lifecycle]
//! [notes.limits]
//! memory = "256MiB"        # as in a manifest's [limits]; these win over the package's asks
//! ```
//!
//! Written by `conduit ext set NAME KEY=VALUE` (aside, then renamed, so a reader never sees half
//! a file) and readable by hand; every value goes through the same parser as the manifest's.
//!
//! The same file holds the daemon's own `[retention]` table (`conduit config set`), whose keys
//! and values are `retention::settings`'s; this module reads and writes the file as a whole,
//! so each writer keeps what the other wrote. No package can be named `retention` (the
//! manifest's name rule), so the table is never taken for a package's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use std::time::Duration;

use conduit_supervisor::Lifecycle;
use conduit_supervisor::lifecycle::{StartMode, format_idle_stop_after, parse_idle_stop_after};
use conduit_supervisor::limits::{LimitKey, LimitSet, LimitValue, format_bytes, parse_value};

use crate::retention::settings::{RetentionSettings, TABLE as RETENTION_TABLE};
use crate::state_dir::StateDir;

/// The file's name in the state directory.
pub const SETTINGS_FILE: &str = "settings.toml";

/// The keys `conduit ext set` takes.
pub const SETTING_KEYS: &[&str] = &[
    "limits.memory",
    "limits.cpu",
    "limits.tasks",
    "limits.open_files",
    "sandbox",
    "sandbox.grant",
    "start",
    "idle_stop_after",
];

/// What the operator decided for one package.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PackageSettings {
    pub limits: LimitSet,
    /// `sandbox = "off"`.
    pub sandbox_off: bool,
    /// The package's declared `[sandbox]` paths are granted.
    pub grant: bool,
    /// When it starts, if the operator said (else the package's `[lifecycle]`).
    pub start: Option<StartMode>,
    /// After how long without calls a run stops (`Some(None)`: never), if the operator said.
    pub idle_stop_after: Option<Option<Duration>>,
}

impl PackageSettings {
    /// The lifecycle in force: the operator's choices where made, else the package's.
    pub fn lifecycle(&self, package: &Lifecycle) -> Lifecycle {
        Lifecycle {
            start: self.start.unwrap_or(package.start),
            idle_stop_after: self.idle_stop_after.unwrap_or(package.idle_stop_after),
        }
    }

    /// A short text that changes whenever the settings do (the daemon restarts a package whose
    /// settings changed).
    pub fn fingerprint(&self) -> String {
        format!("{:?}", self)
    }
}

/// Why the settings file cannot be used or changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SettingsError {
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {problem}; {fix}", path.display())]
    Invalid {
        path: PathBuf,
        problem: String,
        fix: String,
    },
    #[error("unknown setting `{key}`; the settings are {}", SETTING_KEYS.join(", "))]
    UnknownKey { key: String },
    #[error("`{key}` cannot be {value:?}: {problem}")]
    BadValue {
        key: String,
        value: String,
        problem: String,
    },
}

fn path(state: &StateDir) -> PathBuf {
    state.path().join(SETTINGS_FILE)
}

/// Every package's settings (none when the file does not exist).
pub fn load(state: &StateDir) -> Result<BTreeMap<String, PackageSettings>, SettingsError> {
    load_from(&path(state))
}

/// One package's settings.
pub fn for_package(state: &StateDir, name: &str) -> Result<PackageSettings, SettingsError> {
    Ok(load(state)?.remove(name).unwrap_or_default())
}

/// The daemon's retention settings (every default when the file or its table is absent).
pub fn retention(state: &StateDir) -> Result<RetentionSettings, SettingsError> {
    Ok(read(&path(state))?.1)
}

/// Replaces the `[retention]` table with `r`, keeping every package's settings.
pub fn save_retention(state: &StateDir, r: &RetentionSettings) -> Result<(), SettingsError> {
    let p = path(state);
    let (packages, _) = read(&p)?;
    write(&p, &packages, r)
}

fn load_from(p: &Path) -> Result<BTreeMap<String, PackageSettings>, SettingsError> {
    Ok(read(p)?.0)
}

/// The whole file: every package's settings and the retention table.
fn read(p: &Path) -> Result<(BTreeMap<String, PackageSettings>, RetentionSettings), SettingsError> {
    let text = match std::fs::read_to_string(p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok((BTreeMap::new(), RetentionSettings::default()));
        }
        Err(source) => {
            return Err(SettingsError::Io {
                action: "read",
                path: p.to_owned(),
                source,
            });
        }
    };
    let invalid = |problem: String| SettingsError::Invalid {
        path: p.to_owned(),
        problem,
        fix: "fix it by hand or change it with `conduit ext set NAME KEY=VALUE`".into(),
    };
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        invalid(format!("not valid TOML: {}", e.to_string().trim()))
    })?;
    let mut out = BTreeMap::new();
    let mut retention = RetentionSettings::default();
    for (name, v) in table {
        if name == RETENTION_TABLE {
            let t = v.as_table().ok_or_else(|| {
                invalid(format!(
                    "`{RETENTION_TABLE}` must be a table ([{RETENTION_TABLE}]) of settings"
                ))
            })?;
            retention = RetentionSettings::from_table(t).map_err(|problem| SettingsError::Invalid {
                path: p.to_owned(),
                problem,
                fix: "fix it by hand or change it with `conduit config set KEY=VALUE` (`conduit config show` lists the keys)".into(),
            })?;
            continue;
        }
        let t = v
            .as_table()
            .ok_or_else(|| invalid(format!("`{name}` must be a table of settings")))?;
        let mut s = PackageSettings::default();
        for (k, v) in t {
            match (k.as_str(), v) {
                ("sandbox", toml::Value::String(x)) if x == "on" || x == "off" => {
                    s.sandbox_off = x == "off";
                }
                ("grant", toml::Value::Boolean(b)) => s.grant = *b,
                ("start", toml::Value::String(x)) => {
                    s.start = Some(
                        StartMode::parse(x).map_err(|e| invalid(format!("`{name}.start` {e}")))?,
                    );
                }
                ("idle_stop_after", toml::Value::String(x)) => {
                    s.idle_stop_after = Some(
                        parse_idle_stop_after(x)
                            .map_err(|e| invalid(format!("`{name}.idle_stop_after` {e}")))?,
                    );
                }
                ("limits", toml::Value::Table(l)) => {
                    for (lk, lv) in l {
                        let key = LimitKey::from_name(lk).ok_or_else(|| {
                            invalid(format!("`{name}.limits.{lk}` is not a limit (memory, cpu, tasks, open_files)"))
                        })?;
                        let text = match lv {
                            toml::Value::String(x) => x.clone(),
                            toml::Value::Integer(i) => i.to_string(),
                            toml::Value::Float(f) => f.to_string(),
                            other => other.to_string(),
                        };
                        let value = parse_value(key, &text)
                            .map_err(|e| invalid(format!("`{name}.limits.{lk}`: {e}")))?;
                        s.limits.put(value);
                    }
                }
                _ => {
                    return Err(invalid(format!(
                        "`{name}.{k}` is not a setting (sandbox = \"on\"|\"off\", grant = true|false, start = \"always\"|\"on-demand\", idle_stop_after = \"10m\"|\"off\", [{name}.limits])"
                    )));
                }
            }
        }
        out.insert(name, s);
    }
    Ok((out, retention))
}

/// Writes the whole file aside, then renames it into place.
fn write(
    p: &Path,
    all: &BTreeMap<String, PackageSettings>,
    retention: &RetentionSettings,
) -> Result<(), SettingsError> {
    let io = |action, source| SettingsError::Io {
        action,
        path: p.to_owned(),
        source,
    };
    let tmp = p.with_extension("toml.tmp");
    std::fs::write(&tmp, render(all, retention)).map_err(|e| io("write", e))?;
    std::fs::rename(&tmp, p).map_err(|e| io("replace", e))
}

fn render(all: &BTreeMap<String, PackageSettings>, retention: &RetentionSettings) -> String {
    let mut out = String::from(
        "# The operator's settings per package; `conduit ext set NAME KEY=VALUE` changes them.\n",
    );
    for (name, s) in all {
        if s == &PackageSettings::default() {
            continue;
        }
        out.push_str(&format!("\n[{name}]\n"));
        if s.sandbox_off {
            out.push_str("sandbox = \"off\"\n");
        }
        if s.grant {
            out.push_str("grant = true\n");
        }
        if let Some(m) = s.start {
            out.push_str(&format!("start = \"{m}\"\n"));
        }
        if let Some(d) = s.idle_stop_after {
            out.push_str(&format!(
                "idle_stop_after = \"{}\"\n",
                format_idle_stop_after(d)
            ));
        }
        if !s.limits.is_empty() {
            out.push_str(&format!("[{name}.limits]\n"));
            for key in LimitKey::ALL {
                match s.limits.get(key) {
                    Some(LimitValue::Memory(b)) => out.push_str(&format!(
                        "memory = \"{}\"\n",
                        format_bytes(b).replace(' ', "")
                    )),
                    Some(LimitValue::Cpu(c)) => out.push_str(&format!("cpu = {c:?}\n")),
                    Some(LimitValue::Tasks(n)) => out.push_str(&format!("tasks = {n}\n")),
                    Some(LimitValue::OpenFiles(n)) => out.push_str(&format!("open_files = {n}\n")),
                    None => {}
                }
            }
        }
    }
    if let Some(t) = retention.to_table() {
        let doc = toml::Table::from_iter([(RETENTION_TABLE.to_owned(), toml::Value::Table(t))]);
        out.push_str(
            "\n# The daemon's retention; `conduit config set retention.KEY=VALUE` changes it.\n",
        );
        // A table of strings and tables of strings always serialises.
        out.push_str(&toml::to_string(&doc).unwrap_or_default());
    }
    out
}

/// Apply `key=value` to `s`. `default` clears a limit, `start` or `idle_stop_after` (back to
/// the package's); `sandbox` takes `on`/`off`; `sandbox.grant` takes `yes`/`no`; `start` takes
/// `always`/`on-demand`; `idle_stop_after` a duration (`30s`, `10m`) or `off`.
pub fn apply(s: &mut PackageSettings, key: &str, value: &str) -> Result<(), SettingsError> {
    let bad = |problem: &str| SettingsError::BadValue {
        key: key.to_owned(),
        value: value.to_owned(),
        problem: problem.to_owned(),
    };
    match key {
        "sandbox" => match value {
            "on" => s.sandbox_off = false,
            "off" => s.sandbox_off = true,
            _ => return Err(bad("use `on` or `off`")),
        },
        "sandbox.grant" => match value {
            "yes" | "true" => s.grant = true,
            "no" | "false" => s.grant = false,
            _ => return Err(bad("use `yes` or `no`")),
        },
        "start" if value == "default" => s.start = None,
        "start" => {
            s.start = Some(StartMode::parse(value).map_err(|e| bad(&e))?);
        }
        "idle_stop_after" if value == "default" => s.idle_stop_after = None,
        "idle_stop_after" => {
            s.idle_stop_after = Some(parse_idle_stop_after(value).map_err(|e| bad(&e))?);
        }
        _ => {
            let key_name = key.strip_prefix("limits.").unwrap_or("");
            let Some(lk) = LimitKey::from_name(key_name) else {
                return Err(SettingsError::UnknownKey {
                    key: key.to_owned(),
                });
            };
            if value == "default" {
                s.limits.clear(lk);
            } else {
                let v = parse_value(lk, value).map_err(|e| bad(&e.to_string()))?;
                s.limits.put(v);
            }
        }
    }
    Ok(())
}

/// Set `key=value` for package `name` and write the file; returns the package's new settings.
pub fn set(
    state: &StateDir,
    name: &str,
    key: &str,
    value: &str,
) -> Result<PackageSettings, SettingsError> {
    let p = path(state);
    let (mut all, retention) = read(&p)?;
    let mut s = all.remove(name).unwrap_or_default();
    apply(&mut s, key, value)?;
    all.insert(name.to_owned(), s.clone());
    write(&p, &all, &retention)?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip_through_the_file_and_hand_written_sizes_parse() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(SETTINGS_FILE);
        let mut all = BTreeMap::new();
        let mut s = PackageSettings::default();
        apply(&mut s, "limits.memory", "256MiB").unwrap();
        apply(&mut s, "limits.cpu", "0.5").unwrap();
        apply(&mut s, "sandbox", "off").unwrap();
        apply(&mut s, "sandbox.grant", "yes").unwrap();
        all.insert("notes".to_owned(), s.clone());
        std::fs::write(&p, render(&all, &RetentionSettings::default())).unwrap();
        assert_eq!(load_from(&p).unwrap(), all);
        std::fs::write(&p, "[x.limits]\nmemory = \"1GiB\"\ntasks = 12\n").unwrap();
        let x = &load_from(&p).unwrap()["x"];
        assert_eq!((x.limits.memory, x.limits.tasks), (Some(1 << 30), Some(12)));
        apply(&mut s, "limits.memory", "default").unwrap();
        assert_eq!(s.limits.memory, None);
    }

    #[test]
    fn the_lifecycle_settings_round_trip_and_win_over_the_package() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(SETTINGS_FILE);
        let mut s = PackageSettings::default();
        apply(&mut s, "start", "on-demand").unwrap();
        apply(&mut s, "idle_stop_after", "30s").unwrap();
        let mut off = PackageSettings::default();
        apply(&mut off, "idle_stop_after", "off").unwrap();
        let all: BTreeMap<String, PackageSettings> =
            [("a".to_owned(), s.clone()), ("b".to_owned(), off.clone())].into();
        std::fs::write(&p, render(&all, &RetentionSettings::default())).unwrap();
        assert_eq!(load_from(&p).unwrap(), all);
        let package = Lifecycle {
            start: StartMode::Always,
            idle_stop_after: Some(Duration::from_secs(600)),
        };
        assert_eq!(
            s.lifecycle(&package),
            Lifecycle {
                start: StartMode::OnDemand,
                idle_stop_after: Some(Duration::from_secs(30))
            }
        );
        assert_eq!(off.lifecycle(&package).idle_stop_after, None);
        assert_eq!(PackageSettings::default().lifecycle(&package), package);
        apply(&mut s, "start", "default").unwrap();
        apply(&mut s, "idle_stop_after", "default").unwrap();
        assert_eq!(s, PackageSettings::default());
        let e = apply(&mut s, "start", "lazy").unwrap_err().to_string();
        assert!(e.contains("\"on-demand\""), "{e}");
        let e = apply(&mut s, "idle_stop_after", "500ms")
            .unwrap_err()
            .to_string();
        assert!(e.contains("below the least, 1s"), "{e}");
        assert_eq!(s, PackageSettings::default());
    }

    #[test]
    fn package_and_retention_settings_share_the_file_and_each_writer_keeps_the_other() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(SETTINGS_FILE);
        let mut all = BTreeMap::new();
        let mut s = PackageSettings::default();
        apply(&mut s, "limits.tasks", "12").unwrap();
        all.insert("notes".to_owned(), s.clone());
        let mut r = RetentionSettings::default();
        r.apply("retention.artifacts.max_bytes", "10GiB").unwrap();
        write(&p, &all, &r).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(
            text.contains("[notes.limits]") && text.contains("[retention.artifacts]"),
            "{text}"
        );
        assert_eq!(read(&p).unwrap(), (all.clone(), r.clone()));
        // A hand-written bad retention value is refused naming the file, the key and the fix.
        std::fs::write(&p, text.replace("10GiB", "ten")).unwrap();
        let e = read(&p).unwrap_err().to_string();
        assert!(
            e.contains("settings.toml")
                && e.contains("`retention.artifacts.max_bytes` cannot be \"ten\"")
                && e.contains("conduit config set"),
            "{e}"
        );
    }

    #[test]
    fn bad_keys_and_values_are_refused_naming_what_to_use() {
        let mut s = PackageSettings::default();
        let e = apply(&mut s, "limits.disk", "1").unwrap_err().to_string();
        assert!(
            e.contains("unknown setting `limits.disk`") && e.contains("limits.memory"),
            "{e}"
        );
        let e = apply(&mut s, "limits.memory", "15MiB")
            .unwrap_err()
            .to_string();
        assert!(e.contains("below the least, 16 MiB"), "{e}");
        let e = apply(&mut s, "sandbox", "maybe").unwrap_err().to_string();
        assert!(e.contains("`on` or `off`"), "{e}");
        assert_eq!(s, PackageSettings::default());
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(SETTINGS_FILE);
        std::fs::write(&p, "[x]\nsandbox = \"sometimes\"\n").unwrap();
        assert!(
            load_from(&p)
                .unwrap_err()
                .to_string()
                .contains("is not a setting")
        );
    }
}
