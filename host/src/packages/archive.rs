//! Unpacking a package archive (`.tar.gz`) into staging, refusing anything that could write
//! outside it or blow it up.
//!
//! The `tar` crate only parses here; its `unpack` is never called. Each entry is checked and
//! written by this module:
//!
//! ```text
//! entry path   relative, no `..`, UTF-8          else refused
//! folder       created
//! regular      written (0644, or 0755 if any x bit), size charged to the budget first
//! symlink      target resolved against the link's folder  ┐ after all entries: must reach a
//! hardlink     target resolved against the archive root   ┘ regular file inside; its bytes copied
//! device, fifo, sparse, unknown                           refused
//! ```
//!
//! Invariant: every path written is `dest` joined with checked `Normal` components, and `dest`
//! never contains a symlink (links are installed as copies), so no entry can reach outside
//! `dest`. Decompression is metered: the total is capped by the budget (plus header overhead) and
//! the headers before any one entry by [`MAX_ENTRY_METADATA_BYTES`], so neither a gzip bomb nor a
//! giant long-name header can exhaust memory or disk.

use std::cell::Cell;
use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use flate2::read::GzDecoder;
use tar::EntryType;

use super::tree::{Budget, StageError, UnsafeEntry, create_dirs, key, write_new_file};
use crate::manifest::MANIFEST_FILE;

/// The most bytes of headers (ustar, pax, GNU long names) read for one entry. Long paths are at
/// most a few KiB; anything near this is hostile.
pub(crate) const MAX_ENTRY_METADATA_BYTES: u64 = 1 << 20;

/// Header overhead allowed per entry on top of the file-size budget when metering decompression:
/// one 512-byte header, up to 511 bytes of padding, and room for a pax or long-name block.
const OVERHEAD_PER_ENTRY: u64 = 4096;

/// The most links followed from one link to a file.
const MAX_LINK_HOPS: usize = 32;

/// Whether `path` starts like gzip data (so is worth opening as a `.tar.gz`).
pub(crate) fn looks_gzipped(path: &Path) -> io::Result<bool> {
    let mut magic = [0u8; 2];
    let mut file = File::open(path)?;
    let mut got = 0;
    while got < 2 {
        match file.read(&mut magic[got..])? {
            0 => return Ok(false),
            n => got += n,
        }
    }
    Ok(magic == [0x1f, 0x8b])
}

/// A link found in the archive, materialised once every entry has been read.
#[derive(Debug)]
enum Link {
    /// The raw target, relative to the link's own folder.
    Symbolic(String),
    /// The raw target, an archive path.
    Hard(String),
}

/// Unpacks `archive` into `dest` (which must not exist) and returns the package root: `dest`
/// itself if the manifest is at the archive's top level, else the archive's single top-level
/// folder if the manifest is in it.
pub(crate) fn extract(
    archive: &Path,
    dest: &Path,
    budget: &mut Budget,
) -> Result<PathBuf, StageError> {
    let read_err = |e| StageError::Read {
        path: archive.to_owned(),
        source: e,
    };
    let file = File::open(archive).map_err(read_err)?;
    let meter = Rc::new(MeterState {
        total: Cell::new(0),
        total_cap: budget
            .max_bytes()
            .saturating_add(budget.max_entries().saturating_mul(OVERHEAD_PER_ENTRY)),
        window: Cell::new(0),
        in_data: Cell::new(false),
        tripped: Cell::new(None),
    });
    let max_bytes = budget.max_bytes();
    let reader = Meter {
        inner: GzDecoder::new(BufReader::new(file)),
        state: Rc::clone(&meter),
    };
    let mut tar = tar::Archive::new(reader);
    create_dirs(dest).map_err(|e| StageError::Write {
        path: dest.to_owned(),
        source: e,
    })?;

    // Why an archive read failed: our meter's verdict if it tripped, else the parser's.
    let failed = |e: io::Error| match meter.tripped.get() {
        Some(Trip::Total) => StageError::TooLarge { limit: max_bytes },
        Some(Trip::Metadata) => StageError::Corrupt(io::Error::other(format!(
            "an entry's headers are larger than {} KiB",
            MAX_ENTRY_METADATA_BYTES / 1024
        ))),
        // The gzip or tar parser refusing what it read, or the data ending early.
        None if matches!(
            e.kind(),
            io::ErrorKind::InvalidData
                | io::ErrorKind::InvalidInput
                | io::ErrorKind::UnexpectedEof
                | io::ErrorKind::Other
        ) =>
        {
            StageError::Corrupt(e)
        }
        // Reading the file itself failed (a disk error): report the file.
        None => StageError::Read {
            path: archive.to_owned(),
            source: e,
        },
    };

    let mut links: Vec<(Vec<String>, Link)> = Vec::new();
    for entry in tar.entries().map_err(failed)? {
        let mut entry = entry.map_err(failed)?;
        let raw_path = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw_path).into_owned();
        let ty = entry.header().entry_type();
        budget.entry()?;
        if ty == EntryType::XGlobalHeader {
            // Archive-wide pax defaults (mtime, charset); nothing to install.
            meter.window.set(0);
            continue;
        }
        let rel = checked_path(&raw_path).map_err(|p| StageError::unsafe_entry(&shown, p))?;
        if rel.is_empty() {
            // `./` itself.
            meter.window.set(0);
            continue;
        }
        let to = join(dest, &rel);
        match ty {
            EntryType::Directory => {
                create_dirs(&to).map_err(|e| conflict_or(&shown, &to, e))?;
            }
            EntryType::Regular | EntryType::Continuous => {
                budget.check_fits(entry.size())?;
                if let Some(parent) = to.parent() {
                    create_dirs(parent).map_err(|e| conflict_or(&shown, parent, e))?;
                }
                let executable = entry.header().mode().map_err(failed)? & 0o111 != 0;
                meter.in_data.set(true);
                let written = write_new_file(&to, &mut entry, executable, budget, archive);
                meter.in_data.set(false);
                match written {
                    Err(StageError::Write { source, .. })
                        if source.kind() == io::ErrorKind::AlreadyExists =>
                    {
                        return Err(StageError::unsafe_entry(&shown, UnsafeEntry::Duplicate));
                    }
                    Err(StageError::Read { source, .. }) => return Err(failed(source)),
                    other => other?,
                }
            }
            EntryType::Symlink | EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                let Ok(target) = String::from_utf8(target) else {
                    return Err(StageError::unsafe_entry(&shown, UnsafeEntry::NonUtf8Name));
                };
                let link = if ty == EntryType::Symlink {
                    Link::Symbolic(target)
                } else {
                    Link::Hard(target)
                };
                links.push((rel, link));
            }
            EntryType::Char => return Err(special(&shown, "character device")),
            EntryType::Block => return Err(special(&shown, "block device")),
            EntryType::Fifo => return Err(special(&shown, "fifo")),
            EntryType::GNUSparse => return Err(special(&shown, "sparse file")),
            other => {
                return Err(StageError::unsafe_entry(
                    &shown,
                    UnsafeEntry::UnknownType {
                        byte: other.as_byte(),
                    },
                ));
            }
        }
        // The next entry's headers start here.
        meter.window.set(0);
    }
    materialise_links(dest, &links, budget)?;
    package_root(dest).ok_or(StageError::NoManifest)
}

