// Keeps block weights where the executor runs them under a budget: the Python runtime's loader
// (runtimes/python/loader.py) in the page. Blocks run every denoising step are pinned first, in
// order, while pinned bytes plus room to stream the two largest remaining blocks fit the
// budget; the others are placed at each use and destroyed right after. Their bytes come from
// block_bytes.js; the files from package_files.js.

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
