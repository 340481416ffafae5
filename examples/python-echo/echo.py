#!/usr/bin/env python3
"""python-echo: a conduit extension written from docs/protocol.md alone.

Standard library only. It serves two request methods:

- ``echo``: params ``{"text": string}``; the result is the params object as received.
- ``check.sleep``: params ``{"ms": integer}``; holds the request for ``ms`` milliseconds (or until
  it is cancelled) and answers ``{"slept_ms": integer}``. Declared so that ``conduit ext check``
  can test cancellation and the 64-request limit.

Structure: the main thread is the only reader of stdin (bounded line reads, §2); it validates each
line (§3.2), answers what it can at once (errors, ``initialize``, ``overloaded``), and starts one
thread per served request (§10). Every write to stdout goes through one lock and is flushed
(§2). Diagnostics go to stderr only.
"""

import json
import logging
import os
import sys
import threading
import time

# ---------------------------------------------------------------------------------------------
# Protocol constants (docs/protocol.md §1.1 and §12).

PROTOCOL_VERSIONS = [1]  # the versions this extension speaks, newest first
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MAX_CONCURRENT_REQUESTS = 64
DEFAULT_SHUTDOWN_GRACE_MS = 5000
ID_SCAN_BYTES = 4096
DISCARD_CHUNK_BYTES = 64 * 1024
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
OVERLOADED = -32000
CANCELLED = -32001
VERSION_MISMATCH = -32003
MESSAGE_TOO_LARGE = -32004
NOT_INITIALIZED = -32007
SHUTTING_DOWN = -32008

EXTENSION_NAME = "python-echo"
EXTENSION_VERSION = "0.1.0"
METHODS = ["echo", "check.sleep"]

log = logging.getLogger(EXTENSION_NAME)


# ---------------------------------------------------------------------------------------------
# Small helpers.


class _NegativeZero(int):
    """The integer `-0` as written, which is not a valid id (§3.3)."""


class _Members(dict):
    """A JSON object that remembers the member names it repeated (§3.3)."""

    repeated = frozenset()


def _members(pairs):
    obj = _Members(pairs)
    if len(obj) != len(pairs):
        names = [k for k, _ in pairs]
        obj.repeated = frozenset(k for k in names if names.count(k) > 1)
    return obj


def _parse_int(text):
    return _NegativeZero(0) if text == "-0" else int(text)


def is_int(value):
    """A JSON integer within signed 64 bits (bool and `-0` are not integers here)."""
    return type(value) is int and INT64_MIN <= value <= INT64_MAX


def is_valid_id(value):
    return isinstance(value, str) or is_int(value)


def _reject_constant(name):
    # Python's json accepts NaN/Infinity/-Infinity, which are not JSON.
    raise ValueError("invalid JSON literal " + name)


def parse_json(text):
    return json.loads(text, parse_constant=_reject_constant, parse_int=_parse_int,
                      object_pairs_hook=_members)


def error_object(code, message, data=None):
    err = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return err


