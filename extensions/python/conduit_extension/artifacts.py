"""Artifact streams (docs/protocol.md §8): :class:`ArtifactWriter`, as JSON chunks under the
host's window or as frames on the host's bulk pipe (§8.1).

It sends through the session (callbacks, the bulk pipe's descriptor and lock) and does not open
streams itself: :meth:`Host.artifact <conduit_extension.Host.artifact>` does. Invariants: chunks
go in ``seq`` order with at most ``window`` unanswered; a bulk frame is written whole under the
session's bulk lock; a stream that fails or is left by an exception is aborted.
"""

import base64
import hashlib
import os
import struct
import threading
import time
from typing import Any, Dict, Optional

from .protocol import (BULK_FRAME_BYTES, MAX_ARTIFACT_CHUNK_BYTES, MAX_CONCURRENT_REQUESTS,
                       ErrorCode, RpcError)
from .wire import is_int

__all__ = ["ArtifactWriter"]

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
