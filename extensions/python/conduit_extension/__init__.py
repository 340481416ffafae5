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

The package's modules, each importing only those listed before it: ``protocol`` (the version,
limits, error codes and method names), ``messages`` (the params and results, for type
checkers), ``wire`` (JSON by the rules of §3.3, the line writer), ``artifacts`` (artifact
streams), ``context`` (``Ctx``, ``Host``), ``session`` (serving one host) and ``extension``
(``Extension``). This file only re-exports: import every name from ``conduit_extension`` itself,
which is the API; which module holds a name is not.
"""

from .protocol import (ARTIFACT_WINDOW, BULK_FRAME_BYTES, DEFAULT_ARTIFACT_CHUNK_BYTES,
                       DEFAULT_SHUTDOWN_GRACE_MS, ID_SCAN_BYTES, MAX_ARTIFACT_CHUNK_BYTES,
                       MAX_CONCURRENT_REQUESTS, MAX_MESSAGE_BYTES, PROTOCOL_VERSIONS, ErrorCode,
                       RpcError)
from .messages import (CommitParams, CommitResult, Event, FilterParams, FilterResult,
                       IngressPollParams, IngressPollResult, RecurrenceParams, RecurrenceResult,
                       TriggerParams, TriggerResult)
from .wire import encode, is_int, is_valid_id, log, parse_json, scan_head
from .artifacts import ArtifactWriter
from .context import F, Ctx, Handler, Host
from .extension import Extension

__all__ = [
    "Extension", "Ctx", "Host", "ArtifactWriter", "RpcError", "ErrorCode",
    "PROTOCOL_VERSIONS", "MAX_MESSAGE_BYTES", "MAX_CONCURRENT_REQUESTS",
]

__version__ = "0.1.0"
