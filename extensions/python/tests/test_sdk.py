"""The Python SDK's tests: a sample extension (sample_ext.py) run as a subprocess, driven by a
host played over its pipes (host.py), plus unit tests of the SDK's pure functions.

Run from the repository root: python3 -m unittest discover -s extensions/python/tests -v
"""
import base64
import hashlib
import os
import struct
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import conduit_extension as ce  # noqa: E402
from host import INITIALIZE_PARAMS, FakeHost  # noqa: E402

SAMPLE = os.path.join(HERE, "sample_ext.py")


class Units(unittest.TestCase):
    def test_ids(self):
        for ok in ["", "7", 0, 7, -1, 2 ** 63 - 1, -(2 ** 63)]:
            self.assertTrue(ce.is_valid_id(ok), ok)
        for bad in [True, False, None, 1.0, 2 ** 63, -(2 ** 63) - 1, [], {}]:
            self.assertFalse(ce.is_valid_id(bad), bad)
        self.assertFalse(ce.is_valid_id(ce.parse_json("-0")))
        self.assertTrue(ce.is_valid_id(ce.parse_json("0")))
        self.assertFalse(ce.is_valid_id(ce.parse_json("1e2")))

    def test_json_rules(self):
        for bad in ["NaN", "[Infinity]", '{"a":-Infinity}', "\ufeff{}", "   "]:
            with self.assertRaises(ValueError, msg=bad):
                ce.parse_json(bad)
        m = ce.parse_json('{"id":1,"id":2,"params":{"a":1,"a":2}}')
        self.assertEqual(m["id"], 2)
        self.assertEqual(m.dups, frozenset({"id"}))
        self.assertEqual(m["params"], {"a": 2})

    def test_head_scan(self):
        self.assertEqual(ce.scan_head(b'{"jsonrpc":"2.0","id":7,"method":"x","params":{"a'), (7, True, True))
        self.assertEqual(ce.scan_head(b'{"params":{"id":1,"method":"m"},"id":"s"'), ("s", True, False))
        self.assertEqual(ce.scan_head(b'{"id":12'), (None, False, False))  # might go on
        self.assertEqual(ce.scan_head(b'{"id":-0,"method":'), (None, False, True))
        self.assertEqual(ce.scan_head(b'{"id":1,"method"'), (1, True, False))  # no ":" yet
        self.assertEqual(ce.scan_head(b'{"id":1.5,"method":'), (None, False, True))

    def test_retryable(self):
        self.assertFalse(ce.ErrorCode.is_retryable(-32000))  # a library's generic server error
        self.assertFalse(ce.ErrorCode.is_retryable(-32000, {"other": 1}))
        self.assertTrue(ce.ErrorCode.is_retryable(-32000, {"limit": 64}))
        self.assertTrue(ce.ErrorCode.is_retryable(-32000, {"held_bytes_limit": 50331648}))
        self.assertFalse(ce.ErrorCode.is_retryable(-32603))
        self.assertTrue(ce.ErrorCode.is_retryable(-32008))
        self.assertFalse(ce.ErrorCode.is_retryable(-39999))  # unknown codes are not

    def test_registration(self):
        ext = ce.Extension("x", "1.0.0")
        ext.method("a")(lambda c, p: p)
        with self.assertRaises(ValueError):
            ext.method("a")(lambda c, p: p)
        for reserved in ["$/cancel", "shutdown", "state.event", "work_kind.trigger", "check.sleep"]:
            with self.assertRaises(ValueError):
                ext.method(reserved)
        self.assertEqual(ext.capabilities(), {"methods": ["a", "check.sleep"]})


class MethodTable(unittest.TestCase):
    """The SDK's tables against extensions/methods.json, the method table written from the Rust
    one (conduit_protocol::methods::TABLE): a method added, renamed or moved there fails here
    until this SDK follows."""

    def setUp(self):
        import json
        with open(os.path.join(HERE, "..", "..", "methods.json"), encoding="utf-8") as f:
            self.rows = json.load(f)["methods"]

    def test_host_calls_routed_by_a_declared_name(self):
        want = {r["name"]: (r["name_field"], r["capability"]) for r in self.rows
                if r["direction"] == "host_to_extension" and r["name_field"]}
        self.assertEqual(ce.protocol._BY_NAME, want)

    def test_callbacks(self):
        want = {r["name"] for r in self.rows if r["direction"] == "extension_to_host"}
        self.assertEqual(ce.protocol._CALLBACKS, want)

    def test_reserved_names(self):
        want = {r["name"] for r in self.rows if r["reserved"]}
        self.assertEqual(ce.protocol._RESERVED, want)
        self.assertNotIn("check.sleep", ce.protocol._RESERVED)


