#!/usr/bin/env python3
"""The burst of issue 30 against a release daemon, and what each allocator costs per call.

Run with `make bench-burst-memory`, or by hand:

    scripts/bench-burst-memory.py --conduit target/release/conduit \
        --allocators glibc,jemalloc,mimalloc --json target/bench-burst-memory/results.json

For each allocator a fresh daemon runs two packages: `deaf` (escape.py in `stop-reading`
mode: it answers its handshake, then never reads stdin) and `echo` (misbehave.py in `ok`
mode). First the burst: 64 concurrent `POST /v1/extensions/deaf/call` of 600 KiB each (2 s
deadline), the daemon's RSS before, at its peak (VmHWM), when the calls have ended, then
`conduit ext remove deaf` and RSS polled for 10 s after it returned. Then the cost of a call:
sequential echo calls of 1 KiB and of 600 KiB over one keep-alive connection, the daemon's CPU
time per call (utime + stime from /proc, the whole process) and the client's latency p50/p99.

`glibc` is the daemon as built (malloc, and the trimmer of host/src/daemon/memory.rs);
`jemalloc` and `mimalloc` are Debian's libraries (libjemalloc2, libmimalloc2.0) put in place
of malloc with LD_PRELOAD — jemalloc with a background thread purging after 1 s — skipped when
not installed. The trimmer's malloc_trim then works on glibc's unused arenas and does nothing.

Nothing here asserts: it prints figures (docs/perf-log/2026-12-04-burst-memory.md).
"""

import argparse
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRELOADS = {
    "jemalloc": (
        "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
        {"MALLOC_CONF": "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0"},
    ),
    "mimalloc": ("/usr/lib/x86_64-linux-gnu/libmimalloc.so.2", {}),
}
CALLERS = 64
PAYLOAD = 600 * 1024
TICK = os.sysconf("SC_CLK_TCK")


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("conduit", timeout=60)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def post(conn, path, body):
    conn.request("POST", path, body=body, headers={"content-type": "application/json"})
    res = conn.getresponse()
    return json.loads(res.read())


def kib(pid, field):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def cpu_s(pid):
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def package(dir, name, script, mode):
    pkg = dir / "src" / name
    pkg.mkdir(parents=True)
    shutil.copy(ROOT / "host/supervisor/tests/fixtures" / script, pkg / script)
    (pkg / "conduit-extension.toml").write_text(
        f'name = "{name}"\nversion = "0.1.0"\nprotocol = 1\n'
        f'command = ["python3", "{script}", "{mode}"]\n\n[capabilities]\nmethods = ["echo"]\n'
    )
    return pkg


def wait(what, probe, patience=60):
    start = time.monotonic()
    while time.monotonic() - start < patience:
        v = probe()
        if v:
            return v
        time.sleep(0.05)
    sys.exit(f"timed out waiting for {what}")


