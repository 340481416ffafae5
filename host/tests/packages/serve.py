#!/usr/bin/env python3
"""A conduit extension for the tests of `conduit ext check`, in the Python 3 standard library.

Every fixture folder under host/tests/packages/ holds an identical copy of this file (a test
keeps them identical), so each folder is a self-contained package. Its manifest's command
picks a behaviour with flags; without flags it follows docs/protocol.md and passes every rule:

  --name NAME           the name it gives in the handshake
  --versions 2[,3]      the protocol versions it speaks (default 1)
  --banner              prints a banner line on stdout before serving (breaks stdout-only-protocol)
  --ignore-cancel       ignores $/cancel (breaks cancellation)
  --no-overload-limit   serves any number of requests at once (breaks overload)
  --grandchild FILE     starts a long `sleep` and writes its pid to FILE (shows the group is killed)
  --lax-json            parses as Python's json does by default: NaN, a byte-order mark (breaks not-json)
  --serve-batches       answers a batch with parse_error instead of invalid_request (breaks batch)
  --lax-ids             reads the id `-0` as 0 and answers with it (breaks request-ids)
  --keep-last-member    keeps the last of repeated top-level members (breaks repeated-members)
  --method-with-result  serves a request that also has `result` or `error` (breaks method-with-result)
  --strict-members      refuses unknown top-level members with invalid_request (breaks unknown-members)
  --params-first        checks params before the method (breaks refusal-order)
  --no-duplicate-check  serves a request whose id is running (breaks duplicate-id)
  --no-handshake-gate   serves requests before `initialize` (breaks not-initialized)
  --serve-after-shutdown
                        answers `shutdown` late and serves requests meanwhile (breaks shutting-down)
  --eof-exit-code N     exits with code N at stdin EOF (breaks stdin-eof when N is not 0)
  --overload-without-limit
                        refuses the 65th request with -32000 but no data.limit (breaks overload)
  --overload-first      looks at the limit before the ids in use (breaks overload: an id in use
                        must win over overloaded, docs/protocol.md §3.4)
  --artifact-sha256 none|wrong
                        also declares and serves `make-artifact`, which streams a 23,000-byte
                        artifact to the host as chunks, then closes it without a sha256 (`none`:
                        the host computes it, passes) or with the sha256 of other bytes (`wrong`:
                        refused, breaks declared-methods-answer), and answers {"closed": ...}

Invariant: stdout carries only protocol messages (but for --banner); logs go to stderr.
"""

import argparse
import base64
import hashlib
import json
import os
import subprocess
import sys
import threading

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
HEAD_BYTES = 4096
LIMIT = 64
TOP_LEVEL = ("jsonrpc", "id", "method", "params", "result", "error")
SERVED = ("echo", "check.sleep", "make-artifact", "work_kind.trigger", "recurrence.next", "dependency.filter",
          "emit.commit", "ingress.poll", "shutdown", "initialize")

# What it serves; each fixture's conduit-extension.toml declares the same.
CAPABILITIES = {
    "work_kinds": [{"name": "note", "trigger": True}],
    "recurrences": ["digest"],
    "dependency_filters": ["note-closed"],
    "emissions": ["note-summary"],
    "ingress": ["inbox"],
    "methods": ["echo", "check.sleep"],
}

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
OVERLOADED = -32000
CANCELLED = -32001
VERSION_MISMATCH = -32003
MESSAGE_TOO_LARGE = -32004
NOT_INITIALIZED = -32007
SHUTTING_DOWN = -32008


def log(*parts):
    print("fixture:", *parts, file=sys.stderr, flush=True)


class RpcError(Exception):
    def __init__(self, code, message, data=None):
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


class NegZero(int):
    """The integer `-0` as written: not a valid id (docs/protocol.md §3.3)."""


class Members(dict):
    """A JSON object that remembers which of its member names were repeated."""
    repeated = ()


def members(pairs):
    obj = Members(pairs)
    names = [k for k, _ in pairs]
    if len(names) != len(obj):
        obj.repeated = {k for k in names if names.count(k) > 1}
    return obj