class BulkPipe(unittest.TestCase):
    """Artifacts on the host's bulk pipe (docs/protocol.md §8.1), over a real pipe."""

    def setUp(self):
        self.r, w = os.pipe()
        self.h = FakeHost([SAMPLE], cwd=HERE, pass_fds=(w,))
        self.w = w

    def tearDown(self):
        self.h.stop()
        os.close(self.r)
        self.assertEqual(self.h.violations, [], "non-protocol output on stdout")

    def read_frames(self, size, tag):
        """Read `size` bytes of whole frames of `tag` from the pipe: (the bytes, frame lengths)."""
        got, frames, buf = b"", [], b""
        while len(got) < size:
            chunk = os.read(self.r, 65536)
            self.assertTrue(chunk, "the pipe ended early")
            buf += chunk
            while len(buf) >= 8:
                t, n = struct.unpack("<II", buf[:8])
                if len(buf) < 8 + n:
                    break
                self.assertEqual(t, tag)
                self.assertTrue(1 <= n <= 1024 * 1024, n)
                frames.append(n)
                got += buf[8:8 + n]
                buf = buf[8 + n:]
        self.assertEqual(buf, b"", "a frame not read whole")
        return got, frames

    def test_an_offered_pipe_carries_the_bytes_as_whole_frames(self):
        params = dict(INITIALIZE_PARAMS, bulk={"fd": self.w})
        self.assertIn("result", self.h.call("initialize", params))
        os.close(self.w)  # the extension holds its own copy now
        size = 600 * 1024 + 5
        rid = self.h.request("artifact", {"size": size})
        op = self.h.next_call()
        self.assertEqual(op["method"], "artifact.open")
        self.assertIs(op["params"].get("bulk"), True)
        self.h.answer(op, {"stream_id": "s-9", "max_chunk_bytes": 262144, "window": 8,
                           "bulk_tag": 7})
        got, frames = self.read_frames(size, 7)
        self.assertTrue(all(n <= ce.BULK_FRAME_BYTES for n in frames), frames)
        close = self.h.next_call()
        self.assertEqual(close["method"], "artifact.close")
        digest = hashlib.sha256(got).hexdigest()
        self.assertEqual(close["params"], {"stream_id": "s-9", "size": size, "sha256": digest})
        self.h.answer(close, {"artifact_id": "sha256:" + digest, "size": size})
        self.assertEqual(self.h.wait_for(rid)["result"]["size"], size)
        want = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        self.assertEqual(got, want)

    def test_a_current_host_gets_no_digest_and_its_own_is_returned(self):
        params = dict(INITIALIZE_PARAMS, bulk={"fd": self.w})
        self.assertIn("result", self.h.call("initialize", params))
        os.close(self.w)
        size = 300 * 1024
        rid = self.h.request("artifact", {"size": size})
        op = self.h.next_call()
        self.h.answer(op, {"stream_id": "s-4", "max_chunk_bytes": 262144, "window": 8,
                           "bulk_tag": 2, "sha256_optional": True})
        got, _ = self.read_frames(size, 2)
        close = self.h.next_call()
        self.assertEqual(close["params"], {"stream_id": "s-4", "size": size})
        digest = hashlib.sha256(got).hexdigest()
        self.h.answer(close, {"artifact_id": "sha256:" + digest, "size": size, "sha256": digest})
        result = self.h.wait_for(rid)["result"]
        self.assertEqual(result["sha256"], digest)
        self.assertIs(result["hashing"], False)

    def test_without_a_tag_the_stream_takes_chunks(self):
        params = dict(INITIALIZE_PARAMS, bulk={"fd": self.w})
        self.assertIn("result", self.h.call("initialize", params))
        rid = self.h.request("artifact", {"size": 3000, "chunk": 1000})
        op = self.h.next_call()
        self.assertIs(op["params"].get("bulk"), True)
        self.h.answer(op, {"stream_id": "s-1", "max_chunk_bytes": 1000, "window": 8})
        got = b""
        while True:
            c = self.h.next_call()
            if c["method"] == "artifact.close":
                break
            self.assertEqual(c["method"], "artifact.chunk")
            got += base64.b64decode(c["params"]["data"])
            self.h.answer(c, {"received": len(got)})
        self.assertEqual(c["params"]["size"], 3000)
        self.h.answer(c, {"artifact_id": "sha256:" + hashlib.sha256(got).hexdigest(), "size": 3000})
        self.assertEqual(self.h.wait_for(rid)["result"]["size"], 3000)


