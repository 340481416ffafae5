//! The handshake: `initialize` params and result, and version negotiation.
//!
//! The host's first message is `initialize`. The extension picks the newest version in the
//! host's list that it also speaks and answers with it, its name and version, and what it
//! serves. When there is none it answers `version_mismatch` with both lists in `data`
//! ([`VersionMismatchData`]); the host marks the package incompatible and does not restart it.

use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, RpcError};
use crate::limits;

/// The protocol versions this build speaks, newest first. A version is one integer; a change
/// that an existing peer could misread gets a new one (see "Versioning" in `docs/protocol.md`).
pub const PROTOCOL_VERSIONS: &[u32] = &[1];

/// The newest protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = PROTOCOL_VERSIONS[0];

/// A name and a version, for the host or an extension.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct Software {
    pub name: String,
    pub version: String,
}

impl Software {
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> Self {
        Software {
            name: name.into(),
            version: version.into(),
        }
    }
}

/// Limits the host enforces, told to the extension so it can stay within them. A member left
/// out reads as its default.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
#[non_exhaustive]
pub struct Limits {
    pub max_message_bytes: usize,
    pub max_concurrent_requests: usize,
    pub max_artifact_chunk_bytes: usize,
    pub artifact_window: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message_bytes: limits::MAX_MESSAGE_BYTES,
            max_concurrent_requests: limits::MAX_CONCURRENT_REQUESTS,
            max_artifact_chunk_bytes: limits::MAX_ARTIFACT_CHUNK_BYTES,
            artifact_window: limits::ARTIFACT_WINDOW,
        }
    }
}

/// Deadlines the host applies to its calls, in milliseconds. A member left out reads as its
/// default.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
#[non_exhaustive]
pub struct Deadlines {
    pub in_transaction_ms: u64,
    pub default_ms: u64,
    pub shutdown_grace_ms: u64,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            in_transaction_ms: limits::IN_TRANSACTION_DEADLINE.as_millis() as u64,
            default_ms: limits::DEFAULT_CALL_DEADLINE.as_millis() as u64,
            shutdown_grace_ms: limits::SHUTDOWN_GRACE.as_millis() as u64,
        }
    }
}

/// `initialize` params.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct InitializeParams {
    /// Every version the host speaks, newest first.
    pub protocol_versions: Vec<u32>,
    pub host: Software,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub deadlines: Deadlines,
    /// The bulk pipe for artifact bytes, when the host started the extension with one
    /// ([`crate::bulk`]); absent, artifacts travel as JSON chunks only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bulk: Option<BulkOffer>,
}

/// `initialize`'s `bulk`: the descriptor the extension inherited the bulk pipe's write end as.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct BulkOffer {
    pub fd: i32,
}

impl BulkOffer {
    pub const fn new(fd: i32) -> Self {
        BulkOffer { fd }
    }
}

impl InitializeParams {
    /// A host speaking `protocol_versions` (newest first), with the default limits and
    /// deadlines and no bulk pipe.
    pub fn new(protocol_versions: Vec<u32>, host: Software) -> Self {
        InitializeParams {
            protocol_versions,
            host,
            limits: Limits::default(),
            deadlines: Deadlines::default(),
            bulk: None,
        }
    }

    /// What this build of the host sends.
    pub fn current(host_version: &str) -> Self {
        InitializeParams::new(
            PROTOCOL_VERSIONS.to_vec(),
            Software::new("conduit", host_version),
        )
    }

    /// The same, offering the bulk pipe at [`crate::bulk::BULK_FD`].
    pub fn with_bulk(mut self) -> Self {
        self.bulk = Some(BulkOffer {
            fd: crate::bulk::BULK_FD,
        });
        self
    }
}

/// A work kind the extension serves; `trigger` says whether it answers `work_kind.trigger`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkKind {
    pub name: String,
    #[serde(default)]
    pub trigger: bool,
}

impl WorkKind {
    pub fn new(name: impl Into<String>, trigger: bool) -> Self {
        WorkKind {
            name: name.into(),
            trigger,
        }
    }
}

/// What an extension serves. Every list may be empty; unknown fields are ignored so that a
/// newer extension can talk to an older host.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub work_kinds: Vec<WorkKind>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recurrences: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependency_filters: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub emissions: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<String>,
    /// Further request methods the extension serves (for example `echo`, or `check.sleep`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
}

/// One list of [`Capabilities`]: what a name the extension declared is declared as. The method
/// table (`crate::methods`) names the list that permits each method, and the host looks names up
/// through it (the owner of a recurrence, whether a push names a declared source).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Capability {
    WorkKinds,
    Recurrences,
    DependencyFilters,
    Emissions,
    Ingress,
    Methods,
}

