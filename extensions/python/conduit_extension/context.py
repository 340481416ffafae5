"""What a handler gets: its context (:class:`Ctx`: ids, cancellation, the deadline) and the
host as seen from it (:class:`Host`: the callbacks of docs/protocol.md §7 and §8), and the
session's records of a request being served and of a callback awaiting its answer; ``Handler``, the type of a handler.

It does not read or write the stream: a callback goes through the session, which matches the
answer. Invariant: a callback made from a request waits at most until that request's deadline
unless given a timeout of its own.
"""

import threading
import time
from typing import Any, Callable, Dict, List, Optional, TypeVar

from .artifacts import ArtifactWriter
from .messages import Event
from .protocol import DEFAULT_ARTIFACT_CHUNK_BYTES

__all__ = ["Ctx", "Host", "Handler", "F"]

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


Handler = Callable[[Ctx, Any], Any]
F = TypeVar("F", bound=Handler)