class HostDigest(unittest.TestCase):
    """docs/protocol.md §8: the host computes the digest; the writer sends one only when asked
    to verify, when given one, or when the host needs it (no ``sha256_optional``)."""

    OPENED = {"stream_id": "s-1", "max_chunk_bytes": 4096, "window": 8, "sha256_optional": True}
    SIZE = 10_000

    def setUp(self):
        self.h = FakeHost([SAMPLE], cwd=HERE)
        self.h.initialize()
        self.want = bytes(range(256)) * (self.SIZE // 256) + b"x" * (self.SIZE % 256)
        self.digest = hashlib.sha256(self.want).hexdigest()

    def tearDown(self):
        self.h.stop()
        self.assertEqual(self.h.violations, [], "non-protocol output on stdout")

    def stream(self, params, opened=None):
        """Serve one artifact's open and chunks; returns (request id, the close call)."""
        rid = self.h.request("artifact", dict({"size": self.SIZE}, **params))
        op = self.h.next_call()
        self.assertEqual(op["method"], "artifact.open")
        self.h.answer(op, opened or self.OPENED)
        got = b""
        while True:
            c = self.h.next_call()
            if c["method"] == "artifact.close":
                self.assertEqual(got, self.want)
                return rid, c
            got += base64.b64decode(c["params"]["data"])
            self.h.answer(c, {"received": len(got)})

    def test_by_default_no_digest_is_sent_and_the_hosts_is_returned(self):
        rid, close = self.stream({})
        self.assertEqual(close["params"], {"stream_id": "s-1", "size": self.SIZE})
        self.h.answer(close, {"artifact_id": "sha256:" + self.digest, "size": self.SIZE, "sha256": self.digest})
        result = self.h.wait_for(rid)["result"]
        self.assertEqual(result["sha256"], self.digest)
        self.assertIs(result["hashing"], False)

    def test_verify_sends_the_writers_own_digest(self):
        rid, close = self.stream({"verify": True})
        self.assertEqual(close["params"]["sha256"], self.digest)
        self.h.answer(close, {"artifact_id": "sha256:" + self.digest, "size": self.SIZE, "sha256": self.digest})
        self.assertIs(self.h.wait_for(rid)["result"]["hashing"], True)

    def test_a_known_digest_is_sent_and_the_hosts_refusal_is_the_callers(self):
        wrong = hashlib.sha256(b"other bytes").hexdigest()
        rid, close = self.stream({"sha256": wrong})
        self.assertEqual(close["params"]["sha256"], wrong)
        self.h.answer(close, error={"code": -32009, "message": "the artifact does not match its close"})
        msg = self.h.wait_for(rid)
        self.assertEqual(msg["error"]["code"], -32009, msg)

    def test_a_verifying_writer_refuses_a_known_digest_not_its_own_before_closing(self):
        wrong = hashlib.sha256(b"other bytes").hexdigest()
        rid = self.h.request("artifact", {"size": 3000, "chunk": 1000, "verify": True, "sha256": wrong})
        self.h.answer(self.h.next_call(), dict(self.OPENED, max_chunk_bytes=1000))
        while True:
            c = self.h.next_call()
            if c["method"] != "artifact.chunk":
                break
            self.h.answer(c, {"received": 0})
        self.assertEqual(c["method"], "artifact.abort")
        self.h.answer(c, {})
        msg = self.h.wait_for(rid)
        self.assertIn("not the %s given to finish" % wrong, msg["error"]["message"])

    def test_an_older_host_gets_the_digest_and_its_answer_is_completed(self):
        opened = {k: v for k, v in self.OPENED.items() if k != "sha256_optional"}
        rid, close = self.stream({}, opened)
        self.assertEqual(close["params"]["sha256"], self.digest)
        self.h.answer(close, {"artifact_id": "sha256:" + self.digest, "size": self.SIZE})
        result = self.h.wait_for(rid)["result"]
        self.assertEqual(result["sha256"], self.digest)
        self.assertIs(result["hashing"], True)


class Session(unittest.TestCase):
    def setUp(self):
        self.h = FakeHost([SAMPLE], cwd=HERE)

    def tearDown(self):
        self.h.stop()
        self.assertEqual(self.h.violations, [], "non-protocol output on stdout")

    def err(self, msg, code, req_id):
        self.assertIn("error", msg, msg)
        self.assertEqual(msg["error"]["code"], code, msg)
        self.assertIsInstance(msg["error"]["message"], str)
        self.assertEqual(msg["id"], req_id, msg)
        self.assertEqual(type(msg["id"]), type(req_id), msg)

    def test_handshake_declares_what_is_registered(self):
        r = self.h.initialize()
        self.assertEqual(r["protocol_version"], 1)
        self.assertEqual(r["extension"], {"name": "sample", "version": "0.2.0"})
        caps = r["capabilities"]
        self.assertEqual(caps["work_kinds"], [{"name": "job", "trigger": True}, {"name": "plain", "trigger": False}])
        self.assertEqual(caps["ingress"], ["feed"])
        self.assertEqual(caps["methods"][-1], "check.sleep")
        self.assertIn("echo", caps["methods"])

    def test_version_mismatch_then_retry(self):
        p = dict(ce.__dict__.get("X", {}))
        p = {"protocol_versions": [7, 2], "host": {"name": "h", "version": "1"}}
        a = self.h.call("initialize", p)
        self.err(a, -32003, a["id"])
        self.assertEqual(a["error"]["data"], {"host_versions": [7, 2], "extension_versions": [1]})
        self.err(self.h.call("echo", {"text": "x"}), -32007, self.h.next_id - 1)
        self.h.initialize()
        self.err(self.h.call("initialize", p), -32600, self.h.next_id - 1)

    def test_before_the_handshake(self):
        self.err(self.h.call("shutdown", {}), -32007, 100)
        self.h.notify("$/cancel", {"id": 100})
        self.h.silence(0.2)
        a = self.h.call("initialize", {"protocol_versions": "1", "host": {"name": "h", "version": "1"}})
        self.err(a, -32602, 101)

    def test_id_and_shape_rules(self):
        self.h.initialize()
        cases = [
            (b'{"jsonrpc":"2.0","id":-0,"method":"echo","params":{}}', -32600, None),
            (b'{"jsonrpc":"2.0","id":1.0,"method":"echo"}', -32600, None),
            (b'{"jsonrpc":"2.0","id":1e2,"method":"echo"}', -32600, None),
            (b'{"jsonrpc":"2.0","id":9223372036854775808,"method":"echo"}', -32600, None),
            (b'{"jsonrpc":"2.0","id":3,"id":4,"method":"echo"}', -32600, 4),
            (b'{"jsonrpc":"2.0","id":5,"method":"echo","method":"echo"}', -32600, 5),
            (b'{"jsonrpc":"2.0","id":6,"method":"echo","result":1}', -32600, 6),
            (b'{"jsonrpc":"2.0","id":7,"method":"echo","error":{"code":1,"message":"m"}}', -32600, 7),
            (b'{"jsonrpc":"2.0","id":8,"method":7}', -32600, 8),
            (b'{"id":9,"method":"echo"}', -32600, 9),
            (b'{"method":"$/cancel","params":{"id":1}}', -32600, None),
            (b'[{"jsonrpc":"2.0","id":1,"method":"echo"}]', -32600, None),
            (b'[]', -32600, None),
            (b'17', -32600, None),
            (b'{"jsonrpc":"2.0","id":10,"method":"echo","params":{"n":NaN}}', -32700, None),
            (b'\xef\xbb\xbf{"jsonrpc":"2.0","id":11,"method":"echo"}', -32700, None),
            (b'  \t ', -32700, None),
            (b'{"jsonrpc":"2.0","id":12,"method":"echo","params":"\xff"}', -32700, None),
            (b'{"jsonrpc":"2.0","id":13,"method":"$/cancel","params":{"id":1}}', -32601, 13),
            (b'{"jsonrpc":"2.0","id":14,"method":"state.event","params":{}}', -32601, 14),
            (b'{"jsonrpc":"2.0","id":15,"method":"echo","params":null}', -32602, 15),
            (b'{"jsonrpc":"2.0","id":16,"method":"echo","params":[1]}', -32602, 16),
            (b'{"jsonrpc":"2.0","id":17,"method":"nope","params":[1]}', -32601, 17),
        ]
        for line, code, req_id in cases:
            with self.subTest(line=line):
                self.h.send_raw(line + b"\n")
                self.err(self.h.recv(), code, req_id)
        # Never answered: responses, broken responses, unknown notifications, "shutdown" without id.
        for line in [b'{"jsonrpc":"2.0","id":5,"result":{}}', b'{"jsonrpc":"2.0","id":5}',
                     b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}',
                     b'{"jsonrpc":"2.0","method":"shutdown"}', b'{"jsonrpc":"2.0","method":"x/y","extra":1}',
                     b'', b'\r']:
            self.h.send_raw(line + b"\n")
        self.h.silence(0.3)
        # Strings and the extreme integers are ids; unknown members are ignored.
        for rid in ["", "7", -(2 ** 63), 2 ** 63 - 1]:
            a = self.h.call("echo", {"text": "x"}) if False else self.h.wait_for(
                self.h.request("echo", {"t": 1}, req_id=rid))
            self.assertEqual(a, {"jsonrpc": "2.0", "id": rid, "result": {"t": 1}})
        self.h.send_raw(b'{"jsonrpc":"2.0","id":20,"method":"echo","params":{"a":1},"extra":{"b":2}}\r\n')
        self.assertEqual(self.h.recv()["result"], {"a": 1})

    def test_in_transaction_dispatch(self):
        self.h.initialize()
        ev = {"id": 4, "source": "feed", "delivery_id": "d", "kind": "job", "payload": {}, "accepted_at_ms": 1}
        a = self.h.call("work_kind.trigger", {"kind": "job", "inputs": [ev]})
        self.assertEqual(a["result"], {"groups": [{"key": "k:4", "event_ids": [4]}]})
        self.err(self.h.call("work_kind.trigger", {"kind": "other", "inputs": [ev]}), -32602, self.h.next_id - 1)
        self.err(self.h.call("work_kind.trigger", {"kind": "plain", "inputs": [ev]}), -32602, self.h.next_id - 1)
        self.err(self.h.call("recurrence.next", {"recurrence": "r"}), -32601, self.h.next_id - 1)
        self.assertEqual(self.h.call("ingress.poll", {"source": "feed", "limit": 5})["result"], {"events": []})
        self.err(self.h.call("ingress.poll", {"source": "elsewhere", "limit": 5}), -32602, self.h.next_id - 1)

    def test_handler_errors(self):
        self.h.initialize()
        a = self.h.call("boom", {})
        self.err(a, -32603, a["id"])
        self.assertIn("KeyError", a["error"]["message"])
        a = self.h.call("refuse", {"what": "w"})
        self.err(a, -32010, a["id"])
        self.assertEqual(a["error"]["data"], {"what": "w"})
        self.assertEqual(self.h.call("echo", {"text": "still here"})["result"], {"text": "still here"})

    def test_deadline_from_meta(self):
        self.h.initialize()
        r = self.h.call("deadline", {"a": 1, "_meta": {"remaining_ms": 2000}})["result"]
        self.assertEqual(r["params"], {"a": 1})
        self.assertTrue(r["has_deadline"])
        self.assertTrue(0 < r["remaining"] <= 2.0, r)
        r = self.h.call("deadline", {"a": 1})["result"]
        self.assertEqual(r, {"params": {"a": 1}, "remaining": None, "has_deadline": False})
        r = self.h.call("deadline", {"_meta": {"other": 1}})["result"]
        self.assertEqual(r["params"], {})
        self.assertFalse(r["has_deadline"])

    def test_stray_prints_go_to_stderr(self):
        self.h.initialize()
        self.assertEqual(self.h.call("stray-print", {})["result"], {})
        self.h.call("echo", {})
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any("nor this" in l for l in self.h.stderr):
            time.sleep(0.01)
        text = "".join(self.h.stderr)
        self.assertIn("this must not reach the protocol stream", text)
        self.assertIn("nor this", text)

    def test_callbacks(self):
        self.h.initialize()
        rid = self.h.request("callbacks", {})
        answers = {
            "state.event": {"id": 41, "source": "feed", "delivery_id": "a", "kind": "k", "payload": {}, "accepted_at_ms": 1},
            "state.events": {"events": []},
            "ingress.push": {"event_id": 3, "duplicate": False},
            "operation.emit": {"emission_id": 17, "commit_id": "emit-17"},
        }
        seen = []
        for _ in range(5):
            c = self.h.next_call()
            seen.append((c["method"], c["params"]))
            self.assertIsInstance(c["id"], int)
            # Host requests are still served while the extension waits.
            self.assertEqual(self.h.call("echo", {"n": len(seen)})["result"], {"n": len(seen)})
            if c["method"] == "state.work":
                self.h.answer(c, error={"code": -32010, "message": "no work 999"})
            else:
                self.h.answer(c, answers[c["method"]])
        r = self.h.wait_for(rid)["result"]
        self.assertEqual(r["event"]["id"], 41)
        self.assertEqual(r["push"], answers["ingress.push"])
        self.assertEqual(r["emit"], answers["operation.emit"])
        self.assertEqual(r["work_error"], -32010)
        self.assertEqual(seen[1], ("state.events", {"source": "feed", "limit": 2}))
        self.assertEqual(seen[2], ("ingress.push", {"source": "feed", "delivery_id": "d-1", "kind": "job.run", "payload": {"n": 1}}))
        self.assertEqual(seen[3], ("operation.emit", {"emission": "note", "work_id": 5, "payload": {"x": 1}}))

    def test_callback_deadline_sends_cancel(self):
        self.h.initialize()
        rid = self.h.request("slow-callback", {"timeout": 0.2})
        c = self.h.next_call()
        self.assertEqual(c["method"], "state.event")
        self.assertEqual(self.h.wait_for(rid)["result"], {"code": -32002})
        cancel = self.h.next_call()
        self.assertEqual(cancel, {"jsonrpc": "2.0", "method": "$/cancel", "params": {"id": c["id"]}})
        self.h.answer(c, {"late": True})  # a late answer is ignored
        self.assertEqual(self.h.call("echo", {})["result"], {})

    def test_artifact_stream_keeps_the_window(self):
        self.h.initialize()
        size = 10 * 1024 + 7
        rid = self.h.request("artifact", {"size": size, "chunk": 1024})
        op = self.h.next_call()
        self.assertEqual(op["method"], "artifact.open")
        self.assertEqual(op["params"], {"name": "out.bin", "media_type": "application/octet-stream"})
        self.h.answer(op, {"stream_id": "s-1", "max_chunk_bytes": 512, "window": 3})
        got, unacked, seqs, received = b"", [], [], 0
        give_up = time.monotonic() + 30
        while True:
            try:
                c = self.h.next_call(timeout=0.5)
            except AssertionError:
                # Quiet for 0.5 s: the sender waits for an ack (it must not send past the
                # window), or it is slow on a busy machine.
                self.assertLess(time.monotonic(), give_up, "the stream stalled")
                if not unacked:
                    continue
                received += len(base64.b64decode(unacked[0]["params"]["data"]))
                self.h.answer(unacked.pop(0), {"received": received})
                continue
            if c["method"] == "artifact.close":
                self.assertEqual(unacked, [])
                break
            self.assertEqual(c["method"], "artifact.chunk")
            unacked.append(c)
            self.assertLessEqual(len(unacked), 3, "more chunks unanswered than the window")
            data = base64.b64decode(c["params"]["data"])
            self.assertLessEqual(len(data), 512)
            got += data
            seqs.append(c["params"]["seq"])
        self.assertEqual(seqs, list(range(len(seqs))))
        self.assertEqual(len(got), size)
        self.assertEqual(c["params"], {"stream_id": "s-1", "size": size, "sha256": hashlib.sha256(got).hexdigest()})
        self.h.answer(c, {"artifact_id": "sha256:" + hashlib.sha256(got).hexdigest(), "size": size})
        self.assertEqual(self.h.wait_for(rid)["result"]["size"], size)

    def test_artifact_failure_aborts(self):
        self.h.initialize()
        rid = self.h.request("artifact", {"size": 3000, "chunk": 1000})
        self.h.answer(self.h.next_call(), {"stream_id": "s-2", "max_chunk_bytes": 1000, "window": 8})
        c = self.h.next_call()
        self.h.answer(c, error={"code": -32009, "message": "bad chunk"})
        while True:
            c = self.h.next_call()
            if c["method"] == "artifact.abort":
                break
            self.h.answer(c, {"received": 0})
        self.assertEqual(c["params"], {"stream_id": "s-2"})
        self.h.answer(c, {})
        self.err(self.h.wait_for(rid), -32009, rid)

    def test_cancel_duplicate_and_overload(self):
        self.h.initialize()
        with tempfile.TemporaryDirectory() as d:
            marker = os.path.join(d, "m")
            rid = self.h.request("wait-cancel", {"marker": marker})
            self.h.call("echo", {})  # the request is running
            self.err(self.h.wait_for(self.h.request("echo", {}, req_id=rid)), -32600, rid)
            self.h.notify("$/cancel", {"id": rid})
            self.err(self.h.wait_for(rid), -32001, rid)
            # The handler writes the marker as it ends: poll for what it wrote (only a failing
            # test waits out the ceiling).
            end = time.monotonic() + 30
            written = ""
            while written != "cancelled" and time.monotonic() < end:
                try:
                    with open(marker) as f:
                        written = f.read()
                except FileNotFoundError:
                    pass
                time.sleep(0.01)
            self.assertEqual(written, "cancelled")
        held = [self.h.request("check.sleep", {"ms": 60000}) for _ in range(64)]
        self.h.call("echo", {}) if False else None
        extra = self.h.request("check.sleep", {"ms": 1})
        a = self.h.wait_for(extra)
        self.err(a, -32000, extra)
        self.assertEqual(a["error"]["data"], {"limit": 64})
        # A running id still wins over the limit; shutdown at the limit is overloaded too.
        self.err(self.h.wait_for(self.h.request("echo", {}, req_id=held[0])), -32600, held[0])
        self.err(self.h.wait_for(self.h.request("shutdown", {})), -32000, self.h.next_id - 1)
        self.h.notify("$/cancel", {"id": held[0]})
        self.err(self.h.wait_for(held[0]), -32001, held[0])
        self.assertEqual(self.h.call("echo", {"x": 1})["result"], {"x": 1})
        for r in held[1:]:
            self.h.notify("$/cancel", {"id": r})
        for r in held[1:]:
            self.err(self.h.wait_for(r), -32001, r)

    def test_check_sleep(self):
        self.h.initialize()
        a = self.h.call("check.sleep", {"ms": 50})
        self.assertGreaterEqual(a["result"]["slept_ms"], 50)
        for bad in [{"ms": -1}, {"ms": 1.5}, {"ms": "100"}, {}]:
            self.err(self.h.call("check.sleep", bad), -32602, self.h.next_id - 1)

    def test_shutdown_lets_running_requests_finish(self):
        self.h.initialize()
        rid = self.h.request("finish-on-shutdown", {})
        sleeper = self.h.request("check.sleep", {"ms": 60000})
        self.h.call("echo", {})
        sid = self.h.request("shutdown", {})
        self.h.notify("$/cancel", {"id": sid})  # never revokes the stop
        first = self.h.recv()
        second = self.h.recv()
        self.err(first, -32001, sleeper)  # check.sleep is cancelled at once
        self.assertEqual(second, {"jsonrpc": "2.0", "id": rid, "result": {"finished": True}})
        self.assertEqual(self.h.recv(), {"jsonrpc": "2.0", "id": sid, "result": {}})
        self.assertEqual(self.h.proc.wait(timeout=5), 0)

    def test_requests_after_shutdown(self):
        self.h.initialize()
        rid = self.h.request("finish-on-shutdown", {})
        sid = self.h.request("shutdown", {})
        self.err(self.h.wait_for(self.h.request("echo", {})), -32008, self.h.next_id - 1)
        self.err(self.h.wait_for(self.h.request("shutdown", {})), -32008, self.h.next_id - 1)
        self.assertIn("result", self.h.wait_for(rid))
        self.assertEqual(self.h.wait_for(sid)["result"], {})
        self.assertEqual(self.h.proc.wait(timeout=5), 0)

    def test_eof_exits_at_once_with_a_callback_pending(self):
        self.h.initialize()
        self.h.request("callbacks", {})
        self.h.next_call()  # the extension now waits for the host
        t0 = time.monotonic()
        self.h.proc.stdin.close()
        self.assertEqual(self.h.proc.wait(timeout=5), 0)
        self.assertLess(time.monotonic() - t0, 4.0)

    def test_oversized_request(self):
        self.h.initialize()
        head = b'{"jsonrpc":"2.0","id":"big","method":"echo","params":{"t":"'
        line = head + b"a" * (ce.MAX_MESSAGE_BYTES) + b'"}}'
        self.h.send_raw(line + b"\n")
        a = self.h.wait_for("big", timeout=20)
        self.err(a, -32004, "big")
        self.assertEqual(a["error"]["data"], {"limit": ce.MAX_MESSAGE_BYTES, "size": len(line)})
        self.assertEqual(self.h.call("echo", {"after": 1})["result"], {"after": 1})


