//! The spawner (`conduit_supervisor::spawner`) driven directly, with the real `conduit` binary:
//! its children are this process's, its failures keep their step and errno, and one that
//! stops answering is given up after its bound, every later start forking here instead.
//!
//! One test, because the spawner a process starts is process-wide: a second test in this
//! binary would share it.

#![cfg(target_os = "linux")]

use std::path::Path;
use std::time::Instant;

use conduit_supervisor::process::{ChildCommand, Confinement, release_leader};
use conduit_supervisor::spawner::{self, REPLY_TIMEOUT};
use conduit_supervisor::start::spawn_on_forker;

mod support;
use support::PATIENCE;

fn command(program: &str, cwd: &Path) -> ChildCommand {
    ChildCommand {
        program: program.into(),
        args: vec!["1000".into()],
        cwd: cwd.to_owned(),
        env: Vec::new(),
    }
}

fn ppid(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .unwrap_or("")
        .trim()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spawners_children_are_ours_its_failures_keep_their_step_and_a_stopped_one_is_given_up()
{
    let tmp = tempfile::tempdir().unwrap();
    let pid = spawner::start(Path::new(env!("CARGO_BIN_EXE_conduit")))
        .await
        .unwrap()
        .expect("CONDUIT_SPAWNER is not set to off here");

    // A start: this process's child, waited for and killed through its pidfd.
    let (mut child, _) = spawn_on_forker(command("sleep", tmp.path()), Confinement::none(), None)
        .await
        .unwrap();
    let sleeper = child.id().unwrap();
    assert_eq!(ppid(sleeper), std::process::id().to_string());
    child.start_kill().unwrap();
    let st = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(!st.success(), "{st:?}");
    assert_eq!(child.id(), None, "reaped");
    release_leader(sleeper);

    // A program that is not there: the exec's own error, as a fork here gives it.
    let err = spawn_on_forker(
        command("/nonexistent/conduit-test", tmp.path()),
        Confinement::none(),
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{err}");
    // A step before it: named.
    let err = spawn_on_forker(
        command("sleep", &tmp.path().join("missing")),
        Confinement::none(),
        None,
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("cannot enter its working directory"),
        "{err}"
    );

    // Stopped, it answers nothing: the start waits out the bound, then forks here.
    let stopped = nix::unistd::Pid::from_raw(pid as i32);
    nix::sys::signal::kill(stopped, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let t = Instant::now();
    let (mut child, _) = spawn_on_forker(command("sleep", tmp.path()), Confinement::none(), None)
        .await
        .unwrap();
    let waited = t.elapsed();
    assert!(waited >= REPLY_TIMEOUT, "given up after {waited:?}");
    assert!(
        waited < REPLY_TIMEOUT + PATIENCE,
        "given up after {waited:?}"
    );
    let fallback = child.id().unwrap();
    child.start_kill().unwrap();
    let _ = child.wait().await;
    release_leader(fallback);
    // And is not asked again: the next start does not wait.
    let t = Instant::now();
    let (mut child, _) = spawn_on_forker(command("sleep", tmp.path()), Confinement::none(), None)
        .await
        .unwrap();
    assert!(
        t.elapsed() < REPLY_TIMEOUT,
        "asked the stopped spawner again"
    );
    let last = child.id().unwrap();
    child.start_kill().unwrap();
    let _ = child.wait().await;
    release_leader(last);
    let _ = nix::sys::signal::kill(stopped, nix::sys::signal::Signal::SIGKILL);
}
