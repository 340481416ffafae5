//! File-tree work shared by installs and verification: copying a package folder into staging,
//! writing staged files, scanning a tree into the `files` map of a record, and [`UnsafeEntry`],
//! why an entry of a folder or an archive is refused.
//!
//! Invariant: nothing here ever creates a symlink, so a staged tree holds only regular files and
//! folders, and a later write into it cannot be redirected outside it by a link. Every byte and
//! every entry written into staging is charged to a [`Budget`] first.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::registry::{FileRecord, sync_dir};

/// The mode of every installed file with an execute bit; others get [`FILE_MODE`]. Setuid,
/// setgid and sticky bits are never installed.
const EXEC_MODE: u32 = 0o755;
const FILE_MODE: u32 = 0o644;
const DIR_MODE: u32 = 0o755;

/// The size of one read when copying or hashing.
const CHUNK: usize = 64 * 1024;

/// What went wrong while staging a package, before the caller adds which install it was.
#[derive(Debug)]
pub(crate) enum StageError {
    /// An entry of the source is refused; `entry` is its path relative to the package.
    Unsafe {
        entry: String,
        problem: UnsafeEntry,
    },
    TooLarge {
        limit: u64,
    },
    TooManyEntries {
        limit: u64,
    },
    /// An archive with no manifest at its top level nor in its single top-level folder.
    NoManifest,
    /// The archive is not a well-formed `.tar.gz`.
    Corrupt(io::Error),
    /// Reading the source failed (an unreadable file).
    Read {
        path: PathBuf,
        source: io::Error,
    },
    /// Writing into staging failed (most often: the disk is full).
    Write {
        path: PathBuf,
        source: io::Error,
    },
}

impl StageError {
    pub(crate) fn unsafe_entry(entry: impl Into<String>, problem: UnsafeEntry) -> StageError {
        StageError::Unsafe {
            entry: entry.into(),
            problem,
        }
    }
}

/// The limits of one install and what has been spent of them.
#[derive(Debug)]
pub(crate) struct Budget {
    max_bytes: u64,
    max_entries: u64,
    bytes: u64,
    entries: u64,
}

impl Budget {
    pub(crate) fn new(max_bytes: u64, max_entries: u64) -> Budget {
        Budget {
            max_bytes,
            max_entries,
            bytes: 0,
            entries: 0,
        }
    }

    pub(crate) fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    pub(crate) fn max_entries(&self) -> u64 {
        self.max_entries
    }

    /// Charges one file, folder or link.
    pub(crate) fn entry(&mut self) -> Result<(), StageError> {
        self.entries += 1;
        if self.entries > self.max_entries {
            return Err(StageError::TooManyEntries {
                limit: self.max_entries,
            });
        }
        Ok(())
    }

    /// Refuses at once a file whose declared size alone would break the limit, before any of it
    /// is written.
    pub(crate) fn check_fits(&self, n: u64) -> Result<(), StageError> {
        if self.bytes.saturating_add(n) > self.max_bytes {
            return Err(StageError::TooLarge {
                limit: self.max_bytes,
            });
        }
        Ok(())
    }

    fn bytes(&mut self, n: u64) -> Result<(), StageError> {
        self.check_fits(n)?;
        self.bytes += n;
        Ok(())
    }
}

/// Creates `dir` and its missing parents inside staging.
pub(crate) fn create_dirs(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
}

/// Writes a new file at `path` from `from`, charging every chunk to `budget`, with the
/// normalised mode. Fails if `path` exists: a path is written once.
pub(crate) fn write_new_file(
    path: &Path,
    from: &mut impl Read,
    executable: bool,
    budget: &mut Budget,
    source_path: &Path,
) -> Result<(), StageError> {
    let write_err = |e| StageError::Write {
        path: path.to_owned(),
        source: e,
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
        .map_err(write_err)?;
    let mut buf = vec![0; CHUNK];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(StageError::Read {
                    path: source_path.to_owned(),
                    source: e,
                });
            }
        };
        budget.bytes(n as u64)?;
        file.write_all(&buf[..n]).map_err(write_err)?;
    }
    // Set the mode on the open file, so the process umask cannot change what gets recorded.
    let mode = if executable { EXEC_MODE } else { FILE_MODE };
    file.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(write_err)?;
    Ok(())
}

