"""The extension as its author writes it: :class:`Extension`, its handlers registered by name,
the capabilities the handshake declares, and :meth:`Extension.run`.

It serves nothing itself: ``run`` hands the process's streams to the session. Invariant: what is
registered is exactly what the handshake declares, and a custom method never takes a name the
protocol reserves.
"""

import logging
import os
import sys
from typing import Any, Callable, Dict, List, Optional

from .context import F
from .protocol import _BY_NAME, _RESERVED, PROTOCOL_VERSIONS
from .session import _Server
from .wire import _exit

__all__ = ["Extension"]

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
        self._handlers = {key: {} for _, key in _BY_NAME.values()}
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
        for _, key in list(_BY_NAME.values())[1:]:
            if self._handlers[key]:
                caps[key] = list(self._handlers[key])
        caps["methods"] = list(self._methods) + ["check.sleep"]
        return caps

    def serves(self, method: str) -> bool:
        if method in ("shutdown", "check.sleep") or method in self._methods:
            return True
        if method in _BY_NAME:
            return bool(self._handlers[_BY_NAME[method][1]])
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
