"""The session: one extension process serving one host over its stdin and stdout, the way
docs/protocol.md says: reading and validating each line (§2, §3), the refusal order (§3.4), the
handshake (§4), dispatch to the registered handlers, ``$/cancel`` (§9), callbacks to the host
and their answers (§7), ``shutdown`` and stdin EOF (§5).

It does not register handlers (the extension does) or frame bytes (the wire does). Invariants:
the reader thread never waits on the host (its answers are queued past the writer's bound);
every request is answered exactly once; at most 64 requests are served and 64 callbacks are
pending at once; handlers run on threads of their own, so a slow one delays no other.
"""

import json
import os
import stat
import threading
import time

from .context import Ctx, _Call, _Request
from .protocol import (_BY_NAME, _DISCARD_CHUNK, DEFAULT_SHUTDOWN_GRACE_MS, ID_SCAN_BYTES,
                       MAX_CONCURRENT_REQUESTS, MAX_MESSAGE_BYTES, ErrorCode, RpcError)
from .wire import _exit, _Writer, is_int, is_valid_id, log, parse_json, scan_head

__all__ = []

_TOP_MEMBERS = frozenset(("jsonrpc", "id", "method", "params", "result", "error"))


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
        if method in _BY_NAME:
            field, key = _BY_NAME[method]
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
        if req.method in _BY_NAME:
            field, key = _BY_NAME[req.method]
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