/// Makes a staged tree durable before it is renamed into place: every file's bytes, then every
/// folder's entries, deepest first. Without it, a power cut soon after an install could leave the
/// recorded package with empty or short files (the file system writes their bytes later than the
/// rename), which its next start would refuse as modified.
pub(crate) fn sync_tree(root: &Path) -> io::Result<()> {
    let mut dirs = vec![root.to_owned()];
    let mut i = 0;
    while let Some(dir) = dirs.get(i).cloned() {
        i += 1;
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let ty = entry.file_type()?;
            if ty.is_dir() {
                dirs.push(entry.path());
            } else if ty.is_file() {
                File::open(entry.path())?.sync_data()?;
            }
        }
    }
    // Deepest first: a folder's entry for a child folder is durable once the child is.
    for dir in dirs.iter().rev() {
        sync_dir(dir)?;
    }
    Ok(())
}

/// Joins path components with `/`, the separator of record keys on every platform.
pub(crate) fn key(parts: &[String]) -> String {
    parts.join("/")
}

/// Copies the package folder `src` into `dest` (which must not exist).
///
/// Regular files and folders are copied. A symlink is followed if it resolves to a regular file
/// inside `src`, and the file's contents are installed in its place; a link that leads out of
/// `src`, to a folder, or nowhere is refused, as are fifos, sockets and devices.
pub(crate) fn copy_folder(src: &Path, dest: &Path, budget: &mut Budget) -> Result<(), StageError> {
    let read_err = |path: &Path, e| StageError::Read {
        path: path.to_owned(),
        source: e,
    };
    let write_err = |path: &Path, e| StageError::Write {
        path: path.to_owned(),
        source: e,
    };
    let real_root = src.canonicalize().map_err(|e| read_err(src, e))?;
    create_dirs(dest).map_err(|e| write_err(dest, e))?;
    // Relative folders still to copy, as components.
    let mut todo: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(rel_dir) = todo.pop() {
        let src_dir = join(src, &rel_dir);
        let mut entries = fs::read_dir(&src_dir)
            .and_then(|rd| rd.collect::<io::Result<Vec<_>>>())
            .map_err(|e| read_err(&src_dir, e))?;
        // A fixed order makes the first refused entry the same on every run.
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let mut rel = rel_dir.clone();
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                rel.push(name.to_string_lossy().into_owned());
                return Err(StageError::unsafe_entry(
                    key(&rel),
                    UnsafeEntry::NonUtf8Name,
                ));
            };
            rel.push(name.to_owned());
            budget.entry()?;
            let from = entry.path();
            let to = join(dest, &rel);
            let ty = entry.file_type().map_err(|e| read_err(&from, e))?;
            if ty.is_dir() {
                create_dirs(&to).map_err(|e| write_err(&to, e))?;
                todo.push(rel);
            } else if ty.is_file() {
                copy_file(&from, &to, budget)?;
            } else if ty.is_symlink() {
                let target = fs::read_link(&from).map_err(|e| read_err(&from, e))?;
                let target_shown = target.to_string_lossy().into_owned();
                let real = match from.canonicalize() {
                    Ok(real) => real,
                    Err(_) => {
                        return Err(StageError::unsafe_entry(
                            key(&rel),
                            UnsafeEntry::LinkDangling {
                                target: target_shown,
                            },
                        ));
                    }
                };
                if !real.starts_with(&real_root) {
                    return Err(StageError::unsafe_entry(
                        key(&rel),
                        UnsafeEntry::LinkEscapes {
                            target: target_shown,
                        },
                    ));
                }
                let meta = fs::metadata(&real).map_err(|e| read_err(&real, e))?;
                if meta.is_dir() {
                    return Err(StageError::unsafe_entry(
                        key(&rel),
                        UnsafeEntry::LinkToFolder {
                            target: target_shown,
                        },
                    ));
                }
                if !meta.is_file() {
                    return Err(StageError::unsafe_entry(
                        key(&rel),
                        UnsafeEntry::LinkDangling {
                            target: target_shown,
                        },
                    ));
                }
                copy_file(&real, &to, budget)?;
            } else {
                return Err(StageError::unsafe_entry(
                    key(&rel),
                    UnsafeEntry::Special {
                        kind: special_kind(&ty),
                    },
                ));
            }
        }
    }
    Ok(())
}

fn copy_file(from: &Path, to: &Path, budget: &mut Budget) -> Result<(), StageError> {
    let read_err = |e| StageError::Read {
        path: from.to_owned(),
        source: e,
    };
    let mut file = File::open(from).map_err(read_err)?;
    let meta = file.metadata().map_err(read_err)?;
    budget.check_fits(meta.len())?;
    let executable = meta.permissions().mode() & 0o111 != 0;
    write_new_file(to, &mut file, executable, budget, from)
}

fn join(root: &Path, parts: &[String]) -> PathBuf {
    let mut p = root.to_owned();
    p.extend(parts);
    p
}

