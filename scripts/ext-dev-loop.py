#!/usr/bin/env python3
"""Save-to-ready of `conduit ext dev`: edit python-echo's handler N times, time each from the
write to the `state: ready` event of the new run (the debounce included). Run with:
  python3 scripts/ext-dev-loop.py target/debug/conduit examples/python-echo 20 50
"""
import json, os, shutil, signal, subprocess, sys, tempfile, time, threading, queue

conduit, example, n, debounce = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
work = tempfile.mkdtemp()
pkg = os.path.join(work, "python-echo")
shutil.copytree(example, pkg, ignore=shutil.ignore_patterns("__pycache__"))
# The repository keeps one copy of the SDK; a package carries its own.
subprocess.run([os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendor-sdk.sh"), "python", pkg], check=True)
env = dict(os.environ)
env.pop("CONDUIT_STATE_DIR", None)
p = subprocess.Popen([conduit, "ext", "dev", pkg, "--standalone", "--json", "--debounce-ms", debounce],
                     stdout=subprocess.PIPE, env=env, text=True)
events = queue.Queue()
threading.Thread(target=lambda: [events.put(json.loads(l)) for l in p.stdout if l.startswith("{")], daemon=True).start()

def ready(after_pid):
    while True:
        e = events.get(timeout=60)
        if e["event"] == "state" and e["state"] == "ready" and e.get("pid") != after_pid:
            return e["pid"]

pid = ready(None)
times = []
path = os.path.join(pkg, "echo.py")
for i in range(n):
    text = open(path).read()
    t0 = time.monotonic()
    with open(path, "w") as f:
        f.write(text + f"\n# edit {i}\n")
    pid = ready(pid)
    times.append((time.monotonic() - t0) * 1000)
p.send_signal(signal.SIGINT)
p.wait(timeout=60)
times.sort()
print(json.dumps({"n": n, "debounce_ms": int(debounce), "p50_ms": round(times[len(times)//2], 1),
                  "min_ms": round(times[0], 1), "max_ms": round(times[-1], 1), "exit": p.returncode}))
shutil.rmtree(work)
