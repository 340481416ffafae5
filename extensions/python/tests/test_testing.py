"""The kit (conduit_extension.testing) proves each thing it offers against a small extension
on the SDK: the handshake's limits, results, protocol errors, the in-transaction deadline,
callbacks from a table and a function (recorded), $/cancel, chunked and bulk artifacts, a
request left unanswered, reentrant writes and the manifest check.

Run from the repository root: python3 -m unittest discover -s extensions/python/tests -v
"""
import hashlib
import os
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from conduit_extension import ErrorCode, Extension, RpcError  # noqa: E402
from conduit_extension.testing import (  # noqa: E402
    Answered, DeadlineExceeded, RuleBroken, ScriptedHost)

ext = Extension("kit-sample", "0.2.0")


def content(n):
    return bytes(i % 251 for i in range(n))


def event(i, thread):
    return {"id": i, "source": "s", "delivery_id": "d-%d" % i, "kind": "note.posted",
            "payload": {"thread": thread}, "accepted_at_ms": 0}


@ext.method("echo")
def echo(ctx, params):
    if not isinstance(params.get("text"), str):
        raise RpcError.invalid_params('echo needs params {"text": string}')
    return params


@ext.method("limits")
def limits(ctx, params):
    return {"chunk": ctx.init["limits"]["max_artifact_chunk_bytes"], "remaining": ctx.remaining()}


@ext.method("thread_of")
def thread_of(ctx, params):
    return {"thread": ctx.host.event(params["event_id"])["payload"]["thread"]}


@ext.method("upload")
def upload(ctx, params):
    return ctx.host.store_artifact("blob.bin", content(params["bytes"]),
                                   json_chunks=not params.get("bulk", False))


@ext.method("hang")
def hang(ctx, params):
    threading.Event().wait()


@ext.work_kind("slow")
def slow(ctx, params):
    # Waits for its cancellation, then tells the host it saw it (a callback still works).
    remaining = ctx.remaining()
    if ctx.cancelled.wait(30):
        # Its own deadline has passed: the callback gets one of its own.
        ctx.host.call("test.saw_cancel", {"remaining_ms": int(remaining * 1000)}, timeout=5)
    return {"groups": []}


@ext.work_kind("writer")
def writer(ctx, params):
    try:
        ctx.host.emit("x", {})
        code = 0
    except RpcError as e:
        code = e.code
    return {"groups": [{"key": "code:%d" % code, "event_ids": [params["inputs"][0]["id"]]}]}