fn special(shown: &str, kind: &'static str) -> StageError {
    StageError::unsafe_entry(shown, UnsafeEntry::Special { kind })
}

/// A folder could not be created: most often because an earlier entry put a file on its path.
fn conflict_or(shown: &str, path: &Path, e: io::Error) -> StageError {
    match e.kind() {
        io::ErrorKind::AlreadyExists | io::ErrorKind::NotADirectory => {
            StageError::unsafe_entry(shown, UnsafeEntry::Duplicate)
        }
        _ => StageError::Write {
            path: path.to_owned(),
            source: e,
        },
    }
}

/// Splits an entry path into checked components: `.` and empty ones dropped; absolute paths
/// and `..` refused. An empty result is the archive root.
pub(crate) fn checked_path(raw: &[u8]) -> Result<Vec<String>, UnsafeEntry> {
    let Ok(text) = std::str::from_utf8(raw) else {
        return Err(UnsafeEntry::NonUtf8Name);
    };
    if text.starts_with('/') {
        return Err(UnsafeEntry::AbsolutePath);
    }
    let mut out = Vec::new();
    for part in text.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(UnsafeEntry::ParentDir),
            _ => out.push(part.to_owned()),
        }
    }
    Ok(out)
}

/// Resolves a link target against `base` (components), lexically; `None` if it leaves the root.
pub(crate) fn resolve_target(base: &[String], target: &str) -> Option<Vec<String>> {
    if target.starts_with('/') {
        return None;
    }
    let mut out = base.to_vec();
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                out.pop()?;
            }
            _ => out.push(part.to_owned()),
        }
    }
    Some(out)
}

