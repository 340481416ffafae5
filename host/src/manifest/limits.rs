//! The manifest's asks of the operator: `[limits]` (in the supervisor's own units and bounds),
//! `[sandbox]` (paths beyond the defaults) and `[lifecycle]` (when it starts, when an idle run
//! stops). Only asks: the operator decides (`conduit_supervisor::limits::resolve`, the
//! package's `settings.toml`).

use std::path::{Component, Path};

use conduit_supervisor::limits::{LimitKey, LimitSet};

use super::error::ManifestError;
use super::types::{LIFECYCLE_KEYS, LIMIT_KEYS, SANDBOX_KEYS, SandboxAsk};
use super::validate::{Validator, kind};

impl Validator<'_> {
    /// `[lifecycle]`: `start = "always" | "on-demand"`, `idle_stop_after = "10m" | "off"`, each
    /// through the one parser the operator's `conduit ext set` uses too.
    pub(super) fn lifecycle(
        &self,
        value: &toml::Value,
    ) -> Result<conduit_supervisor::Lifecycle, ManifestError> {
        use conduit_supervisor::lifecycle::{StartMode, parse_idle_stop_after};
        let Some(table) = value.as_table() else {
            return Err(self.invalid(
                "lifecycle",
                format!("must be a table, not {}", kind(value)),
                "write `[lifecycle]` with keys start, idle_stop_after",
            ));
        };
        self.known_keys(table, "lifecycle", LIFECYCLE_KEYS)?;
        let mut out = conduit_supervisor::Lifecycle::default();
        if let Some(v) = table.get("start") {
            let fix = "write `start = \"always\"` or `start = \"on-demand\"`";
            let Some(text) = v.as_str() else {
                return Err(self.invalid(
                    "lifecycle.start",
                    format!("must be a string, not {}", kind(v)),
                    fix,
                ));
            };
            out.start = StartMode::parse(text)
                .map_err(|problem| self.invalid("lifecycle.start", problem, fix))?;
        }
        if let Some(v) = table.get("idle_stop_after") {
            let fix = "write a duration in quotes, e.g. `idle_stop_after = \"10m\"`, or \"off\"";
            let Some(text) = v.as_str() else {
                return Err(self.invalid(
                    "lifecycle.idle_stop_after",
                    format!("must be a string, not {}", kind(v)),
                    fix,
                ));
            };
            out.idle_stop_after = parse_idle_stop_after(text)
                .map_err(|problem| self.invalid("lifecycle.idle_stop_after", problem, fix))?;
        }
        Ok(out)
    }

    pub(super) fn limits(&self, value: &toml::Value) -> Result<LimitSet, ManifestError> {
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

    pub(super) fn sandbox(&self, value: &toml::Value) -> Result<SandboxAsk, ManifestError> {
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
}
