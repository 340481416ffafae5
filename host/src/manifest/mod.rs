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
//! [dev]                      # optional; read by `conduit ext dev` only
//! build = "cargo build --release"   # run by `sh -c` in the package folder after a change
//! ignore = ["dist"]          # names whose changes do not count (beside target, .*, …)
//! [lifecycle]                # optional; the operator's `conduit ext set` wins
//! start = "on-demand"        # "always" (the default) or "on-demand": started when first needed
//! idle_stop_after = "10m"    # stop a run this long without calls ("off", the default: never)
//! ```
//!
//! Unlike the wire types, which ignore unknown fields so the protocol can grow, the manifest
//! refuses unknown keys: it is written by hand, and a misspelt key silently ignored would be a
//! capability the operator believes is declared but is not.
//!
//! Invariant: a [`Manifest`] value has passed every rule below; every [`ManifestError`] names the
//! file, the field, what is wrong and how to fix it. Nothing here spawns or reads beyond the
//! manifest file and the metadata of the program it names.
//!
//! Layout, each part importing only the ones listed before it: `types.rs` (the [`Manifest`]
//! value and the limits), `error.rs` ([`ManifestError`]), `validate.rs` (one check per field)
//! and `limits.rs` (the `[limits]` and `[sandbox]` asks), `dev.rs` (`[dev]`), `parse.rs` ([`Manifest::load`] and
//! [`Manifest::parse`]), `command.rs` ([`Manifest::resolve_command`]).

mod command;
mod dev;
mod error;
mod limits;
mod parse;
mod types;
mod validate;

pub use error::ManifestError;
pub use types::{
    CAPABILITY_KEYS, DEV_KEYS, DevAsk, LIFECYCLE_KEYS, LIMIT_KEYS, MANIFEST_FILE,
    MAX_DESCRIPTION_CHARS, MAX_DEV_BUILD_BYTES, MAX_DEV_IGNORE, MAX_MANIFEST_BYTES, MAX_NAME_LEN,
    Manifest, RESERVED_NAMES, ResolvedCommand, SANDBOX_KEYS, SandboxAsk, TOP_LEVEL_KEYS,
    WORK_KIND_KEYS, read_capped,
};

#[cfg(test)]
mod tests;
