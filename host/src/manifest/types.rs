//! What a valid manifest is: the [`Manifest`] value, the limits on its size and its keys, and
//! the asks it carries ([`SandboxAsk`]). Plain data; parsing and checking live beside it.

use std::path::{Path, PathBuf};

use conduit_protocol::Capabilities;
use conduit_supervisor::Lifecycle;
use conduit_supervisor::limits::LimitSet;

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

/// Names no package may take: `settings.toml` keeps the daemon's own tables beside the
/// packages' tables, under these names (`retention`: `conduit config`).
pub const RESERVED_NAMES: &[&str] = &["retention"];

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
    "dev",
    "lifecycle",
];

/// The keys of `[limits]` (see `conduit_supervisor::limits`).
pub const LIMIT_KEYS: &[&str] = &["memory", "cpu", "tasks", "open_files"];

/// The keys of `[sandbox]`.
pub const SANDBOX_KEYS: &[&str] = &["read", "write"];

/// The keys of `[dev]` (read only by `conduit ext dev`).
pub const DEV_KEYS: &[&str] = &["build", "ignore"];

/// The longest `[dev] build` command, in bytes.
pub const MAX_DEV_BUILD_BYTES: usize = 4096;

/// The most names `[dev] ignore` may list.
pub const MAX_DEV_IGNORE: usize = 64;
/// The keys of `[lifecycle]` (see `conduit_supervisor::lifecycle`).
pub const LIFECYCLE_KEYS: &[&str] = &["start", "idle_stop_after"];

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
    /// How `conduit ext dev` builds and watches the package (`[dev]`); the daemon ignores it.
    pub dev: DevAsk,
    /// When the package is started and whether an idle run is stopped (`[lifecycle]`); the
    /// operator's settings win.
    pub lifecycle: Lifecycle,
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

/// What `[dev]` says to `conduit ext dev`: the command that rebuilds the package after a change
/// (run by `sh -c` in the package folder), and names of files or folders whose changes do not
/// count (beside the defaults: `target`, `node_modules`, `__pycache__` and every name starting
/// with `.`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DevAsk {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignore: Vec<String>,
}

impl DevAsk {
    pub fn is_empty(&self) -> bool {
        self.build.is_none() && self.ignore.is_empty()
    }
}

/// The program and arguments [`Manifest::resolve_command`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedCommand {
    /// An absolute path to an executable file.
    pub program: PathBuf,
    pub args: Vec<String>,
}