class Kit(unittest.TestCase):
    def test_the_handshake_carries_the_chosen_limits_and_artifacts_keep_them(self):
        with ScriptedHost(ext, limits={"max_artifact_chunk_bytes": 1000, "artifact_window": 2}) as h:
            self.assertEqual(h.handshake["extension"], {"name": "kit-sample", "version": "0.2.0"})
            self.assertEqual(h.call("limits")["chunk"], 1000)
            stored = h.call("upload", {"bytes": 4500})
            self.assertEqual(stored["size"], 4500)
            a = h.artifacts[0]
            self.assertEqual((a.transport, a.chunks), ("chunks", 5))

    def test_a_call_gives_the_result_and_default_deadline(self):
        with ScriptedHost(ext) as h:
            self.assertEqual(h.call("echo", {"text": "hi"}), {"text": "hi"})
            r = h.call("limits")
            self.assertTrue(25 < r["remaining"] <= 30, r)  # default_ms, in _meta.remaining_ms

    def test_a_protocol_error_is_raised_as_answered(self):
        with ScriptedHost(ext) as h:
            with self.assertRaises(Answered) as cm:
                h.call("echo", {"txt": 1})
            self.assertEqual(cm.exception.code, ErrorCode.INVALID_PARAMS)
            with self.assertRaises(Answered) as cm:
                h.call("nope")
            self.assertEqual(cm.exception.code, ErrorCode.METHOD_NOT_FOUND)

    def test_a_late_in_transaction_answer_is_deadline_exceeded_and_the_handler_is_cancelled(self):
        with ScriptedHost(ext, deadlines={"in_transaction_ms": 100},
                          answers={"test.saw_cancel": {}}) as h:
            with self.assertRaises(DeadlineExceeded) as cm:
                h.call("work_kind.trigger", {"kind": "slow", "inputs": [event(1, "t")]})
            self.assertEqual(cm.exception.code, ErrorCode.DEADLINE_EXCEEDED)
            seen = _poll(lambda: h.callbacks_of("test.saw_cancel"))
            self.assertTrue(0 < seen[0]["remaining_ms"] <= 100, seen)

    def test_callbacks_are_answered_from_the_table_and_recorded(self):
        with ScriptedHost(ext, answers={"state.event": event(7, "t-7")}) as h:
            self.assertEqual(h.call("thread_of", {"event_id": 7}), {"thread": "t-7"})
            self.assertEqual([(c.method, c.params) for c in h.callbacks],
                             [("state.event", {"event_id": 7})])

    def test_callbacks_are_answered_by_a_function_or_an_error(self):
        def state_event(p):
            if p["event_id"] == 404:
                raise RpcError.not_found("no event 404")
            return event(p["event_id"], "t-%d" % p["event_id"])

        with ScriptedHost(ext, answers={"state.event": state_event}) as h:
            self.assertEqual(h.call("thread_of", {"event_id": 3}), {"thread": "t-3"})
            with self.assertRaises(Answered) as cm:
                h.call("thread_of", {"event_id": 404})
            self.assertEqual(cm.exception.code, ErrorCode.NOT_FOUND)
            self.assertEqual(h.callbacks_of("state.event"), [{"event_id": 3}, {"event_id": 404}])
        with ScriptedHost(ext, answers={"state.event": RpcError.not_found("gone")}) as h:
            with self.assertRaises(Answered) as cm:
                h.call("thread_of", {"event_id": 1})
            self.assertEqual((cm.exception.code, cm.exception.message), (ErrorCode.NOT_FOUND, "gone"))
        with ScriptedHost(ext) as h:  # nothing scripted: refused, saying what to script
            with self.assertRaises(Answered) as cm:
                h.call("thread_of", {"event_id": 1})
            self.assertIn("answers=", cm.exception.message)

    def test_cancel_sends_dollar_cancel_and_the_answer_is_cancelled(self):
        with ScriptedHost(ext) as h:
            p = h.start_call("check.sleep", {"ms": 60000})
            p.cancel()
            with self.assertRaises(Answered) as cm:
                p.wait()
            self.assertEqual(cm.exception.code, ErrorCode.CANCELLED)

    def test_a_chunked_artifact_arrives_whole_with_its_digest(self):
        want = content(200000)
        with ScriptedHost(ext) as h:
            stored = h.call("upload", {"bytes": len(want)})
            a = h.artifacts[0]
            self.assertEqual((a.name, a.data, a.transport, a.chunks), ("blob.bin", want, "chunks", 4))
            self.assertEqual(a.sha256, hashlib.sha256(want).hexdigest())
            self.assertEqual(stored["sha256"], a.sha256)

    def test_a_bulk_artifact_arrives_whole_with_its_digest(self):
        want = content(700000)
        with ScriptedHost(ext, bulk_pipe=True) as h:
            stored = h.call("upload", {"bytes": len(want), "bulk": True})
            a = h.artifacts[0]
            self.assertEqual((a.data == want, a.transport, a.chunks), (True, "bulk-pipe", 0))
            self.assertEqual(stored["sha256"], hashlib.sha256(want).hexdigest())
            self.assertEqual(h.callbacks_of("artifact.chunk"), [])

    def test_a_request_left_unanswered_is_named_at_finish(self):
        h = ScriptedHost(ext, patience=0.2, deadlines={"shutdown_grace_ms": 1000})
        h.start()
        h.start_call("hang", {}, timeout=None)
        with self.assertRaises(RuleBroken) as cm:
            h.finish()
        self.assertEqual(cm.exception.rule, "declared-methods-answer")
        self.assertIn("`hang`", str(cm.exception))

    def test_a_write_inside_a_transaction_is_refused_reentrant_write(self):
        with ScriptedHost(ext, answers={"operation.emit": {"emission_id": 1, "commit_id": "c"}}) as h:
            r = h.call("work_kind.trigger", {"kind": "writer", "inputs": [event(1, "t")]})
            self.assertEqual(r["groups"][0]["key"], "code:%d" % ErrorCode.REENTRANT_WRITE)

    def test_the_manifest_must_state_what_the_handshake_says(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "conduit-extension.toml")
            with open(path, "w") as f:
                f.write('name = "kit-sample"\nversion = "0.1.0"  # stale\nprotocol = 1\n')
            with self.assertRaises(RuleBroken) as cm:
                ScriptedHost(ext, manifest=path).start()
            self.assertEqual(cm.exception.rule, "handshake")
            self.assertIn("0.1.0", str(cm.exception))


class Readme(unittest.TestCase):
    def test_the_readme_example_runs(self):
        """The README's kit example, run as the tests it is."""
        readme = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "README.md")
        with open(readme, encoding="utf-8") as f:
            text = f.read()
        section = text.split("## Testing your extension: the kit", 1)[1]
        code = section.split("```python\n", 1)[1].split("```", 1)[0]
        module = type(sys)("readme_kit_example")
        exec(compile(code, readme, "exec"), module.__dict__)
        suite = unittest.defaultTestLoader.loadTestsFromModule(module)
        self.assertEqual(suite.countTestCases(), 3)
        result = unittest.TestResult()
        suite.run(result)
        self.assertEqual((result.failures, result.errors), ([], []))


def _poll(get, seconds=10.0):
    import time
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        v = get()
        if v:
            return v
        time.sleep(0.005)
    raise AssertionError("not seen within %.0f s" % seconds)


if __name__ == "__main__":
    unittest.main()
