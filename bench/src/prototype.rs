//! What the transport comparison's host (`protocol-prototype`) and its two extension children
//! (`proto-jsonrpc-child`, `proto-grpc-child`) agree on: the workload's methods, the messages
//! each transport carries them in, and the probes the children use to say when they saw
//! something happen.
//!
//! The workload is the same over both transports:
//!
//! | call (host → extension) | what the extension does |
//! |---|---|
//! | handshake | answers its protocol version, or refuses the host's list |
//! | `echo {text}` | answers `{text}` unchanged |
//! | `callback {n, text}` | makes `n` sequential `ping {text}` calls to the host, timing each, and answers the times |
//! | `sleep {ms}` | tells the host it started (a `sleeping` callback, not awaited), then waits `ms`, or until cancelled; records when it saw the cancellation |
//! | `cancel_seen` | answers (and clears) when the last `sleep` started and saw its cancellation |
//! | `artifact {bytes, chunk_bytes}` | streams `bytes` bytes to the host in chunks, with their size (the host computes the SHA-256, as conduit's does, docs/protocol.md §8), and answers what the host stored |
//!
//! Cancellation is timed across the two processes on `CLOCK_MONOTONIC`, which is one clock
//! for the whole machine: the host notes the moment it starts cancelling, the extension the
//! moment its handler sees it, and the host reads the second with a follow-up call that is not
//! part of the timing. The host cancels (and, for the crash figure, kills) as soon as the
//! `sleeping` callback arrives: after an idle wait instead, the figure would mostly measure a
//! cold CPU (measured: 60 µs where the hot path takes 7.5), which the echo it is compared with
//! never pays.
//!
//! Not here: spawning, timing and reporting (the `protocol-prototype` binary's), and anything
//! of conduit's own protocol beyond what the SDK already speaks.

#[cfg(feature = "grpc")]
pub mod grpc;
pub mod jsonrpc;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use nix::time::{ClockId, clock_gettime};
use sha2::{Digest, Sha256};

/// The echoed text: 64 bytes that need no escaping in JSON.
pub const PAYLOAD: &str = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ+/";

/// The artifact's size: 16 MiB.
pub const ARTIFACT_BYTES: u64 = 16 * 1024 * 1024;

/// The artifact's chunk size: 64 KiB.
pub const CHUNK_BYTES: usize = 64 * 1024;

/// The protocol version both children speak unless told otherwise.
pub const VERSION: u32 = 1;

/// The artifact's name, as both children announce it.
pub const ARTIFACT_NAME: &str = "bench.bin";

/// Nanoseconds on `CLOCK_MONOTONIC`, comparable between processes on this machine.
pub fn mono_ns() -> u64 {
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// The artifact's content: `len` bytes of a fixed pseudo-random sequence (xorshift), made once
/// per process. Random-looking rather than constant, so neither transport gains from runs of
/// equal bytes.
pub fn artifact_bytes(len: usize) -> &'static [u8] {
    static DATA: OnceLock<Vec<u8>> = OnceLock::new();
    let data = DATA.get_or_init(|| {
        let mut v = Vec::with_capacity(ARTIFACT_BYTES as usize);
        for_each_block(ARTIFACT_BYTES as usize, |b| v.extend_from_slice(b));
        v
    });
    &data[..len.min(data.len())]
}

/// Feed the first `len` bytes of the artifact's sequence to `f`, a block at a time.
fn for_each_block(len: usize, mut f: impl FnMut(&[u8])) {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut block = [0u8; 4096];
    let mut left = len;
    while left > 0 {
        for word in block.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            word.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(block.len());
        f(&block[..n]);
        left -= n;
    }
}

/// The id the host answers for the artifact of `len` bytes (`sha256:<hex>`), computed once
/// per size, so that checking a transfer costs nothing inside its timing after the first.
///
/// Computed from the sequence block by block rather than from [`artifact_bytes`]: the host
/// would otherwise hold 16 MiB for nothing, and every child it spawns would pay for copying
/// the page tables of that memory (the supervisor's spawn forks; measured: +0.5 ms a start).
pub fn artifact_id(len: usize) -> String {
    static IDS: Mutex<Vec<(usize, String)>> = Mutex::new(Vec::new());
    let mut ids = IDS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, id)) = ids.iter().find(|(n, _)| *n == len) {
        return id.clone();
    }
    let mut hasher = Sha256::new();
    for_each_block(len.min(ARTIFACT_BYTES as usize), |b| hasher.update(b));
    let id = format!("sha256:{}", hex::encode(hasher.finalize()));
    ids.push((len, id.clone()));
    id
}

/// `first` (the start of the artifact's content) with its first 8 bytes replaced by `salt`
/// (little-endian), as [`jsonrpc::ArtifactParams::salt`] asks; unchanged for salt 0.
pub fn salted(first: &[u8], salt: u64) -> Vec<u8> {
    let mut out = first.to_vec();
    if salt != 0 {
        let n = out.len().min(8);
        out[..n].copy_from_slice(&salt.to_le_bytes()[..n]);
    }
    out
}

/// [`artifact_id`] of the content salted with `salt` ([`salted`]); not cached, so a salted id
/// costs one pass over `len` bytes.
pub fn salted_artifact_id(len: usize, salt: u64) -> String {
    if salt == 0 {
        return artifact_id(len);
    }
    let mut hasher = Sha256::new();
    let mut first = true;
    for_each_block(len.min(ARTIFACT_BYTES as usize), |b| {
        if first {
            hasher.update(salted(b, salt));
            first = false;
        } else {
            hasher.update(b);
        }
    });
    format!("sha256:{}", hex::encode(hasher.finalize()))
}

