// The extension's end of the host's bulk pipe (docs/protocol.md §8.1): taking the offered
// descriptor, and writing frames to it.
//
// It knows frames, not streams: ArtifactWriter decides what goes in one. Invariant: a frame's
// header and content are queued in one synchronous step, so no other frame comes between them.
import { closeSync, constants as fsConstants, fstatSync, openSync } from "node:fs";
import { Socket } from "node:net";
import { BULK_HEADER_BYTES } from "./protocol.js";

/**
 * The extension's end of the host's bulk pipe (docs/protocol.md §8.1), shared by every artifact
 * stream of the process.
 *
 * It is written through a net.Socket on the descriptor: libuv makes the descriptor non-blocking,
 * writes each queued buffer whole and in order (partial writes and EAGAIN are its business) and
 * waits on the event loop while the pipe is full, which is the flow control. fs.writeSync would
 * stop the event loop, and so every other request, while the host is behind; fs.write on a
 * blocking descriptor would hold a thread of the pool that fs and crypto share.
 *
 * A frame's header and content are queued in one synchronous step, so no other stream's frame
 * can come between them: the socket's queue is the lock. A frame resolves once its bytes are in
 * the pipe, so a caller's buffer is never read after its write resolved.
 */
export class BulkPipe {
  /**
   * The pipe the host offered in `initialize` (`{"fd": 3}`), or null without a usable one:
   * artifacts then go as chunks. The offered descriptor is replaced by one that programs the
   * extension runs do not inherit: Node has no dup, so the pipe is opened again through /dev/fd
   * (Node opens every file close-on-exec) and the offered descriptor is closed.
   */
  static take(offer) {
    const fd = offer !== null && typeof offer === "object" ? offer.fd : undefined;
    if (!Number.isInteger(fd) || fd < 3) return null;
    let copy;
    try {
      if (!fstatSync(fd).isFIFO()) throw new Error("it is not a pipe");
      // O_NONBLOCK: without it, opening a pipe to write waits for a reader; with it, a pipe
      // nobody reads fails here (ENXIO). The socket makes the descriptor non-blocking anyway.
      copy = openSync(`/dev/fd/${fd}`, fsConstants.O_WRONLY | fsConstants.O_NONBLOCK);
      closeSync(fd);
      return new BulkPipe(copy);
    } catch (e) {
      if (copy !== undefined) closeSync(copy);
      console.error(`conduit-extension: cannot use the host's bulk pipe (descriptor ${fd}): ${e.message}; artifacts go as JSON chunks`);
      return null;
    }
  }
  constructor(fd) {
    this._sock = new Socket({ fd, readable: false, writable: true, allowHalfOpen: true });
    this._sock.unref(); // the session's stdin keeps the process alive, not this pipe
    this._failure = null;
    this._sock.on("error", (e) => {
      if (!this._failure) this._failure = e;
    });
  }
  /** Write one frame of `data` (1 to 1,048,576 bytes) for stream `tag`. */
  frame(tag, data) {
    return new Promise((resolve, reject) => {
      if (this._failure) return reject(this._failure);
      const header = Buffer.allocUnsafe(BULK_HEADER_BYTES);
      header.writeUInt32LE(tag, 0);
      header.writeUInt32LE(data.length, 4);
      this._sock.cork(); // header and content in one write
      this._sock.write(header);
      this._sock.write(data, (e) => (e ? reject(this._failure || e) : resolve()));
      this._sock.uncork();
    });
  }
}
