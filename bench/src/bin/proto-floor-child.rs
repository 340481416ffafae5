//! The minimal child of the transport comparison's floors: plain blocking system calls on
//! std's handles, no async runtime, no protocol (`conduit_bench::floor` has the roles).
//!
//! Run by `protocol-prototype` as `proto-floor-child ROLE`, where ROLE is
//! `lines` (echo every line), `first-byte` (write one byte and exit), `blast` (for each line
//! `N` on stdin, write N bytes in 64 KiB writes) or `hang` (write one byte, then wait for
//! stdin to close).

use std::process::ExitCode;

use conduit_bench::floor;

fn main() -> ExitCode {
    let role = std::env::args().nth(1).unwrap_or_default();
    let res = match role.as_str() {
        "lines" => floor::serve_lines(),
        "first-byte" => floor::first_byte(),
        "blast" => floor::blast(64 * 1024),
        "hang" => floor::hang(),
        other => {
            eprintln!("proto-floor-child: unknown role `{other}` (lines, first-byte, blast, hang)");
            return ExitCode::from(2);
        }
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("proto-floor-child: {e:#}");
            ExitCode::FAILURE
        }
    }
}
