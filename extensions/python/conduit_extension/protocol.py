"""What the protocol fixes, as this SDK needs it: the version and the limits (docs/protocol.md
§1.1, §12), the error codes and :class:`RpcError`, and the method table's rows the SDK routes by.

It holds values only: nothing here reads, writes or serves. Every other module of the package
imports from it and it imports none of them, so a limit or a method name has this one home
(the SDK's tests check the tables against extensions/methods.json).
"""

from typing import Any, Dict

__all__ = [
    "PROTOCOL_VERSIONS", "MAX_MESSAGE_BYTES", "MAX_CONCURRENT_REQUESTS", "MAX_ARTIFACT_CHUNK_BYTES",
    "DEFAULT_ARTIFACT_CHUNK_BYTES", "BULK_FRAME_BYTES", "ARTIFACT_WINDOW",
    "DEFAULT_SHUTDOWN_GRACE_MS", "ID_SCAN_BYTES", "ErrorCode", "RpcError",
]

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


# The method table's rows this SDK needs (extensions/methods.json is the table; the SDK's tests
# fail while these differ from it). Host calls served by the handler registered under the name
# in one of their params: method -> (that params member, the capability list declaring it).
# Four of them are in-transaction calls; ingress.poll is not (docs/protocol.md §6.5).
_BY_NAME = {
    "work_kind.trigger": ("kind", "work_kinds"),
    "recurrence.next": ("recurrence", "recurrences"),
    "dependency.filter": ("filter", "dependency_filters"),
    "emit.commit": ("emission", "emissions"),
    "ingress.poll": ("source", "ingress"),
}
# The callbacks an extension makes (docs/protocol.md §7).
_CALLBACKS = {"state.event", "state.events", "state.work", "operation.emit", "ingress.push",
              "artifact.open", "artifact.chunk", "artifact.close", "artifact.abort"}
# Names a custom method may not take ($/... aside): every method of the table but check.sleep.
_RESERVED = set(_BY_NAME) | _CALLBACKS | {"initialize", "shutdown"}
