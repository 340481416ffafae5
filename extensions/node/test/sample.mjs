// An extension on the SDK for the SDK's own tests: one handler per feature under test.
import { readdirSync, readFileSync, readlinkSync, writeFileSync } from "node:fs";
import { Extension, RpcError } from "../index.js";

const ext = new Extension("sample", "0.2.0");
ext.workKind("job", async (ctx, p) => ({ groups: p.inputs.map((e) => ({ key: `k:${e.id}`, event_ids: [e.id] })) }));
ext.declareWorkKind("plain");
ext.declareIngress("feed");
ext.method("echo", async (ctx, params) => params);
ext.method("id", async (ctx) => ({ type: typeof ctx.id, text: String(ctx.id) }));
ext.method("boom", async () => {
  throw new TypeError("no such thing");
});
ext.method("sync-boom", () => {
  throw "a string";
});
ext.method("refuse", async (ctx, p) => {
  throw new RpcError(-32010, "nothing here", { what: p.what });
});
ext.method("deadline", async (ctx, params) => ({ params, remaining: ctx.remaining(), has_deadline: ctx.deadline !== null }));
ext.method("stray-print", async () => {
  console.log("this must not reach the protocol stream");
  process.stdout.write("nor this\n");
  return {};
});
ext.method("callbacks", async (ctx) => {
  const out = { event: await ctx.host.event(41), events: await ctx.host.events({ source: "feed", limit: 2 }) };
  out.push = await ctx.host.push("feed", "d-1", "job.run", { n: 1 });
  out.emit = await ctx.host.emit("note", { x: 1 }, 5);
  try {
    await ctx.host.work(999);
  } catch (e) {
    out.work_error = e.code;
  }
  return out;
});
ext.method("slow-callback", async (ctx, p) => {
  try {
    await ctx.host.call("state.event", { event_id: 1 }, { timeoutMs: p.timeout });
  } catch (e) {
    return { code: e.code };
  }
  return { code: 0 };
});
ext.method("artifact", async (ctx, p) => {
  const data = Buffer.alloc(p.size);
  for (let i = 0; i < p.size; i++) data[i] = i % 256;
  const w = await ctx.host.artifact("out.bin", { mediaType: "application/octet-stream", chunkBytes: p.chunk, verify: p.verify });
  try {
    for (let i = 0; i < data.length; i += 1000) await w.write(data.subarray(i, i + 1000));
    const stored = await w.finish({ sha256: p.sha256 });
    return p.hashing ? { ...stored, bulk: w.isBulk, hashing: w.isHashing } : { ...stored, bulk: w.isBulk };
  } catch (e) {
    w.abort();
    throw e;
  }
});
// Two streams written at once, in writes of 100,000 bytes: stream `b` holds the bytes of `a`
// plus one.
ext.method("two-artifacts", async (ctx, p) => {
  const [a, b] = await Promise.all(["a.bin", "b.bin"].map((name) => ctx.host.artifact(name)));
  const send = async (w, add) => {
    const piece = Buffer.alloc(100000);
    for (let done = 0; done < p.size; done += piece.length) {
      const n = Math.min(piece.length, p.size - done);
      for (let i = 0; i < n; i++) piece[i] = (done + i + add) % 256;
      await w.write(piece.subarray(0, n)); // the same buffer again: the SDK must not keep it
    }
    return { ...(await w.finish()), bulk: w.isBulk };
  };
  return Promise.all([send(a, 0), send(b, 1)]);
});
// This process's descriptors on the file at `path`, each with its flags from /proc (octal).
ext.method("descriptors-of", async (ctx, p) => {
  const out = [];
  for (const fd of readdirSync("/proc/self/fd")) {
    let target;
    try {
      target = readlinkSync(`/proc/self/fd/${fd}`);
    } catch {
      continue; // the descriptor of the listing itself
    }
    if (target !== p.path) continue;
    const flags = /^flags:\s*([0-7]+)$/m.exec(readFileSync(`/proc/self/fdinfo/${fd}`, "utf8"))[1];
    out.push({ fd: Number(fd), flags });
  }
  return out;
});
ext.method("wait-cancel", async (ctx, p) => {
  const cancelled = await ctx.sleep(30000);
  writeFileSync(p.marker, cancelled ? "cancelled" : "timeout");
  return {};
});
ext.method("finish-on-shutdown", async (ctx) => {
  await new Promise((r) => ctx.shutdownSignal.addEventListener("abort", r));
  await new Promise((r) => setTimeout(r, 100));
  return { finished: true };
});
ext.run();
