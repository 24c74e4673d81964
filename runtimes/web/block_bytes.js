// Where the page gets a block's weights bytes: the blocks the budget pins are kept in page
// memory from the download on; the others are read again from the browser's storage (the
// Cache API, where the download stored them, each file checked by size and SHA-256 as it is
// read: PackageFiles.fetchFile) each time they run and let go after, the Python loader's
// streaming (runtimes/python/loader.py). The block the pipeline says runs next is read while
// the current one computes.

const now = () => performance.now() / 1000;

export class BlockBytes {
  // files: PackageFiles; shardsOf(key) -> the manifest records of the block's weights files;
  // kept: Map key -> ArrayBuffer of the blocks held in memory (the pinned ones)
  constructor(files, shardsOf, kept) {
    this.files = files;
    this.shardsOf = shardsOf;
    this.kept = kept;
    this.reading = new Map(); // key -> promise of its bytes, read ahead
    this.inMemory = 0; // streamed bytes held now (being read, read ahead or in use)
    this.stats = { reads: 0, bytes: 0, read_s: 0, wait_s: 0, peak_streamed_bytes: 0, read_ahead: 0 };
  }

  streamed(key) {
    return !this.kept.has(key);
  }

  // The block's bytes (ArrayBuffer); a streamed one is read (or taken from the read ahead),
  // and `next`, the block to run after it, is read ahead. Call done(key) when a streamed
  // block's bytes are no longer needed.
  async get(key, next = null) {
    if (!this.streamed(key)) {
      this.readAhead(next);
      return this.kept.get(key);
    }
    const pending = this.reading.get(key) || this.read(key);
    this.reading.delete(key);
    const t0 = now();
    const bytes = await pending;
    this.stats.wait_s += now() - t0;
    if (next !== key) this.readAhead(next);
    return bytes;
  }

  // Start reading a streamed block's bytes, unless it is being read already.
  readAhead(key) {
    if (key === null || key === undefined || !this.streamed(key) || this.reading.has(key)) return;
    this.reading.set(key, this.read(key));
    this.stats.read_ahead += 1;
  }

  async read(key) {
    const t0 = now();
    const records = this.shardsOf(key);
    const size = records.reduce((n, r) => n + r.bytes, 0);
    this.inMemory += size;
    this.stats.peak_streamed_bytes = Math.max(this.stats.peak_streamed_bytes, this.inMemory);
    let bytes;
    if (records.length === 1) {
      bytes = await this.files.fetchFile(records[0]);
    } else { // shards: joined, as tensor offsets index their concatenation
      const out = new Uint8Array(size);
      let at = 0;
      for (const r of records) {
        out.set(new Uint8Array(await this.files.fetchFile(r)), at);
        at += r.bytes;
      }
      bytes = out.buffer;
    }
    this.stats.reads += 1;
    this.stats.bytes += size;
    this.stats.read_s += now() - t0;
    return bytes;
  }

  // A streamed block's bytes are no longer used (its weights are on the GPU, or its call
  // returned): they no longer count.
  done(key) {
    if (this.streamed(key)) this.inMemory -= this.shardsOf(key).reduce((n, r) => n + r.bytes, 0);
  }

  // A pinned block's bytes are no longer needed in page memory (its weights stay on the
  // GPU): a later get() reads them from storage like a streamed block's.
  forget(key) {
    this.kept.delete(key);
  }

  // Drop what is read ahead (a load that ends, a pipeline destroyed).
  clear() {
    for (const [key, pending] of this.reading) pending.then(() => this.done(key), () => this.done(key));
    this.reading.clear();
  }
}