/// Installs every link as a copy of the regular file it finally reaches.
fn materialise_links(
    dest: &Path,
    links: &[(Vec<String>, Link)],
    budget: &mut Budget,
) -> Result<(), StageError> {
    let by_path: HashMap<&[String], &Link> = links.iter().map(|(p, l)| (p.as_slice(), l)).collect();
    for (rel, _) in links {
        let shown = key(rel);
        let mut at: &[String] = rel;
        let mut hops = 0;
        let file = loop {
            let link = by_path[at];
            let (resolved, raw) = match link {
                Link::Symbolic(t) => (resolve_target(&at[..at.len() - 1], t), t),
                Link::Hard(t) => (resolve_target(&[], t), t),
            };
            let Some(resolved) = resolved.filter(|r| !r.is_empty()) else {
                return Err(StageError::unsafe_entry(
                    &shown,
                    UnsafeEntry::LinkEscapes {
                        target: raw.clone(),
                    },
                ));
            };
            if let Some((next, _)) = by_path.get_key_value(resolved.as_slice()) {
                hops += 1;
                if hops > MAX_LINK_HOPS {
                    return Err(StageError::unsafe_entry(&shown, UnsafeEntry::LinkLoop));
                }
                at = next;
                continue;
            }
            // Staging holds no links, so what `symlink_metadata` sees is what the archive made.
            match fs::symlink_metadata(join(dest, &resolved)) {
                Ok(m) if m.is_file() => break resolved,
                Ok(m) if m.is_dir() => {
                    return Err(StageError::unsafe_entry(
                        &shown,
                        UnsafeEntry::LinkToFolder {
                            target: raw.clone(),
                        },
                    ));
                }
                _ => {
                    return Err(StageError::unsafe_entry(
                        &shown,
                        UnsafeEntry::LinkDangling {
                            target: raw.clone(),
                        },
                    ));
                }
            }
        };
        let from = join(dest, &file);
        let to = join(dest, rel);
        if let Some(parent) = to.parent() {
            create_dirs(parent).map_err(|e| conflict_or(&shown, parent, e))?;
        }
        let read_err = |e| StageError::Read {
            path: from.clone(),
            source: e,
        };
        let mut src = File::open(&from).map_err(read_err)?;
        let meta = src.metadata().map_err(read_err)?;
        budget.check_fits(meta.len())?;
        budget.entry()?;
        let executable = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o111 != 0;
        match write_new_file(&to, &mut src, executable, budget, &from) {
            Err(StageError::Write { source, .. })
                if source.kind() == io::ErrorKind::AlreadyExists =>
            {
                return Err(StageError::unsafe_entry(&shown, UnsafeEntry::Duplicate));
            }
            other => other?,
        }
    }
    Ok(())
}

/// The package's folder inside the unpacked archive, if there is a manifest where one belongs.
fn package_root(dest: &Path) -> Option<PathBuf> {
    if dest.join(MANIFEST_FILE).is_file() {
        return Some(dest.to_owned());
    }
    let mut entries = fs::read_dir(dest).ok()?;
    let only = entries.next()?.ok()?;
    if entries.next().is_some() || !only.file_type().ok()?.is_dir() {
        return None;
    }
    let root = only.path();
    root.join(MANIFEST_FILE).is_file().then_some(root)
}

fn join(root: &Path, parts: &[String]) -> PathBuf {
    let mut p = root.to_owned();
    p.extend(parts);
    p
}

/// Which limit the decompression meter hit.
#[derive(Debug, Clone, Copy)]
enum Trip {
    Total,
    Metadata,
}

#[derive(Debug)]
struct MeterState {
    total: Cell<u64>,
    total_cap: u64,
    /// Bytes read outside entry data since the last entry was handled: headers, padding, pax and
    /// long-name blocks. Reset by [`extract`] after each entry.
    window: Cell<u64>,
    /// Set while [`extract`] reads an entry's data, which the window does not count.
    in_data: Cell<bool>,
    tripped: Cell<Option<Trip>>,
}

/// Counts decompressed bytes and fails the read once a cap is passed.
struct Meter<R> {
    inner: R,
    state: Rc<MeterState>,
}

impl<R: Read> Read for Meter<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let s = &self.state;
        let total = s.total.get() + n as u64;
        s.total.set(total);
        if !s.in_data.get() {
            s.window.set(s.window.get() + n as u64);
        }
        if total > s.total_cap {
            s.tripped.set(Some(Trip::Total));
            return Err(io::Error::other(
                "the archive unpacks to more than the size limit",
            ));
        }
        if s.window.get() > MAX_ENTRY_METADATA_BYTES {
            s.tripped.set(Some(Trip::Metadata));
            return Err(io::Error::other("an entry's headers are too large"));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checked_path_keeps_only_normal_components() {
        let ok = |s: &str| checked_path(s.as_bytes()).unwrap();
        assert_eq!(ok("a/b"), ["a", "b"]);
        assert_eq!(ok("./a//b/."), ["a", "b"]);
        assert!(ok("./").is_empty());
        assert!(matches!(
            checked_path(b"/etc/passwd"),
            Err(UnsafeEntry::AbsolutePath)
        ));
        assert!(matches!(
            checked_path(b"a/../../b"),
            Err(UnsafeEntry::ParentDir)
        ));
        assert!(matches!(checked_path(b"a/.."), Err(UnsafeEntry::ParentDir)));
        assert!(matches!(
            checked_path(b"a\xff"),
            Err(UnsafeEntry::NonUtf8Name)
        ));
        // `..` inside a name is just a name.
        assert_eq!(ok("a..b/..c"), ["a..b", "..c"]);
    }

    #[test]
    fn link_targets_resolve_lexically_and_never_above_the_root() {
        let base = ["pkg".to_owned(), "bin".to_owned()];
        assert_eq!(
            resolve_target(&base, "../lib/x").unwrap(),
            ["pkg", "lib", "x"]
        );
        assert_eq!(resolve_target(&base, "./y").unwrap(), ["pkg", "bin", "y"]);
        assert_eq!(resolve_target(&base, "../../z").unwrap(), ["z"]);
        assert!(resolve_target(&base, "../../../z").is_none());
        assert!(resolve_target(&base, "/etc/passwd").is_none());
        assert!(resolve_target(&[], "..").is_none());
    }
}
