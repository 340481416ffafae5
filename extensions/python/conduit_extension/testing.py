"""conduit_extension.testing: test an extension's own logic without a daemon.

A :class:`ScriptedHost` runs your :class:`~conduit_extension.Extension` with its own ``run()``
(the SDK's real session code, exactly what the daemon starts) in a forked copy of the test
process, over real pipes, and plays the host::

    import unittest
    from conduit_extension.testing import ScriptedHost, Answered
    from main import ext            # the module registers its handlers; run() is under __main__

    class EchoTest(unittest.TestCase):
        def test_echo(self):
            with ScriptedHost(ext) as host:
                self.assertEqual(host.call("echo", {"text": "hi"}), {"text": "hi"})

What the host does:

- the handshake, with the ``limits``, ``deadlines`` and ``protocol_versions`` you choose, and
  the bulk pipe (``bulk_pipe=True``, docs/protocol.md §8.1);
- :meth:`ScriptedHost.call` any method and get its result, or the protocol error it was
  answered as (:class:`Answered`, with ``code``, ``message``, ``data``); the four
  in-transaction calls get the host's deadline (``in_transaction_ms``, 250 by default) in
  ``_meta.remaining_ms``, and an answer later than that raises :class:`DeadlineExceeded`
  after ``$/cancel`` was sent, as the host does, so the handler sees ``ctx.cancelled``;
- callbacks (``ctx.host``) answered from a table (``answers={"state.event": {...}}``, an
  :class:`~conduit_extension.RpcError` to answer an error) or a function of the params
  (``answers={"state.event": lambda p: ...}``), every one recorded (:attr:`callbacks`);
  ``operation.emit``, ``ingress.push`` and ``artifact.close`` during an in-transaction call are
  refused ``reentrant_write`` as conduit refuses them (§7.6);
- :meth:`PendingCall.cancel` sends ``$/cancel``;
- artifacts received whole as bytes, by chunks or on the bulk pipe (:attr:`artifacts`);
- :meth:`ScriptedHost.finish` (the ``with`` block's end) checks that every request was
  answered and every artifact stream kept the rules, then sends ``shutdown`` and checks that
  the extension exits 0.

A broken rule raises :class:`RuleBroken` naming the rule as ``conduit ext check`` names it
(:data:`RULES`). Every error is an ``AssertionError``, so unittest reports it as a failure.

The extension runs in a fork: what a handler changes in memory is not seen by the test, which
observes the extension the way the host does, through its answers and callbacks. The fork
needs a POSIX system. Not here: the wire's edge rules (``conduit ext check`` tests those).

Invariant: every wait is bounded (deadlines, and ``patience`` for what the test waits on at the
end), and the forked extension is always reaped.
"""

import base64
import hashlib
import json
import os
import signal
import struct
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from conduit_extension import ErrorCode, Extension, RpcError

__all__ = ["ScriptedHost", "PendingCall", "Callback", "Artifact", "KitError", "Answered",
           "DeadlineExceeded", "RuleBroken", "RULES", "IN_TRANSACTION"]

#: The rules a kit test can see broken: id (as ``conduit ext check`` reports it) -> section of
#: docs/protocol.md.
RULES = {
    "handshake": "§4, §4.2",
    "version": "§4.3, §16",
    "capabilities-match-manifest": "§4.2, §16",
    "declared-methods-answer": "§6, §8",
    "cancellation": "§9",
    "shutdown": "§5",
    "stdout-only-protocol": "§2",
}

#: The calls the host makes inside its transaction, under ``in_transaction_ms``.
IN_TRANSACTION = ("work_kind.trigger", "recurrence.next", "dependency.filter", "emit.commit")
_WRITES = ("operation.emit", "ingress.push", "artifact.close")

_LIMITS = {"max_message_bytes": 16777216, "max_concurrent_requests": 64,
           "max_artifact_chunk_bytes": 262144, "artifact_window": 8}
_DEADLINES = {"in_transaction_ms": 250, "default_ms": 30000, "shutdown_grace_ms": 5000}
_START_TIMEOUT = 10.0
_MAX_FRAME = 1024 * 1024


class KitError(AssertionError):
    """Why a call through the scripted host did not give the result the test asked for."""