/// When the last `sleep` started and when it saw its cancellation (0: not yet).
static SLEEP_STARTED: AtomicU64 = AtomicU64::new(0);
static CANCEL_SEEN: AtomicU64 = AtomicU64::new(0);

/// The extension side's record of one cancellable `sleep`.
///
/// Created when the handler starts; [`SleepProbe::saw_cancel`] records the moment the handler
/// learns of the cancellation. Dropped before [`SleepProbe::finished`], it records the drop as
/// that moment: a transport that cancels by dropping the handler's future (gRPC does) tells the
/// handler no other way.
#[derive(Debug)]
pub struct SleepProbe {
    armed: bool,
}

impl SleepProbe {
    pub fn start() -> SleepProbe {
        SLEEP_STARTED.store(mono_ns(), Ordering::SeqCst);
        CANCEL_SEEN.store(0, Ordering::SeqCst);
        SleepProbe { armed: true }
    }

    /// The handler saw the cancellation now.
    pub fn saw_cancel(mut self) {
        self.record();
    }

    /// The sleep ran to its end: nothing to record.
    pub fn finished(mut self) {
        self.armed = false;
    }

    fn record(&mut self) {
        if self.armed {
            self.armed = false;
            let _ = CANCEL_SEEN.compare_exchange(0, mono_ns(), Ordering::SeqCst, Ordering::SeqCst);
        }
    }

    /// (started, seen) of the last sleep, in [`mono_ns`]; cleared once the cancellation has
    /// been seen, so that a host that asks before the handler saw it can ask again.
    pub fn take() -> (u64, u64) {
        let seen = CANCEL_SEEN.swap(0, Ordering::SeqCst);
        let started = if seen == 0 {
            SLEEP_STARTED.load(Ordering::SeqCst)
        } else {
            SLEEP_STARTED.swap(0, Ordering::SeqCst)
        };
        (started, seen)
    }
}

impl Drop for SleepProbe {
    fn drop(&mut self) {
        self.record();
    }
}

/// The extension children's few arguments (no argument parser, so that the children stay as
/// small as an extension author's would).
#[derive(Debug, Clone, Default)]
pub struct ChildArgs {
    /// `--protocol-version N`: speak only this version (to be refused).
    pub protocol_version: Option<u32>,
    /// `--socket PATH`: where the gRPC child serves.
    pub socket: Option<String>,
    /// `--host-socket PATH`: where the host serves the gRPC child's callbacks.
    pub host_socket: Option<String>,
}

impl ChildArgs {
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<ChildArgs, String> {
        let mut out = ChildArgs::default();
        let mut args = args.into_iter();
        while let Some(a) = args.next() {
            let mut value = || args.next().ok_or_else(|| format!("{a} needs a value"));
            match a.as_str() {
                "--protocol-version" => {
                    let v = value()?;
                    out.protocol_version =
                        Some(v.parse().map_err(|_| format!("bad protocol version {v}"))?);
                }
                "--socket" => out.socket = Some(value()?),
                "--host-socket" => out.host_socket = Some(value()?),
                other => return Err(format!("unknown argument {other}")),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_records_the_first_sign_of_cancellation_only() {
        let p = SleepProbe::start();
        p.saw_cancel();
        let (started, seen) = SleepProbe::take();
        assert!(started > 0 && seen >= started, "{started} {seen}");
        assert_eq!(SleepProbe::take(), (0, 0));

        SleepProbe::start().finished();
        let (started, seen) = SleepProbe::take();
        assert!(started > 0, "asked before a cancellation, the start stays");
        assert_eq!(seen, 0, "a finished sleep saw no cancellation");

        drop(SleepProbe::start());
        assert!(
            SleepProbe::take().1 > 0,
            "a dropped sleep counts as cancelled"
        );
    }

    #[test]
    fn the_artifact_id_is_the_digest_of_its_bytes() {
        let want = format!(
            "sha256:{}",
            hex::encode(Sha256::digest(artifact_bytes(10_000)))
        );
        assert_eq!(artifact_id(10_000), want);
    }

    #[test]
    fn a_salted_artifact_id_is_the_digest_of_the_salted_bytes() {
        for len in [3, 8, 10_000] {
            let bytes = artifact_bytes(len);
            let mut salted_bytes = salted(&bytes[..len.min(4096)], 77);
            salted_bytes.extend_from_slice(&bytes[len.min(4096)..]);
            assert_ne!(salted_bytes, bytes);
            let want = format!("sha256:{}", hex::encode(Sha256::digest(&salted_bytes)));
            assert_eq!(salted_artifact_id(len, 77), want, "{len} bytes");
        }
        assert_eq!(salted_artifact_id(10_000, 0), artifact_id(10_000));
    }

    #[test]
    fn the_artifact_is_the_same_every_time_and_not_constant() {
        let a = artifact_bytes(1024);
        assert_eq!(a, artifact_bytes(1024));
        assert!(a.iter().any(|&b| b != a[0]));
        assert_eq!(
            artifact_bytes(ARTIFACT_BYTES as usize).len(),
            ARTIFACT_BYTES as usize
        );
    }

    #[test]
    fn child_args_parse() {
        let a = ChildArgs::parse(
            [
                "--socket",
                "/s",
                "--protocol-version",
                "2",
                "--host-socket",
                "/h",
            ]
            .map(String::from),
        )
        .unwrap();
        assert_eq!(a.protocol_version, Some(2));
        assert_eq!(a.socket.as_deref(), Some("/s"));
        assert_eq!(a.host_socket.as_deref(), Some("/h"));
        assert!(ChildArgs::parse(["--what".to_owned()]).is_err());
    }
}