def refuse_constant(name):
    raise ValueError(f"{name} is not JSON")


def parse_int(text):
    return NegZero(0) if text == "-0" else int(text)


def valid_id(v):
    """A string, or an integer within signed 64 bits written without fraction, exponent or `-0`."""
    return isinstance(v, str) or (type(v) is int and -(1 << 63) <= v < (1 << 63))


def peek_id(head):
    """The top-level "id" of a cut-off message, and whether it has a "method"."""
    text = head.decode("utf-8", "replace")
    dec = json.JSONDecoder()
    i, n = 0, len(text)

    def ws(i):
        while i < n and text[i] in " \t\r\n":
            i += 1
        return i

    found, has_method = None, False
    i = ws(i)
    if i >= n or text[i] != "{":
        return None, False
    i += 1
    while True:
        try:
            i = ws(i)
            key, i = dec.raw_decode(text, i)
            i = ws(i)
            if i >= n or text[i] != ":":
                break
            value, i = dec.raw_decode(text, ws(i + 1))
        except ValueError:
            break  # the head ends inside this member
        if key == "id" and (isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))):
            found = value
        elif key == "method":
            has_method = True
        i = ws(i)
        if i < n and text[i] == ",":
            i += 1
            continue
        break
    return found, has_method


class Server:
    def __init__(self, args):
        self.args = args
        self.out = sys.stdout.buffer
        self.write_lock = threading.Lock()
        self.lock = threading.Lock()
        self.running = {}  # json.dumps(id) -> threading.Event set on cancel
        self.initialized = False
        self.shutting_down = False
        self.calls = {}  # json.dumps(id) of a callback -> [threading.Event set on its answer, answer]
        self.next_call = 0
        self.capabilities = dict(CAPABILITIES)
        if args.artifact_sha256:
            self.capabilities["methods"] = CAPABILITIES["methods"] + ["make-artifact"]

    # ---- writing ------------------------------------------------------------------------

    def send(self, msg):
        line = json.dumps(msg, separators=(",", ":")).encode() + b"\n"
        with self.write_lock:
            self.out.write(line)
            self.out.flush()

    def answer(self, id, result=None, error=None):
        if error is None:
            self.send({"jsonrpc": "2.0", "id": id, "result": result})
        else:
            err = {"code": error.code, "message": error.message}
            if error.data is not None:
                err["data"] = error.data
            self.send({"jsonrpc": "2.0", "id": id, "error": err})

    # ---- reading ------------------------------------------------------------------------

    def run(self):
        stdin = sys.stdin.buffer
        while True:
            line = stdin.readline(MAX_MESSAGE_BYTES + 2)
            if not line:
                break
            if not line.endswith(b"\n"):
                if len(line) < MAX_MESSAGE_BYTES + 2:
                    log("stdin ended in the middle of a line; dropped it")
                    break
                # Over the cap: discard up to the next newline without keeping it.
                head, size = line[:HEAD_BYTES], len(line)
                while True:
                    chunk = stdin.readline(1 << 16)
                    size += len(chunk)
                    if not chunk or chunk.endswith(b"\n"):
                        break
                self.on_oversized(head, size)
                continue
            body = line[:-1]
            if body.endswith(b"\r"):
                body = body[:-1]
            if not body:
                continue
            if len(body) > MAX_MESSAGE_BYTES:
                self.on_oversized(body[:HEAD_BYTES], len(body))
                continue
            self.on_line(body)
        # stdin EOF means the same as shutdown: exit 0 promptly, abandoning running requests.
        self.exit(self.args.eof_exit_code)

    def exit(self, code=0):
        with self.write_lock:
            self.out.flush()
            os._exit(code)

    def on_oversized(self, head, size):
        log(f"discarded a message of {size} bytes, over the cap")
        id, has_method = peek_id(head)
        if id is not None and has_method:
            self.answer(id, error=RpcError(
                MESSAGE_TOO_LARGE,
                f"the request was {size} bytes, over the {MAX_MESSAGE_BYTES}-byte cap",
                {"limit": MAX_MESSAGE_BYTES, "size": size}))

    def on_line(self, body):
        a = self.args
        try:
            if a.lax_json:  # a byte-order mark is skipped, NaN accepted
                msg = json.loads(body.decode("utf-8-sig"), parse_int=parse_int, object_pairs_hook=members)
            else:
                msg = json.loads(body.decode("utf-8"), parse_constant=refuse_constant,
                                 parse_int=parse_int, object_pairs_hook=members)
        except ValueError as e:  # includes invalid UTF-8 and a byte-order mark
            self.answer(None, error=RpcError(PARSE_ERROR, f"parse error: {e}"))
            return
        if not isinstance(msg, dict):
            if isinstance(msg, list) and a.serve_batches:
                self.answer(None, error=RpcError(PARSE_ERROR, "batches are not read"))
                return
            why = "batches are not supported" if isinstance(msg, list) else "a message is a JSON object"
            self.answer(None, error=RpcError(INVALID_REQUEST, why))
            return
        raw_id = msg.get("id")
        if a.lax_ids and isinstance(raw_id, NegZero):
            raw_id = 0
        id_ok = valid_id(raw_id)
        method = msg.get("method")
        if method is None:  # an answer to one of our callbacks, or else nothing to act on
            with self.lock:
                slot = self.calls.pop(json.dumps(raw_id), None)
            if slot is not None:
                slot[1] = msg
                slot[0].set()
            return
        repeated = [k for k in getattr(msg, "repeated", ()) if k in TOP_LEVEL]
        unknown = [k for k in msg if k not in TOP_LEVEL]
        if (msg.get("jsonrpc") != "2.0" or not isinstance(method, str)
                or (repeated and not a.keep_last_member)
                or (("result" in msg or "error" in msg) and not a.method_with_result)
                or (unknown and a.strict_members)):
            self.answer(raw_id if id_ok else None, error=RpcError(INVALID_REQUEST, "not a JSON-RPC 2.0 request"))
            return
        params = msg["params"] if "params" in msg else {}  # absent reads as {}; null does not
        if "id" not in msg:
            self.on_notification(method, params)
            return
        if not id_ok:
            self.answer(None, error=RpcError(INVALID_REQUEST, "`id` must be an integer or a string"))
            return
        if a.params_first and not isinstance(params, dict):
            self.answer(raw_id, error=RpcError(INVALID_PARAMS, "params must be an object"))
            return
        self.on_request(raw_id, method, params)

    def on_notification(self, method, params):
        if method != "$/cancel" or self.args.ignore_cancel or not isinstance(params, dict):
            return
        id = params.get("id")
        with self.lock:
            cancel = self.running.pop(json.dumps(id), None)
        if cancel is not None:
            cancel.set()
            self.answer(id, error=RpcError(CANCELLED, "the request was cancelled"))

    def on_request(self, id, method, params):
        """Refuses in the order of docs/protocol.md §3.4, then serves."""
        a = self.args
        key = json.dumps(id)
        with self.lock:
            if a.overload_first and len(self.running) >= LIMIT:
                refusal = RpcError(OVERLOADED, f"already serving {LIMIT} requests; retry after one finishes",
                                   {"limit": LIMIT})
            elif key in self.running and not a.no_duplicate_check:
                refusal = RpcError(INVALID_REQUEST, f"id {key} is in use by a running request")
            elif len(self.running) >= LIMIT and not a.no_overload_limit:
                refusal = RpcError(OVERLOADED, f"already serving {LIMIT} requests; retry after one finishes",
                                   None if a.overload_without_limit else {"limit": LIMIT})
            elif (not self.initialized and method != "initialize"
                  and not (a.no_handshake_gate and method != "shutdown")):
                refusal = RpcError(NOT_INITIALIZED, "the handshake has not finished")
            elif self.initialized and method == "initialize":
                refusal = RpcError(INVALID_REQUEST, "initialize was already answered")
            elif self.shutting_down:
                refusal = RpcError(SHUTTING_DOWN, "shutting down")
            elif method not in SERVED:
                refusal = RpcError(METHOD_NOT_FOUND, f"method `{method}` is not served here")
            elif method != "shutdown" and not isinstance(params, dict):
                refusal = RpcError(INVALID_PARAMS, "params must be an object")
            else:
                refusal = None
        if refusal is not None:
            self.answer(id, error=refusal)
            return
        if method == "initialize":
            self.initialize(id, params)
            return
        if method == "shutdown":
            self.shutdown(id)
            return
        with self.lock:
            cancel = self.running[key] = threading.Event()
        threading.Thread(target=self.serve, args=(id, key, method, params, cancel), daemon=True).start()

    def serve(self, id, key, method, params, cancel):
        try:
            result, error = self.dispatch(method, params, cancel), None
        except RpcError as e:
            result, error = None, e
        except Exception as e:  # a bug in a handler is an internal error, not a dead reader
            result, error = None, RpcError(-32603, f"{type(e).__name__}: {e}")
        with self.lock:
            still_ours = self.running.pop(key, None) is not None
        if still_ours:  # a cancelled request was answered already
            self.answer(id, result, error)

    # ---- methods ------------------------------------------------------------------------

    def initialize(self, id, params):
        offered = params.get("protocol_versions")
        if not isinstance(offered, list) or not all(isinstance(v, int) for v in offered):
            self.answer(id, error=RpcError(INVALID_PARAMS, "protocol_versions must be a list of integers"))
            return
        common = [v for v in offered if v in self.args.versions]
        if not common:
            self.answer(id, error=RpcError(
                VERSION_MISMATCH,
                f"no protocol version in common: the host speaks {offered}, the extension {self.args.versions}",
                {"host_versions": offered, "extension_versions": self.args.versions}))
            return
        self.initialized = True
        self.answer(id, {
            "protocol_version": max(common),
            "extension": {"name": self.args.name, "version": "0.1.0"},
            "capabilities": self.capabilities,
        })

    def shutdown(self, id):
        if self.args.serve_after_shutdown:
            def late():
                threading.Event().wait(0.5)
                self.answer(id, {})
                self.exit()
            threading.Thread(target=late, daemon=True).start()
            return
        self.shutting_down = True
        with self.lock:
            running, self.running = self.running, {}
        if not self.args.ignore_cancel:
            for key, cancel in running.items():
                cancel.set()
                self.answer(json.loads(key), error=RpcError(CANCELLED, "the extension is shutting down"))
        self.answer(id, {})
        self.exit()

    def call(self, method, params, timeout=10):
        """A callback to the host (its own id space, string ids); its result, or RpcError."""
        with self.lock:
            self.next_call += 1
            cid = f"cb-{self.next_call}"
            slot = self.calls[json.dumps(cid)] = [threading.Event(), None]
        self.send({"jsonrpc": "2.0", "id": cid, "method": method, "params": params})
        if not slot[0].wait(timeout):
            raise RpcError(-32603, f"the host did not answer {method} in {timeout} s")
        answer = slot[1]
        if "error" in answer:
            raise RpcError(answer["error"].get("code"), answer["error"].get("message"))
        return answer.get("result")

    def make_artifact(self):
        data = b"conduit check artifact\n" * 1000
        opened = self.call("artifact.open", {"name": "check.txt", "size": len(data)})
        sid, step = opened["stream_id"], min(opened["max_chunk_bytes"], 8192)
        for seq, at in enumerate(range(0, len(data), step)):  # one at a time: within any window
            self.call("artifact.chunk", {"stream_id": sid, "seq": seq,
                                         "data": base64.b64encode(data[at:at + step]).decode()})
        close = {"stream_id": sid, "size": len(data)}
        if self.args.artifact_sha256 == "wrong":
            close["sha256"] = hashlib.sha256(b"other " + data).hexdigest()
        try:
            return {"closed": self.call("artifact.close", close)}
        except RpcError as e:  # the host says why; the checker reports it
            return {"refused": e.message}

    def dispatch(self, method, params, cancel):
        params = {k: v for k, v in params.items() if k != "_meta"}  # the host's, not a param (§11)
        def declared(field, name):
            names = [k["name"] for k in CAPABILITIES[field]] if field == "work_kinds" else CAPABILITIES[field]
            if name not in names:
                raise RpcError(INVALID_PARAMS, f"{name!r} is not a declared {field} name")

        if method == "make-artifact" and self.args.artifact_sha256:
            return self.make_artifact()
        if method == "echo":
            if not isinstance(params.get("text"), str):
                raise RpcError(INVALID_PARAMS, "echo needs {\"text\": string}")
            return params
        if method == "check.sleep":
            ms = params.get("ms")
            if not isinstance(ms, int) or ms < 0:
                raise RpcError(INVALID_PARAMS, "check.sleep needs {\"ms\": integer}")
            if cancel.wait(ms / 1000):
                raise RpcError(CANCELLED, "the request was cancelled")
            return {"slept_ms": ms}
        if method == "work_kind.trigger":
            declared("work_kinds", params.get("kind"))
            inputs = params.get("inputs") or []
            if not inputs:
                raise RpcError(INVALID_PARAMS, "inputs must not be empty")
            return {"groups": [{"key": "notes", "event_ids": [e["id"] for e in inputs], "start": True}]}
        if method == "recurrence.next":
            declared("recurrences", params.get("recurrence"))
            spec, fired = params.get("spec", ""), params.get("fired_at_ms")
            units = {"s": 1000, "m": 60_000, "h": 3_600_000}
            parts = spec.split()
            if len(parts) != 2 or parts[0] != "every" or parts[1][-1:] not in units or not parts[1][:-1].isdigit():
                raise RpcError(INVALID_PARAMS, f"cannot read the spec {spec!r}; write `every 15m`")
            return {"next_at_ms": fired + int(parts[1][:-1]) * units[parts[1][-1]]}
        if method == "dependency.filter":
            declared("dependency_filters", params.get("filter"))
            payload = (params.get("event") or {}).get("payload") or {}
            return {"satisfied": payload.get("closed") is True}
        if method == "emit.commit":
            declared("emissions", params.get("emission"))
            # Computed from the params alone, so a repeated commit_id gets the same records.
            return {"records": [{"kind": "note-summary",
                                 "body": {"commit_id": params.get("commit_id"), "payload": params.get("payload")}}]}
        if method == "ingress.poll":
            declared("ingress", params.get("source"))
            return {"events": []}
        raise RpcError(METHOD_NOT_FOUND, f"method `{method}` is not served here")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="good")
    parser.add_argument("--versions", default="1", type=lambda s: [int(v) for v in s.split(",")])
    parser.add_argument("--banner", action="store_true")
    parser.add_argument("--ignore-cancel", action="store_true")
    parser.add_argument("--no-overload-limit", action="store_true")
    parser.add_argument("--grandchild", metavar="FILE")
    for flag in ("lax-json", "serve-batches", "lax-ids", "keep-last-member", "method-with-result",
                 "strict-members", "params-first", "no-duplicate-check", "no-handshake-gate",
                 "serve-after-shutdown", "overload-without-limit", "overload-first"):
        parser.add_argument(f"--{flag}", action="store_true")
    parser.add_argument("--eof-exit-code", type=int, default=0)
    parser.add_argument("--artifact-sha256", choices=("none", "wrong"))
    args = parser.parse_args()
    if args.grandchild:
        child = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        with open(args.grandchild, "a") as f:
            f.write(f"{child.pid}\n")
    if args.banner:
        sys.stdout.write(f"{args.name} fixture 0.1.0 starting\n")
        sys.stdout.flush()
    log(f"{args.name}: serving protocol {args.versions}")
    Server(args).run()


if __name__ == "__main__":
    main()
