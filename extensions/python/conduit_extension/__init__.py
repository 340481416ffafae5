"""conduit_extension: write conduit extensions in Python (standard library only, Python >= 3.9).

An extension is a child process that the conduit daemon starts and talks to over stdin and stdout
with JSON-RPC 2.0, one message per line (docs/protocol.md). With this package an extension is a
set of handlers registered with decorators; the SDK does everything else::

    from conduit_extension import Extension

    ext = Extension("python-echo", "0.1.0")

    @ext.method("echo")
    def echo(ctx, params):
        return params

    ext.run()

What the SDK does, with the section of docs/protocol.md for each:

- framing (§2): bounded line reads (16 MiB + "\\r\\n"), an oversized line discarded and, when its
  first 4,096 bytes name a top-level id and method, answered ``message_too_large``; one compact
  JSON object per line, written by one writer thread and flushed;
- the edge rules of §3.2/§3.3: parse errors, batches, id validity (``-0``, ``1.0``, out of
  range), repeated top-level members, ``method`` with ``result``/``error``, ``NaN`` and a BOM;
  responses are never answered;
- the refusal order of §3.4: a running id, 64 requests (``overloaded`` with ``data.limit``),
  ``not_initialized``, ``shutting_down``, ``method_not_found``, ``invalid_params``, the handler;
- the handshake (§4): newest common version, ``version_mismatch`` with both lists (a retry is
  accepted), the capabilities derived from what was registered;
- dispatch: ``work_kind.trigger``, ``recurrence.next``, ``dependency.filter``, ``emit.commit``,
  ``ingress.poll`` go to the handler registered for the name in their params (an undeclared
  name is ``invalid_params``); custom methods to theirs; ``check.sleep`` is always served;
- ``$/cancel`` (§9): the request is answered ``cancelled`` at once, ``ctx.cancelled`` is set;
- ``shutdown`` and stdin EOF (§5); a closed stdout exits too;
- callbacks to the host (§7) through ``ctx.host``, and artifact streams with the window of §8
  (or on the host's bulk pipe, §8.1); the host computes the stored SHA-256 and the SDK hands it
  back (``finish()``'s ``sha256``), hashing here only when asked to verify end to end
  (``verify=True``) or when an older host needs the digest;
- deadlines: a host request's ``params._meta.remaining_ms`` is removed from the params and read
  into ``ctx.deadline`` / ``ctx.remaining()``;
- stdout is protected: the protocol writes to a duplicate of fd 1, and fd 1 itself (with
  ``sys.stdout``) is pointed at stderr, so a stray ``print`` lands in the log; logging goes to
  stderr (level from ``CONDUIT_LOG``, default ``info``).

A handler that raises :class:`RpcError` answers that error; any other exception answers
``internal_error`` (-32603), which conduit treats as not retryable.
"""

import base64
import hashlib
import json
import logging
import os
import stat
import struct
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, TypeVar

from typing import TypedDict

__all__ = [
    "Extension", "Ctx", "Host", "ArtifactWriter", "RpcError", "ErrorCode",
    "PROTOCOL_VERSIONS", "MAX_MESSAGE_BYTES", "MAX_CONCURRENT_REQUESTS",
]

__version__ = "0.1.0"

# ---------------------------------------------------------------------------------------------
# Constants (docs/protocol.md §1.1, §12).

PROTOCOL_VERSIONS = [1]
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MAX_CONCURRENT_REQUESTS = 64
MAX_ARTIFACT_CHUNK_BYTES = 256 * 1024
DEFAULT_ARTIFACT_CHUNK_BYTES = 64 * 1024
#: Bytes of content this SDK puts in one frame on the bulk pipe (docs/protocol.md §8.1).
BULK_FRAME_BYTES = 256 * 1024
ARTIFACT_WINDOW = 8
DEFAULT_SHUTDOWN_GRACE_MS = 5000
ID_SCAN_BYTES = 4096
_DISCARD_CHUNK = 64 * 1024
_INT64_MIN = -(2 ** 63)
_INT64_MAX = 2 ** 63 - 1
# Bytes of answers a handler may have queued for a host that is not reading, before it waits.
_QUEUE_BYTES = 32 * 1024 * 1024


class ErrorCode:
    """The error codes of docs/protocol.md §12."""

    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    OVERLOADED = -32000
    CANCELLED = -32001
    DEADLINE_EXCEEDED = -32002
    VERSION_MISMATCH = -32003
    MESSAGE_TOO_LARGE = -32004
    EXTENSION_EXITED = -32005
    REENTRANT_WRITE = -32006
    NOT_INITIALIZED = -32007
    SHUTTING_DOWN = -32008
    ARTIFACT_INVALID = -32009
    NOT_FOUND = -32010
    STORAGE_FULL = -32011

    _RETRYABLE = (-32002, -32005, -32008, -32011)

    @staticmethod
    def is_retryable(code: int, data: Any = None) -> bool:
        """Whether a request refused with ``code`` may succeed if sent again unchanged (§12).

        ``overloaded`` (-32000) is retryable only as conduit sends it, with ``data.limit`` or
        ``data.held_bytes_limit``: a bare -32000 is what many JSON-RPC libraries answer for any
        handler failure, and is read as a generic, non-retryable server error.
        """
        if code == ErrorCode.OVERLOADED:
            return isinstance(data, dict) and ("limit" in data or "held_bytes_limit" in data)
        return code in ErrorCode._RETRYABLE


