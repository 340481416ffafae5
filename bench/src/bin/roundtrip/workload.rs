//! The host side of each workload: spawn the child, warm up, time sequential echo calls, close
//! the child's stdin and reap it.
//!
//! Each workload is one sequential caller: the next call starts when the previous answer is in.
//! The host side of every tokio workload runs on a runtime of its own, created for that
//! workload and dropped after it, so no state carries from one workload to the next: a
//! current-thread runtime by default, or ([`HostRuntime::HostLoop`]) a two-worker one whose
//! session tasks run on the workers while the calls come from the main thread blocking on each,
//! as the daemon's host loop makes them.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use conduit_protocol::message::{self, Message, RequestParams};
use conduit_protocol::{MAX_MESSAGE_BYTES, RequestId};
use conduit_rpc::codec::{Frame, FrameReader};
use conduit_rpc::{CallOptions, NoRequests, Peer, Session, SessionConfig};
use hdrhistogram::Histogram;
use jsonrpsee::core::client::{ClientBuilder, ClientT};
use jsonrpsee::core::traits::ToRpcParams;
use serde_json::value::RawValue;
use tokio::io::AsyncWriteExt;
use tokio::process::{ChildStdin, ChildStdout};

use crate::child::{self, Role};
use crate::jsonrpsee_client;
use crate::measure::Run;
use conduit_bench::measure::{CpuMark, new_histogram, record};

/// The echoed text: 64 bytes that need no escaping in JSON.
pub(crate) const PAYLOAD: &str = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ+/";

/// How long a child may take to exit once its stdin is closed before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(5);

/// Where the host side's calls come from and its session's tasks run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum HostRuntime {
    /// One thread: the calls and the session's tasks share a current-thread runtime.
    #[default]
    Current,
    /// The daemon's shape: a two-worker runtime carries the session, and the calls come from
    /// another thread blocking on each (`block_on`), as the host loop's do.
    HostLoop,
}

impl HostRuntime {
    pub(crate) fn key(self) -> &'static str {
        match self {
            HostRuntime::Current => "current",
            HostRuntime::HostLoop => "host-loop",
        }
    }

    fn build(self) -> std::io::Result<tokio::runtime::Runtime> {
        match self {
            HostRuntime::Current => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build(),
            HostRuntime::HostLoop => tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build(),
        }
    }
}

/// Every workload, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Workload {
    Floor,
    TokioInline,
    Conduit,
    SessionHost,
    JsonrpseeDispatch,
    JsonrpseeClient,
}

impl Workload {
    pub(crate) const ALL: [Workload; 6] = [
        Workload::Floor,
        Workload::TokioInline,
        Workload::Conduit,
        Workload::SessionHost,
        Workload::JsonrpseeDispatch,
        Workload::JsonrpseeClient,
    ];