def run(conduit, allocator, echo_small, echo_large):
    dir = Path(tempfile.mkdtemp(prefix="bench-burst-"))
    env = dict(os.environ, CONDUIT_STATE_DIR=str(dir / "state"))
    env.pop("CONDUIT_LOG", None)
    cli = lambda *a: subprocess.run([conduit, *a], env=env, capture_output=True, text=True)
    for name, script, mode in (("deaf", "escape.py", "stop-reading"), ("echo", "misbehave.py", "ok")):
        r = cli("ext", "install", "--no-wait", "--force", str(package(dir, name, script, mode)))
        if r.returncode != 0:
            sys.exit(r.stderr)
    denv = dict(env)
    if allocator in PRELOADS:
        lib, extra = PRELOADS[allocator]
        denv["LD_PRELOAD"] = lib
        denv.update(extra)
    log = open(dir / "daemon.log", "w")
    daemon = subprocess.Popen([conduit, "daemon", "run"], env=denv, stdout=log, stderr=log)
    sock = str(dir / "state/run/conduit.sock")
    try:
        for name in ("deaf", "echo"):
            wait(f"{name} ready", lambda: json.loads(cli("ext", "status", name, "--json").stdout or "{}").get("state") == "ready")
        pid = daemon.pid
        conn = UnixHTTPConnection(sock)
        conn.request("GET", "/v1/health")
        conn.getresponse().read()
        conn.close()
        time.sleep(1)
        out = {"before_mib": kib(pid, "VmRSS") / 1024}

        body = json.dumps({"method": "echo", "params": "x" * PAYLOAD, "timeout_ms": 2000})
        names = []

        def caller():
            c = UnixHTTPConnection(sock)
            names.append(post(c, "/v1/extensions/deaf/call", body).get("error", {}).get("name"))
            c.close()

        threads = [threading.Thread(target=caller) for _ in range(CALLERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out["peak_mib"] = kib(pid, "VmHWM") / 1024
        out["after_calls_mib"] = kib(pid, "VmRSS") / 1024
        out["refused_or_timed_out"] = sum(n in ("deadline_exceeded", "overloaded") for n in names)
        t = time.monotonic()
        r = cli("ext", "remove", "deaf")
        if r.returncode != 0:
            sys.exit(r.stderr)
        out["remove_s"] = time.monotonic() - t
        removed = time.monotonic()
        back = None
        while time.monotonic() - removed < 10:
            rss = kib(pid, "VmRSS") / 1024
            if back is None and rss <= out["before_mib"] + 20:
                back = time.monotonic() - removed
            time.sleep(0.05)
        out["back_within_20_mib_s"] = back
        out["after_10s_mib"] = kib(pid, "VmRSS") / 1024

        # A connection of its own: the server closes one left idle past its header timeout.
        conn = UnixHTTPConnection(sock)
        for label, size, n in (("echo_1k", 1024, echo_small), ("echo_600k", PAYLOAD, echo_large)):
            body = json.dumps({"method": "echo", "params": "x" * size, "timeout_ms": 10000})
            for _ in range(min(50, n)):
                post(conn, "/v1/extensions/echo/call", body)
            lat = []
            c0 = cpu_s(pid)
            for _ in range(n):
                t = time.perf_counter()
                a = post(conn, "/v1/extensions/echo/call", body)
                lat.append(time.perf_counter() - t)
                if "result" not in a:
                    sys.exit(f"echo failed: {str(a)[:200]}")
            cpu = cpu_s(pid) - c0
            lat.sort()
            out[label] = {
                "calls": n,
                "daemon_cpu_us_per_call": cpu / n * 1e6,
                "p50_us": lat[n // 2] * 1e6,
                "p99_us": lat[int(n * 0.99)] * 1e6,
            }
        out["after_echo_mib"] = kib(pid, "VmRSS") / 1024
        return out
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
        shutil.rmtree(dir, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conduit", default=str(ROOT / "target/release/conduit"))
    p.add_argument("--allocators", default="glibc,jemalloc,mimalloc")
    p.add_argument("--echo-small", type=int, default=5000, help="1 KiB echo calls measured")
    p.add_argument("--echo-large", type=int, default=300, help="600 KiB echo calls measured")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args()
    results = {"load_before": os.getloadavg()[0], "allocators": {}}
    for alloc in a.allocators.split(","):
        if alloc in PRELOADS and not Path(PRELOADS[alloc][0]).exists():
            print(f"{alloc}: {PRELOADS[alloc][0]} is not installed; skipped", file=sys.stderr)
            continue
        r = run(a.conduit, alloc, a.echo_small, a.echo_large)
        r["load"] = os.getloadavg()[0]
        results["allocators"][alloc] = r
        back = r["back_within_20_mib_s"]
        print(
            f"{alloc:9} RSS before {r['before_mib']:.1f} MiB, peak {r['peak_mib']:.1f}, "
            f"calls ended {r['after_calls_mib']:.1f}, 10 s after removal {r['after_10s_mib']:.1f} "
            f"(within 20 MiB {'at %.1f s' % back if back is not None else 'never'}); "
            f"daemon CPU per echo 1 KiB {r['echo_1k']['daemon_cpu_us_per_call']:.0f} us "
            f"(p50 {r['echo_1k']['p50_us']:.0f} us), 600 KiB "
            f"{r['echo_600k']['daemon_cpu_us_per_call']:.0f} us (p50 {r['echo_600k']['p50_us']:.0f} us); "
            f"RSS after echoes {r['after_echo_mib']:.1f}; load {r['load']:.1f}",
            flush=True,
        )
    results["load_after"] = os.getloadavg()[0]
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
