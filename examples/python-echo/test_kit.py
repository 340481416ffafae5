"""python-echo tested with the kit (conduit_extension.testing): echo.py's `ext` behind a scripted
host, on the SDK's own session, with no daemon.

Run in the staged package (`make stage`; staging puts the SDK and its kit beside echo.py):

    python3 -B -m unittest discover -s target/packages/python-echo -p 'test_*.py'
"""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # the SDK, with its kit, beside echo.py where staging puts it

from conduit_extension import ErrorCode  # noqa: E402
from conduit_extension.testing import Answered, DeadlineExceeded, ScriptedHost  # noqa: E402
from echo import ext  # noqa: E402

MANIFEST = os.path.join(HERE, "conduit-extension.toml")


class EchoKit(unittest.TestCase):
    def test_echo_answers_its_params_without_the_meta(self):
        with ScriptedHost(ext, manifest=MANIFEST) as host:
            self.assertEqual(host.call("echo", {"text": "hi", "n": 1}), {"text": "hi", "n": 1})

    def test_echo_without_text_is_invalid_params(self):
        with ScriptedHost(ext) as host:
            with self.assertRaises(Answered) as cm:
                host.call("echo", {"txt": "hi"})
            self.assertEqual(cm.exception.code, ErrorCode.INVALID_PARAMS)
            self.assertIn("text", cm.exception.message)

    def test_a_sleep_past_its_deadline_is_deadline_exceeded_then_cancelled(self):
        with ScriptedHost(ext) as host:
            with self.assertRaises(DeadlineExceeded):
                host.call("check.sleep", {"ms": 60000}, timeout=0.1)
            # The $/cancel the kit sent freed the request: the next call is served at once.
            self.assertEqual(host.call("echo", {"text": "after"}), {"text": "after"})

    def test_cancel_answers_cancelled(self):
        with ScriptedHost(ext) as host:
            p = host.start_call("check.sleep", {"ms": 60000})
            p.cancel()
            with self.assertRaises(Answered) as cm:
                p.wait()
            self.assertEqual(cm.exception.code, ErrorCode.CANCELLED)


if __name__ == "__main__":
    unittest.main()