class RpcError(Exception):
    """An error answer: raise it from a handler, or catch it from a ``ctx.host`` call."""

    def __init__(self, code: int, message: str, data: Any = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_dict(self) -> Dict[str, Any]:
        err = {"code": self.code, "message": self.message}
        if self.data is not None:
            err["data"] = self.data
        return err

    @property
    def retryable(self) -> bool:
        return ErrorCode.is_retryable(self.code, self.data)

    @classmethod
    def invalid_params(cls, message: str, data: Any = None) -> "RpcError":
        return cls(ErrorCode.INVALID_PARAMS, message, data)

    @classmethod
    def internal(cls, message: str, data: Any = None) -> "RpcError":
        return cls(ErrorCode.INTERNAL_ERROR, message, data)

    @classmethod
    def not_found(cls, message: str) -> "RpcError":
        return cls(ErrorCode.NOT_FOUND, message)

    def __repr__(self) -> str:
        return "RpcError(%d, %r)" % (self.code, self.message)


# ---------------------------------------------------------------------------------------------
# The params and results of docs/protocol.md §6-§8, for type checkers (they are plain dicts).


class Event(TypedDict):
    id: int
    source: str
    delivery_id: str
    kind: str
    payload: Any
    accepted_at_ms: int


class TriggerParams(TypedDict):
    kind: str
    inputs: List[Event]


class TriggerResult(TypedDict):
    groups: List[Dict[str, Any]]  # {key: str, event_ids: [int], start?: bool}


class RecurrenceParams(TypedDict):
    recurrence: str
    timer_id: int
    spec: str
    fired_at_ms: int


class RecurrenceResult(TypedDict):
    next_at_ms: Optional[int]


class FilterParams(TypedDict):
    filter: str
    wait_id: int
    subject: str
    event: Event


class FilterResult(TypedDict):
    satisfied: bool


class CommitParams(TypedDict, total=False):
    emission: str
    commit_id: str
    work_id: int
    payload: Any


class CommitResult(TypedDict):
    records: List[Dict[str, Any]]  # {kind: str, body: any}


class IngressPollParams(TypedDict, total=False):
    source: str
    cursor: str
    limit: int


class IngressPollResult(TypedDict, total=False):
    events: List[Dict[str, Any]]  # {delivery_id, kind, payload}
    cursor: str


Handler = Callable[["Ctx", Any], Any]
F = TypeVar("F", bound=Handler)

log = logging.getLogger("conduit_extension")

# ---------------------------------------------------------------------------------------------
# Reading JSON by the rules of §3.3.


class _NegZero(int):
    """The integer literal ``-0``: 0 as a number, never a valid id (§3.3)."""


_NEG_ZERO = _NegZero(0)


class _DupObject(dict):
    """An object that repeated a member name; ``dups`` holds the repeated names."""

    dups: frozenset = frozenset()


def _pairs(pairs):
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen, dups = set(), set()
        for k, _ in pairs:
            (dups if k in seen else seen).add(k)
        obj = _DupObject(obj)
        obj.dups = frozenset(dups)
    return obj


def _reject_constant(name):
    raise ValueError("%s is not JSON" % name)


def _parse_int(text):
    return _NEG_ZERO if text == "-0" else int(text)


def parse_json(text: str) -> Any:
    """JSON as §3.3 reads it: no NaN/Infinity, ``-0`` marked, repeated members marked."""
    return json.loads(text, parse_constant=_reject_constant, parse_int=_parse_int,
                      object_pairs_hook=_pairs)


def is_int(value: Any) -> bool:
    """An integer within signed 64 bits (``True`` is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and _INT64_MIN <= value <= _INT64_MAX


def is_valid_id(value: Any) -> bool:
    """A valid request id (§3.3): any string, or an integer in signed 64 bits written without
    fraction or exponent, and not ``-0``."""
    return isinstance(value, str) or (type(value) is int and _INT64_MIN <= value <= _INT64_MAX)


def encode(msg: Any) -> bytes:
    """One compact JSON line body (no terminator); never NaN."""
    try:
        return json.dumps(msg, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates cannot be UTF-8: escape everything
        return json.dumps(msg, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode("ascii")


_WS = b" \t\r\n"
_SCALAR_END = b",}] \t\r\n"


def _scan_string(buf, i):
    n = len(buf)
    i += 1
    while i < n:
        c = buf[i]
        if c == 0x5C:
            i += 2
            continue
        if c == 0x22:
            return i + 1
        i += 1
    return None


def _skip_value(buf, i):
    n = len(buf)
    c = buf[i]
    if c == 0x22:
        return _scan_string(buf, i)
    if c in b"{[":
        depth = 0
        while i < n:
            c = buf[i]
            if c == 0x22:
                j = _scan_string(buf, i)
                if j is None:
                    return None
                i = j
                continue
            if c in b"{[":
                depth += 1
            elif c in b"}]":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return None
    j = i
    while j < n and buf[j] not in _SCALAR_END:
        j += 1
    return None if j >= n else j


def scan_head(buf: bytes):
    """``(id, id_readable, has_method)`` from the head of an oversized message (§2, "Size
    cap"): top-level members only, strings and nesting tracked, stopping where the head ends or
    stops being well-formed."""
    n = len(buf)

    def ws(k):
        while k < n and buf[k] in _WS:
            k += 1
        return k

    found, readable, has_method, seen_id = None, False, False, False
    i = ws(0)
    if i >= n or buf[i] != 0x7B:
        return None, False, False
    i += 1
    while True:
        i = ws(i)
        if i >= n or buf[i] != 0x22:
            break
        j = _scan_string(buf, i)
        if j is None:
            break
        try:
            key = json.loads(buf[i:j].decode("utf-8"))
        except ValueError:
            break
        i = ws(j)
        if i >= n or buf[i] != 0x3A:
            break
        if key == "method":
            has_method = True
        i = ws(i + 1)
        if i >= n:
            break
        end = _skip_value(buf, i)
        if end is None:
            break
        if key == "id" and not seen_id:
            seen_id = True
            try:
                value = parse_json(buf[i:end].decode("utf-8"))
            except ValueError:
                value = None
            if is_valid_id(value):
                found, readable = value, True
        i = ws(end)
        if i < n and buf[i] == 0x2C:
            i += 1
            continue
        break
    return found, readable, has_method


# ---------------------------------------------------------------------------------------------
# Output: one writer thread, so no caller (the reader above all) ever blocks on a full pipe.


class _Writer:
    def __init__(self, stream, on_closed):
        self._stream = stream
        self._on_closed = on_closed
        self._cond = threading.Condition()
        self._queue = []
        self._bytes = 0
        self._final = False
        self._closed = False
        self._busy = False
        threading.Thread(target=self._run, name="conduit-writer", daemon=True).start()

    def send(self, msg, final=False, wait_room=True):
        data = encode(msg)
        if len(data) > MAX_MESSAGE_BYTES:
            if "id" in msg and ("result" in msg or "error" in msg):
                log.warning("the answer to id %r is %d bytes, over the %d-byte cap: answering "
                            "message_too_large instead", msg["id"], len(data), MAX_MESSAGE_BYTES)
                data = encode({"jsonrpc": "2.0", "id": msg["id"], "error": {
                    "code": ErrorCode.MESSAGE_TOO_LARGE,
                    "message": "the answer would be %d bytes, over the %d-byte limit"
                               % (len(data), MAX_MESSAGE_BYTES),
                    "data": {"limit": MAX_MESSAGE_BYTES, "size": len(data)}}})
            else:
                raise RpcError(ErrorCode.MESSAGE_TOO_LARGE,
                               "the message would be %d bytes, over the %d-byte limit"
                               % (len(data), MAX_MESSAGE_BYTES),
                               {"limit": MAX_MESSAGE_BYTES, "size": len(data)})
        with self._cond:
            while wait_room and self._queue and self._bytes + len(data) > _QUEUE_BYTES \
                    and not self._closed:
                self._cond.wait(1.0)
            if self._closed or self._final:
                return
            self._queue.append(data)
            self._bytes += len(data)
            if final:
                self._final = True
            self._cond.notify_all()

    def _run(self):
        while True:
            with self._cond:
                while not self._queue:
                    if self._final:
                        self._closed = True
                        self._cond.notify_all()
                        return
                    self._cond.wait()
                batch, self._queue = self._queue, []
                self._busy = True
            try:
                for data in batch:
                    self._stream.write(data + b"\n")
                self._stream.flush()  # one flush per batch: every message taken is flushed
            except (BrokenPipeError, OSError, ValueError) as exc:
                log.info("stdout closed (%s); exiting", exc)
                self._on_closed()
                return
            with self._cond:
                self._bytes -= sum(len(d) for d in batch)
                self._busy = False
                self._cond.notify_all()

    def drain(self, timeout):
        """Wait until everything queued is written (or ``timeout`` s pass)."""
        end = time.monotonic() + timeout
        with self._cond:
            while (self._queue or self._busy) and not self._closed:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True


def _exit(code):
    try:
        sys.stderr.flush()
    except Exception:
        pass
    os._exit(code)


# ---------------------------------------------------------------------------------------------
# Requests: the handler's context.


class Ctx:
    """What a handler gets besides its params.

    - ``id``, ``method``: the request's;
    - ``cancelled``: a ``threading.Event`` set when the host cancels the request (``$/cancel``)
      or a shutdown gives up on it; the SDK has already answered ``cancelled`` by then, and what
      the handler returns is discarded;
    - ``shutting_down``: a ``threading.Event`` set when the host asked the extension to stop;
    - ``deadline``: the ``time.monotonic()`` time past which the host stops waiting (from
      ``params._meta.remaining_ms``), or ``None``; ``remaining()`` is the seconds left, or None;
    - ``host``: the callbacks of docs/protocol.md §7 (:class:`Host`); their calls wait at most
      until ``deadline`` unless given a timeout;
    - ``init``: the host's ``initialize`` params; ``log``: the extension's logger (stderr).
    """

    def __init__(self, server, req_id, method, deadline):
        self.id = req_id
        self.method = method
        self.deadline = deadline
        self.cancelled = threading.Event()
        self.shutting_down = server.shutting_down_event
        self.init = server.init_params
        self.log = server.ext.log
        self.host = Host(server, self)
        self._server = server

    def remaining(self) -> Optional[float]:
        """Seconds until the host's deadline for this request (never below 0), or None."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())

    def is_cancelled(self) -> bool:
        return self.cancelled.is_set()

    def sleep(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, waking early if cancelled; True if it was cancelled."""
        return self.cancelled.wait(max(0.0, seconds))


class _Request:
    __slots__ = ("id", "method", "params", "ctx", "answered", "received")

    def __init__(self, req_id, method, params, ctx):
        self.id = req_id
        self.method = method
        self.params = params
        self.ctx = ctx
        self.answered = False
        self.received = time.monotonic()


class _Call:
    __slots__ = ("done", "result", "error", "on_done")

    def __init__(self, on_done=None):
        self.done = threading.Event()
        self.result = None
        self.error = None
        self.on_done = on_done


class Host:
    """The host, as seen from a handler: the callbacks of docs/protocol.md §7 and §8. Each call
    blocks the calling thread (the SDK keeps reading and serving meanwhile) and returns the
    result, or raises :class:`RpcError` (the host's error, ``deadline_exceeded`` past the
    timeout, ``extension_exited`` when the session ends). Usable from any thread, also after
    the handler answered (a thread it started)."""

    def __init__(self, server, ctx=None):
        self._server = server
        self._ctx = ctx

    def call(self, method: str, params: Any = None, timeout: Optional[float] = None) -> Any:
        """Any callback by name. ``timeout`` in seconds; default: the request's deadline."""
        if timeout is None and self._ctx is not None:
            timeout = self._ctx.remaining()
        return self._server.call(method, {} if params is None else params, timeout)

    def event(self, event_id: int, **kw) -> Event:
        return self.call("state.event", {"event_id": event_id}, **kw)

    def events(self, source: Optional[str] = None, after_id: Optional[int] = None,
               limit: Optional[int] = None, **kw) -> Dict[str, List[Event]]:
        p = {}
        if source is not None:
            p["source"] = source
        if after_id is not None:
            p["after_id"] = after_id
        if limit is not None:
            p["limit"] = limit
        return self.call("state.events", p, **kw)

    def work(self, work_id: int, **kw) -> Dict[str, Any]:
        return self.call("state.work", {"work_id": work_id}, **kw)

    def emit(self, emission: str, payload: Any, work_id: Optional[int] = None, **kw) -> Dict[str, Any]:
        p = {"emission": emission}
        if work_id is not None:
            p["work_id"] = work_id
        p["payload"] = payload
        return self.call("operation.emit", p, **kw)

    def push(self, source: str, delivery_id: str, kind: str, payload: Any, **kw) -> Dict[str, Any]:
        return self.call("ingress.push", {"source": source, "delivery_id": delivery_id,
                                          "kind": kind, "payload": payload}, **kw)

    def artifact(self, name: str, media_type: Optional[str] = None, size: Optional[int] = None,
                 chunk_bytes: int = DEFAULT_ARTIFACT_CHUNK_BYTES, verify: bool = False,
                 json_chunks: bool = False, **kw) -> "ArtifactWriter":
        """Open an artifact stream; write to it, then ``finish()`` it (or use ``with``: leaving
        the block by an exception aborts the stream).

        The host computes the SHA-256 of what it received and ``finish()`` returns it. With
        ``verify=True`` the writer also hashes the bytes as they are written and sends that
        digest at close, and the host refuses the stream (``artifact_invalid``, keeping
        nothing) unless what it received matches: end-to-end verification, for one SHA-256
        pass here. ``json_chunks=True`` sends base64 chunks even where the host offers the
        bulk pipe (docs/protocol.md §8.1)."""
        p = {"name": name}
        if media_type is not None:
            p["media_type"] = media_type
        if size is not None:
            p["size"] = size
        if self._server.bulk_fd is not None and not json_chunks:
            p["bulk"] = True
        opened = self.call("artifact.open", p, **kw)
        return ArtifactWriter(self, name, opened, chunk_bytes, kw.get("timeout"), verify,
                              bulk=not json_chunks)

    def store_artifact(self, name: str, data: bytes, media_type: Optional[str] = None,
                       verify: bool = False, sha256: Optional[str] = None,
                       json_chunks: bool = False, **kw) -> Dict[str, Any]:
        """Store ``data`` as one artifact: open (with its size), chunks, close; returns
        ``{artifact_id, size, sha256}`` with the digest the host computed. ``verify`` as for
        :meth:`artifact`; ``sha256``: the digest already known, sent for the host to check."""
        w = self.artifact(name, media_type=media_type, size=len(data), verify=verify,
                          json_chunks=json_chunks, **kw)
        with w:
            w.write(data)
            return w.finish(sha256=sha256)


class ArtifactWriter:
    """An open artifact stream (docs/protocol.md §8). Chunks are at most the host's
    ``max_chunk_bytes`` (64 KiB by default), sent in ``seq`` order and pipelined: at most the
    host's ``window`` are unanswered at once. The size is counted on the way; the SHA-256 is
    the host's (it answers it at close), and is computed here too only when verifying end to
    end or when the host needs it (an older host, whose open answer lacks ``sha256_optional``).
    ``finish()`` waits for every ack, then closes. One writer thread at a time.

    When the host offered the bulk pipe and granted it (``bulk_tag``, §8.1), the bytes go there
    instead, as frames of up to 256 KiB written whole under one lock, with no acks."""

    def __init__(self, host, name, opened, chunk_bytes, timeout, verify=False, bulk=True):
        self._host = host
        self._server = host._server
        self.name = name
        self.stream_id = opened.get("stream_id") if isinstance(opened, dict) else None
        max_chunk = opened.get("max_chunk_bytes") if isinstance(opened, dict) else None
        window = opened.get("window") if isinstance(opened, dict) else None
        if not isinstance(self.stream_id, str) or not is_int(max_chunk) or max_chunk < 1 \
                or not is_int(window) or window < 1:
            raise RpcError.internal("artifact `%s`: unusable artifact.open answer %r" % (name, opened))
        self.max_chunk_bytes = min(max_chunk, MAX_ARTIFACT_CHUNK_BYTES)
        self.chunk_bytes = max(1, min(chunk_bytes, self.max_chunk_bytes))
        self.window = min(window, MAX_CONCURRENT_REQUESTS)
        self._timeout = timeout
        self._buf = bytearray()
        self._seq = 0
        self.size = 0
        hashing = verify or opened.get("sha256_optional") is not True
        self._sha = hashlib.sha256() if hashing else None
        self._cond = threading.Condition()
        self._in_flight = 0
        self._failure = None
        self._state = "open"
        tag = opened.get("bulk_tag")
        self._tag = tag if bulk and self._server.bulk_fd is not None and is_int(tag) \
            and 0 <= tag < 2 ** 32 else None
        if self._tag is not None:
            self.chunk_bytes = BULK_FRAME_BYTES

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._state not in ("done", "aborted"):
            self.abort()
        return False

    def _acked(self, call):
        with self._cond:
            self._in_flight -= 1
            if call.error is not None and self._failure is None:
                self._failure = call.error
            self._cond.notify_all()

    def _wait(self, below):
        end = None if self._timeout is None else time.monotonic() + self._timeout
        with self._cond:
            while self._in_flight > below and self._failure is None:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    raise RpcError(ErrorCode.DEADLINE_EXCEEDED,
                                   "artifact `%s`: no chunk ack in time" % self.name)
                self._cond.wait(left)
            if self._failure is not None:
                self._state = "failed"
                raise self._failure

    def _send_chunk(self, data):
        self._wait(self.window - 1)
        with self._cond:
            self._in_flight += 1
        seq = self._seq
        self._seq += 1
        self._server.call_async("artifact.chunk", {
            "stream_id": self.stream_id, "seq": seq,
            "data": base64.b64encode(bytes(data)).decode("ascii")}, self._acked)

    @property
    def is_bulk(self) -> bool:
        """Whether the bytes go on the host's bulk pipe rather than as chunks."""
        return self._tag is not None

    @property
    def is_hashing(self) -> bool:
        """Whether the bytes are hashed here, to be sent at close (``verify=True``, or a host
        that needs the digest)."""
        return self._sha is not None

    def _send_frame(self, data):
        frame = memoryview(struct.pack("<II", self._tag, len(data)) + bytes(data))
        try:
            with self._server.bulk_lock:
                while frame:
                    frame = frame[os.write(self._server.bulk_fd, frame):]
        except OSError as e:
            raise RpcError.internal("artifact `%s`: cannot write to the bulk pipe: %s" % (self.name, e))

    def _send(self, data):
        if self._tag is not None:
            self._send_frame(data)
        else:
            self._send_chunk(data)

    def write(self, data: bytes) -> None:
        if self._state != "open":
            raise RpcError.internal("artifact `%s`: the stream is %s" % (self.name, self._state))
        data = memoryview(bytes(data))
        if self._sha is not None:
            self._sha.update(data)
        self.size += len(data)
        self._buf += data
        try:
            while len(self._buf) >= self.chunk_bytes:
                chunk = self._buf[:self.chunk_bytes]
                del self._buf[:self.chunk_bytes]
                self._send(chunk)
        except BaseException:
            self.abort()
            raise

    def finish(self, sha256: Optional[str] = None) -> Dict[str, Any]:
        """Send what is buffered, wait for every ack, close; returns ``{artifact_id, size,
        sha256}``, ``sha256`` being the digest the host computed of what it stored.

        ``sha256``: the content's digest if already known (a file hashed earlier); it is sent
        and the host refuses the stream (``artifact_invalid``, keeping nothing) unless the bytes
        it received have it. A writer that hashed the bytes itself refuses a ``sha256`` that is
        not its own before closing."""
        if self._state != "open":
            raise RpcError.internal("artifact `%s`: the stream is %s" % (self.name, self._state))
        try:
            if self._buf:
                self._send(self._buf)
                self._buf = bytearray()
            self._wait(0)
            own = self._sha.hexdigest() if self._sha is not None else None
            if own is not None and sha256 is not None and own != sha256.lower():
                raise RpcError.internal(
                    "artifact `%s`: the %d bytes written have sha256 %s, not the %s given to finish; "
                    "the stream was aborted" % (self.name, self.size, own, sha256))
            sent = sha256 if sha256 is not None else own
            close = {"stream_id": self.stream_id, "size": self.size}
            if sent is not None:
                close["sha256"] = sent
            self._state = "closing"
            stored = self._host.call("artifact.close", close, timeout=self._timeout)
        except BaseException:
            self.abort()
            raise
        self._state = "done"
        if isinstance(stored, dict) and not isinstance(stored.get("sha256"), str):
            aid = stored.get("artifact_id")
            if isinstance(aid, str) and aid.startswith("sha256:"):  # an older host's answer
                stored["sha256"] = aid[len("sha256:"):]
        if sent is not None and isinstance(stored, dict) \
                and str(stored.get("sha256", "")).lower() != sent.lower():
            raise RpcError.internal("artifact `%s`: the host accepted sha256 %s but answered %r"
                                    % (self.name, sent, stored))
        return stored

    def abort(self) -> None:
        """Discard the stream (best effort; nothing waits for the host's answer)."""
        if self._state in ("done", "aborted"):
            return
        self._state = "aborted"
        try:
            self._server.call_async("artifact.abort", {"stream_id": self.stream_id}, None)
        except RpcError:
            pass


# ---------------------------------------------------------------------------------------------
# The extension: what it serves.

_IN_TX = {
    "work_kind.trigger": ("kind", "work_kinds"),
    "recurrence.next": ("recurrence", "recurrences"),
    "dependency.filter": ("filter", "dependency_filters"),
    "emit.commit": ("emission", "emissions"),
    "ingress.poll": ("source", "ingress"),
}
_CALLBACKS = {"state.event", "state.events", "state.work", "operation.emit", "ingress.push",
              "artifact.open", "artifact.chunk", "artifact.close", "artifact.abort"}
_RESERVED = set(_IN_TX) | _CALLBACKS | {"initialize", "shutdown"}
_TOP_MEMBERS = frozenset(("jsonrpc", "id", "method", "params", "result", "error"))


class Extension:
    """An extension: a name, a version and its handlers. Register handlers with the decorators
    below, then call :meth:`run`. What is registered is what the handshake declares, so the
    manifest's ``[capabilities]`` must list the same names (``check.sleep`` is always
    declared: list it in ``methods``)."""

    def __init__(self, name: str, version: str, protocol_versions: Optional[List[int]] = None):
        self.name = name
        self.version = version
        self.protocol_versions = sorted(protocol_versions or PROTOCOL_VERSIONS, reverse=True)
        self.log = logging.getLogger(name)
        self._handlers = {key: {} for _, key in _IN_TX.values()}
        self._triggers = {}
        self._methods = {}

    # -- registration ---------------------------------------------------------------------------

    def _add(self, table, name, fn):
        if not isinstance(name, str) or not name:
            raise ValueError("a name must be a non-empty string")
        if name in table:
            raise ValueError("`%s` is registered twice" % name)
        table[name] = fn
        return fn

    def work_kind(self, name: str, trigger: bool = True) -> Callable[[F], F]:
        """``work_kind.trigger`` for kind ``name``: ``fn(ctx, TriggerParams) -> TriggerResult``.
        With ``trigger=False`` the kind is declared without a trigger (the decorated function is
        never called; pass ``None`` to :meth:`declare_work_kind` instead)."""
        def deco(fn):
            self._triggers[name] = trigger
            return self._add(self._handlers["work_kinds"], name, fn)
        return deco

    def declare_work_kind(self, name: str) -> None:
        """Declare a work kind without a trigger (the host routes its events itself)."""
        self._triggers[name] = False
        self._add(self._handlers["work_kinds"], name, None)

    def recurrence(self, name: str) -> Callable[[F], F]:
        """``recurrence.next``: ``fn(ctx, RecurrenceParams) -> RecurrenceResult``."""
        return lambda fn: self._add(self._handlers["recurrences"], name, fn)

    def dependency_filter(self, name: str) -> Callable[[F], F]:
        """``dependency.filter``: ``fn(ctx, FilterParams) -> FilterResult``."""
        return lambda fn: self._add(self._handlers["dependency_filters"], name, fn)

    def emission(self, name: str) -> Callable[[F], F]:
        """``emit.commit``: ``fn(ctx, CommitParams) -> CommitResult`` (same records for the
        same ``commit_id``)."""
        return lambda fn: self._add(self._handlers["emissions"], name, fn)

    def ingress(self, name: str) -> Callable[[F], F]:
        """``ingress.poll``: ``fn(ctx, IngressPollParams) -> IngressPollResult``."""
        return lambda fn: self._add(self._handlers["ingress"], name, fn)

    def declare_ingress(self, name: str) -> None:
        """Declare a push-only ingress source: its polls are answered ``{"events": []}``."""
        self._add(self._handlers["ingress"], name, lambda ctx, p: {"events": []})

    def method(self, name: str) -> Callable[[F], F]:
        """A custom method: ``fn(ctx, params) -> result`` (params: the request's object)."""
        if name.startswith("$/") or name in _RESERVED or name == "check.sleep":
            raise ValueError("`%s` cannot be a custom method (docs/protocol.md §6.8)" % name)
        return lambda fn: self._add(self._methods, name, fn)

    def capabilities(self) -> Dict[str, Any]:
        """The handshake's capabilities, from what is registered."""
        caps = {}
        kinds = [{"name": k, "trigger": self._triggers[k]} for k in self._handlers["work_kinds"]]
        if kinds:
            caps["work_kinds"] = kinds
        for _, key in list(_IN_TX.values())[1:]:
            if self._handlers[key]:
                caps[key] = list(self._handlers[key])
        caps["methods"] = list(self._methods) + ["check.sleep"]
        return caps

    def serves(self, method: str) -> bool:
        if method in ("shutdown", "check.sleep") or method in self._methods:
            return True
        if method in _IN_TX:
            return bool(self._handlers[_IN_TX[method][1]])
        return False

    def run(self) -> None:
        """Serve this process's stdin/stdout until ``shutdown`` or stdin EOF, then exit 0.

        Points fd 1 (and ``sys.stdout``) at stderr and fd 0 at /dev/null first, keeping
        duplicates of both for the protocol, so nothing else can read or write the streams."""
        level = os.environ.get("CONDUIT_LOG", "info").split(",")[0].strip().upper() or "INFO"
        logging.basicConfig(stream=sys.stderr, level=getattr(logging, level, logging.INFO),
                            format="%(name)s: %(levelname)s %(message)s")
        proto_out = os.fdopen(os.dup(1), "wb", buffering=1 << 16)
        proto_in = os.fdopen(os.dup(0), "rb", buffering=1 << 16)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        sys.stdin = open(os.devnull)
        _Server(self, proto_in, proto_out).run()
        _exit(0)


# ---------------------------------------------------------------------------------------------
# The session.


def _take_bulk(offer):
    """The descriptor of the host's bulk pipe (docs/protocol.md §8.1), moved to a copy that
    programs the extension runs do not inherit; None without a usable offer."""
    fd = offer.get("fd") if isinstance(offer, dict) else None
    if not is_int(fd) or fd < 3:
        return None
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return None
        copy = os.dup(fd)  # not inheritable
        os.close(fd)
        return copy
    except OSError:
        return None


class _Server:
    def __init__(self, ext, stdin, stdout):
        self.ext = ext
        self.stdin = stdin
        self.writer = _Writer(stdout, lambda: _exit(0))
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.running = {}  # id -> _Request: received, not yet answered
        self.unfinished = 0
        self.initialized = False
        self.init_params = {}
        #: The bulk pipe's descriptor, when the host offered one (docs/protocol.md §8.1).
        self.bulk_fd = None
        self.bulk_lock = threading.Lock()
        self.shutting_down = False
        self.shutting_down_event = threading.Event()
        self.shutdown_thread = None
        self.shutdown_grace_ms = DEFAULT_SHUTDOWN_GRACE_MS
        self.calls = {}  # our id -> _Call
        self.next_id = 1
        self.call_slots = threading.BoundedSemaphore(MAX_CONCURRENT_REQUESTS)

    # -- answering ------------------------------------------------------------------------------

    def send_error(self, req_id, code, message, data=None):
        err = {"code": code, "message": message}
        if data is not None:
            err["data"] = data
        self.writer.send({"jsonrpc": "2.0", "id": req_id, "error": err}, wait_room=False)

    def finish(self, req, result=None, error=None, final=False, wait_room=True):
        """Answer ``req`` once. ``wait_room=False`` (the reader thread's answers) queues the
        answer even past the queue's byte bound, so the reader never waits on a host that is
        not reading its answers."""
        with self.lock:
            if req.answered:
                return False
            req.answered = True
        msg = {"jsonrpc": "2.0", "id": req.id}
        if error is not None:
            msg["error"] = error
        else:
            msg["result"] = result
        try:
            try:
                self.writer.send(msg, final=final, wait_room=wait_room)
            except (TypeError, ValueError) as exc:  # the result is not JSON
                self.writer.send({"jsonrpc": "2.0", "id": req.id, "error": {
                    "code": ErrorCode.INTERNAL_ERROR,
                    "message": "`%s` returned a result that is not JSON: %s" % (req.method, exc)}},
                    final=final, wait_room=wait_room)
        finally:
            # It stops counting once its answer is on its way (§9, §10).
            with self.lock:
                if self.running.get(req.id) is req:
                    del self.running[req.id]
                self.unfinished -= 1
                self.changed.notify_all()
        return True

    def cancel(self, req):
        req.ctx.cancelled.set()
        self.finish(req, error={"code": ErrorCode.CANCELLED, "message": "the request was cancelled"},
                    wait_room=False)

    # -- reading --------------------------------------------------------------------------------

    def run(self):
        limit = MAX_MESSAGE_BYTES + 2
        while True:
            try:
                line = self.stdin.readline(limit)
            except (OSError, ValueError):
                line = b""
            if not line:
                return self.on_eof()
            if not line.endswith(b"\n"):
                if len(line) < limit:
                    log.warning("discarding %d bytes cut off by the end of stdin", len(line))
                    return self.on_eof()
                head, total, eof = line[:ID_SCAN_BYTES], len(line), False
                del line
                while True:
                    chunk = self.stdin.readline(_DISCARD_CHUNK)
                    if not chunk:
                        eof = True
                        break
                    total += len(chunk)
                    if chunk.endswith(b"\n"):
                        total -= 2 if chunk.endswith(b"\r\n") else 1
                        break
                self.on_oversized(head, total)
                if eof:
                    return self.on_eof()
                continue
            body = line[:-1]
            if body.endswith(b"\r"):
                body = body[:-1]
            if not body:
                continue
            if len(body) > MAX_MESSAGE_BYTES:
                self.on_oversized(body[:ID_SCAN_BYTES], len(body))
                continue
            self.on_line(body)

    def on_oversized(self, head, size):
        req_id, readable, has_method = scan_head(head)
        data = {"limit": MAX_MESSAGE_BYTES, "size": size}
        if readable and has_method:
            log.warning("request %r is %d bytes, over the cap: answering message_too_large", req_id, size)
            self.send_error(req_id, ErrorCode.MESSAGE_TOO_LARGE,
                            "the request was %d bytes, over the %d-byte limit, and was discarded"
                            % (size, MAX_MESSAGE_BYTES), data)
        elif readable:
            self.complete(req_id, None, RpcError(ErrorCode.MESSAGE_TOO_LARGE,
                                                 "the answer was %d bytes, over the limit" % size, data))
        else:
            log.warning("discarded an oversized message (%d bytes) without a readable id", size)

    def on_line(self, body):
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            return self.send_error(None, ErrorCode.PARSE_ERROR, "parse error: not UTF-8 (%s)" % exc.reason)
        try:
            msg = parse_json(text)
        except (ValueError, RecursionError) as exc:
            return self.send_error(None, ErrorCode.PARSE_ERROR, "parse error: %s" % exc)
        if isinstance(msg, list):
            return self.send_error(None, ErrorCode.INVALID_REQUEST, "invalid request: batches are not supported")
        if not isinstance(msg, dict):
            return self.send_error(None, ErrorCode.INVALID_REQUEST, "invalid request: a message must be a JSON object")
        has_id = "id" in msg
        raw_id = msg.get("id")
        id_ok = has_id and is_valid_id(raw_id)
        dups = getattr(msg, "dups", frozenset()) & _TOP_MEMBERS
        if "method" not in msg:
            return self.on_response(msg, raw_id, id_ok, dups)
        problem = None
        if dups:
            problem = "repeated member(s) %s" % ", ".join(sorted(dups))
        elif msg.get("jsonrpc") != "2.0":
            problem = 'jsonrpc must be "2.0"'
        elif has_id and raw_id is None:
            problem = "a request id must not be null"
        elif has_id and not id_ok:
            problem = "an id must be a string or an integer in signed 64 bits (not -0, 1.0 or 1e2)"
        elif "result" in msg or "error" in msg:
            problem = "a request must not carry result or error"
        elif not isinstance(msg["method"], str):
            problem = "method must be a string"
        if problem is not None:
            return self.send_error(raw_id if id_ok else None, ErrorCode.INVALID_REQUEST,
                                   "invalid request: " + problem)
        if not has_id:
            return self.on_notification(msg["method"], msg.get("params"))
        self.on_request(raw_id, msg["method"], "params" in msg, msg.get("params"))

    def on_response(self, msg, raw_id, id_ok, dups):
        if raw_id is None and "error" in msg:
            log.warning("the host reported an error about an unreadable message: %r", msg.get("error"))
            return
        if not id_ok:
            log.warning("ignoring a response with an invalid id: %r", raw_id)
            return
        ok_shape = (not dups and msg.get("jsonrpc") == "2.0"
                    and (("result" in msg) != ("error" in msg)))
        err = msg.get("error")
        if ok_shape and "error" in msg:
            ok_shape = (isinstance(err, dict) and is_int(err.get("code"))
                        and isinstance(err.get("message"), str))
        if not ok_shape:
            log.warning("a broken response for id %r: %.200s", raw_id, msg)
            return self.complete(raw_id, None, RpcError(ErrorCode.INVALID_REQUEST,
                                                        "the host's answer was not a valid response"))
        if "error" in msg:
            return self.complete(raw_id, None, RpcError(err["code"], err["message"], err.get("data")))
        self.complete(raw_id, msg["result"], None)

    def on_notification(self, method, params):
        if not self.initialized or method != "$/cancel":
            return  # ignored before the handshake; unknown notifications are ignored
        if not isinstance(params, dict) or not is_valid_id(params.get("id")):
            log.warning("ignoring $/cancel with unusable params: %.200r", params)
            return
        with self.lock:
            req = self.running.get(params["id"])
        if req is None or req.method == "shutdown":
            return  # answered already, unknown, or shutdown (a stop is never revoked)
        log.info("cancelling request %r (%s)", req.id, req.method)
        self.cancel(req)

    def on_request(self, req_id, method, has_params, params):
        # The order of docs/protocol.md §3.4.
        with self.lock:
            if req_id in self.running:
                busy = "dup"
            elif self.unfinished >= MAX_CONCURRENT_REQUESTS:
                busy = "full"
            else:
                busy = None
        if busy == "dup":
            return self.send_error(req_id, ErrorCode.INVALID_REQUEST,
                                   "invalid request: id %s is already in use by a running request"
                                   % json.dumps(req_id))
        if busy == "full":
            return self.send_error(req_id, ErrorCode.OVERLOADED,
                                   "already serving %d requests; retry after one finishes"
                                   % MAX_CONCURRENT_REQUESTS, {"limit": MAX_CONCURRENT_REQUESTS})
        if not self.initialized:
            if method != "initialize":
                return self.send_error(req_id, ErrorCode.NOT_INITIALIZED,
                                       "`%s` before initialize: the handshake comes first" % method)
            return self.on_initialize(req_id, has_params, params)
        if method == "initialize":
            return self.send_error(req_id, ErrorCode.INVALID_REQUEST,
                                   "invalid request: initialize was already done")
        if self.shutting_down:
            return self.send_error(req_id, ErrorCode.SHUTTING_DOWN, "shutting down; no new requests")
        if not self.ext.serves(method):
            return self.send_error(req_id, ErrorCode.METHOD_NOT_FOUND, "method `%s` is not served" % method)
        deadline = None
        if method != "shutdown":
            if not has_params:
                params = {}
            if not isinstance(params, dict):
                return self.send_error(req_id, ErrorCode.INVALID_PARAMS,
                                       "`%s`: params must be an object" % method)
            if "_meta" in params:
                params = dict(params)
                meta = params.pop("_meta")
                ms = meta.get("remaining_ms") if isinstance(meta, dict) else None
                if is_int(ms):
                    deadline = time.monotonic() + max(ms, 0) / 1000.0
            problem = self.check_params(method, params)
            if problem is not None:
                return self.send_error(req_id, ErrorCode.INVALID_PARAMS, "`%s`: %s" % (method, problem))
        req = _Request(req_id, method, params, Ctx(self, req_id, method, deadline))
        with self.lock:
            self.running[req_id] = req
            self.unfinished += 1
        if method == "shutdown":
            self.shutting_down = True
            self.shutting_down_event.set()
            self.shutdown_thread = threading.Thread(target=self.do_shutdown, args=(req,),
                                                    name="conduit-shutdown", daemon=True)
            self.shutdown_thread.start()
            return
        threading.Thread(target=self.serve, args=(req,), name="req-%s" % (req_id,), daemon=True).start()

    def check_params(self, method, params):
        if method == "check.sleep":
            ms = params.get("ms")
            if not is_int(ms) or ms < 0:
                return 'needs {"ms": integer >= 0}, got %.100s' % json.dumps(params.get("ms"))
            return None
        if method in _IN_TX:
            field, key = _IN_TX[method]
            name = params.get(field)
            if not isinstance(name, str):
                return "`%s` must be a string" % field
            if name not in self.ext._handlers[key]:
                return "`%s` %s is not declared" % (field, json.dumps(name))
            if method == "work_kind.trigger":
                if not self.ext._triggers.get(name):
                    return "work kind %s is not declared with trigger = true" % json.dumps(name)
                if not isinstance(params.get("inputs"), list):
                    return "`inputs` must be an array of events"
        return None

    # -- the handshake --------------------------------------------------------------------------

    def on_initialize(self, req_id, has_params, params):
        if not has_params:
            params = {}
        if not isinstance(params, dict):
            return self.send_error(req_id, ErrorCode.INVALID_PARAMS, "initialize: params must be an object")
        versions = params.get("protocol_versions")
        if not isinstance(versions, list) or not all(is_int(v) and 0 <= v < 2 ** 32 for v in versions):
            return self.send_error(req_id, ErrorCode.INVALID_PARAMS,
                                   "initialize: `protocol_versions` must be an array of integers")
        host = params.get("host")
        if not isinstance(host, dict) or not isinstance(host.get("name"), str) \
                or not isinstance(host.get("version"), str):
            return self.send_error(req_id, ErrorCode.INVALID_PARAMS,
                                   "initialize: `host` must be {name: string, version: string}")
        common = [v for v in self.ext.protocol_versions if v in versions]
        if not common:
            return self.send_error(
                req_id, ErrorCode.VERSION_MISMATCH,
                "no protocol version in common: the host speaks %s, the extension %s"
                % (json.dumps(versions), json.dumps(self.ext.protocol_versions)),
                {"host_versions": versions, "extension_versions": self.ext.protocol_versions})
        deadlines = params.get("deadlines")
        if isinstance(deadlines, dict) and is_int(deadlines.get("shutdown_grace_ms")) \
                and deadlines["shutdown_grace_ms"] > 0:
            self.shutdown_grace_ms = deadlines["shutdown_grace_ms"]
        self.init_params.update(params)
        self.bulk_fd = _take_bulk(params.get("bulk"))
        self.writer.send({"jsonrpc": "2.0", "id": req_id, "result": {
            "protocol_version": max(common),
            "extension": {"name": self.ext.name, "version": self.ext.version},
            "capabilities": self.ext.capabilities()}}, wait_room=False)
        self.initialized = True
        log.info("initialized: protocol %d, host %s %s", max(common), host["name"], host["version"])

    # -- serving --------------------------------------------------------------------------------

    def serve(self, req):
        try:
            result = self.dispatch(req)
        except RpcError as exc:
            self.finish(req, error=exc.to_dict())
            return
        except Exception as exc:  # a handler bug: internal_error, never a dead session
            self.ext.log.exception("the handler of `%s` failed", req.method)
            self.finish(req, error={"code": ErrorCode.INTERNAL_ERROR,
                                    "message": "the handler of `%s` failed: %s: %s"
                                               % (req.method, type(exc).__name__, exc)})
            return
        if not req.ctx.cancelled.is_set():
            self.finish(req, result=result)

    def dispatch(self, req):
        if req.method == "check.sleep":
            return self.sleep(req)
        if req.method in _IN_TX:
            field, key = _IN_TX[req.method]
            fn = self.ext._handlers[key][req.params[field]]
        else:
            fn = self.ext._methods[req.method]
        return fn(req.ctx, req.params)

    @staticmethod
    def sleep(req):
        ms = req.params["ms"]
        start = time.monotonic()
        end = start + ms / 1000.0
        while True:
            left = end - time.monotonic()
            if left <= 0 or req.ctx.cancelled.wait(min(left, 3600.0)):
                break
        # The time actually held, in whole milliseconds rounded down (never below `ms` when
        # the hold ran its course).
        return {"slept_ms": int((time.monotonic() - start) * 1000)}

    # -- callbacks ------------------------------------------------------------------------------

    def call_async(self, method, params, on_done):
        """Send a callback; ``on_done(call)`` runs on the reader thread when it completes."""
        if not self.initialized:
            raise RpcError(ErrorCode.NOT_INITIALIZED, "callbacks start after the handshake")
        call = _Call(on_done)
        with self.lock:
            req_id = self.next_id
            self.next_id += 1
            self.calls[req_id] = call
        try:
            self.writer.send({"jsonrpc": "2.0", "id": req_id, "method": method, "params": params})
        except BaseException:
            with self.lock:
                self.calls.pop(req_id, None)
            raise
        return req_id, call

    def call(self, method, params, timeout):
        if timeout is not None and timeout <= 0:
            raise RpcError(ErrorCode.DEADLINE_EXCEEDED, "`%s`: the deadline has passed" % method)
        start = time.monotonic()
        if not self.call_slots.acquire(timeout=-1 if timeout is None else timeout):
            raise RpcError(ErrorCode.DEADLINE_EXCEEDED, "`%s`: no call slot in time" % method)
        try:
            left = None if timeout is None else max(0.0, timeout - (time.monotonic() - start))
            req_id, call = self.call_async(method, params, None)
            if not call.done.wait(left):
                with self.lock:
                    self.calls.pop(req_id, None)
                self.writer.send({"jsonrpc": "2.0", "method": "$/cancel", "params": {"id": req_id}},
                                 wait_room=False)
                raise RpcError(ErrorCode.DEADLINE_EXCEEDED,
                               "`%s`: no answer within %.3f s" % (method, timeout))
        finally:
            self.call_slots.release()
        if call.error is not None:
            raise call.error
        return call.result

    def complete(self, req_id, result, error):
        with self.lock:
            call = self.calls.pop(req_id, None)
        if call is None:
            log.warning("ignoring a response for id %r: no call of ours is pending", req_id)
            return
        call.result, call.error = result, error
        call.done.set()
        if call.on_done is not None:
            try:
                call.on_done(call)
            except Exception:
                log.exception("a callback completion failed")

    # -- stopping -------------------------------------------------------------------------------

    def do_shutdown(self, req):
        """§5: new requests are refused (already set); running ones get up to half of
        ``shutdown_grace_ms`` (``check.sleep`` is cancelled at once), the rest are cancelled;
        then ``{}`` is the last answer and the process exits 0."""
        started = time.monotonic()
        wait_s = self.shutdown_grace_ms / 1000.0 / 2
        with self.lock:
            others = [r for r in self.running.values() if r is not req]
        for r in others:
            if r.method == "check.sleep":
                self.cancel(r)
        with self.lock:
            while self.unfinished > 1 and time.monotonic() - started < wait_s:
                self.changed.wait(0.05)
            others = [r for r in self.running.values() if r is not req]
        for r in others:
            self.cancel(r)
        self.finish(req, result={}, final=True)
        self.writer.drain(1.0)
        log.info("shutdown answered; exiting")
        _exit(0)

    def on_eof(self):
        """stdin EOF: exit 0 promptly, abandoning what runs and every pending callback (§5)."""
        if self.shutdown_thread is not None:
            self.shutdown_thread.join(timeout=self.shutdown_grace_ms / 1000.0)
        log.info("stdin closed; exiting")
        self.writer.drain(0.5)
        _exit(0)