impl Capability {
    /// Every list, in the order of [`Capabilities`]' members.
    pub const ALL: [Capability; 6] = [
        Capability::WorkKinds,
        Capability::Recurrences,
        Capability::DependencyFilters,
        Capability::Emissions,
        Capability::Ingress,
        Capability::Methods,
    ];

    /// The member of `capabilities` that holds the list (`dependency_filters`).
    pub const fn field(self) -> &'static str {
        match self {
            Capability::WorkKinds => "work_kinds",
            Capability::Recurrences => "recurrences",
            Capability::DependencyFilters => "dependency_filters",
            Capability::Emissions => "emissions",
            Capability::Ingress => "ingress",
            Capability::Methods => "methods",
        }
    }

    /// A name of the list as a sentence says it ("the dependency filter `x`").
    pub const fn noun(self) -> &'static str {
        match self {
            Capability::WorkKinds => "work kind",
            Capability::Recurrences => "recurrence",
            Capability::DependencyFilters => "dependency filter",
            Capability::Emissions => "emission",
            Capability::Ingress => "ingress source",
            Capability::Methods => "method",
        }
    }

    /// The answer to a call naming `name`, which the extension did not declare in this list:
    /// `invalid_params` naming the method and the member to declare it in (§4.2, §7).
    pub fn not_declared(self, method: &str, name: &str) -> RpcError {
        RpcError::invalid_params(
            method,
            format!(
                "the {} `{name}` is not declared in this extension's handshake; declare it in capabilities.{}",
                self.noun(),
                self.field()
            ),
        )
    }
}

impl Capabilities {
    /// Whether `name` is declared in the list `capability` (a work kind by its name, with or
    /// without a trigger).
    pub fn declares(&self, capability: Capability, name: &str) -> bool {
        let list = match capability {
            Capability::WorkKinds => return self.work_kinds.iter().any(|k| k.name == name),
            Capability::Recurrences => &self.recurrences,
            Capability::DependencyFilters => &self.dependency_filters,
            Capability::Emissions => &self.emissions,
            Capability::Ingress => &self.ingress,
            Capability::Methods => &self.methods,
        };
        list.iter().any(|n| n == name)
    }
}

/// `initialize` result.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct InitializeResult {
    /// The version the extension chose from the host's list.
    pub protocol_version: u32,
    pub extension: Software,
    #[serde(default)]
    pub capabilities: Capabilities,
}

impl InitializeResult {
    pub fn new(protocol_version: u32, extension: Software, capabilities: Capabilities) -> Self {
        InitializeResult {
            protocol_version,
            extension,
            capabilities,
        }
    }
}

/// `data` of a `version_mismatch` error.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct VersionMismatchData {
    pub host_versions: Vec<u32>,
    pub extension_versions: Vec<u32>,
}

impl VersionMismatchData {
    pub fn new(host_versions: Vec<u32>, extension_versions: Vec<u32>) -> Self {
        VersionMismatchData {
            host_versions,
            extension_versions,
        }
    }
}

/// Pick the newest version both lists share, or the `version_mismatch` error to answer with.
pub fn negotiate(host_versions: &[u32], ours: &[u32]) -> Result<u32, RpcError> {
    host_versions
        .iter()
        .copied()
        .filter(|v| ours.contains(v))
        .max()
        .ok_or_else(|| version_mismatch(host_versions, ours))
}

/// The `version_mismatch` error, with both sides' versions in `data`.
pub fn version_mismatch(host_versions: &[u32], extension_versions: &[u32]) -> RpcError {
    RpcError::new(
        ErrorCode::VersionMismatch,
        format!(
            "no protocol version in common: the host speaks {host_versions:?}, the extension {extension_versions:?}"
        ),
    )
    .with_data(&VersionMismatchData {
        host_versions: host_versions.to_vec(),
        extension_versions: extension_versions.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_picks_newest_shared_version() {
        assert_eq!(negotiate(&[3, 2, 1], &[1, 2]).unwrap(), 2);
        let e = negotiate(&[1], &[2]).unwrap_err();
        assert!(e.is(ErrorCode::VersionMismatch));
        let data: VersionMismatchData = serde_json::from_str(e.data.unwrap().get()).unwrap();
        assert_eq!(
            data,
            VersionMismatchData {
                host_versions: vec![1],
                extension_versions: vec![2]
            }
        );
    }

    #[test]
    fn capabilities_tolerate_unknown_fields_and_omit_empty_lists() {
        let caps: Capabilities =
            serde_json::from_str(r#"{"recurrences":["digest"],"from_the_future":true}"#).unwrap();
        assert_eq!(caps.recurrences, ["digest"]);
        assert_eq!(
            serde_json::to_string(&caps).unwrap(),
            r#"{"recurrences":["digest"]}"#
        );
    }
}
