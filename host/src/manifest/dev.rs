//! `[dev]`: how `conduit ext dev` rebuilds the package after a change (`build`) and which
//! names' changes do not count (`ignore`). The daemon never reads it: an installed package runs
//! what was installed, built or not.

use super::error::ManifestError;
use super::types::{DEV_KEYS, DevAsk, MAX_DEV_BUILD_BYTES, MAX_DEV_IGNORE};
use super::validate::{Validator, kind};

impl Validator<'_> {
    pub(super) fn dev(&self, value: &toml::Value) -> Result<DevAsk, ManifestError> {
        let Some(table) = value.as_table() else {
            return Err(self.invalid(
                "dev",
                format!("must be a table, not {}", kind(value)),
                "write `[dev]` with keys build, ignore",
            ));
        };
        self.known_keys(table, "dev", DEV_KEYS)?;
        let mut out = DevAsk::default();
        if let Some(v) = table.get("build") {
            let fix = "write the command in quotes, e.g. `build = \"cargo build --release\"` (run by `sh -c` in the package folder)";
            let Some(text) = v.as_str() else {
                return Err(self.invalid(
                    "dev.build",
                    format!("must be a string, not {}", kind(v)),
                    fix,
                ));
            };
            if text.trim().is_empty() {
                return Err(self.invalid("dev.build", "is empty", fix));
            }
            if text.len() > MAX_DEV_BUILD_BYTES {
                return Err(self.invalid(
                    "dev.build",
                    format!(
                        "is {} bytes, more than the most, {MAX_DEV_BUILD_BYTES}",
                        text.len()
                    ),
                    "put a long build in a script of the package and run that",
                ));
            }
            out.build = Some(text.to_owned());
        }
        if let Some(v) = table.get("ignore") {
            let fix = "list file or folder names, e.g. `ignore = [\"dist\", \"build\"]`";
            let Some(items) = v.as_array() else {
                return Err(self.invalid(
                    "dev.ignore",
                    format!("must be a list of names, not {}", kind(v)),
                    fix,
                ));
            };
            if items.len() > MAX_DEV_IGNORE {
                return Err(self.invalid(
                    "dev.ignore",
                    format!(
                        "lists {} names, more than the most, {MAX_DEV_IGNORE}",
                        items.len()
                    ),
                    fix,
                ));
            }
            for (i, item) in items.iter().enumerate() {
                let field = format!("dev.ignore[{i}]");
                let Some(name) = item.as_str() else {
                    return Err(self.invalid(
                        field,
                        format!("must be a string, not {}", kind(item)),
                        fix,
                    ));
                };
                if name.is_empty() || name == "." || name == ".." || name.contains('/') {
                    return Err(self.invalid(
                        field,
                        format!("is {name:?}, which is not a file or folder name (no `/`)"),
                        fix,
                    ));
                }
                out.ignore.push(name.to_owned());
            }
        }
        Ok(out)
    }
}