    /// The key in tables and JSON.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Workload::Floor => "floor",
            Workload::TokioInline => "tokio-inline",
            Workload::Conduit => "conduit",
            Workload::SessionHost => "session-host",
            Workload::JsonrpseeDispatch => "jsonrpsee-dispatch",
            Workload::JsonrpseeClient => "jsonrpsee-client",
        }
    }

    /// One line on what runs on each side.
    pub(crate) fn description(self) -> &'static str {
        match self {
            Workload::Floor => {
                "raw pipe ping-pong of a 64-byte line, blocking read/write on both sides"
            }
            Workload::TokioInline => {
                "JSON-RPC echo, both sides one task on a current-thread runtime over epoll pipes: \
                 conduit framing and message parsing, no session"
            }
            Workload::Conduit => "conduit_rpc::Session on both sides, TestHandler echo",
            Workload::SessionHost => {
                "conduit_rpc::Session on the host, the one-task inline loop in the child"
            }
            Workload::JsonrpseeDispatch => {
                "conduit_rpc::Session on the host, child dispatching through \
                 jsonrpsee RpcModule::raw_json_request"
            }
            Workload::JsonrpseeClient => {
                "jsonrpsee client (build_with_tokio over the pipes, with a demux task) on the \
                 host, the RpcModule child"
            }
        }
    }

    fn role(self) -> Role {
        match self {
            Workload::Floor => Role::Floor,
            Workload::TokioInline | Workload::SessionHost => Role::Inline,
            Workload::Conduit => Role::Conduit,
            Workload::JsonrpseeDispatch | Workload::JsonrpseeClient => Role::Jsonrpsee,
        }
    }

    /// Spawn the child (on `child_cpu` if given, else where this thread may run), make
    /// `warmup` untimed calls and `calls` timed ones, reap the child.
    pub(crate) fn run(
        self,
        exe: &Path,
        warmup: u64,
        calls: u64,
        child_cpu: Option<usize>,
        host_runtime: HostRuntime,
    ) -> anyhow::Result<Run> {
        let mut args = vec!["--child".to_owned(), self.role().arg().to_owned()];
        if let Some(cpu) = child_cpu {
            args.extend(["--pin".to_owned(), cpu.to_string()]);
        }
        if self == Workload::Floor {
            return floor(exe, &args, warmup, calls);
        }
        // The runtime's threads inherit this thread's placement.
        let rt = host_runtime.build().context("tokio runtime")?;
        let mark = CpuMark::now()?;
        let hist = rt.block_on(self.run_async(exe, &args, warmup, calls))?;
        drop(rt);
        Ok(Run::one(hist, warmup + calls, mark.elapsed()?))
    }

    async fn run_async(
        self,
        exe: &Path,
        args: &[String],
        warmup: u64,
        calls: u64,
    ) -> anyhow::Result<Histogram<u64>> {
        let mut child = tokio::process::Command::new(exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawning {}", exe.display()))?;
        let stdin = child.stdin.take().context("child stdin")?;
        let stdout = child.stdout.take().context("child stdout")?;
        let params = RawValue::from_string(format!(r#"{{"text":"{PAYLOAD}"}}"#))?;

        // Each arm drops its handles on the child's stdin before it returns, which tells the
        // child to exit.
        let hist = match self {
            Workload::Floor => unreachable!("the floor runs without tokio"),
            Workload::TokioInline => {
                let mut caller = InlineCaller {
                    stdin,
                    frames: FrameReader::new(stdout, MAX_MESSAGE_BYTES),
                    next_id: 1,
                    out: Vec::with_capacity(256),
                    params,
                };
                drive(&mut caller, warmup, calls).await?
            }
            Workload::Conduit | Workload::SessionHost | Workload::JsonrpseeDispatch => {
                let session =
                    Session::new(stdout, stdin, NoRequests, SessionConfig::named(self.key()));
                let mut caller = SessionCaller {
                    peer: session.peer(),
                    params,
                };
                let hist = drive(&mut caller, warmup, calls).await;
                session.close(Duration::from_secs(1)).await;
                hist?
            }
            Workload::JsonrpseeClient => {
                let (sender, receiver, demux) = jsonrpsee_client::transport(
                    stdout,
                    stdin,
                    child::echo_module()?,
                    MAX_MESSAGE_BYTES,
                );
                let client = ClientBuilder::default()
                    .request_timeout(Duration::from_secs(10))
                    .build_with_tokio(sender, receiver);
                let mut caller = JsonrpseeCaller { client, params };
                let hist = drive(&mut caller, warmup, calls).await;
                drop(caller);
                demux.abort();
                let _ = demux.await;
                hist?
            }
        };

        match tokio::time::timeout(EXIT_GRACE, child.wait()).await {
            Ok(status) => {
                let status = status.context("waiting for the child")?;
                ensure!(
                    status.success(),
                    "the {} child exited with {status}",
                    self.key()
                );
            }
            Err(_) => {
                child.kill().await.context("killing the child")?;
                bail!(
                    "the {} child did not exit after its stdin closed",
                    self.key()
                );
            }
        }
        Ok(hist)
    }
}

/// One sequential echo call.
trait Caller {
    /// Make one call and check its answer.
    async fn call(&mut self) -> anyhow::Result<()>;
}

async fn drive<C: Caller>(c: &mut C, warmup: u64, calls: u64) -> anyhow::Result<Histogram<u64>> {
    let mut hist = new_histogram();
    for _ in 0..warmup {
        c.call().await?;
    }
    for _ in 0..calls {
        let start = Instant::now();
        c.call().await?;
        record(&mut hist, start.elapsed());
    }
    Ok(hist)
}

/// The floor: no runtime, no JSON, blocking system calls on both ends.
fn floor(exe: &Path, args: &[String], warmup: u64, calls: u64) -> anyhow::Result<Run> {
    let mut cmd = std::process::Command::new(exe);
    cmd.args(args);
    // The child pins itself (`--pin`), so the spawn needs no placement of its own.
    let cpus = conduit_bench::regime::Cpus::default();
    let pp = conduit_bench::floor::ping_pong(&mut cmd, cpus, warmup, calls, PAYLOAD)?;
    Ok(Run::one(pp.hist, pp.calls_total, pp.life))
}

/// Writes the request and reads the answer on the calling task, nothing else.
struct InlineCaller {
    stdin: ChildStdin,
    frames: FrameReader<ChildStdout>,
    next_id: i64,
    out: Vec<u8>,
    params: Box<RawValue>,
}

impl Caller for InlineCaller {
    async fn call(&mut self) -> anyhow::Result<()> {
        let id = self.next_id;
        self.next_id += 1;
        self.out.clear();
        message::write_request(&mut self.out, &RequestId::num(id), "echo", |out| {
            self.params.write_to(out)
        })?;
        self.out.push(b'\n');
        self.stdin.write_all(&self.out).await?;
        loop {
            let frame = self
                .frames
                .next()
                .await
                .context("the child closed stdout")??;
            let Frame::Message(line) = frame else {
                bail!("unexpected frame {frame:?}");
            };
            if let Ok(Message::Response { id: got, result }) = Message::parse(&line) {
                ensure!(got.as_num() == Some(id), "answer to {got}, expected {id}");
                let raw = result.map_err(|e| anyhow::anyhow!("echo failed: {e}"))?;
                ensure!(raw.get() == self.params.get(), "wrong echo {}", raw.get());
                return Ok(());
            }
        }
    }
}

/// A call through the conduit session, as the host's adapter will make it.
struct SessionCaller {
    peer: Peer,
    params: Box<RawValue>,
}

impl Caller for SessionCaller {
    async fn call(&mut self) -> anyhow::Result<()> {
        let raw = self
            .peer
            .request("echo", &self.params, CallOptions::within(None))
            .await?;
        ensure!(raw.get() == self.params.get(), "wrong echo {}", raw.get());
        Ok(())
    }
}

/// Already-serialized params, so the jsonrpsee client does the same work as the others.
struct RawParams<'a>(&'a RawValue);

impl ToRpcParams for RawParams<'_> {
    fn to_rpc_params(self) -> Result<Option<Box<RawValue>>, serde_json::Error> {
        Ok(Some(self.0.to_owned()))
    }
}

struct JsonrpseeCaller<C> {
    client: C,
    params: Box<RawValue>,
}

impl<C: ClientT> Caller for JsonrpseeCaller<C> {
    async fn call(&mut self) -> anyhow::Result<()> {
        let raw: Box<RawValue> = self.client.request("echo", RawParams(&self.params)).await?;
        ensure!(raw.get() == self.params.get(), "wrong echo {}", raw.get());
        Ok(())
    }
}
