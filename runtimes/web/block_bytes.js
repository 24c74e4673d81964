// Where the page gets a block's weights bytes: the blocks the budget pins are kept in page
// memory from the download on; the others are read again from the browser's storage (the
// Cache API, where the download stored them: PackageFiles.fetchFile, a file's SHA-256
// checked the first time it is read on the page, its size every time) into one of two
// reused buffers each time they run and let go after, the Python loader's streaming
// (runtimes/python/loader.py). The block the pipeline says runs next is read while the
// current one computes.

const now = () => performance.now() / 1000;
// Buffers a streamed block is read into, reused from block to block: the one in use and the
// one read ahead. A fresh buffer for each read would leave the garbage collector blocks'
// worth of buffers to free, which it does late (the page then holds several blocks more).
// Where a block's bytes are done with as soon as they are handed out (WebGPU copies them to
// the GPU), one buffer is enough: the next block is read into it once it is free (`slots: 1`).
const SLOTS = 2;

export class BlockBytes {
  // files: PackageFiles; shardsOf(key) -> the manifest records of the block's weights files;
  // kept: Map key -> ArrayBuffer of the blocks held in memory (the pinned ones)
  // slots: the buffers streamed blocks are read into (2: in use and read ahead; 1: the next
  // block is read once done() frees the buffer)
  constructor(files, shardsOf, kept, { slots = SLOTS } = {}) {
    this.files = files;
    this.shardsOf = shardsOf;
    this.kept = kept;
    this.slotCount = slots;
    this.aheadAfterDone = new Map(); // key -> the block to read once key's buffer is free
    this.reading = new Map(); // key -> promise of its bytes, read ahead
    this.inMemory = 0; // streamed bytes held now (being read, read ahead or in use)
    this.slots = []; // {buffer: ArrayBuffer, key: the block in it, or null when free}
    this.handedOut = new Map(); // key -> slots (null: a buffer of its own) given by get()
    this.stats = {
      reads: 0, bytes: 0, read_s: 0, wait_s: 0, peak_streamed_bytes: 0, read_ahead: 0,
      slot_misses: 0,
    };
  }

  streamed(key) {
    return !this.kept.has(key);
  }

  // a block's weights bytes: its shards' together
  size(key) {
    return this.shardsOf(key).reduce((n, r) => n + r.bytes, 0);
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
    const { bytes, slot } = await pending;
    this.stats.wait_s += now() - t0;
    // the bytes handed out for the key, oldest first: done(key) frees the oldest
    if (!this.handedOut.has(key)) this.handedOut.set(key, []);
    this.handedOut.get(key).push(slot);
    if (next !== key) {
      if (this.slotCount > 1) this.readAhead(next);
      else this.aheadAfterDone.set(key, next);
    }
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
    const size = this.size(key);
    this.inMemory += size;
    this.stats.peak_streamed_bytes = Math.max(this.stats.peak_streamed_bytes, this.inMemory);
    // shards joined, as tensor offsets index their concatenation
    const slot = this.slotFor(key, size);
    const out = new Uint8Array(slot ? slot.buffer : new ArrayBuffer(size), 0, size);
    let at = 0;
    try {
      for (const r of this.shardsOf(key)) {
        await this.files.fetchFile(r, undefined, out.subarray(at, at + r.bytes));
        at += r.bytes;
      }
    } catch (err) {
      if (slot) slot.key = null;
      this.inMemory -= size;
      throw err;
    }
    this.stats.reads += 1;
    this.stats.bytes += size;
    this.stats.read_s += now() - t0;
    return { bytes: out.buffer, slot }; // tensor offsets index it from 0; a slot may be longer
  }

  // A free slot for the block (grown where it is too small), or null when every slot is
  // held (the block gets a buffer of its own: a read never waits for a slot).
  slotFor(key, size) {
    let slot = this.slots.find((s) => s.key === null);
    if (!slot && this.slots.length < this.slotCount) {
      slot = { buffer: null, key: null };
      this.slots.push(slot);
    }
    if (!slot) {
      this.stats.slot_misses += 1;
      return null;
    }
    if (!slot.buffer || slot.buffer.byteLength < size) slot.buffer = new ArrayBuffer(size);
    slot.key = key;
    return slot;
  }

  // A streamed block's bytes are no longer used (its weights are on the GPU, or its call
  // returned): they no longer count, and its slot is free.
  done(key) {
    if (!this.streamed(key)) return;
    this.inMemory -= this.size(key);
    const slot = (this.handedOut.get(key) || []).shift();
    if (slot) slot.key = null;
    const next = this.aheadAfterDone.get(key);
    this.aheadAfterDone.delete(key);
    this.readAhead(next);
  }

  // A pinned block's bytes are no longer needed in page memory (its weights stay on the
  // GPU): a later get() reads them from storage like a streamed block's.
  forget(key) {
    this.kept.delete(key);
  }

  // Drop what is read ahead and the slots (a load that ends, a pipeline destroyed).
  clear() {
    for (const [key, pending] of this.reading) {
      pending.then(() => { this.inMemory -= this.size(key); }, () => {});
    }
    this.reading.clear();
    this.aheadAfterDone.clear();
    this.slots = [];
    this.handedOut.clear();
  }
}