/// What a file type that is neither a file, a folder nor a link is called in messages.
pub(crate) fn special_kind(ty: &fs::FileType) -> &'static str {
    if ty.is_fifo() {
        "fifo"
    } else if ty.is_socket() {
        "socket"
    } else if ty.is_char_device() {
        "character device"
    } else if ty.is_block_device() {
        "block device"
    } else if ty.is_symlink() {
        "symlink"
    } else if ty.is_dir() {
        "folder"
    } else {
        "special file"
    }
}

/// A tree as found on disk.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// Every regular file, by `/`-joined relative path.
    pub(crate) files: BTreeMap<String, FileRecord>,
    /// Everything that is neither a regular file nor a folder, with what it is. An installed
    /// package has none; in a scan for verification each is a sign of tampering.
    pub(crate) others: BTreeMap<String, &'static str>,
}

/// Hashes every regular file under `root`, without following links.
pub(crate) fn scan(root: &Path) -> io::Result<Scan> {
    let mut out = Scan::default();
    let mut todo: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(rel_dir) = todo.pop() {
        for entry in fs::read_dir(join(root, &rel_dir))? {
            let entry = entry?;
            let mut rel = rel_dir.clone();
            // A non-UTF-8 name is never installed; if one appears, the lossy form still names it.
            rel.push(entry.file_name().to_string_lossy().into_owned());
            let ty = entry.file_type()?;
            if ty.is_dir() {
                todo.push(rel);
            } else if ty.is_file() {
                out.files.insert(key(&rel), hash_file(&entry.path())?);
            } else {
                out.others.insert(key(&rel), special_kind(&ty));
            }
        }
    }
    Ok(out)
}

/// The record of one file on disk.
pub(crate) fn hash_file(path: &Path) -> io::Result<FileRecord> {
    let mut file = File::open(path)?;
    let executable = file.metadata()?.permissions().mode() & 0o111 != 0;
    let mut hasher = Sha256::new();
    let mut buf = vec![0; CHUNK];
    let mut size = 0u64;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok(FileRecord {
        sha256: hex::encode(hasher.finalize()),
        size,
        executable,
    })
}

/// Why an entry of a package (a file in a folder, an entry of an archive) is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnsafeEntry {
    AbsolutePath,
    ParentDir,
    NonUtf8Name,
    /// A link whose target leaves the package.
    LinkEscapes {
        target: String,
    },
    /// A link to something that is not a file of the package.
    LinkDangling {
        target: String,
    },
    /// A link to a folder; only links to files are installed (as copies).
    LinkToFolder {
        target: String,
    },
    /// A chain of links too long to be anything but a loop.
    LinkLoop,
    /// A device, fifo, socket or sparse file.
    Special {
        kind: &'static str,
    },
    /// An archive entry whose path an earlier entry already took.
    Duplicate,
    /// An archive entry of a type this installer does not know.
    UnknownType {
        byte: u8,
    },
}

impl fmt::Display for UnsafeEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnsafeEntry::AbsolutePath => f.write_str(
                "is an absolute path, which could write anywhere; pack the archive from inside the package folder (`tar -C <folder> -czf <archive> .`)",
            ),
            UnsafeEntry::ParentDir => f.write_str(
                "has a `..` component, which could write outside the package; pack the archive from inside the package folder (`tar -C <folder> -czf <archive> .`)",
            ),
            UnsafeEntry::NonUtf8Name => f.write_str("has a name that is not UTF-8; rename it"),
            UnsafeEntry::LinkEscapes { target } => write!(
                f,
                "is a link to `{target}`, which is outside the package; put the file itself in the package"
            ),
            UnsafeEntry::LinkDangling { target } => write!(
                f,
                "is a link to `{target}`, which is not a file in the package; fix the link or remove it"
            ),
            UnsafeEntry::LinkToFolder { target } => write!(
                f,
                "is a link to the folder `{target}`; only links to files are installed, so put the folder itself in the package"
            ),
            UnsafeEntry::LinkLoop => {
                f.write_str("is a link in a loop or in a chain of more than 32 links; link to the file itself")
            }
            UnsafeEntry::Special { kind } => write!(
                f,
                "is a {kind}; a package may hold only regular files, folders and links to files inside it, so remove it"
            ),
            UnsafeEntry::Duplicate => f.write_str(
                "appears more than once in the archive (or as both a file and a folder); rebuild the archive so each path appears once",
            ),
            UnsafeEntry::UnknownType { byte } => write!(
                f,
                "has tar entry type {:?}, which a package may not hold; rebuild the archive with plain files and folders",
                char::from(*byte)
            ),
        }
    }
}
