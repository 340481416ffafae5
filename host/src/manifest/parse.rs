//! Reading a manifest file and turning its TOML into a [`Manifest`]: the top-level walk, each
//! field handed to the [`Validator`](super::validate::Validator) check for it.

use std::path::Path;

use conduit_protocol::Capabilities;
use conduit_supervisor::limits::LimitSet;

use super::error::ManifestError;
use super::types::{
    DevAsk, MANIFEST_FILE, MAX_MANIFEST_BYTES, Manifest, SandboxAsk, TOP_LEVEL_KEYS, read_capped,
};
use super::validate::Validator;

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
        let dev = match table.get("dev") {
            None => DevAsk::default(),
            Some(d) => v.dev(d)?,
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
            dev,
        })
    }
}
