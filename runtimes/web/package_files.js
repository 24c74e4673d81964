// Fetches and verifies a web package's files.
//
// Files are fetched with byte-accurate progress, kept with the Cache API, and checked against
// the manifest's size and SHA-256 (crypto.subtle) before use. A cached copy that fails the
// check is dropped and fetched once more; a fresh copy that fails is a clear error naming the
// file. A download cut short (connection lost, body shorter than the file, 5xx) is tried
// again a bounded number of times, asking only for the missing bytes, and is never stored:
// only whole, verified files reach the cache. When storing fails (storage quota), the files
// stay in memory for this page, every file of the package already stored is dropped, and
// onCacheFailure says so.

import { eachChunk, streamOf } from "./bodies.js";
import { PackageError, checkManifest, fileRecords, sha256Hex } from "./manifest.js";
import { abortError } from "./options.js";
import { formatSize } from "./sizes.js";

const CACHE_NAME = "edge-web-packages-v1";

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
      const [need, room] = [formatSize(needed), formatSize(Math.max(0, quota - usage))];
      throw new PackageError(`this package streams ${need} of block weights from the ` +
                             "browser's storage under the memory budget, but the browser " +
                             `lets this site store ${room} more (quota ${formatSize(quota)}, ` +
                             `${formatSize(usage)} used); nothing was downloaded: free ` +
                             "storage for this site, or load with a " +
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
