"""Tests of `{{name}}` with the SDK's test kit (conduit_extension.testing): main.py's `ext`
served on the SDK's own session behind a scripted host, with no daemon.

Run in this folder: python3 -B -m unittest -v   (-B: no __pycache__ in the package folder)
"""
import os
import unittest

from conduit_extension import ErrorCode
from conduit_extension.testing import Answered, DeadlineExceeded, ScriptedHost
from main import MANIFEST, ext


class EchoTest(unittest.TestCase):
    def test_echo_answers_its_params(self):
        # manifest=: the handshake must state the manifest's name and version.
        with ScriptedHost(ext, manifest=MANIFEST) as host:
            self.assertEqual(host.call("echo", {"text": "hi"}), {"text": "hi"})

    def test_echo_without_text_is_invalid_params(self):
        with ScriptedHost(ext) as host:
            with self.assertRaises(Answered) as cm:
                host.call("echo", {"txt": "hi"})
            self.assertEqual(cm.exception.code, ErrorCode.INVALID_PARAMS)

    def test_a_call_past_its_deadline_is_deadline_exceeded(self):
        with ScriptedHost(ext) as host:
            with self.assertRaises(DeadlineExceeded):
                host.call("check.sleep", {"ms": 60000}, timeout=0.1)

    # A callback answered by the scripted host, and what it was asked:
    #
    #     with ScriptedHost(ext, answers={"state.event": {"id": 7, ...}}) as host:
    #         host.call("my_method", {"event_id": 7})
    #         self.assertEqual(host.callbacks_of("state.event"), [{"event_id": 7}])


if __name__ == "__main__":
    unittest.main()
