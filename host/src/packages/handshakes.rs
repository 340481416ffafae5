//! What each package's last accepted handshake said, kept in
//! `packages/.handshakes/<name>.json`, so the capabilities of an extension that is not running —
//! on demand and not started yet, stopped for idleness, disabled — are known without running
//! it: which work kinds it routes, which recurrences, filters, emissions and ingress sources it
//! serves.
//!
//! Written by the daemon whenever a run's handshake is accepted, and by `conduit ext install`
//! from the dry handshake it makes of an on-demand package (it starts it once, handshakes, and
//! stops it). A record counts only for the install it was made of (the same version and install
//! time); for any other, or none, the manifest's declared capabilities stand in.
//!
//! Invariant: a record file is only ever replaced whole (written aside, renamed), so a reader
//! sees the old one or the new one. Losing one costs nothing but falling back to the manifest.

use std::fs;
use std::io::{self, Write};
use std::path::PathBuf;

use conduit_protocol::Capabilities;
use serde::{Deserialize, Serialize};

use super::registry::PackageRecord;
use crate::state_dir::StateDir;

/// The folder of the records inside `<state>/packages/`. Package names are `[a-z0-9-]`, so no
/// package folder can have this name.
pub const HANDSHAKES_DIR: &str = ".handshakes";

/// One accepted handshake of a package.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandshakeRecord {
    /// The install it was made of: the version and the install time of its record.
    pub version: String,
    pub installed_at_ms: u64,
    pub protocol_version: u32,
    pub capabilities: Capabilities,
    /// When (Unix ms), and by what: `install` (the dry handshake of `conduit ext install`) or
    /// `daemon` (a run the daemon started).
    pub at_ms: i64,
    pub by: String,
}

impl HandshakeRecord {
    /// Whether this record was made of the install `rec` describes.
    pub fn is_of(&self, rec: &PackageRecord) -> bool {
        self.version == rec.version && self.installed_at_ms == rec.installed_at_ms
    }
}

fn path(state: &StateDir, name: &str) -> PathBuf {
    state
        .packages_dir()
        .join(HANDSHAKES_DIR)
        .join(format!("{name}.json"))
}

/// Keep `rec` as `name`'s last handshake (replacing the one kept, whole).
pub fn record(state: &StateDir, name: &str, rec: &HandshakeRecord) -> io::Result<()> {
    let folder = state.packages_dir().join(HANDSHAKES_DIR);
    fs::create_dir_all(&folder)?;
    // The prefix of the store's scratch: one left by a crash is swept by the next install.
    let mut tmp = tempfile::Builder::new()
        .prefix("registry-")
        .tempfile_in(state.tmp_dir())?;
    serde_json::to_writer_pretty(&mut tmp, rec)?;
    tmp.write_all(b"\n")?;
    // No fsync: a record lost or torn by a power cut only means the manifest stands in until
    // the next handshake, and the daemon writes one as an extension it starts becomes ready.
    tmp.persist(path(state, name)).map_err(|e| e.error)?;
    Ok(())
}

/// `name`'s last kept handshake, if there is one that can be read.
pub fn recorded(state: &StateDir, name: &str) -> Option<HandshakeRecord> {
    let bytes = fs::read(path(state, name)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The capabilities of `rec` as best known without running it: its last handshake's for this
/// very install, else its manifest's.
pub fn capabilities(state: &StateDir, rec: &PackageRecord) -> Capabilities {
    recorded(state, &rec.name)
        .filter(|h| h.is_of(rec))
        .map_or_else(|| rec.manifest.capabilities.clone(), |h| h.capabilities)
}

/// Forget the kept handshake of a removed package.
pub(crate) fn forget(state: &StateDir, name: &str) {
    let _ = fs::remove_file(path(state, name));
}
