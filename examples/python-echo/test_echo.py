"""Tests for echo.py: each test starts it as a subprocess and plays the host over pipes.

Run in the staged package (staging puts the SDK beside echo.py), from the repository root:

    make stage && python3 -B -m unittest discover -s target/packages/python-echo -v
"""

import json
import os
import queue
import subprocess
import sys
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ECHO = os.path.join(HERE, "echo.py")

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
RECV_TIMEOUT = 5.0

INITIALIZE_PARAMS = {
    "protocol_versions": [1],
    "host": {"name": "conduit", "version": "0.1.0"},
    "limits": {
        "max_message_bytes": 16777216,
        "max_concurrent_requests": 64,
        "max_artifact_chunk_bytes": 262144,
        "artifact_window": 8,
    },
    "deadlines": {"in_transaction_ms": 250, "default_ms": 30000, "shutdown_grace_ms": 5000},
}


class Extension:
    """The extension under test, driven as the host would drive it."""

    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-B", ECHO],
            cwd=HERE,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.messages = queue.Queue()
        self.stashed = []  # received while waiting for another id
        self.stdout_violations = []  # anything on stdout that is not one protocol message
        self.stderr_lines = []
        self.next_id = 100
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stdout(self):
        for line in self.proc.stdout:
            try:
                msg = json.loads(line.decode("utf-8"))
                if not line.endswith(b"\n") or not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
                    raise ValueError("not a protocol message")
            except ValueError:
                self.stdout_violations.append(line)
                continue
            self.messages.put(msg)
        self.messages.put(None)  # end of stream

    def _read_stderr(self):
        for line in self.proc.stderr:
            self.stderr_lines.append(line.decode("utf-8", "replace"))

    # -- writing --------------------------------------------------------------------------------

    def send_raw(self, data):
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, msg):
        self.send_raw(json.dumps(msg, separators=(",", ":")).encode("utf-8") + b"\n")

    def request(self, method, params=None, req_id=None):
        if req_id is None:
            req_id = self.next_id
            self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": req_id, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        return req_id

    def notify(self, method, params):
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def close_stdin(self):
        self.proc.stdin.close()

    # -- reading --------------------------------------------------------------------------------

    def recv(self, timeout=RECV_TIMEOUT):
        if self.stashed:
            return self.stashed.pop(0)
        try:
            msg = self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("no message within %.1f s" % timeout) from None
        if msg is None:
            self.messages.put(None)
            raise AssertionError("stdout closed")
        return msg

    def wait_for(self, req_id, timeout=RECV_TIMEOUT):
        """The answer with this id; other messages received meanwhile are kept for later."""
        for i, msg in enumerate(self.stashed):
            if msg.get("id") == req_id and type(msg.get("id")) is type(req_id):
                return self.stashed.pop(i)
        end = time.monotonic() + timeout
        others = []
        try:
            while True:
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError("no answer for id %r within %.1f s" % (req_id, timeout))
                try:
                    msg = self.messages.get(timeout=left)
                except queue.Empty:
                    continue
                if msg is None:
                    self.messages.put(None)
                    raise AssertionError("stdout closed before the answer for id %r" % (req_id,))
                if msg.get("id") == req_id and type(msg.get("id")) is type(req_id):
                    return msg
                others.append(msg)
        finally:
            self.stashed.extend(others)

    def call(self, method, params=None, timeout=RECV_TIMEOUT):
        return self.wait_for(self.request(method, params), timeout)

    def expect_silence(self, seconds):
        try:
            msg = self.messages.get(timeout=seconds)
        except queue.Empty:
            return
        raise AssertionError("unexpected message: %r" % (msg,))

    def initialize(self, params=None):
        answer = self.call("initialize", params if params is not None else INITIALIZE_PARAMS)
        return answer

    def wait_exit(self, timeout):
        return self.proc.wait(timeout=timeout)

    def stop(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            try:
                stream.close()
            except OSError:
                pass


class EchoTest(unittest.TestCase):
    def setUp(self):
        self.ext = Extension()

    def tearDown(self):
        self.ext.stop()
        self.assertEqual(self.ext.stdout_violations, [], "non-protocol output on stdout")

    def assertError(self, msg, code, req_id):
        self.assertIn("error", msg, msg)
        self.assertNotIn("result", msg, msg)
        self.assertEqual(msg["error"]["code"], code, msg)
        self.assertIsInstance(msg["error"]["message"], str)
        self.assertEqual(msg["id"], req_id, msg)

    def ready(self):
        answer = self.ext.initialize()
        self.assertIn("result", answer, answer)
        return answer

    # -- handshake ------------------------------------------------------------------------------

    def test_handshake(self):
        answer = self.ready()
        result = answer["result"]
        self.assertEqual(result["protocol_version"], 1)
        self.assertEqual(result["extension"], {"name": "python-echo", "version": "0.1.0"})
        self.assertEqual(sorted(result["capabilities"]["methods"]), ["check.sleep", "echo"])

    def test_handshake_picks_newest_common_version(self):
        params = dict(INITIALIZE_PARAMS, protocol_versions=[3, 2, 1])
        answer = self.ext.initialize(params)
        self.assertEqual(answer["result"]["protocol_version"], 1)

    def test_version_mismatch(self):
        params = dict(INITIALIZE_PARAMS, protocol_versions=[99])
        answer = self.ext.call("initialize", params)
        self.assertError(answer, -32003, answer["id"])
        self.assertEqual(answer["error"]["data"], {"host_versions": [99], "extension_versions": [1]})

    def test_not_initialized(self):
        answer = self.ext.call("echo", {"text": "too early"})
        self.assertError(answer, -32007, answer["id"])
        # a notification before the handshake is ignored, not answered
        self.ext.notify("$/cancel", {"id": 1})
        self.ready()
        self.assertEqual(self.ext.call("echo", {"text": "now"})["result"], {"text": "now"})

    def test_second_initialize_is_invalid_request(self):
        self.ready()
        answer = self.ext.call("initialize", INITIALIZE_PARAMS)
        self.assertError(answer, -32600, answer["id"])

    # -- methods --------------------------------------------------------------------------------

    def test_echo(self):
        self.ready()
        for text in ["hello", "", "line\nbreak", "ünïcödé ✓", "x" * 100000]:
            answer = self.ext.call("echo", {"text": text})
            self.assertEqual(answer["result"], {"text": text})
        # string ids work and are kept as strings
        answer = self.ext.wait_for(self.ext.request("echo", {"text": "s"}, req_id="abc"))
        self.assertEqual(answer, {"jsonrpc": "2.0", "id": "abc", "result": {"text": "s"}})

    def test_echo_bad_params(self):
        self.ready()
        self.assertError(self.ext.call("echo", {"text": 5}), -32602, self.ext.next_id - 1)
        self.assertError(self.ext.call("echo", ["positional"]), -32602, self.ext.next_id - 1)

    def test_check_sleep(self):
        self.ready()
        start = time.monotonic()
        answer = self.ext.call("check.sleep", {"ms": 100})
        self.assertGreaterEqual(time.monotonic() - start, 0.09)
        self.assertGreaterEqual(answer["result"]["slept_ms"], 100)

    def test_unknown_method(self):
        self.ready()
        answer = self.ext.call("no.such.method", {})
        self.assertError(answer, -32601, answer["id"])
        # unknown notifications are ignored
        self.ext.notify("no.such.notification", {})
        self.ext.notify("$/no.such", {})
        self.ext.expect_silence(0.2)

    # -- malformed input ------------------------------------------------------------------------

    def test_garbage_line(self):
        self.ready()
        self.ext.send_raw(b"this is not json\n")
        answer = self.ext.recv()
        self.assertError(answer, -32700, None)
        self.assertEqual(self.ext.call("echo", {"text": "after"})["result"], {"text": "after"})

    def test_malformed_messages(self):
        self.ready()
        cases = [
            (b"\xff\xfe not utf-8\n", -32700, None),
            (b'[{"jsonrpc":"2.0","id":1,"method":"echo"}]\n', -32600, None),
            (b'"just a string"\n', -32600, None),
            (b'{"jsonrpc":"1.0","id":7,"method":"echo","params":{"text":"x"}}\n', -32600, 7),
            (b'{"jsonrpc":"2.0","id":1.5,"method":"echo","params":{"text":"x"}}\n', -32600, None),
            (b'{"jsonrpc":"2.0","id":true,"method":"echo","params":{"text":"x"}}\n', -32600, None),
            (b'{"jsonrpc":"2.0","id":null,"method":"echo","params":{"text":"x"}}\n', -32600, None),
        ]
        for line, code, req_id in cases:
            with self.subTest(line=line):
                self.ext.send_raw(line)
                self.assertError(self.ext.recv(), code, req_id)
        # responses and errors are never answered, whatever their shape
        self.ext.send_raw(b'{"jsonrpc":"2.0","id":5,"result":{}}\n')
        self.ext.send_raw(b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}\n')
        self.ext.send_raw(b'{"jsonrpc":"2.0","id":6,"result":1,"error":{"code":1,"message":"x"}}\n')
        # empty lines are ignored; "\r\n" is a terminator
        self.ext.send_raw(b"\n\r\n")
        self.ext.expect_silence(0.2)
        self.ext.send_raw(b'{"jsonrpc":"2.0","id":8,"method":"echo","params":{"text":"crlf"}}\r\n')
        self.assertEqual(self.ext.recv(), {"jsonrpc": "2.0", "id": 8, "result": {"text": "crlf"}})

    def test_oversized_line(self):
        self.ready()
        head = b'{"jsonrpc":"2.0","id":42,"method":"echo","params":{"text":"'
        tail = b'"}}'
        filler = MAX_MESSAGE_BYTES + 1 - len(head) - len(tail)
        line = head + b"a" * filler + tail
        self.assertEqual(len(line), MAX_MESSAGE_BYTES + 1)
        self.ext.send_raw(line + b"\n")
        answer = self.ext.wait_for(42, timeout=10)
        self.assertError(answer, -32004, 42)
        self.assertEqual(self.ext.call("echo", {"text": "next"})["result"], {"text": "next"})

    def test_oversized_line_without_readable_id(self):
        self.ready()
        # the id comes after the first 4 KiB: only logged, nothing answered
        line = (b'{"jsonrpc":"2.0","method":"echo","params":{"text":"' + b"b" * (MAX_MESSAGE_BYTES + 10)
                + b'"},"id":43}\n')
        self.ext.send_raw(line)
        self.ext.expect_silence(0.3)
        self.assertEqual(self.ext.call("echo", {"text": "next"})["result"], {"text": "next"})

    def test_largest_message_is_accepted(self):
        self.ready()
        head = b'{"jsonrpc":"2.0","id":44,"method":"echo","params":{"text":"'
        tail = b'"}}'
        line = head + b"c" * (MAX_MESSAGE_BYTES - len(head) - len(tail)) + tail
        self.assertEqual(len(line), MAX_MESSAGE_BYTES)
        self.ext.send_raw(line + b"\r\n")  # the "\r" does not count toward the cap
        answer = self.ext.wait_for(44, timeout=10)
        self.assertIn("result", answer)
        self.assertEqual(len(answer["result"]["text"]), MAX_MESSAGE_BYTES - len(head) - len(tail))

    # -- concurrency, overload, cancellation ----------------------------------------------------

    def test_overloaded_65th(self):
        self.ready()
        held = [self.ext.request("check.sleep", {"ms": 60000}) for _ in range(64)]
        extra = self.ext.request("check.sleep", {"ms": 60000})
        answer = self.ext.wait_for(extra)
        self.assertError(answer, -32000, extra)
        self.assertEqual(answer["error"]["data"], {"limit": 64})
        # notifications are never refused: cancelling one frees a slot for a new request
        self.ext.notify("$/cancel", {"id": held[0]})
        self.assertError(self.ext.wait_for(held[0]), -32001, held[0])
        self.assertEqual(self.ext.call("echo", {"text": "room"})["result"], {"text": "room"})
        for req_id in held[1:]:
            self.ext.notify("$/cancel", {"id": req_id})
        for req_id in held[1:]:
            self.assertError(self.ext.wait_for(req_id), -32001, req_id)

    def test_concurrent_requests_are_not_serialized(self):
        self.ready()
        start = time.monotonic()
        ids = [self.ext.request("check.sleep", {"ms": 300}) for _ in range(20)]
        for req_id in ids:
            self.assertIn("result", self.ext.wait_for(req_id))
        self.assertLess(time.monotonic() - start, 2.0)

    def test_cancel(self):
        self.ready()
        req_id = self.ext.request("check.sleep", {"ms": 60000})
        time.sleep(0.05)
        start = time.monotonic()
        self.ext.notify("$/cancel", {"id": req_id})
        answer = self.ext.wait_for(req_id)
        self.assertLess(time.monotonic() - start, 1.0)
        self.assertError(answer, -32001, req_id)
        # the cancel itself is never answered; cancelling an unknown or finished id is ignored
        self.ext.notify("$/cancel", {"id": req_id})
        self.ext.notify("$/cancel", {"id": 987654})
        self.ext.expect_silence(0.2)
        self.assertEqual(self.ext.call("echo", {"text": "still here"})["result"], {"text": "still here"})

    # -- stopping -------------------------------------------------------------------------------

    def test_shutdown(self):
        self.ready()
        held = self.ext.request("check.sleep", {"ms": 60000})
        start = time.monotonic()
        shutdown = self.ext.request("shutdown", {})
        self.assertError(self.ext.wait_for(held), -32001, held)
        self.assertEqual(self.ext.wait_for(shutdown)["result"], {})
        self.assertEqual(self.ext.wait_exit(timeout=5), 0)
        self.assertLess(time.monotonic() - start, 5.0)

    def test_requests_after_shutdown(self):
        self.ready()
        shutdown = self.ext.request("shutdown", {})
        late = self.ext.request("echo", {"text": "late"})
        self.assertEqual(self.ext.wait_for(shutdown)["result"], {})
        self.assertEqual(self.ext.wait_exit(timeout=5), 0)
        time.sleep(0.1)
        # a request that arrived after shutdown is refused or not answered at all, never served
        for msg in self.ext.stashed + list(self.ext.messages.queue):
            if msg is not None and msg.get("id") == late:
                self.assertError(msg, -32008, late)

    def test_stdin_eof(self):
        self.ready()
        self.ext.request("check.sleep", {"ms": 60000})  # abandoned on EOF
        time.sleep(0.05)
        start = time.monotonic()
        self.ext.close_stdin()
        self.assertEqual(self.ext.wait_exit(timeout=5), 0)
        self.assertLess(time.monotonic() - start, 5.0)

    def test_stdin_eof_before_handshake(self):
        self.ext.close_stdin()
        self.assertEqual(self.ext.wait_exit(timeout=5), 0)


if __name__ == "__main__":
    unittest.main()
