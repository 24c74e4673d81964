// Response bodies read, and made, without whole-file copies for the JavaScript engine to
// free late.
//
// eachChunk reads a body (a download, or a file the Cache API stored) chunk by chunk without
// leaving chunk buffers behind. A default reader hands out a fresh buffer for every chunk,
// which the JavaScript engine frees when it collects: reading a 93 MB block left ~190 MB of
// such garbage at times (benchmarks/browser_storage_reads.py). Where the body is a byte
// stream (Chromium's fetch and Cache API bodies are), it is read into one staging buffer
// taken from a small pool (a read transfers the buffer and hands it back), and the chunk is
// copied from there.

const STAGING_BYTES = 1 << 20;
const pool = [];

function takeStaging() {
  return pool.pop() || new ArrayBuffer(STAGING_BYTES);
}

function giveBack(buffer) {
  if (buffer && buffer.byteLength === STAGING_BYTES && pool.length < 4) pool.push(buffer);
}

function byobReader(body) {
  try {
    return body.getReader({ mode: "byob" });
  } catch {
    return null; // not a byte stream: read as it comes
  }
}

// Calls onChunk(view) for each chunk of `body` in order (the view is valid only until
// onChunk returns); onChunk returns false to stop reading (the body is cancelled). Returns
// true where the body was read to its end. Errors of the stream (a connection cut) are
// thrown as they come.
export async function eachChunk(body, onChunk) {
  const byob = byobReader(body);
  if (!byob) {
    const reader = body.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return true;
      if (onChunk(value) === false) {
        reader.cancel().catch(() => {});
        return false;
      }
    }
  }
  let staging = takeStaging();
  try {
    for (;;) {
      const { done, value } = await byob.read(new Uint8Array(staging));
      staging = value ? value.buffer : null; // handed back, transferred
      if (done) return true;
      if (onChunk(value) === false) {
        byob.cancel().catch(() => {});
        return false;
      }
    }
  } finally {
    giveBack(staging);
  }
}

const PIECE_BYTES = 1 << 20;

// A body of `bytes` (an ArrayBuffer or a Uint8Array) for cache.put, as a stream of views of
// it: `new Response(bytes)` copies the whole file first (a 93 MB block's worth of garbage
// per file stored). The bytes must not change until the put has finished.
export function streamOf(bytes) {
  const view = bytes instanceof ArrayBuffer ? new Uint8Array(bytes) : bytes;
  let at = 0;
  return new ReadableStream({
    pull(controller) {
      if (at >= view.byteLength) {
        controller.close();
        return;
      }
      const end = Math.min(at + PIECE_BYTES, view.byteLength);
      controller.enqueue(view.subarray(at, end));
      at = end;
    },
  });
}
