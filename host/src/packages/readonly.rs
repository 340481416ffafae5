//! Installed packages are read-only: every file and folder loses its write bits once it is in
//! place, and gets them back only to be moved aside or deleted (an upgrade, a remove).
//!
//! Why: an extension (or the interpreter running it) that writes into its own folder — a
//! `__pycache__`, a log beside the code — would be refused as tampered at its next start. The
//! extension gets a writable data directory and temporary folder instead, and Python is told not
//! to write bytecode (`PYTHONDONTWRITEBYTECODE=1`). For root, which ignores write bits, the
//! sandbox (Landlock) is what keeps the folder unwritten.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Clear the write bits of `root` and everything in it (folders last, bottom up, so the walk
/// never loses the right to read what it still has to change). Links are not followed; a
/// package holds none.
pub(crate) fn make_read_only(root: &Path) -> io::Result<()> {
    set_modes(root, &|mode, _| mode & !0o222)
}

/// Give the owner write (and, for folders, search) permission back on `root` and everything
/// in it, so it can be renamed or deleted. A missing `root` is not an error.
pub(crate) fn make_writable(root: &Path) -> io::Result<()> {
    match fs::symlink_metadata(root) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
        Ok(_) => {}
    }
    set_modes(root, &|mode, dir| {
        mode | 0o200 | if dir { 0o100 } else { 0 }
    })
}

fn set_modes(path: &Path, f: &dyn Fn(u32, bool) -> u32) -> io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    let dir = meta.is_dir();
    let mode = meta.permissions().mode() & 0o7777;
    let new = f(mode, dir);
    if dir {
        // Folders first made writable (to change what is inside), last made read-only.
        if new & 0o200 != 0 && new != mode {
            fs::set_permissions(path, fs::Permissions::from_mode(new))?;
        }
        for entry in fs::read_dir(path)? {
            set_modes(&entry?.path(), f)?;
        }
    }
    if new != mode {
        fs::set_permissions(path, fs::Permissions::from_mode(new))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_tree_loses_its_write_bits_keeps_its_execute_bits_and_gets_them_back() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("pkg");
        fs::create_dir_all(root.join("lib/vendored")).unwrap();
        fs::write(root.join("lib/vendored/mod.py"), "x = 1\n").unwrap();
        fs::write(root.join("run"), "#!/bin/sh\n").unwrap();
        fs::set_permissions(root.join("run"), fs::Permissions::from_mode(0o755)).unwrap();
        make_read_only(&root).unwrap();
        assert_eq!(mode(&root), 0o555);
        assert_eq!(mode(&root.join("lib/vendored")), 0o555);
        assert_eq!(mode(&root.join("lib/vendored/mod.py")), 0o444);
        assert_eq!(mode(&root.join("run")), 0o555);
        make_writable(&root).unwrap();
        assert_eq!(mode(&root.join("lib/vendored")), 0o755);
        assert_eq!(mode(&root.join("lib/vendored/mod.py")), 0o644);
        fs::remove_dir_all(&root).unwrap();
        make_writable(&root).unwrap();
    }
}