class PublicApi(unittest.TestCase):
    """The SDK is a package of modules (protocol, messages, wire, artifacts, context, session,
    extension); its API is what the package root offers, as when it was one file."""

    # Every public name of the one-file SDK: each stays importable from the package root.
    NAMES = [
        "ARTIFACT_WINDOW", "ArtifactWriter", "BULK_FRAME_BYTES", "CommitParams", "CommitResult",
        "Ctx", "DEFAULT_ARTIFACT_CHUNK_BYTES", "DEFAULT_SHUTDOWN_GRACE_MS", "ErrorCode", "Event",
        "Extension", "F", "FilterParams", "FilterResult", "Handler", "Host", "ID_SCAN_BYTES",
        "IngressPollParams", "IngressPollResult", "MAX_ARTIFACT_CHUNK_BYTES",
        "MAX_CONCURRENT_REQUESTS", "MAX_MESSAGE_BYTES", "PROTOCOL_VERSIONS", "RecurrenceParams",
        "RecurrenceResult", "RpcError", "TriggerParams", "TriggerResult", "encode", "is_int",
        "is_valid_id", "log", "parse_json", "scan_head",
    ]

    def test_every_public_name_of_the_one_file_sdk_is_importable_from_the_root(self):
        missing = [n for n in self.NAMES if not hasattr(ce, n)]
        self.assertEqual(missing, [])
        self.assertEqual(ce.__all__, ["Extension", "Ctx", "Host", "ArtifactWriter", "RpcError",
                                      "ErrorCode", "PROTOCOL_VERSIONS", "MAX_MESSAGE_BYTES",
                                      "MAX_CONCURRENT_REQUESTS"])

    def test_every_modules_public_names_are_the_roots(self):
        import importlib
        import pkgutil
        modules = sorted(m.name for m in pkgutil.iter_modules(ce.__path__))
        self.assertIn("session", modules)
        for m in modules:
            mod = importlib.import_module("conduit_extension." + m)
            self.assertTrue(mod.__doc__ and mod.__doc__.strip(), "%s has no module doc" % m)
            if m == "testing":
                continue  # the test kit is imported as conduit_extension.testing, by tests only
            for name in getattr(mod, "__all__", []):
                self.assertIs(getattr(ce, name, None), getattr(mod, name),
                              "conduit_extension.%s.%s is not importable from the root" % (m, name))


if __name__ == "__main__":
    unittest.main()
