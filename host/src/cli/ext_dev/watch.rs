//! Watching a package folder for `conduit ext dev`: inotify (through the `notify` crate) on
//! every folder that counts, one watch each, and a quiet period that gathers a burst of writes
//! (an editor's save, a `git checkout`) into one change.
//!
//! Why one watch per folder and not notify's recursive mode: the recursive mode watches every
//! folder below the root, `target/` and `node_modules/` included — thousands of folders a build
//! fills, each a watch of the user's limited inotify budget, each build a storm of events. Here
//! a folder whose name is ignored ([`ignored`]) is never watched, and a folder created later is
//! watched when its creation is seen.
//!
//! Invariant: at most [`MAX_WATCHED_DIRS`] folders are watched (more is refused, saying to
//! ignore some); at most [`MAX_PENDING_EVENTS`] events wait to be read (past that they are
//! dropped and the next change says so: something changed, the names are not all known); a
//! change is reported at most [`MAX_GATHER`] after its first event, however busy the folder.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use notify::{EventKind, RecursiveMode, Watcher as _};
use tokio::sync::mpsc;

/// Names never watched: build outputs, dependencies, caches (and every name starting with `.`,
/// see [`ignored`]).
pub(super) const DEFAULT_IGNORED: &[&str] = &["target", "node_modules", "__pycache__"];

/// The most folders one session watches.
pub(super) const MAX_WATCHED_DIRS: usize = 10_000;

/// The most events waiting to be read.
const MAX_PENDING_EVENTS: usize = 4096;

/// The longest a change is gathered before it is reported, however busy the folder.
const MAX_GATHER: Duration = Duration::from_secs(5);

/// The most paths a change names.
pub(super) const MAX_NAMED: usize = 20;

/// Whether a path (relative to the package folder) does not count: any part of it ignored by
/// name (the defaults, `[dev] ignore`, a hidden name), or its file an editor's scratch (`x~`,
/// `#x#`, vim's `4913` probe).
pub(super) fn ignored(rel: &Path, extra: &[String]) -> bool {
    let parts: Vec<&str> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => s.to_str(),
            _ => None,
        })
        .collect();
    let by_name = |p: &str| {
        p.starts_with('.') || DEFAULT_IGNORED.contains(&p) || extra.iter().any(|e| e == p)
    };
    if parts.iter().any(|p| by_name(p)) {
        return true;
    }
    match parts.last() {
        Some(f) => f.ends_with('~') || f.starts_with('#') || *f == "4913",
        None => false,
    }
}

/// What changed in one quiet period.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Change {
    /// Relative paths, at most [`MAX_NAMED`].
    pub(super) paths: Vec<String>,
    /// How many more changed (or events were dropped).
    pub(super) more: usize,
}

/// A watched package folder.
pub(super) struct Watcher {
    root: PathBuf,
    extra: Vec<String>,
    inner: notify::RecommendedWatcher,
    events: mpsc::Receiver<(PathBuf, bool)>,
    dropped: Arc<AtomicBool>,
    watched: BTreeSet<PathBuf>,
    /// What the change being gathered holds so far, and when its first and last events came.
    paths: BTreeSet<String>,
    more: usize,
    gathering: Option<(tokio::time::Instant, tokio::time::Instant)>,
}

/// Sleep until `due`, or forever when nothing is due.
async fn sleep_until(due: Option<tokio::time::Instant>) {
    match due {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher")
            .field("root", &self.root)
            .field("watched", &self.watched.len())
            .finish_non_exhaustive()
    }
}

