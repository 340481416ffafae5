"""An extension on the SDK for the SDK's own tests: one handler per feature under test."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from conduit_extension import Extension, RpcError  # noqa: E402

ext = Extension("sample", "0.2.0")


@ext.work_kind("job")
def trigger(ctx, p):
    return {"groups": [{"key": "k:%d" % e["id"], "event_ids": [e["id"]]} for e in p["inputs"]]}


ext.declare_work_kind("plain")
ext.declare_ingress("feed")


@ext.method("echo")
def echo(ctx, params):
    return params


@ext.method("boom")
def boom(ctx, params):
    raise KeyError("no such thing")


@ext.method("refuse")
def refuse(ctx, params):
    raise RpcError(-32010, "nothing here", {"what": params.get("what")})


@ext.method("deadline")
def deadline(ctx, params):
    return {"params": params, "remaining": ctx.remaining(), "has_deadline": ctx.deadline is not None}


@ext.method("stray-print")
def stray_print(ctx, params):
    print("this must not reach the protocol stream")
    os.write(1, b"nor this\n")
    return {}


@ext.method("callbacks")
def callbacks(ctx, params):
    out = {"event": ctx.host.event(41), "events": ctx.host.events(source="feed", limit=2)}
    out["push"] = ctx.host.push("feed", "d-1", "job.run", {"n": 1})
    out["emit"] = ctx.host.emit("note", {"x": 1}, work_id=5)
    try:
        ctx.host.work(999)
    except RpcError as exc:
        out["work_error"] = exc.code
    return out


@ext.method("slow-callback")
def slow_callback(ctx, params):
    try:
        ctx.host.call("state.event", {"event_id": 1}, timeout=params["timeout"])
    except RpcError as exc:
        return {"code": exc.code}
    return {"code": 0}


@ext.method("artifact")
def artifact(ctx, params):
    data = bytes(range(256)) * (params["size"] // 256) + b"x" * (params["size"] % 256)
    w = ctx.host.artifact("out.bin", media_type="application/octet-stream",
                          chunk_bytes=params.get("chunk", 65536), verify=params.get("verify", False))
    with w:
        for i in range(0, len(data), 1000):
            w.write(data[i:i + 1000])
        return dict(w.finish(sha256=params.get("sha256")), hashing=w.is_hashing)


@ext.method("wait-cancel")
def wait_cancel(ctx, params):
    ctx.cancelled.wait(30)
    with open(params["marker"], "w") as f:
        f.write("cancelled" if ctx.is_cancelled() else "timeout")
    return {}


@ext.method("finish-on-shutdown")
def finish_on_shutdown(ctx, params):
    ctx.shutting_down.wait(30)
    time.sleep(0.1)
    return {"finished": True}


if __name__ == "__main__":
    ext.run()
