"""Where a page should keep the weights it streams: the Cache API (where the web runtime
stores its package today) against the origin private file system (OPFS), in headless
Chromium, side by side in one run.

    python benchmarks/browser_storage_reads.py --mb 93 --files 4 --rounds 3

The page stores `--files` files of `--mb` MB each in both, then reads them back into one
reused buffer, as runtimes/web/block_bytes.js reads a streamed block: from the Cache API
(`cache.match()`, the body read chunk by chunk), and from OPFS three ways (`getFile()` then
its `stream()` chunk by chunk; `getFile().arrayBuffer()`, a fresh buffer a read; and a
`FileSystemSyncAccessHandle.read()` into the buffer in a dedicated worker, the only
synchronous read a page has). Every read is cold: the profile folder's files are evicted
from the page cache (posix_fadvise DONTNEED) before each one. Beside each rate: the browser's
peak PSS while reading, over its PSS before. Then `navigator.storage.estimate()` (quota and
usage after both copies are stored) and whether the page was granted persistent storage.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from chromium_launch import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from web_streaming import Sampler, chromium_pss_bytes, evict  # noqa: E402

# the page: helpers on window, each step a separate evaluate so the evictions happen between
PAGE = r"""
<!doctype html><meta charset="utf-8"><script type="module">
const CACHE = "edge-storage-bench";
const nameOf = (i) => `weights-${i}.bin`;
window.fill = (bytes, i) => {  // distinct bytes per file, cheap to make
  const data = new Uint8Array(bytes);
  const words = new Uint32Array(data.buffer, 0, bytes >> 2);
  for (let k = 0; k < words.length; k += 1) words[k] = (k * 2654435761 + i) >>> 0;
  return data;
};
window.store = async (bytes, count) => {
  const cache = await caches.open(CACHE);
  const root = await navigator.storage.getDirectory();
  for (let i = 0; i < count; i += 1) {
    const data = fill(bytes, i);
    await cache.put(new URL(nameOf(i), location.href).href, new Response(data));
    const handle = await root.getFileHandle(nameOf(i), { create: true });
    const writable = await handle.createWritable();
    await writable.write(data);
    await writable.close();
  }
  window.buffer = new Uint8Array(bytes);
  const persisted = await navigator.storage.persist();
  return { estimate: await navigator.storage.estimate(), persisted };
};
async function intoBuffer(stream) {
  const reader = stream.getReader();
  let at = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return at;
    window.buffer.set(value, at);
    at += value.byteLength;
  }
}
// a byte stream read straight into the buffer (no chunk buffers for the collector)
async function intoBufferByob(stream) {
  const reader = stream.getReader({ mode: "byob" });
  let at = 0;
  for (;;) {
    const rest = window.buffer.byteLength - at;
    if (rest === 0) {
      const { done } = await reader.read(new Uint8Array(1));
      if (!done) throw new Error("longer than the buffer");
      return at;
    }
    const { done, value } = await reader.read(new Uint8Array(window.buffer.buffer, at, rest));
    if (done) return at;
    window.buffer = new Uint8Array(value.buffer); // the buffer comes back, transferred
    at += value.byteLength;
  }
}
const cacheBody = async (i) =>
  (await (await caches.open(CACHE)).match(new URL(nameOf(i), location.href).href)).body;
const opfsFile = async (i) =>
  (await (await navigator.storage.getDirectory()).getFileHandle(nameOf(i))).getFile();
const ways = {
  cache_api: async (i) => intoBuffer(await cacheBody(i)),
  cache_api_byob: async (i) => intoBufferByob(await cacheBody(i)),
  opfs_stream: async (i) => intoBuffer((await opfsFile(i)).stream()),
  opfs_stream_byob: async (i) => intoBufferByob((await opfsFile(i)).stream()),
  opfs_array_buffer: async (i) => (await (await opfsFile(i)).arrayBuffer()).byteLength,
  async opfs_sync_handle(i) {
    if (!window.worker) {
      // the worker's own buffer, reused as the page's is
      const code = `let buffer = null;
      onmessage = async ({ data: { name, bytes } }) => {
        const root = await navigator.storage.getDirectory();
        const handle = await (await root.getFileHandle(name)).createSyncAccessHandle();
        if (!buffer || buffer.byteLength !== bytes) buffer = new Uint8Array(bytes);
        const t0 = performance.now();
        let at = 0;
        while (at < bytes) {
          const n = handle.read(buffer.subarray(at), { at });
          if (n === 0) break;
          at += n;
        }
        handle.close();
        postMessage({ at, ms: performance.now() - t0 });
      };`;
      const url = URL.createObjectURL(new Blob([code], { type: "text/javascript" }));
      window.worker = new Worker(url);
    }
    const got = await new Promise((resolve) => {
      window.worker.onmessage = ({ data }) => resolve(data);
      window.worker.postMessage({ name: nameOf(i), bytes: window.buffer.byteLength });
    });
    return got.at;
  },
};
window.readOnce = async (way, i) => {
  const t0 = performance.now();
  const got = await ways[way](i);
  return { bytes: got, s: (performance.now() - t0) / 1000 };
};
window.ready = true;
</script>
"""

WAYS = ("cache_api", "cache_api_byob", "opfs_stream", "opfs_stream_byob", "opfs_array_buffer",
        "opfs_sync_handle")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=93.0, help="size of each file, MB")
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chromium", default=CHROMIUM)
    args = parser.parse_args()

    import http.server

    from playwright.sync_api import sync_playwright

    site = Path(tempfile.mkdtemp(prefix="edge-storage-site-"))
    (site / "index.html").write_text(PAGE)
    handler = type("Quiet", (http.server.SimpleHTTPRequestHandler,),
                   {"log_message": lambda *a: None})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a: handler(*a, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    profile = Path(tempfile.mkdtemp(prefix="edge-chromium-"))
    sampler = Sampler(None)  # evictions are done here, before each read
    size = int(args.mb * 1e6) // 4 * 4
    out: dict = {"file_bytes": size, "files": args.files, "rounds": args.rounds}
    try:
        with sync_playwright() as p:
            context = p.chromium.launch_persistent_context(
                str(profile), executable_path=args.chromium, args=CHROMIUM_ARGS, headless=True)
            page = context.new_page()
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html")
            page.wait_for_function("window.ready === true")
            out["storage"] = page.evaluate("([b, n]) => store(b, n)", [size, args.files])
            results = {way: [] for way in WAYS}
            for _ in range(args.rounds):
                for way in WAYS:
                    for i in range(args.files):
                        evict(profile)
                        sampler.reset()
                        before = sum(chromium_pss_bytes().values())
                        got = page.evaluate("([w, i]) => readOnce(w, i)", [way, i])
                        if got["bytes"] != size:
                            raise SystemExit(f"{way} read {got['bytes']} of {size} bytes")
                        # a read shorter than the sampling period is sampled once after
                        peak = max(sampler.peak(), sum(chromium_pss_bytes().values()))
                        results[way].append({"s": got["s"], "pss_over_before": peak - before})
            out["reads"] = {
                way: {"mb_per_s": round(size * len(r) / sum(x["s"] for x in r) / 1e6, 1),
                      "best_mb_per_s": round(size / min(x["s"] for x in r) / 1e6, 1),
                      "peak_pss_over_before_mb": round(max(x["pss_over_before"] for x in r)
                                                       / 1e6, 1)}
                for way, r in results.items()}
            context.close()
    finally:
        sampler.stop()
        server.shutdown()
        shutil.rmtree(profile, ignore_errors=True)
        shutil.rmtree(site, ignore_errors=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