class HandlerError(Exception):
    """Raised by a handler to answer with a protocol error."""

    def __init__(self, code, message, data=None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


# ---------------------------------------------------------------------------------------------
# Id scan of an oversized message (§2 "Size cap"): read the top-level "id" and whether a
# top-level "method" appears, within the first 4,096 bytes only, tracking strings and nesting.

_WS = b" \t\r\n"
_SCALAR_END = b",}] \t\r\n"


def _scan_string(buf, i):
    """buf[i] is '"'; return the index after the closing quote, or None if cut off."""
    n = len(buf)
    i += 1
    while i < n:
        c = buf[i]
        if c == 0x5C:  # backslash: skip the escaped byte
            i += 2
            continue
        if c == 0x22:
            return i + 1
        i += 1
    return None


def _skip_value(buf, i):
    """Return the index just after the JSON value starting at buf[i], or None if cut off."""
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
    if j >= n:
        return None  # a number or literal running to the end may be cut off
    return j


def scan_envelope(buf):
    """Return (id, has_id, has_method) from the head of a message.

    ``has_id`` is true only when a top-level "id" with a valid value (integer or string) was read
    completely within ``buf``.
    """
    n = len(buf)

    def skip_ws(k):
        while k < n and buf[k] in _WS:
            k += 1
        return k

    found_id = None
    has_id = False
    has_method = False
    i = skip_ws(0)
    if i >= n or buf[i] != 0x7B:  # '{'
        return None, False, False
    i += 1
    seen_id_key = False
    while True:
        i = skip_ws(i)
        if i >= n or buf[i] != 0x22:
            break
        j = _scan_string(buf, i)
        if j is None:
            break
        try:
            key = parse_json(buf[i:j].decode("utf-8"))
        except ValueError:
            break
        i = skip_ws(j)
        if i >= n or buf[i] != 0x3A:  # ':'
            break
        i = skip_ws(i + 1)
        if i >= n:
            break
        if key == "method":
            has_method = True
        end = _skip_value(buf, i)
        if end is None:
            break
        if key == "id" and not seen_id_key:
            seen_id_key = True
            try:
                value = parse_json(buf[i:end].decode("utf-8"))
            except ValueError:
                value = None
            if is_valid_id(value):
                found_id, has_id = value, True
        i = skip_ws(end)
        if i < n and buf[i] == 0x2C:  # ','
            i += 1
            continue
        break
    return found_id, has_id, has_method


# ---------------------------------------------------------------------------------------------
# Output: one compact JSON object per line, serialized under a lock, flushed per message.


class Writer:
    def __init__(self, stream):
        self._stream = stream
        self._lock = threading.Lock()
        self._closed = False

    @staticmethod
    def encode(msg):
        try:
            text = json.dumps(msg, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            return text.encode("utf-8")
        except UnicodeEncodeError:
            # Lone surrogates cannot be UTF-8; escape everything instead.
            text = json.dumps(msg, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
            return text.encode("ascii")

    def send(self, msg, final=False):
        """Write one message. ``final`` closes the writer afterwards (nothing more is written)."""
        data = self.encode(msg)
        if len(data) > MAX_MESSAGE_BYTES:
            if "id" in msg and ("result" in msg or "error" in msg):
                log.warning("answer to id %r is %d bytes, over the cap: answering message_too_large",
                            msg["id"], len(data))
                data = self.encode({
                    "jsonrpc": "2.0",
                    "id": msg["id"],
                    "error": error_object(MESSAGE_TOO_LARGE,
                                          "the answer would be %d bytes, over the %d-byte limit"
                                          % (len(data), MAX_MESSAGE_BYTES)),
                })
            else:
                log.error("refusing to send a %d-byte message", len(data))
                return
        with self._lock:
            if self._closed:
                return
            try:
                self._stream.write(data + b"\n")
                self._stream.flush()
            except (BrokenPipeError, OSError) as exc:
                # The host closed our stdout: it is gone or stopping us.
                log.info("stdout closed (%s); exiting", exc)
                self._closed = True
                exit_now(0)
            if final:
                self._closed = True

    def close(self, timeout):
        """Stop writing. Waits at most ``timeout`` s for a write in progress."""
        if self._lock.acquire(timeout=timeout):
            self._closed = True
            self._lock.release()
            return True
        return False


def exit_now(code):
    try:
        sys.stderr.flush()
    except Exception:
        pass
    os._exit(code)


# ---------------------------------------------------------------------------------------------
# Requests in progress.


class Request:
    __slots__ = ("id", "method", "params", "cancel", "answered", "received")

    def __init__(self, req_id, method, params):
        self.received = time.monotonic()
        self.id = req_id
        self.method = method
        self.params = params
        self.cancel = threading.Event()
        self.answered = False


class Server:
    def __init__(self, stdin, writer):
        self.stdin = stdin
        self.writer = writer
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.pending = {}  # id -> Request: received, not yet claimed for answering
        self.unfinished = 0  # requests received and not yet answered (the §10 count)
        self.initialized = False
        self.shutting_down = False
        self.shutdown_thread = None
        self.shutdown_grace_ms = DEFAULT_SHUTDOWN_GRACE_MS

    # -- output ---------------------------------------------------------------------------------

    def send_result(self, req_id, result):
        self.writer.send({"jsonrpc": "2.0", "id": req_id, "result": result})

    def send_error(self, req_id, code, message, data=None):
        self.writer.send({"jsonrpc": "2.0", "id": req_id, "error": error_object(code, message, data)})

    def finish(self, req, result=None, error=None, final=False):
        """Answer a registered request exactly once. Returns False if it was already answered."""
        with self.lock:
            if req.answered:
                return False
            req.answered = True
            if self.pending.get(req.id) is req:
                del self.pending[req.id]
        if error is not None:
            msg = {"jsonrpc": "2.0", "id": req.id, "error": error}
        else:
            msg = {"jsonrpc": "2.0", "id": req.id, "result": result}
        try:
            self.writer.send(msg, final=final)
        finally:
            # It stops counting toward the limit once its answer is sent (§9, §10).
            with self.lock:
                self.unfinished -= 1
                self.changed.notify_all()
        return True

    def cancel(self, req):
        req.cancel.set()
        self.finish(req, error=error_object(CANCELLED, "the request was cancelled"))

    # -- input ----------------------------------------------------------------------------------

    def run(self):
        limit = MAX_MESSAGE_BYTES + 2  # content + "\r\n"
        while True:
            line = self.stdin.readline(limit)
            if not line:
                self.on_eof()
                return
            if not line.endswith(b"\n"):
                if len(line) < limit:
                    # A line cut off by end of stream: never parsed.
                    log.warning("discarding %d bytes after the last newline at end of stream", len(line))
                    self.on_eof()
                    return
                # Past the cap without a newline: oversized. Keep only the head for the id scan.
                head = line[:ID_SCAN_BYTES]
                total = len(line)
                del line
                eof = False
                while True:
                    chunk = self.stdin.readline(DISCARD_CHUNK_BYTES)
                    if not chunk:
                        eof = True
                        break
                    total += len(chunk)
                    if chunk.endswith(b"\n"):
                        break
                self.on_oversized(head, total)
                if eof:
                    self.on_eof()
                    return
                continue
            body = line[:-1]
            if body.endswith(b"\r"):
                body = body[:-1]
            if not body:
                continue  # empty line
            if len(body) > MAX_MESSAGE_BYTES:
                self.on_oversized(body[:ID_SCAN_BYTES], len(body))
                continue
            self.on_line(body)

    def on_oversized(self, head, size):
        req_id, has_id, has_method = scan_envelope(head)
        if has_id and has_method:
            log.warning("request id %r is over the size limit (%d+ bytes): answering message_too_large",
                        req_id, size)
            self.send_error(req_id, MESSAGE_TOO_LARGE,
                            "message over the %d-byte limit was discarded" % MAX_MESSAGE_BYTES)
        elif has_id:
            # A response: this extension makes no calls of its own, so no call can fail.
            log.warning("discarded an oversized response for id %r (no such pending call)", req_id)
        else:
            log.warning("discarded an oversized message (%d+ bytes) with no readable id", size)

    def on_line(self, body):
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.send_error(None, PARSE_ERROR, "parse error: not UTF-8 (%s)" % exc.reason)
            return
        try:
            msg = parse_json(text)
        except ValueError as exc:
            self.send_error(None, PARSE_ERROR, "parse error: %s" % exc)
            return
        if isinstance(msg, list):
            self.send_error(None, INVALID_REQUEST, "batches are not supported")
            return
        if not isinstance(msg, dict):
            self.send_error(None, INVALID_REQUEST, "a message must be a JSON object")
            return

        has_method = "method" in msg
        has_id = "id" in msg
        raw_id = msg.get("id")
        id_ok = has_id and is_valid_id(raw_id)
        readable_id = raw_id if id_ok else None

        if not has_method:
            # A response, an error, or a broken response: never answered (§3.2).
            if "error" in msg and raw_id is None:
                log.warning("peer reported an error about an unreadable message: %r", msg.get("error"))
            else:
                log.warning("ignoring a response for id %r: no call of ours is pending", raw_id)
            return

        problem = None
        if msg.get("jsonrpc") != "2.0":
            problem = 'jsonrpc must be "2.0"'
        elif has_id and raw_id is None:
            problem = "a request id must not be null"
        elif has_id and not id_ok:
            problem = "an id must be an integer (signed 64-bit) or a string"
        elif "result" in msg or "error" in msg:
            problem = "a request must not have result or error"
        elif msg.repeated & {"jsonrpc", "id", "method", "params", "result", "error"}:
            problem = "a top-level member is repeated"
        elif not isinstance(msg["method"], str):
            problem = "method must be a string"
        if problem is not None:
            self.send_error(readable_id, INVALID_REQUEST, "invalid request: " + problem)
            return

        method = msg["method"]
        params = msg.get("params")
        if not has_id:
            self.on_notification(method, params)
        else:
            self.on_request(raw_id, method, params)

    def on_notification(self, method, params):
        if not self.initialized:
            return  # ignored before the handshake (§4)
        if method == "$/cancel":
            if not isinstance(params, dict) or not is_valid_id(params.get("id")):
                log.warning("ignoring $/cancel with unusable params: %r", params)
                return
            with self.lock:
                req = self.pending.get(params["id"])
            if req is not None:
                log.info("cancelling request %r (%s)", req.id, req.method)
                self.cancel(req)
            return
        # Unknown notifications are ignored (§9).

    def on_request(self, req_id, method, params):
        with self.lock:
            duplicate = req_id in self.pending
        if duplicate:
            self.send_error(req_id, INVALID_REQUEST,
                            "invalid request: id %r is already in use by an unanswered request" % (req_id,))
            return
        if not self.initialized and method != "initialize":
            self.send_error(req_id, NOT_INITIALIZED, "`%s` before initialize" % method)
            return
        if self.shutting_down:
            self.send_error(req_id, SHUTTING_DOWN, "shutting down; no new requests")
            return
        with self.lock:
            if self.unfinished >= MAX_CONCURRENT_REQUESTS:
                overloaded = True
            else:
                overloaded = False
        if overloaded:
            self.send_error(req_id, OVERLOADED,
                            "already serving %d requests; retry after one finishes" % MAX_CONCURRENT_REQUESTS,
                            {"limit": MAX_CONCURRENT_REQUESTS})
            return

        if method == "initialize":
            self.on_initialize(req_id, params)
            return
        if method not in METHODS and method != "shutdown":
            self.send_error(req_id, METHOD_NOT_FOUND, "method `%s` is not served" % method)
            return
        if params is None:
            params = {}  # absent params read as {} (§3.1)
        if not isinstance(params, dict):
            self.send_error(req_id, INVALID_PARAMS, "params must be an object")
            return
        # `_meta` (the host's remaining time, §11) is the protocol's, not a param: never echoed.
        params.pop("_meta", None)

        req = Request(req_id, method, params)
        with self.lock:
            self.pending[req_id] = req
            self.unfinished += 1
        if method == "shutdown":
            self.shutting_down = True
            self.shutdown_thread = threading.Thread(target=self.do_shutdown, args=(req,),
                                                    name="shutdown", daemon=True)
            self.shutdown_thread.start()
            return
        threading.Thread(target=self.serve, args=(req,), name="req-%s" % (req_id,), daemon=True).start()

    # -- handshake ------------------------------------------------------------------------------

    def on_initialize(self, req_id, params):
        if self.initialized:
            self.send_error(req_id, INVALID_REQUEST, "invalid request: initialize was already done")
            return
        if params is None:
            params = {}
        if not isinstance(params, dict):
            self.send_error(req_id, INVALID_PARAMS, "params must be an object")
            return
        host_versions = params.get("protocol_versions")
        if not isinstance(host_versions, list) or not all(is_int(v) for v in host_versions):
            self.send_error(req_id, INVALID_PARAMS, "protocol_versions must be an array of integers")
            return
        common = [v for v in PROTOCOL_VERSIONS if v in host_versions]
        if not common:
            self.send_error(
                req_id, VERSION_MISMATCH,
                "no protocol version in common: the host speaks %s, the extension %s"
                % (json.dumps(host_versions), json.dumps(PROTOCOL_VERSIONS)),
                {"host_versions": host_versions, "extension_versions": PROTOCOL_VERSIONS},
            )
            return
        deadlines = params.get("deadlines")
        if isinstance(deadlines, dict) and is_int(deadlines.get("shutdown_grace_ms")) \
                and deadlines["shutdown_grace_ms"] > 0:
            self.shutdown_grace_ms = deadlines["shutdown_grace_ms"]
        host = params.get("host") if isinstance(params.get("host"), dict) else {}
        version = max(common)
        self.send_result(req_id, {
            "protocol_version": version,
            "extension": {"name": EXTENSION_NAME, "version": EXTENSION_VERSION},
            "capabilities": {"methods": list(METHODS)},
        })
        self.initialized = True
        log.info("initialized: protocol %d, host %s %s", version, host.get("name"), host.get("version"))

    # -- handlers -------------------------------------------------------------------------------

    def serve(self, req):
        try:
            if req.method == "echo":
                result = self.handle_echo(req)
            elif req.method == "check.sleep":
                result = self.handle_sleep(req)
            else:  # not reachable: dispatch checks the method first
                raise HandlerError(METHOD_NOT_FOUND, "method `%s` is not served" % req.method)
        except HandlerError as exc:
            self.finish(req, error=error_object(exc.code, exc.message, exc.data))
            return
        except Exception as exc:  # a handler bug is internal_error, never a dead session
            log.exception("handler for %s failed", req.method)
            self.finish(req, error=error_object(INTERNAL_ERROR, "handler failed: %s" % exc))
            return
        if req.cancel.is_set():
            return  # already answered `cancelled`; the result is discarded
        self.finish(req, result=result)

    @staticmethod
    def handle_echo(req):
        text = req.params.get("text")
        if not isinstance(text, str):
            raise HandlerError(INVALID_PARAMS, "echo needs params {\"text\": string}")
        return req.params

    @staticmethod
    def handle_sleep(req):
        ms = req.params.get("ms")
        if not is_int(ms) or ms < 0:
            raise HandlerError(INVALID_PARAMS, "check.sleep needs params {\"ms\": integer >= 0}")
        start = time.monotonic()
        end = start + ms / 1000.0
        while True:
            left = end - time.monotonic()
            if left <= 0:
                break
            if req.cancel.wait(min(left, threading.TIMEOUT_MAX, 3600.0)):
                break
        return {"slept_ms": int(round((time.monotonic() - start) * 1000))}

    # -- stopping -------------------------------------------------------------------------------

    def do_shutdown(self, req):
        """§5: refuse new requests (already set), finish or cancel the others, answer, exit 0."""
        started = time.monotonic()
        wait_s = min(self.shutdown_grace_ms / 1000.0 / 2, 2.0)
        # A hold that would outlast the wait is cancelled at once; the rest get a bounded time
        # to finish on their own.
        with self.lock:
            others = [r for r in self.pending.values() if r is not req]
        for r in others:
            if r.method == "check.sleep":
                ms = r.params.get("ms")
                if not is_int(ms) or r.received + ms / 1000.0 > started + wait_s:
                    self.cancel(r)
        with self.lock:
            while self.unfinished > 1 and time.monotonic() - started < wait_s:
                self.changed.wait(0.05)
            others = [r for r in self.pending.values() if r is not req]
        for r in others:
            self.cancel(r)
        # Wait (briefly) until every other answer is on the wire, so ours is the last message.
        with self.lock:
            while self.unfinished > 1 and time.monotonic() - started < wait_s + 0.5:
                self.changed.wait(0.05)
        self.finish(req, result={}, final=True)
        log.info("shutdown answered; exiting")
        exit_now(0)

    def on_eof(self):
        """stdin EOF means shutdown: exit 0 promptly, abandoning whatever is in progress (§5)."""
        if self.shutdown_thread is not None:
            self.shutdown_thread.join(timeout=2.0)
        log.info("stdin closed; exiting")
        self.writer.close(timeout=1.0)
        exit_now(0)


def main():
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(name)s: %(levelname)s %(message)s")
    # Keep the real stdout for protocol only; anything else that prints (a stray print, a
    # library) lands on stderr instead of corrupting the stream.
    proto_out = os.fdopen(os.dup(1), "wb", buffering=1 << 16)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    stdin = os.fdopen(os.dup(0), "rb", buffering=1 << 16)
    server = Server(stdin, Writer(proto_out))
    log.info("started (pid %d)", os.getpid())
    server.run()
    exit_now(0)


if __name__ == "__main__":
    main()