class Answered(KitError):
    """The extension answered an error object: ``code``, ``message``, ``data`` as sent."""

    def __init__(self, method: str, error: Dict[str, Any]):
        self.method = method
        self.code = error.get("code")
        self.message = error.get("message")
        self.data = error.get("data")
        super().__init__("`%s` was answered with error %s: %s" % (method, self.code, self.message))


class DeadlineExceeded(KitError):
    """No answer within the deadline the kit applied: ``deadline_exceeded`` (-32002), and
    ``$/cancel`` was sent, as the host does (docs/protocol.md §11)."""

    code = ErrorCode.DEADLINE_EXCEEDED

    def __init__(self, method: str, seconds: float):
        self.method = method
        super().__init__("`%s`: deadline_exceeded (-32002): no answer within %.3f s; the kit sent "
                         "`$/cancel` as the host does (docs/protocol.md §11)" % (method, seconds))


class RuleBroken(KitError):
    """The extension broke a rule of the protocol; ``rule`` is its id in ``conduit ext check``."""

    def __init__(self, rule: str, detail: str, stderr: str = ""):
        self.rule = rule
        self.section = RULES[rule]
        self.detail = detail
        text = "rule `%s` (docs/protocol.md %s) broken: %s" % (rule, self.section, detail)
        if stderr:
            text += "\nthe extension's stderr (last lines):\n" + stderr
        super().__init__(text)


class Callback:
    """A callback the extension made: its ``method`` and ``params`` as they came."""

    def __init__(self, method: str, params: Any):
        self.method = method
        self.params = params

    def __repr__(self):
        return "Callback(%r, %r)" % (self.method, self.params)


class Artifact:
    """An artifact the extension stored: ``name``, ``media_type``, ``data`` (bytes), ``sha256``
    (as the host answered it), ``transport`` (``"chunks"`` or ``"bulk-pipe"``), ``chunks``."""

    def __init__(self, name, media_type, data, transport, chunks):
        self.name = name
        self.media_type = media_type
        self.data = bytes(data)
        self.sha256 = hashlib.sha256(self.data).hexdigest()
        self.transport = transport
        self.chunks = chunks

    def __repr__(self):
        return "Artifact(%r, %d bytes, %s)" % (self.name, len(self.data), self.transport)


class _Call:
    def __init__(self, method):
        self.method = method
        self.done = threading.Event()
        self.msg = None
        self.cancelled = False
        self.given_up = False
        self.in_tx = False


class PendingCall:
    """A request sent to the extension and not yet waited for."""

    def __init__(self, host, req_id, call, timeout):
        self._host = host
        self.id = req_id
        self._call = call
        self._timeout = timeout

    def cancel(self) -> None:
        """Send ``$/cancel`` for it (its answer, normally ``cancelled``, is still awaited)."""
        self._call.cancelled = True
        self._host._send({"jsonrpc": "2.0", "method": "$/cancel", "params": {"id": self.id}})

    def wait(self) -> Any:
        """The result; raises :class:`Answered`, :class:`DeadlineExceeded` or :class:`RuleBroken`."""
        call = self._call
        limit = self._timeout if self._timeout is not None else self._host.patience
        if not call.done.wait(limit):
            if self._timeout is None:
                raise self._host._rule("declared-methods-answer",
                                       "`%s` was not answered within %.1f s" % (call.method, limit))
            with self._host._lock:
                late = self._host._pending.pop(self.id, None) is not None
                call.given_up = late
            if late:
                self._host._send({"jsonrpc": "2.0", "method": "$/cancel", "params": {"id": self.id}})
                self._host._leave_transaction(call)
                raise DeadlineExceeded(call.method, limit)
            call.done.wait()  # answered as the deadline passed: it is being delivered
        msg = call.msg
        if msg is None:
            raise self._host._rule("declared-methods-answer",
                                   "the extension exited before answering `%s`" % call.method)
        if "error" in msg:
            raise Answered(call.method, msg["error"])
        return msg["result"]


