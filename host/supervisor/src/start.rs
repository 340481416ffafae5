//! Starting an extension's process: on the forker thread (`forker.rs`), through the spawner
//! when this process has one (`spawner.rs`, Linux), else forked right there
//! ([`crate::process::spawn_with_bulk`]). The supervisor starts every run here.

use std::io;

use crate::child::ExtChild;
use crate::process::{Applied, ChildCommand, Confinement};

/// Start `cmd` confined by `confine`, with `bulk` (a pipe's write end, closed once the child
/// has its copy) as its descriptor 3. Must be called inside a tokio runtime.
pub async fn spawn_on_forker(
    cmd: ChildCommand,
    confine: Confinement,
    bulk: Option<std::os::fd::OwnedFd>,
) -> io::Result<(ExtChild, Applied)> {
    crate::forker::run(
        move || {
            let bulk_fd = bulk.as_ref().map(std::os::fd::AsFd::as_fd);
            #[cfg(target_os = "linux")]
            let spawned = crate::spawner::spawn(&cmd, &confine, bulk_fd);
            #[cfg(not(target_os = "linux"))]
            let spawned = None;
            spawned.unwrap_or_else(|| {
                crate::process::spawn_with_bulk(&cmd, &confine, bulk_fd)
                    .and_then(|(c, applied)| Ok((ExtChild::from_tokio(c)?, applied)))
            })
        },
        |(child, _)| {
            // Nobody waits any more (the caller gave up): the child is killed as it drops, and
            // is no leader of ours.
            if let Some(pid) = child.id() {
                crate::process::release_leader(pid);
            }
            drop(child);
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use nix::sys::signal::Signal;
    use nix::unistd::Pid;

    use super::*;
    use crate::process::{is_leader, release_leader};

    fn sleeper() -> ChildCommand {
        ChildCommand {
            program: "sleep".into(),
            args: vec!["1000".into()],
            cwd: std::env::temp_dir(),
            env: Vec::new(),
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_child_of_the_forker_outlives_the_runtime_and_thread_that_asked_for_it() {
        // The parent-death signal is tied to the forking thread: were the child forked on the
        // asking thread, it would be SIGKILLed when that thread exits below.
        let asked = std::thread::spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let (child, _) = spawn_on_forker(sleeper(), Confinement::none(), None)
                    .await
                    .unwrap();
                let pid = child.id().unwrap();
                assert!(is_leader(pid), "registered before anyone could reap it");
                std::mem::forget(child); // no kill on drop: this test ends it itself
                pid
            })
        });
        let pid = asked.join().unwrap();
        let alive = || crate::tree::stat(pid).is_some_and(|s| !s.is_zombie());
        // The signal would come with the thread's exit; a second is far more than it takes.
        let until = std::time::Instant::now() + Duration::from_secs(1);
        while std::time::Instant::now() < until {
            assert!(alive(), "the child died with the thread that asked for it");
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(Pid::from_raw(pid as i32), None);
        release_leader(pid);
    }

    #[tokio::test]
    async fn the_forker_reports_a_program_that_cannot_start() {
        let cmd = ChildCommand {
            program: "/nonexistent/conduit-test-program".into(),
            ..sleeper()
        };
        let err = spawn_on_forker(cmd, Confinement::none(), None)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
        // And it goes on serving.
        let (mut child, _) = spawn_on_forker(sleeper(), Confinement::none(), None)
            .await
            .unwrap();
        let pid = child.id().unwrap();
        child.start_kill().unwrap();
        let st = child.wait().await.unwrap();
        assert!(!st.success());
        release_leader(pid);
    }
}
