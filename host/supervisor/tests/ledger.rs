//! The ledger sweep against real processes this test starts itself.
//!
//! Its own test binary: the processes stand for what a killed daemon's extension left, so they
//! are plain children of this process, and a supervisor's orphan reaper in the same process (the
//! tests of `escapes.rs`, run in threads by `cargo test`) would kill and reap them as orphans.

use conduit_supervisor::tree;

#[test]
fn the_ledger_sweep_kills_recorded_processes_wherever_they_moved_and_nothing_else() {
    // Processes this test starts itself stand for what a killed daemon's extension left.
    let dir = tempfile::tempdir().unwrap();
    let mut kids: Vec<std::process::Child> = (0..2)
        .map(|_| {
            use std::os::unix::process::CommandExt;
            let mut c = std::process::Command::new("sleep");
            c.arg("1000");
            c.process_group(0);
            c.spawn().unwrap()
        })
        .collect();
    let recorded = tree::stat(kids[0].id()).unwrap().id;
    let stranger = kids[1].id();
    let ledger = tree::Ledger::new(dir.path().join(format!("gone{}", tree::LEDGER_SUFFIX)));
    // The second entry has the stranger's pid but another start time: a reused pid.
    let reused = tree::ProcId {
        pid: stranger,
        start: tree::stat(stranger).unwrap().id.start + 1,
    };
    ledger
        .write(&[recorded, reused].into_iter().collect())
        .unwrap();
    let swept = tree::sweep_ledgers(dir.path());
    assert_eq!(swept, vec![("gone".to_owned(), 1)]);
    let st = kids[0].wait().unwrap();
    assert!(st.code().is_none(), "killed by a signal");
    assert!(
        kids[1].try_wait().unwrap().is_none(),
        "a reused pid is never killed"
    );
    assert!(!ledger.path().exists());
    let _ = kids[1].kill();
    let _ = kids[1].wait();
}
