"""The wire: JSON read by the rules of docs/protocol.md §3.3, the head scan of an oversized
line (§2), one compact line per message, and the one writer thread that puts lines on stdout.

It knows messages as JSON values and bytes, not what they mean: the session decides what to
answer. Invariant: only the writer thread writes to the protocol stream, a batch at a time and
flushed, so no caller (the reader above all) ever blocks on a full pipe; a message over the
16 MiB cap is never written (an answer becomes ``message_too_large``).
"""

import json
import logging
import os
import sys
import threading
import time
from typing import Any

from .protocol import _INT64_MAX, _INT64_MIN, _QUEUE_BYTES, MAX_MESSAGE_BYTES, ErrorCode, RpcError

__all__ = ["parse_json", "is_int", "is_valid_id", "encode", "scan_head", "log"]

#: The SDK's own logger (stderr, like every log of an extension).
log = logging.getLogger("conduit_extension")

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
