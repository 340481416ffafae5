"""A host for tests: starts an extension as a subprocess and plays conduit over its pipes."""
import json
import os
import queue
import subprocess
import sys
import threading
import time

RECV_TIMEOUT = 10.0

INITIALIZE_PARAMS = {
    "protocol_versions": [1],
    "host": {"name": "conduit", "version": "0.1.0"},
    "limits": {"max_message_bytes": 16777216, "max_concurrent_requests": 64,
               "max_artifact_chunk_bytes": 262144, "artifact_window": 8},
    "deadlines": {"in_transaction_ms": 250, "default_ms": 30000, "shutdown_grace_ms": 5000},
}


class FakeHost:
    def __init__(self, argv, cwd=None, pass_fds=()):
        self.proc = subprocess.Popen([sys.executable, "-B"] + argv, cwd=cwd, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     pass_fds=pass_fds)
        self.answers = queue.Queue()  # answers and errors to our requests
        self.calls = queue.Queue()  # requests and notifications from the extension
        self.stashed = []
        self.violations = []
        self.stderr = []
        self.next_id = 100
        threading.Thread(target=self._out, daemon=True).start()
        threading.Thread(target=self._err, daemon=True).start()

    def _out(self):
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
                assert line.endswith(b"\n") and isinstance(msg, dict) and msg["jsonrpc"] == "2.0"
            except Exception:
                self.violations.append(line)
                continue
            (self.calls if "method" in msg else self.answers).put(msg)
        self.answers.put(None)

    def _err(self):
        for line in self.proc.stderr:
            self.stderr.append(line.decode("utf-8", "replace"))

    def send_raw(self, data):
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, msg):
        self.send_raw(json.dumps(msg, separators=(",", ":")).encode() + b"\n")

    def request(self, method, params=None, req_id=None):
        if req_id is None:
            req_id, self.next_id = self.next_id, self.next_id + 1
        msg = {"jsonrpc": "2.0", "id": req_id, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        return req_id

    def notify(self, method, params):
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def recv(self, timeout=RECV_TIMEOUT):
        if self.stashed:
            return self.stashed.pop(0)
        try:
            msg = self.answers.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("no answer within %.1f s; stderr:\n%s" % (timeout, "".join(self.stderr)))
        if msg is None:
            self.answers.put(None)
            raise AssertionError("stdout closed; stderr:\n%s" % "".join(self.stderr))
        return msg

    def wait_for(self, req_id, timeout=RECV_TIMEOUT):
        for i, m in enumerate(self.stashed):
            if m.get("id") == req_id and type(m.get("id")) is type(req_id):
                return self.stashed.pop(i)
        end = time.monotonic() + timeout
        others = []
        try:
            while True:
                m = self.answers.get(timeout=max(0.01, end - time.monotonic())) \
                    if time.monotonic() < end else None
                if m is None:
                    if time.monotonic() >= end:
                        raise AssertionError("no answer for %r; stderr:\n%s" % (req_id, "".join(self.stderr)))
                    self.answers.put(None)
                    raise AssertionError("stdout closed before the answer for %r" % (req_id,))
                if m.get("id") == req_id and type(m.get("id")) is type(req_id):
                    return m
                others.append(m)
        except queue.Empty:
            raise AssertionError("no answer for %r" % (req_id,))
        finally:
            self.stashed.extend(others)

    def call(self, method, params=None, timeout=RECV_TIMEOUT):
        return self.wait_for(self.request(method, params), timeout)

    def next_call(self, timeout=RECV_TIMEOUT):
        try:
            return self.calls.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("the extension made no call within %.1f s" % timeout)

    def answer(self, call, result=None, error=None):
        msg = {"jsonrpc": "2.0", "id": call["id"]}
        if error is not None:
            msg["error"] = error
        else:
            msg["result"] = result
        self.send(msg)

    def silence(self, seconds):
        try:
            m = self.answers.get(timeout=seconds)
        except queue.Empty:
            return
        raise AssertionError("unexpected message %r" % (m,))

    def initialize(self):
        a = self.call("initialize", INITIALIZE_PARAMS)
        assert "result" in a, a
        return a["result"]

    def stop(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for s in (self.proc.stdout, self.proc.stderr):
            try:
                s.close()
            except OSError:
                pass