class ScriptedHost:
    """The host, scripted by a test. See the module's docs.

    ``answers``: callback method -> a result, an :class:`RpcError` (answered as that error), or
    a function ``f(params)`` returning a result or raising :class:`RpcError`. ``delays``:
    method -> seconds to hold its callbacks before answering. ``patience``: seconds
    :meth:`finish` waits for what is still unanswered (and a bulk close for its bytes).
    ``manifest``: a ``conduit-extension.toml`` whose name and version the handshake must state.
    """

    def __init__(self, ext: Extension, *, limits: Optional[Dict[str, int]] = None,
                 deadlines: Optional[Dict[str, int]] = None, protocol_versions=(1,),
                 bulk_pipe: bool = False, answers: Optional[Dict[str, Any]] = None,
                 delays: Optional[Dict[str, float]] = None, patience: float = 5.0,
                 manifest: Optional[str] = None):
        self.ext = ext
        self.limits = dict(_LIMITS, **(limits or {}))
        self.deadlines = dict(_DEADLINES, **(deadlines or {}))
        self.protocol_versions = list(protocol_versions)
        self.bulk_pipe = bulk_pipe
        self.answers = dict(answers or {})
        self.delays = dict(delays or {})
        self.patience = patience
        self.manifest = manifest
        self.handshake = None
        self.callbacks: List[Callback] = []
        self.artifacts: List[Artifact] = []
        self.aborted_artifacts: List[str] = []
        self._violations: List[RuleBroken] = []
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._pending: Dict[int, _Call] = {}
        self._started: List[_Call] = []
        self._next_id = 1
        self._in_tx = 0
        self._streams: Dict[str, Dict[str, Any]] = {}
        self._next_stream = 0
        self._frames: Dict[int, bytearray] = {}
        self._bulk_broken = None
        self._stderr: List[str] = []
        self._pid = None
        self._threads: List[threading.Thread] = []

    # -- starting and stopping ------------------------------------------------------------------

    def __enter__(self) -> "ScriptedHost":
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.finish()
        else:
            self._kill()
        return False

    def start(self) -> Dict[str, Any]:
        """Fork the extension, make the handshake; returns the ``initialize`` result."""
        to_ext_r, to_ext_w = os.pipe()
        from_ext_r, from_ext_w = os.pipe()
        err_r, err_w = os.pipe()
        bulk_r = bulk_w = None
        if self.bulk_pipe:
            bulk_r, bulk_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the extension: its own run(), on these pipes
            code = 70
            try:
                os.dup2(to_ext_r, 0)
                os.dup2(from_ext_w, 1)
                os.dup2(err_w, 2)
                keep = bulk_w if bulk_w is not None else 2
                os.closerange(3, keep)
                os.closerange(keep + 1, 65536)
                self.ext.run()
                code = 0
            finally:
                os._exit(code)
        self._pid = pid
        for fd in (to_ext_r, from_ext_w, err_w) + ((bulk_w,) if bulk_w is not None else ()):
            os.close(fd)
        self._stdin = os.fdopen(to_ext_w, "wb", buffering=0)
        self._stdout = os.fdopen(from_ext_r, "rb")
        self._spawn(self._read_stdout)
        self._spawn(self._read_stderr, os.fdopen(err_r, "rb"))
        if bulk_r is not None:
            self._spawn(self._read_bulk, bulk_r)
        params = {"protocol_versions": self.protocol_versions,
                  "host": {"name": "conduit_extension.testing", "version": "0.1.0"},
                  "limits": self.limits, "deadlines": self.deadlines}
        if bulk_w is not None:
            params["bulk"] = {"fd": bulk_w}
        pending = self._request("initialize", params, None, _START_TIMEOUT)
        try:
            result = pending.wait()
        except DeadlineExceeded:
            self._kill()
            raise self._rule("handshake", "no answer to `initialize` within %.0f s" % _START_TIMEOUT)
        except Answered:
            self._kill()
            raise
        try:
            version = result["protocol_version"]
            ext = result["extension"]
            caps = result["capabilities"]
        except (TypeError, KeyError) as e:
            self._kill()
            raise self._rule("handshake", "the `initialize` result lacks %s: %r" % (e, result))
        if version not in self.protocol_versions:
            self._kill()
            raise self._rule("version", "the extension answered protocol version %r, the host "
                                        "offered %r" % (version, self.protocol_versions))
        if caps != self.ext.capabilities():
            self._kill()
            raise self._rule("handshake", "the handshake declares %r, the extension registered %r"
                             % (caps, self.ext.capabilities()))
        if self.manifest is not None:
            facts = manifest_facts(self.manifest)
            said = {"name": ext.get("name"), "version": ext.get("version")}
            if facts != said:
                self._kill()
                raise self._rule("handshake", "the manifest %s says %r, the handshake %r: read the "
                                              "version from one place, or change both"
                                 % (self.manifest, facts, said))
        self.handshake = result
        return result

    def finish(self) -> None:
        """Check that every request was answered and no rule was broken, then ``shutdown``:
        answered ``{}``, and the extension exits 0. Raises :class:`RuleBroken` for the first
        problem (naming the others)."""
        end = time.monotonic() + self.patience
        for call in list(self._started):
            call.done.wait(max(0.0, end - time.monotonic()))
        problems = []
        for call in self._started:
            if not call.done.is_set() and not call.given_up:
                rule = "cancellation" if call.cancelled else "declared-methods-answer"
                how = "cancelled with `$/cancel` and " if call.cancelled else ""
                problems.append((rule, "the request `%s` was %snever answered within %.1f s; every "
                                       "request is answered exactly once (docs/protocol.md §3)"
                                 % (call.method, how, self.patience)))
        problems.extend((v.rule, v.detail) for v in self._violations)
        grace = self.deadlines["shutdown_grace_ms"] / 1000.0
        try:
            answer = self._request("shutdown", {}, None, grace).wait()
            if answer != {}:
                problems.append(("shutdown", "`shutdown` was answered %r, not {}" % (answer,)))
        except KitError as e:
            problems.append(("shutdown", "`shutdown` failed: %s" % e))
        code = self._reap(grace)
        if code != 0:
            problems.append(("shutdown", "after `shutdown` the extension ended with %s, not exit 0"
                             % ("no exit" if code is None else "status %d" % code)))
        self._close()
        if problems:
            rule, detail = problems[0]
            if len(problems) > 1:
                detail += "; and %d more: %s" % (len(problems) - 1,
                                                 "; ".join("%s: %s" % p for p in problems[1:]))
            raise RuleBroken(rule, detail, self.stderr_tail())

    # -- calling the extension ------------------------------------------------------------------

    def call(self, method: str, params: Any = None, timeout: Optional[float] = -1) -> Any:
        """Call ``method`` and return its result, under the host's deadline for it (or
        ``timeout`` seconds; ``None``: no deadline, waiting up to ``patience``)."""
        return self.start_call(method, params, timeout).wait()

    def start_call(self, method: str, params: Any = None,
                   timeout: Optional[float] = -1) -> PendingCall:
        """Send ``method`` now; cancel it, or wait for it later."""
        if timeout == -1:
            ms = self.deadlines["in_transaction_ms" if method in IN_TRANSACTION else "default_ms"]
            timeout = ms / 1000.0
        params = {} if params is None else params
        if timeout is not None and isinstance(params, dict):
            params = dict([("_meta", {"remaining_ms": int(timeout * 1000)})] + list(params.items()))
        return self._request(method, params, method in IN_TRANSACTION, timeout)

    def callbacks_of(self, method: str) -> List[Any]:
        """The params of every ``method`` callback so far, in order."""
        return [c.params for c in list(self.callbacks) if c.method == method]

    def stderr_tail(self, lines: int = 40) -> str:
        return "".join(self._stderr[-lines:])

    @property
    def stderr(self) -> str:
        """Everything the extension wrote to stderr (its log) so far."""
        return "".join(self._stderr)

    # -- the wire -------------------------------------------------------------------------------

    def _spawn(self, fn, *args):
        t = threading.Thread(target=fn, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    def _send(self, msg):
        data = json.dumps(msg, separators=(",", ":")).encode() + b"\n"
        with self._write_lock:
            try:
                self._stdin.write(data)
            except (OSError, ValueError):
                pass  # the extension is gone; its calls end when its stdout does

    def _request(self, method, params, in_tx, timeout):
        call = _Call(method)
        call.in_tx = bool(in_tx)  # counted in _in_tx until answered or given up
        with self._lock:
            req_id = self._next_id
            self._next_id += 1
            self._pending[req_id] = call
            if call.in_tx:
                self._in_tx += 1
            if method not in ("initialize", "shutdown"):
                self._started.append(call)
        self._send({"jsonrpc": "2.0", "id": req_id, "method": method, "params": params})
        return PendingCall(self, req_id, call, timeout)

    def _leave_transaction(self, call):
        with self._lock:
            if call.in_tx:
                call.in_tx = False
                self._in_tx -= 1

    def _rule(self, rule, detail):
        return RuleBroken(rule, detail, self.stderr_tail())

    def _violation(self, rule, detail):
        with self._lock:
            self._violations.append(RuleBroken(rule, detail))

    def _read_stdout(self):
        for line in self._stdout:
            try:
                msg = json.loads(line)
                if not line.endswith(b"\n") or not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
                    raise ValueError("not a JSON-RPC 2.0 message")
            except ValueError as e:
                self._violation("stdout-only-protocol", "the extension wrote %.200r to stdout (%s)"
                                % (line, e))
                continue
            if "method" in msg:
                if "id" in msg:
                    self._spawn(self._serve_callback, msg)
                continue  # a notification ($/cancel of a callback): its answer is still sent
            with self._lock:
                call = self._pending.pop(msg.get("id"), None)
            if call is None:
                continue  # the answer to a request the kit gave up on (§11: ignored)
            self._leave_transaction(call)
            call.msg = msg
            call.done.set()
        with self._lock:
            left, self._pending = list(self._pending.values()), {}
        for call in left:
            call.done.set()

    def _read_stderr(self, stream):
        with stream:
            for line in stream:
                self._stderr.append(line.decode("utf-8", "replace"))

    # -- callbacks ------------------------------------------------------------------------------

    def _serve_callback(self, msg):
        method, params = msg["method"], msg.get("params")
        with self._lock:
            self.callbacks.append(Callback(method, params))
        try:
            result = self._answer(method, params)
            reply = {"jsonrpc": "2.0", "id": msg["id"], "result": result}
        except RpcError as e:
            reply = {"jsonrpc": "2.0", "id": msg["id"], "error": e.to_dict()}
        self._send(reply)

    def _answer(self, method, params):
        if method in _WRITES and self._in_tx > 0:
            raise RpcError(ErrorCode.REENTRANT_WRITE, "`%s` refused: the host is inside a transaction "
                           "waiting for this extension (docs/protocol.md §7.6)" % method)
        if method in self.delays:
            time.sleep(self.delays[method])
        if method in self.answers:
            a = self.answers[method]
            if isinstance(a, RpcError):
                raise a
            return a(params) if callable(a) else a
        if method.startswith("artifact."):
            return self._artifact(method, params if isinstance(params, dict) else {})
        raise RpcError(ErrorCode.METHOD_NOT_FOUND, "the scripted host has no answer for `%s`: give it "
                       "one with ScriptedHost(answers={%r: ...})" % (method, method))

    # -- artifacts (docs/protocol.md §8) --------------------------------------------------------

    def _broken(self, detail):
        self._violation("declared-methods-answer", detail)
        return RpcError(ErrorCode.ARTIFACT_INVALID, detail)

    def _artifact(self, method, p):
        sid = p.get("stream_id")
        if method == "artifact.open":
            with self._lock:
                n = self._next_stream
                self._next_stream += 1
            sid = "s-%d" % n
            tag = n if p.get("bulk") is True and self.bulk_pipe else None
            self._streams[sid] = {"name": p.get("name"), "media_type": p.get("media_type"),
                                  "data": bytearray(), "seq": 0, "tag": tag}
            opened = {"stream_id": sid, "max_chunk_bytes": self.limits["max_artifact_chunk_bytes"],
                      "window": self.limits["artifact_window"], "sha256_optional": True}
            if tag is not None:
                opened["bulk_tag"] = tag
            return opened
        s = self._streams.get(sid)
        if s is None:
            raise self._broken("%s for `%s`, which is not open" % (method, sid))
        if method == "artifact.abort":
            del self._streams[sid]
            self.aborted_artifacts.append(s["name"])
            return {}
        if method == "artifact.chunk":
            try:
                data = base64.b64decode(p.get("data", ""), validate=True)
            except (ValueError, TypeError):
                data = None
            problem = None
            if s["tag"] is not None:
                problem = "artifact `%s` was granted the bulk pipe and takes no artifact.chunk (§8.1)"
            elif p.get("seq") != s["seq"]:
                problem = "artifact `%%s`: chunk seq %r where %d was next" % (p.get("seq"), s["seq"])
            elif data is None:
                problem = "artifact `%s`: `data` is not standard base64"
            elif len(data) > self.limits["max_artifact_chunk_bytes"]:
                problem = "artifact `%%s`: a chunk of %d bytes, over the max_chunk_bytes of %d" % (
                    len(data), self.limits["max_artifact_chunk_bytes"])
            if problem:
                del self._streams[sid]
                raise self._broken(problem % s["name"])
            s["data"] += data
            s["seq"] += 1
            return {"received": len(s["data"])}
        # artifact.close
        del self._streams[sid]
        size = p.get("size")
        data = s["data"] if s["tag"] is None else self._bulk_bytes(s["tag"], size, s["name"])
        if len(data) != size:
            raise self._broken("artifact `%s`: close says %r bytes, %d were received"
                               % (s["name"], size, len(data)))
        a = Artifact(s["name"], s["media_type"], data,
                     "chunks" if s["tag"] is None else "bulk-pipe", s["seq"])
        claimed = p.get("sha256")
        if claimed is not None and str(claimed).lower() != a.sha256:
            raise self._broken("artifact `%s`: close says sha256 %s, the bytes have %s"
                               % (s["name"], claimed, a.sha256))
        self.artifacts.append(a)
        return {"artifact_id": "sha256:" + a.sha256, "size": size, "sha256": a.sha256}

    def _bulk_bytes(self, tag, size, name):
        end = time.monotonic() + self.patience
        while True:
            with self._lock:
                have = self._frames.get(tag, bytearray())
                if isinstance(size, int) and len(have) >= size:
                    data, rest = bytes(have[:size]), have[size:]
                    self._frames[tag] = rest
                    return data
                broken = self._bulk_broken
            if broken or time.monotonic() >= end:
                raise self._broken("artifact `%s`: close says %r bytes, %d came on the bulk pipe%s"
                                   % (name, size, len(have),
                                      " (it broke: %s)" % broken if broken else ""))
            time.sleep(0.002)

    def _read_bulk(self, fd):
        buf = b""
        with os.fdopen(fd, "rb", buffering=0) as pipe:
            while True:
                chunk = pipe.read(1 << 16)
                if not chunk:
                    break
                buf += chunk
                while len(buf) >= 8:
                    tag, n = struct.unpack("<II", buf[:8])
                    if n == 0 or n > _MAX_FRAME:
                        with self._lock:
                            self._bulk_broken = "a frame header with length %d" % n
                        return
                    if len(buf) < 8 + n:
                        break
                    with self._lock:
                        self._frames.setdefault(tag, bytearray()).extend(buf[8:8 + n])
                    buf = buf[8 + n:]
        if buf:
            with self._lock:
                self._bulk_broken = "the pipe ended inside a frame"

    # -- the child ------------------------------------------------------------------------------

    def _reap(self, timeout):
        if self._pid is None:
            return None
        end = time.monotonic() + timeout
        while True:
            pid, status = os.waitpid(self._pid, os.WNOHANG)
            if pid:
                self._pid = None
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() >= end:
                self._kill()
                return None
            time.sleep(0.005)

    def _kill(self):
        if self._pid is not None:
            try:
                os.kill(self._pid, signal.SIGKILL)
                os.waitpid(self._pid, 0)
            except OSError:
                pass
            self._pid = None
        self._close()

    def _close(self):
        try:
            self._stdin.close()
        except (AttributeError, OSError):
            pass
        for t in self._threads:
            t.join(timeout=1.0)
        try:
            self._stdout.close()
        except (AttributeError, OSError):
            pass


def manifest_facts(path: str) -> Dict[str, Optional[str]]:
    """The ``name`` and ``version`` a ``conduit-extension.toml`` states (its top-level keys)."""
    facts: Dict[str, Optional[str]] = {"name": None, "version": None}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line.startswith("["):
                break
            key, sep, value = line.partition("=")
            key = key.strip()
            if sep and key in facts:
                value = value.split("#", 1)[0].strip()
                facts[key] = json.loads(value) if value.startswith('"') else value
    return facts