impl Watcher {
    /// Watch `root` and every folder below it that counts.
    pub(super) fn start(root: &Path, extra: &[String]) -> anyhow::Result<Watcher> {
        let (tx, events) = mpsc::channel(MAX_PENDING_EVENTS);
        let dropped = Arc::new(AtomicBool::new(false));
        let lost = dropped.clone();
        let inner = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            let Ok(ev) = res else {
                lost.store(true, Ordering::Relaxed);
                return;
            };
            if ev.need_rescan() {
                lost.store(true, Ordering::Relaxed);
            }
            if !counts(&ev.kind) {
                return;
            }
            let created_dir = matches!(
                ev.kind,
                EventKind::Create(notify::event::CreateKind::Folder)
            );
            for p in ev.paths {
                if tx.try_send((p, created_dir)).is_err() {
                    lost.store(true, Ordering::Relaxed);
                }
            }
        })?;
        let mut w = Watcher {
            root: root.to_owned(),
            extra: extra.to_vec(),
            inner,
            events,
            dropped,
            watched: BTreeSet::new(),
            paths: BTreeSet::new(),
            more: 0,
            gathering: None,
        };
        w.watch_tree(root)?;
        Ok(w)
    }

    /// How many folders are watched.
    pub(super) fn watched(&self) -> usize {
        self.watched.len()
    }

    /// Watch `dir` and the folders below it that count.
    fn watch_tree(&mut self, dir: &Path) -> anyhow::Result<()> {
        let mut stack = vec![dir.to_owned()];
        while let Some(d) = stack.pop() {
            if self.watched.contains(&d) {
                continue;
            }
            if self.watched.len() >= MAX_WATCHED_DIRS {
                anyhow::bail!(
                    "{} holds more than {MAX_WATCHED_DIRS} folders to watch; list the ones that are not source (build outputs, vendored code) in `[dev] ignore` of its manifest",
                    self.root.display()
                );
            }
            match self.inner.watch(&d, RecursiveMode::NonRecursive) {
                Ok(()) => {}
                // Gone before it could be watched: nothing to watch.
                Err(e) if matches!(e.kind, notify::ErrorKind::PathNotFound) => continue,
                Err(e) if d != self.root => {
                    tracing::debug!(folder = %d.display(), error = %e, "cannot watch");
                    continue;
                }
                Err(e) => {
                    return Err(anyhow::anyhow!(
                        "cannot watch {}: {e}; if the limit of inotify watches is reached, raise fs.inotify.max_user_watches",
                        d.display()
                    ));
                }
            }
            self.watched.insert(d.clone());
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            for entry in entries.flatten() {
                let Ok(ty) = entry.file_type() else { continue };
                let p = entry.path();
                if ty.is_dir() && !self.is_ignored(&p) {
                    stack.push(p);
                }
            }
        }
        Ok(())
    }

    fn is_ignored(&self, p: &Path) -> bool {
        match p.strip_prefix(&self.root) {
            Ok(rel) => ignored(rel, &self.extra),
            Err(_) => true,
        }
    }

    /// The next change: waits for a first event that counts, then gathers until `quiet` passes
    /// without one (at most [`MAX_GATHER`]). Cancel-safe: what was gathered is kept in the
    /// watcher for the next call.
    pub(super) async fn next(&mut self, quiet: Duration) -> anyhow::Result<Change> {
        loop {
            let due = self
                .gathering
                .map(|(first, last)| (last + quiet).min(first + MAX_GATHER));
            tokio::select! {
                ev = self.events.recv() => match ev {
                    Some((p, dir)) => {
                        if self.take(p, dir)? {
                            let now = tokio::time::Instant::now();
                            let first = self.gathering.map_or(now, |(f, _)| f);
                            self.gathering = Some((first, now));
                        }
                    }
                    None => anyhow::bail!("the file watcher stopped"),
                },
                () = sleep_until(due) => {
                    self.gathering = None;
                    let mut more = std::mem::take(&mut self.more);
                    if self.dropped.swap(false, Ordering::Relaxed) {
                        more += 1;
                    }
                    return Ok(Change {
                        paths: std::mem::take(&mut self.paths).into_iter().collect(),
                        more,
                    });
                }
            }
        }
    }

    /// Count one event's path; a new folder is watched. Whether it counted.
    fn take(&mut self, p: PathBuf, created_dir: bool) -> anyhow::Result<bool> {
        let Ok(rel) = p.strip_prefix(&self.root) else {
            return Ok(false);
        };
        if rel.as_os_str().is_empty() || ignored(rel, &self.extra) {
            return Ok(false);
        }
        let rel = rel.to_string_lossy().into_owned();
        if created_dir || (p.is_dir() && !self.watched.contains(&p)) {
            self.watch_tree(&p)?;
        }
        if self.paths.len() < MAX_NAMED {
            self.paths.insert(rel);
        } else if !self.paths.contains(&rel) {
            self.more += 1;
        }
        Ok(true)
    }
}

/// Whether an event is a change: anything but a read, an open, or a close after reading.
fn counts(kind: &EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode};
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ignored_names_and_editor_scratch_do_not_count() {
        let extra = vec!["dist".to_owned()];
        for p in [
            "target/release/x",
            "node_modules/a/b.js",
            "src/__pycache__/m.pyc",
            ".git/index",
            "src/.main.py.swp",
            "dist/app.js",
            "main.py~",
            "#main.py#",
            "4913",
        ] {
            assert!(ignored(Path::new(p), &extra), "{p}");
        }
        for p in [
            "main.py",
            "src/lib.rs",
            "conduit-extension.toml",
            "distant/x",
        ] {
            assert!(!ignored(Path::new(p), &extra), "{p}");
        }
    }

    #[tokio::test]
    async fn a_burst_of_writes_is_one_change_and_new_folders_are_watched() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir(root.join("target")).unwrap();
        let mut w = Watcher::start(&root, &[]).unwrap();
        assert_eq!(w.watched(), 1, "target/ is not watched");
        std::fs::write(root.join("target/out"), "x").unwrap();
        std::fs::write(root.join("a.py"), "1").unwrap();
        std::fs::write(root.join("b.py"), "2").unwrap();
        let quiet = Duration::from_millis(200);
        let ch = tokio::time::timeout(Duration::from_secs(30), w.next(quiet))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(ch.paths, vec!["a.py".to_owned(), "b.py".to_owned()]);
        // A folder made now is watched, and a file written in it counts.
        std::fs::create_dir(root.join("pkg")).unwrap();
        let ch = tokio::time::timeout(Duration::from_secs(30), w.next(quiet))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(ch.paths, vec!["pkg".to_owned()]);
        std::fs::write(root.join("pkg/m.py"), "3").unwrap();
        let ch = tokio::time::timeout(Duration::from_secs(30), w.next(quiet))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(ch.paths, vec!["pkg/m.py".to_owned()]);
    }
}
