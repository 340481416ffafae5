//! Turning a manifest's `command` into a program the host can spawn: inside the package folder
//! (no absolute path, no `..` or link leading out of it) or a bare name on `PATH`, and
//! executable. Reads only the metadata of the program it names.

use std::path::{Component, Path, PathBuf};

use super::error::ManifestError;
use super::types::{MANIFEST_FILE, Manifest, ResolvedCommand};

impl Manifest {
    /// The program to spawn and its arguments, for a package in `dir`.
    ///
    /// A program containing `/` is relative to the package folder and must stay inside it (no
    /// absolute path, no `..` that leaves it, no symlink that points out of it); it must be an
    /// executable file. A bare name is looked up on `PATH`.
    pub fn resolve_command(&self, dir: &Path) -> Result<ResolvedCommand, ManifestError> {
        let path = dir.join(MANIFEST_FILE);
        let program = &self.command[0];
        let err = |problem: String, fix: &str| ManifestError::Command {
            path: path.clone(),
            program: program.clone(),
            problem,
            fix: fix.to_owned(),
        };
        let resolved = if program.contains('/') {
            let rel = Path::new(program);
            if rel.is_absolute() {
                return Err(err(
                    "is an absolute path".into(),
                    "name a file inside the package folder (e.g. \"./bin/tool\") or a bare program name looked up on PATH (e.g. \"python3\")",
                ));
            }
            if escapes(rel) {
                return Err(err(
                    "leads out of the package folder".into(),
                    "the program must be a file inside the package folder; remove the `..`",
                ));
            }
            let dir = dir.canonicalize().map_err(|e| {
                err(
                    format!("cannot be looked up: the package folder is unreadable ({e})"),
                    "check the package folder's path and permissions",
                )
            })?;
            let full = dir.join(rel);
            let real = full.canonicalize().map_err(|e| {
                err(
                    format!("does not exist in {} ({e})", dir.display()),
                    "build or copy the program into the package folder, or fix `command`",
                )
            })?;
            if !real.starts_with(&dir) {
                return Err(err(
                    format!(
                        "is a link that leads out of the package folder, to {}",
                        real.display()
                    ),
                    "put the program itself inside the package folder",
                ));
            }
            real
        } else {
            match find_on_path(program) {
                Some(p) => p,
                None => {
                    return Err(err(
                        "was not found on PATH".into(),
                        "install it, or name a file in the package folder with a path such as \"./tool\"",
                    ));
                }
            }
        };
        check_executable(&resolved).map_err(|problem| {
            err(
                problem,
                "make it an executable file (chmod +x), or fix `command`",
            )
        })?;
        Ok(ResolvedCommand {
            program: resolved,
            args: self.command[1..].to_vec(),
        })
    }
}

/// Whether a relative path climbs above its starting folder at any point.
fn escapes(rel: &Path) -> bool {
    let mut depth = 0i32;
    for c in rel.components() {
        match c {
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return true;
                }
            }
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return true,
        }
    }
    false
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .filter(|d| d.is_absolute())
        .map(|d| d.join(program))
        .find(|p| check_executable(p).is_ok())
}

fn check_executable(p: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(p).map_err(|e| format!("cannot be read ({e})"))?;
    if !meta.is_file() {
        return Err(format!("{} is not a file", p.display()));
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(format!("{} is not executable", p.display()));
    }
    Ok(())
}
