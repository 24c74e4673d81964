// Fetches and verifies a web package's files, and keeps block weights on the GPU under a budget.
//
// Files are fetched with byte-accurate progress, kept with the Cache API, and checked against
// the manifest's size and SHA-256 (crypto.subtle) before use. A cached copy that fails the
// check is dropped and fetched once more; a fresh copy that fails is a clear error naming the
// file. A download cut short (connection lost, body shorter than the file, 5xx) is tried
// again a bounded number of times, asking only for the missing bytes, and is never stored:
// only whole, verified files reach the cache. When storing fails (storage quota), the files
// stay in memory for this page, every file of the package already stored is dropped, and
// onCacheFailure says so. GPU residency follows the Python runtime's loader
// (runtimes/python/loader.py): blocks run every denoising step are pinned first, in order,
// while pinned bytes plus room to stream the two largest remaining blocks fit the budget; the
// others are uploaded at each use and destroyed right after.

import { eachChunk, streamOf } from "./bodies.js";
import { abortError } from "./options.js";

export const FORMAT = "edge-package";
export const FORMAT_VERSION = 1;
const CACHE_NAME = "edge-web-packages-v1";

export class PackageError extends Error {}

function hex(buffer) {
  return [...new Uint8Array(buffer)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

export async function sha256Hex(buffer) {
  return hex(await crypto.subtle.digest("SHA-256", buffer));
}

// Every file record in the manifest, as the Python side lists them (edge/core/manifest_schema.py).
export function fileRecords(manifest) {
  const out = [...manifest.tokenizer.files, ...Object.values(manifest.conditioning)];
  for (const c of manifest.components) for (const b of c.blocks) out.push(...b.files);
  const seen = new Set();
  return out.filter((r) => !seen.has(r.path) && seen.add(r.path));
}

export function checkManifest(manifest, url) {
  const where = `${url}`;
  if (manifest.format !== FORMAT) {
    throw new PackageError(`${where}: not an edge package ` +
                           `(format ${JSON.stringify(manifest.format)})`);
  }
  if (manifest.format_version !== FORMAT_VERSION) {
    throw new PackageError(`${where}: format_version ${manifest.format_version}; ` +
                           `this runtime reads version ${FORMAT_VERSION}`);
  }
  if (manifest.target !== "web") {
    throw new PackageError(`${where}: target ${JSON.stringify(manifest.target)}; the web ` +
                           `runtime runs "web" packages (export with: edge export --target web)`);
  }
  // optional (older packages lack it): what a seed means; a seed is only drawn for the
  // definition noise.js draws (checkNoise, at generate)
  if ("noise" in manifest && typeof manifest.noise !== "string") {
    throw new PackageError(`${where}: field 'noise' must be a string (the ` +
                           `seeds' definition, e.g. "torch.randn/cpu/float32"), ` +
                           `got ${JSON.stringify(manifest.noise)}`);
  }
  // optional: how the null caption is masked (absent: every token; "prompt": Open-Sora's)
  if ("null_caption_mask" in manifest && !["all", "prompt"].includes(manifest.null_caption_mask)) {
    throw new PackageError(`${where}: field 'null_caption_mask' ` +
                           `is ${JSON.stringify(manifest.null_caption_mask)}; known: all, prompt`);
  }
  checkDecode(manifest, where);
  for (const r of fileRecords(manifest)) {
    if (typeof r.path !== "string" || r.path.startsWith("/")
        || r.path.split("/").some((p) => p === ".." || p === "." || p === "")) {
      throw new PackageError(
        `${where}: file path ${JSON.stringify(r.path)} escapes the package folder`);
    }
  }
}

const DECODE_INPUTS = ["decode_noise", "decode_noise_scale", "decode_t"];

// A decoder that takes the decode inputs needs the manifest's `decode` settings and runs on
// whole videos; a manifest with them has such a decoder (the Python runtime's check_decode).
function checkDecode(manifest, where) {
  const decoder = (manifest.components || []).find((c) => c.name === "vae_decoder");
  const names = new Set(
    (decoder?.blocks || []).flatMap((b) => (b.inputs || []).map((s) => s.name)));
  const takes = DECODE_INPUTS.filter((n) => names.has(n));
  const spec = manifest.decode;
  if (spec === undefined && !takes.length) return;
  if (spec === undefined) {
    throw new PackageError(`${where}: the vae_decoder takes ${takes.join(", ")} ` +
                           "but the manifest has no 'decode' settings");
  }
  if (takes.length !== DECODE_INPUTS.length || decoder.chunked
      || manifest.latent_layout !== "video") {
    throw new PackageError(`${where} decode: needs a whole-video vae_decoder (latent_layout ` +
                           `'video', not chunked) taking ${DECODE_INPUTS.join(", ")}`);
  }
  const number = (v) => typeof v === "number" && Number.isFinite(v);
  if (spec === null || typeof spec !== "object" || !number(spec.timestep)
      || !(spec.noise_scale === null || spec.noise_scale === undefined
           || number(spec.noise_scale))) {
    throw new PackageError(`${where} decode: must be {"timestep": number, ` +
                           `"noise_scale": number or null}, got ${JSON.stringify(spec)}`);
  }
}

// A download is tried this many times when the connection fails, the body arrives short, or
// the server answers 5xx; a brief wait (this many ms times the attempt) lets a blip pass.
const DOWNLOAD_ATTEMPTS = 3;
const RETRY_DELAY_MS = 250;

// This attempt did not bring the whole file (internal: downloadVerified tries again, going
// on from `partial`, the bytes got so far, where there are some).
class Interrupted extends Error {
  constructor(message, partial = null) {
    super(message);
    this.partial = partial;
  }
}
// The server sent more bytes than the manifest lists (internal: treated like a bad digest).
class Oversized extends Error {}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

export class PackageFiles {
  // base: URL of the package folder (ends with "/"); onProgress(loadedBytes, totalBytes, path);
  // onCacheFailure(message): the Cache API refused a file (quota): the model runs from memory;
  // signal: an AbortSignal that cancels the download in flight and every later one (the
  // pipeline sets it for its load only: `signal` is null again once the load is done, so the
  // streamed reads of a generation do not answer to it)
  constructor(base, manifest, {
    onProgress = () => {}, useCache = true, onCacheFailure = () => {}, signal = null,
  } = {}) {
    this.base = base;
    this.manifest = manifest;
    this.onProgress = onProgress;
    this.onCacheFailure = onCacheFailure;
    this.signal = signal;
    this.useCache = useCache && typeof caches !== "undefined";
    this.refetched = [];     // paths whose cached or first copy failed verification
    this.interrupted = [];   // "path: what happened" for each download attempt cut short
    this.fromCache = 0;      // files served by the Cache API
    // paths whose bytes matched their SHA-256 on this page (downloaded, or read back from
    // the Cache API once): a later read of one checks its size, not its digest again, as the
    // Python loader checks a verified file's identity, not its digest, at each streamed read
    this.verified = new Set();
    this.cacheFailure = null; // message once storing failed; nothing of the package is kept
  }

  static async open(base, options = {}) {
    const url = new URL("manifest.json", base).href;
    let response;
    try {
      response = await fetch(url, { cache: "no-cache", signal: options.signal || null });
    } catch (err) {
      if (options.signal?.aborted) {
        throw abortError(`loading ${base}: cancelled while fetching ` +
                         "the manifest (the signal was aborted)");
      }
      throw new PackageError(`${url}: could not be fetched (${err.message}); ` +
                             "check the connection and load the page again");
    }
    if (!response.ok) throw new PackageError(`${url}: HTTP ${response.status}`);
    let manifest;
    try {
      manifest = await response.json();
    } catch (err) {
      throw new PackageError(`${url}: invalid JSON (${err.message})`);
    }
    checkManifest(manifest, url);
    return new PackageFiles(base, manifest, options);
  }

  url(path) {
    return new URL(path, this.base).href;
  }

  // An AbortError where the signal was aborted (to throw), else null.
  aborted(path) {
    return this.signal?.aborted ? abortError(`loading ${this.base}: cancelled while ` +
                                             `downloading ${path} (the signal was aborted)`) : null;
  }

  // verify() the first time a file is read on this page; its size after that
  async check(record, buffer) {
    if (this.verified.has(record.path)) return sizeProblem(record, buffer);
    const problem = await this.verify(record, buffer);
    if (!problem) this.verified.add(record.path);
    return problem;
  }

  async verify(record, buffer) {
    const size = sizeProblem(record, buffer);
    if (size) return size;
    const digest = await sha256Hex(buffer);
    return digest === record.sha256 ? null : `sha256 ${digest}, the manifest says ${record.sha256}`;
  }

  // One attempt at the file's bytes. Throws Interrupted when the body is cut short; its
  // `partial` ({out, got}) lets the next attempt ask only for the rest (an HTTP Range).
  async download(record, progress, partial = null, into = null) {
    const resume = partial && partial.got > 0 && partial.got < record.bytes ? partial : null;
    let response;
    try {
      response = await fetch(this.url(record.path), {
        cache: "reload", headers: resume ? { Range: `bytes=${resume.got}-` } : {},
        signal: this.signal,
      });
    } catch (err) {
      throw this.aborted(record.path) || new Interrupted(
        `got ${resume ? resume.got : 0} of ${record.bytes} ` +
        `bytes: no response (${err.message})`, resume);
    }
    if (response.status >= 500) {
      throw new Interrupted(`got ${resume ? resume.got : 0} of ${record.bytes} ` +
                            `bytes: HTTP ${response.status}`, resume);
    }
    if (!response.ok) throw new PackageError(`${record.path}: HTTP ${response.status}`);
    // the rest of the file where the server answered the range as asked, else all of it
    const range = /^bytes (\d+)-\d+\/(\d+)$/.exec(response.headers.get("Content-Range") || "");
    const resumed = resume && response.status === 206 && range
      && Number(range[1]) === resume.got && Number(range[2]) === record.bytes;
    if (response.status === 206 && !resumed) {
      response.body.cancel().catch(() => {});
      throw new Interrupted(`got 0 of ${record.bytes} bytes: the server answered ` +
                            `another range (${response.headers.get("Content-Range")})`);
    }
    const out = resumed ? resume.out : into || new Uint8Array(record.bytes);
    let got = resumed ? resume.got : 0;
    progress(got); // a retried file's share of the progress restarts where it stands, never adds
    let oversized = false;
    try {
      await eachChunk(response.body, (chunk) => {
        if (got + chunk.byteLength > record.bytes) {
          oversized = true;
          return false;
        }
        out.set(chunk, got);
        got += chunk.byteLength;
        progress(got);
        return true;
      });
    } catch (err) {
      throw this.aborted(record.path) || new Interrupted(
        `got ${got} of ${record.bytes} bytes, then the ` +
        `connection failed (${err.message})`, { out, got });
    }
    if (oversized) {
      throw new Oversized(`more than ${record.bytes} bytes, the manifest says ${record.bytes}`);
    }
    if (got < record.bytes) {
      throw new Interrupted(`got ${got} of ${record.bytes} bytes: the response ended early`,
                            { out, got });
    }
    return into ? out : out.buffer;
  }

  // Downloads until a whole copy matches the manifest: an interrupted download goes on from
  // the bytes it got, up to DOWNLOAD_ATTEMPTS attempts; a whole copy that fails its check is
  // fetched once more from the start (the sha256 covers the joined parts).
  async downloadVerified(record, progress, into = null) {
    const cuts = [];
    let partial = null;
    for (;;) {
      let problem;
      try {
        const buffer = await this.download(record, progress, partial, into);
        problem = await this.verify(record, buffer);
        if (!problem) return buffer;
      } catch (err) {
        if (err instanceof Oversized) {
          problem = err.message;
        } else if (err instanceof Interrupted) {
          cuts.push(err.message);
          this.interrupted.push(`${record.path}: ${err.message}`);
          if (cuts.length >= DOWNLOAD_ATTEMPTS) {
            throw new PackageError(`${record.path}: the download was interrupted ${cuts.length} ` +
                                   `times (${cuts.join("; ")}); nothing of it was kept, check ` +
                                   "the connection and load the page again");
          }
          partial = err.partial;
          await sleep(RETRY_DELAY_MS * cuts.length);
          const stop = this.aborted(record.path);
          if (stop) throw stop;
          continue;
        } else {
          throw err;
        }
      }
      partial = null;
      if (this.refetched.includes(record.path)) {
        throw new PackageError(`${record.path}: the downloaded file does not match ` +
                               `the manifest (${problem}), also after fetching it ` +
                               "again; the package on the server is damaged or changed");
      }
      this.refetched.push(record.path);
    }
  }

  // The Cache API, or null when it is off, missing, or failed earlier in this load.
  async cache() {
    if (!this.useCache || this.cacheFailure) return null;
    try {
      return await caches.open(CACHE_NAME);
    } catch (err) {
      await this.giveUpCache(null, err);
      return null;
    }
  }

  // Storing failed (storage quota, most often): keep the files in memory for this page only
  // and drop every file of this package already stored, so the cache never holds part of it.
  async giveUpCache(path, err) {
    const reason = err && err.name === "QuotaExceededError"
      ? "the browser's storage quota for this site is exceeded"
      : `${(err && err.name) || "Error"}: ${err && err.message}`;
    this.cacheFailure = "The model could not be stored in this browser " +
                        `(${reason}${path ? ` while storing ${path}` : ""}): it runs from ` +
                        "memory on this page and will be downloaded again on the next visit.";
    try {
      const cache = await caches.open(CACHE_NAME);
      await Promise.all(fileRecords(this.manifest).map((r) => cache.delete(this.url(r.path))));
    } catch {
      // nothing stored can be reached either: nothing to drop
    }
    this.onCacheFailure(this.cacheFailure);
  }

  // One file's bytes, verified (an ArrayBuffer). progress(bytesOfThisFile) during downloads.
  // into: a Uint8Array of the file's size to read it into (then it is returned): a file
  // checked and stored but not kept goes into one reused scratch buffer, a pinned block's
  // shards into their place in the block's buffer, a streamed block's into its slot
  // (block_bytes.js), so no buffer per file is left for the collector to free late. A file
  // verified on this page already is checked by its size only (`check`).
  async fetchFile(record, progress = () => {}, into = null) {
    const cache = await this.cache();
    const url = this.url(record.path);
    if (cache) {
      const hit = await cache.match(url);
      if (hit) {
        const buffer = into ? await storedInto(hit, into) : await hit.arrayBuffer();
        if (buffer && !(await this.check(record, buffer))) {
          this.fromCache += 1;
          progress(record.bytes);
          return buffer;
        }
        await cache.delete(url); // corrupt or stale: drop it and fetch once more
        this.verified.delete(record.path);
        this.refetched.push(record.path);
      }
    }
    const buffer = await this.downloadVerified(record, progress, into);
    this.verified.add(record.path);
    if (cache && !this.cacheFailure) {
      try {
        await cache.put(url, new Response(streamOf(buffer)));
      } catch (err) {
        await this.giveUpCache(record.path, err);
      }
    }
    return buffer;
  }

  // Refuse, before downloading, files the browser's storage cannot hold: streamed blocks are
  // read back from it at each use. Asks for persistent storage (so the browser does not evict
  // them under pressure); files already stored count as stored. Nothing to check where the
  // Cache API is off or missing (streamed blocks are then downloaded at each use).
  async checkRoomFor(records) {
    const cache = await this.cache();
    if (!cache || !navigator.storage?.estimate) return;
    await navigator.storage.persist?.().catch(() => false);
    let needed = 0;
    for (const r of records) if (!(await cache.match(this.url(r.path)))) needed += r.bytes;
    const { usage = 0, quota = Infinity } = await navigator.storage.estimate();
    if (needed > quota - usage) {
      const mb = (n) => `${(n / 1e6).toFixed(1)} MB`;
      throw new PackageError(`this package streams ${mb(needed)} of block weights from the ` +
                             "browser's storage under the memory budget, but the browser " +
                             `lets this site store ${mb(Math.max(0, quota - usage))} more ` +
                             `(quota ${mb(quota)}, ${mb(usage)} used); nothing was ` +
                             "downloaded: free storage for this site, or load with a " +
                             "budget that holds every block");
    }
  }

  // Many files at once, with one progress figure over all their bytes. Returns path -> bytes
  // of the files `keep(record)` wants (the others are downloaded, checked and stored only);
  // `placeOf(record)`: where a kept file's bytes go (a Uint8Array of its size), or null for
  // a buffer of its own.
  async fetchAll(records, keep = () => true, placeOf = () => null) {
    const total = records.reduce((n, r) => n + r.bytes, 0);
    const done = new Map(); // path -> bytes of the file in flight (its latest attempt)
    let finished = 0;
    const report = (path) => this.onProgress(
      finished + [...done.values()].reduce((a, b) => a + b, 0), total, path);
    const out = new Map();
    // the files not kept are read into one buffer, reused
    const largest = Math.max(0, ...records.filter((r) => !keep(r)).map((r) => r.bytes));
    const scratch = largest ? new ArrayBuffer(largest) : null;
    for (const r of records) {
      const stop = this.aborted(r.path);
      if (stop) throw stop; // no file is fetched in the background after an abort
      const into = keep(r) ? placeOf(r) : new Uint8Array(scratch, 0, r.bytes);
      const bytes = await this.fetchFile(r, (n) => {
        done.set(r.path, Math.min(n, r.bytes));
        report(r.path);
      }, into);
      if (keep(r)) out.set(r.path, bytes);
      done.delete(r.path);
      finished += r.bytes;
      report(r.path);
    }
    return out;
  }
}

function sizeProblem(record, buffer) {
  return buffer.byteLength === record.bytes ? null : `${buffer.byteLength} bytes, the ` +
                                                     `manifest says ${record.bytes}`;
}

// A stored Response's body read into `into` (a Uint8Array of the file's size) chunk by chunk:
// `into`, or null where the body is not that long (changed since it was stored).
async function storedInto(response, into) {
  let got = 0;
  const whole = await eachChunk(response.body, (chunk) => {
    if (got + chunk.byteLength > into.byteLength) return false;
    into.set(chunk, got);
    got += chunk.byteLength;
    return true;
  });
  return whole && got === into.byteLength ? into : null;
}

// A block's weights files (its shards, joined in order: tensor offsets index their
// concatenation) as manifest paths, and as the block's file records.
export function shardPaths(record) {
  return record.weights.shards || [record.weights.path];
}

export function shardFiles(record) {
  return shardPaths(record).map((p) => record.files.find((f) => f.path === p));
}

// the weights file that holds a tensor of the block (for messages)
export function shardHolding(record, tensor) {
  let end = 0;
  for (const f of shardFiles(record)) {
    end += f.bytes;
    if (tensor.offset < end) return f.path;
  }
  return record.weights.path;
}

// edge/core/budget.py parse_size: '64MB', '1.5GiB', '512k', 1000 -> bytes (powers of 1024 for
// every unit); anything else (not finite, not positive, under a byte, past 2^60, another
// type) refused naming the value
const SIZE_UNITS = { K: 2 ** 10, M: 2 ** 20, G: 2 ** 30, T: 2 ** 40 };
const MAX_SIZE = 2 ** 60;

export function parseSize(value) {
  if (value === null || value === undefined || value === "") return null;
  const what = `memory budget ${JSON.stringify(value)}`;
  let number, factor = 1;
  if (typeof value === "number") {
    if (!Number.isInteger(value)) {
      throw new Error(`${what}: a number of bytes is a whole number; or give a size such as ` +
                      "'64MB'");
    }
    number = value;
  } else if (typeof value === "string") {
    let s = value.trim().toUpperCase();
    if (s.endsWith("B")) s = s.slice(0, -1);
    if (s.endsWith("I")) s = s.slice(0, -1);
    if (s.slice(-1) in SIZE_UNITS) {
      factor = SIZE_UNITS[s.slice(-1)];
      s = s.slice(0, -1);
    }
    s = s.trim();
    if (/^[+-]?(?:INF|INFINITY|NAN)$/.test(s)) {  // numbers to Python's float(), not sizes
      throw new Error(`${what}: must be a finite size, e.g. 64MB or 1.5GB`);
    }
    if (!/^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:E[+-]?\d+)?$/.test(s)) {
      throw new Error(`${what}: not understood; use e.g. 64MB or 1.5GB`);
    }
    number = Number(s);
    if (!Number.isFinite(number)) {  // 1e999
      throw new Error(`${what}: must be a finite size, e.g. 64MB or 1.5GB`);
    }
  } else {
    throw new Error(`${what} is ${Array.isArray(value) ? "a list" : `a ${typeof value}`}; give ` +
                    "a whole number of bytes or a size such as '64MB'");
  }
  if (number <= 0) throw new Error(`${what}: must be positive`);
  if (number * factor > MAX_SIZE) {
    throw new Error(`${what}: more than 1 EiB, beyond any machine's memory`);
  }
  const size = Math.floor(number * factor);
  if (size < 1) throw new Error(`${what}: less than one byte`);
  return size;
}

// The blocks kept on the GPU once uploaded: the Python loader's rule (plan_pins).
export function planPins(sizes, budget, everyStep = []) {
  const keys = Object.keys(sizes);
  const largest = keys.reduce((a, k) => (sizes[k] > sizes[a] ? k : a), keys[0]);
  if (budget !== null && budget < sizes[largest]) {
    throw new Error(`GPU memory budget ${budget} bytes is smaller than ` +
                    `block ${largest} (${sizes[largest]} bytes); the ` +
                    `smallest budget that works is ${sizes[largest]} bytes`);
  }
  if (budget === null) return new Set(keys);
  const order = [...everyStep, ...keys.filter((k) => !everyStep.includes(k))];
  let pinned = new Set();
  for (const key of order) {
    const trial = new Set([...pinned, key]);
    const streamed = keys.filter((k) => !trial.has(k)).map((k) => sizes[k]).sort((a, b) => b - a);
    const reserve = streamed.slice(0, 2).reduce((a, b) => a + b, 0);
    const held = [...trial].reduce((a, k) => a + sizes[k], 0);
    if (held + reserve <= budget) pinned = trial;
  }
  return pinned;
}

// Block weights where the executor runs them (GPU buffers on WebGPU, page memory on wasm),
// under the budget: the pinned blocks stay once placed, the others are placed for each call
// and freed after. source: a BlockBytes (block_bytes.js), which streams the unpinned blocks'
// bytes from storage; tensorsOf(key) -> the manifest's tensor table; sizes: what each block
// holds (executor.heldBytes).
export class GpuWeights {
  constructor(executor, sizes, tensorsOf, source, pinned) {
    this.executor = executor;
    this.sizes = sizes;
    this.tensorsOf = tensorsOf;
    this.source = source;
    this.pinned = pinned;
    this.resident = new Map();
    this.held = 0;
    this.stats = { uploads: 0, uploadedBytes: 0, peakHeldBytes: 0 };
  }

  // the block to read ahead after `key`: none where it is on the GPU already (its bytes,
  // let go once uploaded, would be read from storage for nothing)
  ahead(next) {
    return this.resident.has(next) ? null : next;
  }

  async upload(key, next) {
    // a streamed block is uploaded once the GPU's queue is empty: a released block is freed
    // only when its queued work is done, and so are an upload's staging copies (a page that
    // queued every block at once held the whole model: 11 GB for Wan 1.3B's shapes on
    // SwiftShader; one call behind, the GPU process still held two streamed blocks and
    // their staging). Its bytes were read from storage while the call before it ran.
    if (!this.pinned.has(key)) await this.executor.settle();
    const weights = await this.executor.uploadWeights(
      await this.source.get(key, this.ahead(next)), this.tensorsOf(key), key);
    // the GPU holds a copy now; on wasm the weights are views of the bytes until released
    if (!this.executor.viewsWeights) this.source.done(key);
    this.stats.uploads += 1;
    this.stats.uploadedBytes += this.sizes[key];
    this.held += this.sizes[key];
    this.stats.peakHeldBytes = Math.max(this.stats.peakHeldBytes, this.held);
    return weights;
  }

  // The block's weights; call release(key, weights) when its call is submitted. next: the
  // block that runs after it, read ahead from storage where it is streamed.
  async acquire(key, next = null) {
    if (this.resident.has(key)) {
      this.source.readAhead(this.ahead(next));
      return this.resident.get(key);
    }
    const w = await this.upload(key, next);
    if (this.pinned.has(key)) {
      this.resident.set(key, w);
      // once on the GPU a pinned block's bytes are not needed in page memory again
      if (!this.executor.viewsWeights) this.source.forget(key);
    }
    return w;
  }

  release(key, weights) {
    if (this.resident.has(key)) return;
    for (const b of Object.values(weights)) b.destroy();
    // counted until freed, once the queued work is done
    const size = this.sizes[key];
    this.executor.afterDone(() => { this.held -= size; });
    if (this.executor.viewsWeights) this.source.done(key);
  }

  destroy() {
    for (const [key, w] of this.resident) {
      for (const b of Object.values(w)) b.destroy();
      this.held -= this.sizes[key];
    }
    this.resident.clear();
    this.source.clear();
  }
}
