// Runs a web package (edge export --target web) in the browser: tokenizer -> text encoder ->
// rectified-flow sampler over the transformer blocks -> VAE decoder, every block either a
// launch plan replayed on WebGPU (executor.js) or an ONNX graph run by onnxruntime-web's wasm
// provider (ort_executor.js), whichever paths.js picks; files fetched and verified by
// package_files.js, weights kept under the budget by loader.js; a seed's initial noise drawn
// as PyTorch draws it (noise.js).
import { byteSize } from "./executor.js";
import { BlockBytes } from "./block_bytes.js";
import { GpuWeights, planPins } from "./loader.js";
import { parseSize } from "./sizes.js";
import { PackageError } from "./manifest.js";
import { PackageFiles, shardFiles, shardPaths } from "./package_files.js";
import { checkNoise, checkSeed, torchRandn, torchRandnDraws } from "./noise.js";
import { choosePath, findAdapter, timeBlock } from "./paths.js";
import { DEFAULT_SETTINGS, checkSettings, guidedCall, runPairs, sample } from "./sampler.js";
import {
  GENERATE_OPTIONS, LOAD_OPTIONS, OUTPUT_TYPES, abortError, abortable, checkLatents, checkSignal,
  checkText, checkThreads, refuseUnknown, settingsWith, show,
} from "./options.js";
import { CaptionTokenizer } from "./tokenizer.js";
import { concatAlong, pieceBounds, sliceAlong } from "./chunks.js";
import { BlendedTiles, Tiling, tileVariant } from "./tiles.js";
// so that a page needs this module alone: why the wasm path is missing, where it is
export { ortFailure } from "./ort_executor.js";
export { formatSize, parseSize } from "./sizes.js";

export class WebGpuUnavailable extends Error {}

export function adapterInfo(adapter) {
  const i = adapter.info || {};
  return {
    vendor: i.vendor || "", architecture: i.architecture || "", description: i.description || "",
    shaderF16: adapter.features.has("shader-f16"),
    maxStorageBufferBindingSize: adapter.limits.maxStorageBufferBindingSize,
    maxStorageBuffersPerShaderStage: adapter.limits.maxStorageBuffersPerShaderStage,
  };
}

// A little-endian float32 .npy file (version 1 to 3) -> {shape, data}
export function parseNpy(buffer, where) {
  const bytes = new Uint8Array(buffer);
  if (bytes[0] !== 0x93 || String.fromCharCode(...bytes.slice(1, 6)) !== "NUMPY") {
    throw new PackageError(`${where}: not a .npy file`);
  }
  const view = new DataView(buffer);
  const major = bytes[6];
  const headerLen = major === 1 ? view.getUint16(8, true) : view.getUint32(8, true);
  const start = major === 1 ? 10 : 12;
  const header = new TextDecoder().decode(bytes.slice(start, start + headerLen));
  if (!/'descr':\s*'<f4'/.test(header) || /'fortran_order':\s*True/.test(header)) {
    throw new PackageError(`${where}: expected a C-ordered little-endian float32 array`);
  }
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header)[1].split(",").filter((s) => s.trim())
    .map(Number);
  const offset = start + headerLen;
  const end = offset + shape.reduce((a, b) => a * b, 1) * 4;
  return { shape, data: new Float32Array(buffer.slice(offset, end)) };
}

// np.round: halves to even
function roundHalfEven(x) {
  const r = Math.round(x);
  return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

// A video (T, H, W, 3) of `count` values in the output type's storage, and how a decoded
// value in [0, 1] is stored there: uint8 as np.round(v * 255) (through a clamped view, so
// out-of-range values saturate); float as the value clipped to [0, 1] (the Python
// runtime's float video). Written in place, so a real-size video is held once.
function videoStore(count, outputType) {
  if (outputType === "float") return [new Float32Array(count), (v) => Math.min(1, Math.max(0, v))];
  return [new Uint8ClampedArray(count), (v) => roundHalfEven(Math.fround(v * 255))];
}

// latents (C, T, h, w)'s tile from row `top`, column `left`, of `size` [rows, cols]
function latentTile(latents, [c, t, h, w], top, left, [rows, cols]) {
  const tile = new Float32Array(c * t * rows * cols);
  for (let k = 0; k < c * t; k++) {
    for (let y = 0; y < rows; y++) {
      const from = (k * h + top + y) * w + left;
      tile.set(latents.subarray(from, from + cols), (k * rows + y) * cols);
    }
  }
  return tile;
}

function handBack(video, shape) {
  return {
    frames: video instanceof Uint8ClampedArray ? new Uint8Array(video.buffer) : video, shape,
  };
}

// One buffer per block for its weights' shards, joined as tensor offsets index them: each
// shard is read straight into its place (fetchAll's placeOf), so no shard buffers are joined
// and left for the collector (that held the pinned weights twice while a page loaded).
// blocks: [key, manifest record] -> {buffers: Map key -> ArrayBuffer, placeOf(file record)}
function blockBuffers(blocks) {
  const buffers = new Map();
  const places = new Map();
  for (const [key, record] of blocks) {
    const files = shardFiles(record);
    const buffer = new ArrayBuffer(files.reduce((n, f) => n + f.bytes, 0));
    let at = 0;
    for (const f of files) {
      places.set(f.path, new Uint8Array(buffer, at, f.bytes));
      at += f.bytes;
    }
    buffers.set(key, buffer);
  }
  return { buffers, placeOf: (r) => places.get(r.path) ?? null };
}

const now = () => performance.now() / 1000;

// Wall seconds of a generation's phases, by name in the order they ran, and the whole
// (`total`, from the clock's making to `finish`): lastRun.wall_s, as the Python runtime's
// PhaseClock records them
export class PhaseClock {
  constructor() {
    this.started = now();
    this.wall_s = {};
  }

  async phase(name, work) {
    const began = now();
    try {
      return await work();
    } finally {
      this.wall_s[name] = now() - began;
    }
  }

  finish() {
    this.wall_s.total = now() - this.started;
    return this.wall_s;
  }
}

// Which variant a transformer call runs (edge/core/manifest_schema.py call_variant): merged
// (TDTM) or not, and the caption's half alone ("unguided") or the guidance pair
export function callVariant(merged, alone) {
  const variant = merged ? "tdtm" : null;
  if (!alone) return variant;
  return variant ? `${variant}_unguided` : "unguided";
}

// The variant one block runs for a call's variant, given its variants {name: ...}
// (edge/core/manifest_schema.py block_variant): merging where the block merges (TDTM pairs), the
// caption's half on every block: "tdtm" falls back to the block's own graph, "tdtm_unguided"
// to "unguided" where the block does not merge; any other variant must be there.
export function blockVariant(present, variant, key = "the block") {
  if (variant === null || variant in present) return variant;
  if (variant === "tdtm") return null;
  if (variant === "tdtm_unguided" && "unguided" in present && !("tdtm" in present)) {
    return "unguided";
  }
  throw new Error(`block ${key} has no variant '${variant}' (it ` +
                  `has: ${Object.keys(present).sort().join(", ") || "none"})`);
}

// The files the page fetches for one path: tokenizer, conditioning, every block's weights and
// its (and its variants') graphs of that path; each once.
export function pathRecords(manifest, executor) {
  const out = [...manifest.tokenizer.files, ...Object.values(manifest.conditioning)];
  for (const c of manifest.components) {
    for (const b of c.blocks) {
      const wanted = new Set([
        ...shardPaths(b), executor.graphOf(b),
        ...Object.values(b.variants || {}).map((v) => executor.graphOf(v)),
      ]);
      out.push(...b.files.filter((f) => wanted.has(f.path)));
    }
  }
  const seen = new Set();
  return out.filter((r) => !seen.has(r.path) && seen.add(r.path));
}

export class Pipeline {
  constructor(files, executor, blocks, weights, tokenizer, nullCaption, adapter) {
    Object.assign(this, { files, executor, blocks, weights, tokenizer, nullCaption, adapter });
    this.manifest = files.manifest;
    this.settings = checkSettings(this.manifest.sampler);
    this.latentShape = this.manifest.latent_shape;
    // the unconditional pass without a negative prompt: the learned null caption, or the
    // package's own negative prompt encoded (a family with no learned one: Wan's "")
    this.negativePrompt = nullCaption ? null : this.manifest.negative_prompt;
    this.chunking = Object.fromEntries(this.manifest.components.filter((c) => c.chunked)
      .map((c) => [c.name, c.chunked]));
    this.tiling = Object.fromEntries(this.manifest.components.filter((c) => c.tiles)
      .map((c) => [c.name, new Tiling(c.tiles)]));
    this.lastRun = null;
  }

  // base: URL of the package folder; budget: GPU bytes for block weights ("64MB"; null: all;
  // the wasm path keeps every block in page memory and takes no budget)
  // tune: time the exporter's alternative schedules of the transformer's kernels on this
  // adapter and keep the fastest (remembered per adapter; see PlanExecutor.tune)
  // path: "webgpu" or "wasm" to skip the choice of paths.js (null: choose)
  // threads: onnxruntime-web's threads on the wasm path, fewer than the cores where other
  // work shares them (null: one a core up to 8; 1 where the page is not cross-origin isolated)
  // onProgress(loadedBytes, totalBytes, path); onCacheFailure(message): the files could not
  // be stored (quota), they run from memory; signal: an AbortSignal that cancels the load
  // (rejects with an AbortError naming the phase; nothing is kept, the GPU device is released)
  static async load(base, options = {}) {
    const started = now();
    refuseUnknown(options, LOAD_OPTIONS, "load");
    const {
      budget = null, onProgress = () => {}, useCache = true, tune = true,
      onCacheFailure = () => {}, path = null, signal = null, threads = null,
    } = options;
    checkSignal("signal", signal);
    checkThreads(threads);
    parseSize(budget); // a bad budget is refused before megabytes are downloaded
    const stopIf = (phase) => {
      if (signal?.aborted) {
        throw abortError(`loading ${base}: cancelled ${phase} (the signal was aborted)`);
      }
    };
    // a page that aborted hears no more of bytes it no longer wants
    const progress = (...args) => { if (!signal?.aborted) onProgress(...args); };
    stopIf("before anything was fetched");
    const files = await abortable(
      PackageFiles.open(base, { onProgress: progress, useCache, onCacheFailure, signal }), signal,
      `loading ${base}: the manifest`);
    stopIf("after the manifest");
    const m = files.manifest;
    const transformer = m.components.find((c) => c.name === "transformer");
    const probeRecord = transformer.blocks[Math.min(1, transformer.blocks.length - 1)];
    const probeKey = `transformer/${probeRecord.name}`;
    const gpu = await findAdapter();
    // not raced against the signal: an executor made after we gave up would hold a device
    const choice = await choosePath({
      files, gpu, asked: path, modelKey: `${m.model}|${m.manifest_sha256 || ""}`, threads,
      getProbe: async () => {
        const weights = blockBuffers([[probeKey, probeRecord]]);
        const paths = new Set(
          [probeRecord.graph, probeRecord.wasm.graph, ...shardPaths(probeRecord)]);
        const got = await files.fetchAll(
          [...paths].map((p) => probeRecord.files.find((f) => f.path === p)), () => true,
          weights.placeOf);
        return {
          key: probeKey, record: probeRecord, weightBytes: weights.buffers.get(probeKey),
          graphs: { webgpu: got.get(probeRecord.graph), wasm: got.get(probeRecord.wasm.graph) },
        };
      },
    });
    if (!choice.executor) {
      throw new WebGpuUnavailable(`${choice.why[0].toUpperCase()}${choice.why.slice(1)}: ` +
                                  "use a recent Chrome, Edge or Safari, served over " +
                                  "https or from localhost.");
    }
    try {
      stopIf("after choosing the path");
      const pipe = await Pipeline.build(
        base, files, choice, gpu, { budget, tune, signal, stopIf, started, probeKey });
      files.signal = null; // loaded: the generations' streamed reads answer to their own signals
      return pipe;
    } catch (err) {
      choice.executor.destroy(); // a failed or cancelled load keeps no GPU device
      throw err;
    }
  }

  // load() once the path is chosen: fetch the path's files, prepare every block, place the
  // weights, tune, time the probe block
  static async build(
    base, files, choice, gpu, { budget, tune, signal, stopIf, started, probeKey },
  ) {
    const m = files.manifest;
    const executor = choice.executor;
    const onGpu = executor.path === "webgpu";
    // what each block holds on this path (float32 on the GPU, the stored form in page memory
    // on wasm), from the manifest: a budget under the largest block is refused here, before
    // the download, naming the block and the figures
    const sizes = {};
    const recordOf = new Map();
    for (const c of m.components) {
      for (const b of c.blocks) {
        if (onGpu) executor.checkLimits(`${c.name}/${b.name}`, b);
        sizes[`${c.name}/${b.name}`] = executor.heldBytes(b.weights.tensors);
        recordOf.set(`${c.name}/${b.name}`, b);
      }
    }
    const transformerKeys = Object.keys(sizes).filter((k) => k.startsWith("transformer/"));
    const pinned = planPins(sizes, parseSize(budget), transformerKeys);
    const records = pathRecords(m, executor);
    // the streamed blocks' files are downloaded, checked and stored, not kept in memory
    const streamedFiles = new Set([...recordOf].filter(([k]) => !pinned.has(k))
      .flatMap(([, b]) => shardPaths(b)));
    if (streamedFiles.size) {
      await files.checkRoomFor(records.filter((r) => streamedFiles.has(r.path)));
    }
    // the pinned blocks' shards are read straight into one buffer a block
    const pinnedBytes = blockBuffers([...pinned].map((k) => [k, recordOf.get(k)]));
    const bytes = await abortable(
      files.fetchAll(records, (r) => !streamedFiles.has(r.path), pinnedBytes.placeOf), signal,
      `loading ${base}: the download`);
    stopIf("after the download");
    const fetchedAt = now();
    // key -> {record, prepared, variants: {name: prepared}, variantRecords: {name: record}}
    const blocks = new Map();
    for (const c of m.components) {
      for (const b of c.blocks) {
        const key = `${c.name}/${b.name}`;
        stopIf(`while preparing block ${key}`);
        const variants = {};
        const variantRecords = {};
        for (const [name, v] of Object.entries(b.variants || {})) {
          // a variant reads the block's weights; a chunked component's "first" has
          // inputs and outputs of its own
          variantRecords[name] = { ...b, ...v };
          variants[name] = await executor.prepareFrom(
            bytes.get(executor.graphOf(v)), `${key}.${name}`, variantRecords[name]);
        }
        const prepared = await executor.prepareFrom(bytes.get(executor.graphOf(b)), key, b);
        blocks.set(key, { component: c.name, record: b, prepared, variants, variantRecords });
      }
    }
    const kept = pinnedBytes.buffers;
    for (const key of pinned) for (const p of shardPaths(recordOf.get(key))) bytes.delete(p);
    // on WebGPU a block's bytes are free once uploaded: one buffer reads the next block
    const source = new BlockBytes(
      files, (k) => shardFiles(recordOf.get(k)), kept, { slots: onGpu ? 1 : 2 });
    const weights = new GpuWeights(
      executor, sizes, (k) => recordOf.get(k).weights.tensors, source, pinned);
    const compiledAt = now();
    if (tune && onGpu) {
      for (const key of transformerKeys) {
        stopIf(`while timing the kernels of ${key}`);
        const b = blocks.get(key);
        for (const prepared of [b.prepared, ...Object.values(b.variants)]) {
          if (!prepared.calls.some((c) => c.key && !executor.choices.has(c.key))) continue;
          const inputs = {};
          for (const s of b.record.inputs) {
            inputs[s.name] = executor.storageBuffer(byteSize(s.shape, s.dtype));
          }
          const w = await weights.acquire(key);
          await executor.tune(prepared, inputs, w);
          weights.release(key, w);
          for (const buf of Object.values(inputs)) buf.destroy();
        }
      }
    }
    const tunedAt = now();
    stopIf("before timing a block");
    // what one transformer block costs here, for the expected time shown before Generate
    const probe = blocks.get(probeKey);
    const probeWeights = await weights.acquire(probeKey);
    const blockMs = choice.timings && choice.timings[`${executor.path}_ms`] !== undefined
      && choice.timings.block === probeKey
      ? choice.timings[`${executor.path}_ms`]
      : await timeBlock(executor, probe.prepared, probe.record, probeWeights);
    weights.release(probeKey, probeWeights);
    const tokenizer = CaptionTokenizer.fromManifest(
      JSON.parse(new TextDecoder().decode(bytes.get(m.tokenizer.files[0].path))), m.tokenizer);
    const nullRecord = m.conditioning.null_caption;
    const nullCaption = nullRecord ? parseNpy(bytes.get(nullRecord.path), nullRecord.path) : null;
    const pipe = new Pipeline(
      files, executor, blocks, weights, tokenizer, nullCaption, gpu.adapter);
    pipe.path = {
      name: executor.path, why: choice.why, timings: choice.timings, budget: parseSize(budget),
      held_in: onGpu ? "GPU memory" : "page memory",
    };
    pipe.loadFigures = {
      fetch_s: fetchedAt - started, compile_s: compiledAt - fetchedAt, tune_s: tunedAt - compiledAt,
      ...executor.figures(), block_ms: { [probeKey]: blockMs },
      bytes: records.reduce((n, r) => n + r.bytes, 0), from_cache: files.fromCache,
      refetched: files.refetched, interrupted: files.interrupted, cache_failure: files.cacheFailure,
      pinned: [...weights.pinned],
    };
    return pipe;
  }

  // Seconds the transformer is expected to take for `steps` steps: the probed block stands
  // for each block between the prologue and the epilogue (which cost little).
  expectedTransformerSeconds(steps) {
    const ms = Object.values(this.loadFigures.block_ms)[0];
    return (steps * Math.max(1, this.keys("transformer").length - 2) * ms) / 1000;
  }

  keys(component) {
    return [...this.blocks.keys()].filter((k) => this.blocks.get(k).component === component);
  }

  upload(array) {
    return this.executor.upload(array);
  }

  // Run blocks in order; feeds: {name: buffer of the path}. Blocks pass outputs on by name.
  // variant: a call's variant, as each block runs it (blockVariant: "tdtm" where a block
  // merges, the block elsewhere). then: the block that runs after the last of `keys` (read
  // ahead from storage if streamed).
  async runBlocks(keys, feeds, variant = null, temp = [], then = null) {
    for (const [i, key] of keys.entries()) {
      const b = this.blocks.get(key);
      const runsAs = blockVariant(b.variants, variant, key);
      const prepared = runsAs ? b.variants[runsAs] : b.prepared;
      const record = runsAs ? b.variantRecords[runsAs] : b.record;
      const inputs = {};
      for (const s of record.inputs) {
        if (!feeds[s.name]) throw new Error(`block ${key}: input ${s.name} was not computed`);
        inputs[s.name] = feeds[s.name];
      }
      const w = await this.weights.acquire(key, keys[i + 1] ?? then);
      const t0 = now();
      const outs = await this.executor.run(prepared, inputs, w);
      this.computeS += now() - t0;
      this.weights.release(key, w);
      feeds = { ...feeds };
      record.outputs.forEach((s, i) => { feeds[s.name] = outs[i]; temp.push(outs[i]); });
    }
    return feeds;
  }

  async read(buffer, shape) {
    return new Float32Array(await this.executor.read(buffer, byteSize(shape, "float32")));
  }

  signature(key, name, io = "outputs", variant = null) {
    const b = this.blocks.get(key);
    const runsAs = blockVariant(b.variants, variant, key);
    const record = runsAs ? b.variantRecords[runsAs] : b.record;
    return record[io].find((s) => s.name === name).shape;
  }

  async encodePrompt(prompt) {
    const { ids, mask, truncated } = this.tokenizer.encode(prompt);
    const temp = [];
    const feeds = await this.runBlocks(
      this.keys("text_encoder"),
      { input_ids: this.upload(ids), attention_mask: this.upload(mask) }, null, temp);
    const keys = this.keys("text_encoder");
    const hidden = await this.read(feeds.hidden, this.signature(keys[keys.length - 1], "hidden"));
    for (const b of temp) b.destroy();
    return { hidden, mask, truncated };
  }

  // The embedding API's generate (docs/web.md): the Python runtime's option names and
  // meanings. options: seed (default 0: a Number up to 2^53 - 1, a BigInt or a decimal string
  // up to 2^63 - 1; the noise torch.randn draws for it, as the Python runtime does: noise.js)
  // or latents (the initial noise, a Float32Array in diffusers' layout; `noise` is its old
  // name), not both; negative_prompt (the unconditional pass's text instead of the package's
  // null caption); any sampler setting (steps, guidance, leap, merge_steps, cache_threshold,
  // ...); onStep(done, total); signal (an AbortSignal, checked before each step).
  // output_type: "uint8" (default), "float" or "latent".
  // Returns {frames: Uint8Array (T, H, W, 3), shape: [T, H, W, 3]}; for "float" frames is a
  // Float32Array in [0, 1] (the video before rounding); for "latent" {latents: Float32Array,
  // shape: the manifest's latent_shape}, the denoised latents, nothing decoded.
  async generate(prompt, options = {}) {
    const request = this.checkRequest(prompt, options); // refusals: before any work
    if (this.running) {
      throw new Error("generate() is already running on this pipeline: one generation " +
                      "at a time; await it (or abort it through its signal) first");
    }
    this.running = true;
    try {
      return await this.run(prompt, request);
    } finally {
      this.running = false;
    }
  }

  // generate()'s arguments, checked in the Python runtime's order -> what run() needs
  checkRequest(prompt, options) {
    checkText("prompt", prompt);
    if (options === null || typeof options !== "object" || Array.isArray(options)) {
      throw new Error(`generate options must be an object, got ${show(options)}`);
    }
    refuseUnknown(options, [...GENERATE_OPTIONS, ...Object.keys(DEFAULT_SETTINGS)], "generate");
    const {
      negative_prompt = null, seed = null, latents = null, noise = null, onStep = null,
      signal = null, decode_timestep = null, decode_noise_scale = null, decode_noise = null,
      output_type = "uint8", ...overrides
    } = options;
    if (!OUTPUT_TYPES.includes(output_type)) {
      throw new Error(`output_type ${show(output_type)}: one of ${OUTPUT_TYPES.join(", ")}`);
    }
    if (latents !== null && noise !== null) {
      throw new Error("latents and noise given together: noise is " +
                      "the old name of latents, so give latents");
    }
    if (seed !== null && latents !== null) {
      throw new Error("seed and latents given together: the " +
                      "latents are the initial noise, so give one");
    }
    if (seed !== null && noise !== null) {
      throw new Error("seed and noise given together: the noise " +
                      "is the initial latents, so give one");
    }
    // the initial noise given, under the name it was given by (for the refusals)
    const [givenName, given] = noise !== null ? ["noise", noise] : ["latents", latents];
    const drawn = given === null;
    const seedValue = drawn ? checkSeed(seed ?? 0) : null;
    if (drawn) checkNoise(this.manifest, this.files.url("manifest.json"));
    if (negative_prompt !== null) checkText("negative_prompt", negative_prompt);
    const givenLatents = drawn ? null : checkLatents(givenName, given, this.latentShape);
    if (onStep !== null && typeof onStep !== "function") {
      throw new Error(`onStep must be a function (done, total), got ${show(onStep)}`);
    }
    checkSignal("signal", signal);
    const settings = settingsWith(this.manifest.sampler, overrides);
    if (settings.merge_steps > 0
        && !this.keys("transformer").some((k) => this.blocks.get(k).variants.tdtm)) {
      throw new Error(`merge_steps=${settings.merge_steps}: this ` +
                      "package has no 'tdtm' transformer variants");
    }
    const decode = this.decodeSettings(decode_timestep, decode_noise_scale, decode_noise, drawn);
    // drawn once every check passed: Wan's 2 M values take milliseconds a refusal need not spend
    const n = this.latentShape.reduce((a, b) => a * b, 1);
    let x0 = givenLatents;
    if (x0 === null && decode?.drawNoise) {
      // diffusers draws the decode noise from the pipeline's generator after the latents
      [x0, decode.noise] = torchRandnDraws([n, n], seedValue);
    } else if (x0 === null) {
      x0 = torchRandn(n, seedValue);
    }
    return {
      x0, settings, negative: negative_prompt, onStep, signal, decode, outputType: output_type,
    };
  }

  // A timestep-conditioned decoder's inputs (the manifest's `decode`; the Python runtime's
  // _decode_conditioning): the timestep, given or the manifest's; the noise scale, given,
  // else the manifest's, else the timestep's value (diffusers' decode_noise_scale=None); the
  // noise, given, else zeros at scale 0, else the seed's second draw (drawNoise). Without
  // `decode` any of them is refused. -> {t, s, noise, drawNoise} or null
  decodeSettings(timestep, noiseScale, noise, drawn) {
    const spec = this.manifest.decode;
    if (spec === undefined || spec === null) {
      if (timestep !== null || noiseScale !== null || noise !== null) {
        throw new Error("this package's decoder takes no decode timestep " +
                        "or noise (the manifest has no 'decode')");
      }
      return null;
    }
    const given = [["decode_timestep", timestep], ["decode_noise_scale", noiseScale]];
    for (const [name, value] of given) {
      if (value !== null && (typeof value !== "number" || !Number.isFinite(value))) {
        throw new Error(`${name} ${show(value)} must be a finite number`);
      }
    }
    const t = timestep ?? spec.timestep;
    const s = noiseScale ?? spec.noise_scale ?? t;
    if (noise !== null) {
      const checked = checkLatents("decode_noise", noise, this.latentShape);
      return { t, s, noise: checked, drawNoise: false };
    }
    const n = this.latentShape.reduce((a, b) => a * b, 1);
    // mixed in with weight 0
    if (s === 0) return { t, s, noise: new Float32Array(n), drawNoise: false };
    if (!drawn) {
      throw new Error(`decode noise scale ${s} with given latents: pass ` +
                      "decode_noise too (diffusers draws it from the " +
                      "pipeline's generator), or decode_noise_scale: 0");
    }
    return { t, s, noise: null, drawNoise: true };
  }

  // The prompt's caption alone, for a generation with no guided call -> [caption, mask,
  // truncated], laid out as guidanceCaptions' first half
  async promptCaption(prompt) {
    const { hidden, mask, truncated } = await this.encodePrompt(prompt);
    const caption2 = new Float32Array(2 * hidden.length);
    const mask2 = new Int32Array(2 * mask.length);
    caption2.set(hidden, 0);
    mask2.set(mask, 0);
    return [caption2, mask2, truncated];
  }

  // The caption pair of classifier-free guidance: the prompt's, then the unconditional one
  // (the negative prompt encoded, else the package's null caption or negative prompt)
  // -> [caption2, mask2, truncated]
  async guidanceCaptions(prompt, negative) {
    const { hidden, mask, truncated } = await this.encodePrompt(prompt);
    const tokens = mask.length;
    const dim = hidden.length / tokens;
    const caption2 = new Float32Array(2 * tokens * dim);
    const mask2 = new Int32Array(2 * tokens).fill(1); // the null caption attends to every token
    caption2.set(hidden, 0);
    mask2.set(mask, 0);
    const text = negative ?? this.negativePrompt;
    if (text === null) {
      caption2.set(this.nullCaption.data, tokens * dim);
      // the manifest's null_caption_mask: as the prompt's (Open-Sora), else every token
      if (this.manifest.null_caption_mask === "prompt") mask2.set(mask, tokens);
    } else {
      const other = await this.encodePrompt(text);
      caption2.set(other.hidden, tokens * dim);
      mask2.set(other.mask, tokens);
    }
    return [caption2, mask2, truncated];
  }

  // a generation as encode -> denoise -> decode, each phase's wall seconds in one clock
  async run(prompt, { x0, settings, negative, onStep, signal, decode, outputType }) {
    // cancellation between steps: the error names where it stopped (err.step: the step that
    // did not run, 1-based; 0 before the text encoder)
    let done = 0, total = settings.steps;
    const stopIf = (where, step) => {
      if (signal?.aborted) {
        throw abortError(`generation cancelled ${where} (the signal was aborted)`,
                         { step, stepsDone: done });
      }
    };
    const stepped = (d, t) => { done = d; total = t; if (onStep) onStep(d, t); };
    stopIf("before the text encoder", 0);
    const clock = new PhaseClock();
    const before = {
      uploads: this.weights.stats.uploads, streamed: { ...this.weights.source.stats },
    };
    this.computeS = 0;
    const captions = await clock.phase("text_encoder", () => this.encode(prompt, negative,
                                                                         settings));
    let denoised;
    try {
      denoised = await clock.phase("transformer", () => this.denoise(
        x0, settings, captions, stepped, (step) =>
          stopIf(`before step ${step} of ${total} (${done} done)`, step)));
    } finally { // also when cancelled: the pipeline stays usable and leaks nothing
      captions.destroy();
    }
    stopIf(`after step ${done} of ${total}, before the VAE decoder`, done + 1);
    const frames = await clock.phase("vae_decoder", () => outputType === "latent"
      ? { latents: denoised.latents, shape: [...this.latentShape] }
      : this.decode(denoised.latents, decode, outputType));
    this.lastRun = this.runFigures(clock.finish(), denoised, captions.truncated, before);
    return frames;
  }

  // the captions every transformer call takes, uploaded: the guidance pair (the caption's
  // half first) and the caption's half alone; which calls may run that half alone
  async encode(prompt, negative, settings) {
    // a call without guidance runs the caption's half alone where every transformer block
    // has that variant (`unguided`; `tdtm_unguided` for a merged call), else the pair;
    // decided once a generation, for unmerged and merged calls
    const runsAlone = (merged) => this.keys("transformer").every((k) => {
      try {
        return blockVariant(this.blocks.get(k).variants, callVariant(merged, true), k) !== null;
      } catch {
        return false;
      }
    });
    const aloneUnmerged = runsAlone(false), aloneMerged = runsAlone(true);
    // no call guided and the caption's half runnable alone: no unconditional caption to encode
    const [caption2, mask2, truncated] = guidedCall(settings, 0) || !aloneUnmerged
      ? await this.guidanceCaptions(prompt, negative) : await this.promptCaption(prompt);
    const buffers = {
      caption: this.upload(caption2), mask: this.upload(mask2),
      // the caption's half for the calls run alone (a copy: a buffer is bound whole)
      captionOne: this.upload(caption2.subarray(0, caption2.length / 2)),
      maskOne: this.upload(mask2.subarray(0, mask2.length / 2)),
    };
    return {
      ...buffers, truncated, aloneUnmerged, aloneMerged,
      destroy: () => { for (const b of Object.values(buffers)) b.destroy(); },
    };
  }

  // the sampler's loop over the transformer from the initial latents `x0`; `beforeCall(step)`
  // may stop it (cancellation), `stepped(done, total)` hears each step
  async denoise(x0, settings, captions, stepped, beforeCall) {
    const n = x0.length;
    const [prologue, ...rest] = this.keys("transformer");
    const epilogue = rest.pop();
    const pairs = rest;
    const batches = [];
    const predict = async (x, t, step) => {
      beforeCall(step.index + 1);
      const temp = [];
      const one = !step.guided && (step.merged ? captions.aloneMerged : captions.aloneUnmerged);
      const variant = callVariant(step.merged, one);
      const xShape = this.signature(prologue, "x", "outputs", variant);
      const tmodShape = this.signature(prologue, "t_mod", "outputs", variant);
      const velocityShape = this.signature(epilogue, "velocity", "outputs", variant);
      const latent = new Float32Array((one ? 1 : 2) * n);
      latent.set(x, 0);
      if (!one) latent.set(x, n);
      batches.push(one ? 1 : 2);
      const inputs = {
        latent: this.upload(latent), t: this.upload(new Float32Array(one ? [t] : [t, t])),
        caption: one ? captions.captionOne : captions.caption,
        caption_mask: one ? captions.maskOne : captions.mask,
      };
      temp.push(inputs.latent, inputs.t);
      let feeds = await this.runBlocks([prologue], inputs, variant, temp);
      if (step.cache === null) {
        feeds = await this.runBlocks(pairs, feeds, variant, temp);
      } else {
        const tokensX = await this.read(feeds.x, xShape);
        const tMod = await this.read(feeds.t_mod, tmodShape);
        const [after] = await runPairs(step, tokensX, tMod, async (h) => {
          const out = await this.runBlocks(pairs, { ...feeds, x: this.upload(h) }, variant, temp);
          temp.push(out.x);
          return this.read(out.x, xShape);
        }, xShape[0], xShape[xShape.length - 1]);
        const xBuf = this.upload(after);
        temp.push(xBuf);
        feeds = { ...feeds, x: xBuf };
      }
      feeds = await this.runBlocks([epilogue], feeds, variant, temp);
      const v = await this.read(feeds.velocity, velocityShape);
      for (const b of temp) b.destroy();
      // an unguided call run as the pair (a package without the unguided variants) keeps
      // the caption's half
      return [v.subarray(0, n), step.guided ? v.subarray(n, 2 * n) : null];
    };
    const trace = {};
    const latents = await sample(predict, x0, settings, stepped, trace);
    return { latents, trace, batches };
  }

  // lastRun: the phases' walls, the transformer's calls, and where the weights were held and
  // what was read from storage since `before` (the counters when the generation began)
  runFigures(wallS, { trace, batches }, truncated, before) {
    const streamed = this.weights.source.stats;
    const was = before.streamed;
    return {
      wall_s: wallS,
      compute_submit_s: this.computeS,
      transformer_calls: trace.transformer_calls,
      // rows a call ran: 2 guided (or run as the pair), 1 alone
      transformer_batches: batches,
      sampler: trace,
      prompt_truncated: truncated,
      weight_uploads: this.weights.stats.uploads - before.uploads,
      peak_gpu_weight_bytes: this.weights.stats.peakHeldBytes,
      weights: {
        held_in: this.path.held_in, budget: this.path.budget,
        stored_as: this.manifest.web?.storage?.quantize ?? "fp32",
        peak_held_bytes: this.weights.stats.peakHeldBytes,
        streamed_reads: streamed.reads - was.reads,
        streamed_bytes: streamed.bytes - was.bytes, read_s: streamed.read_s - was.read_s,
        read_wait_s: streamed.wait_s - was.wait_s,
        peak_streamed_bytes: streamed.peak_streamed_bytes,
        // reads started while another block ran; reads that found both reused buffers held
        read_ahead: streamed.read_ahead - was.read_ahead,
        slot_misses: streamed.slot_misses - was.slot_misses,
        // WebGPU: how blocks reach the GPU (pieces through one scratch buffer, bytes in flight)
        upload: this.executor.uploadFigures(),
      },
    };
  }

  // latents (C, T, h, w) -> {frames: (T, H, W, 3), shape: [T, H, W, 3]}, frames a Uint8Array
  // or, for outputType "float", a Float32Array in [0, 1]; through the decoder's layout:
  // frames of images (C, h, w) in pieces of the decoder's batch, or a video (1, C, T, h, w)
  // that a chunked decoder takes piece by piece
  // decode: a timestep-conditioned decoder's inputs (decodeSettings), or null
  async decode(latents, decode = null, outputType = "uint8") {
    if ((this.manifest.latent_layout || "frames") === "video") {
      return this.decodeVideo(latents, decode, outputType);
    }
    return this.decodeFrames(latents, outputType);
  }

  async decodeVideo(latents, decode, outputType) {
    const extra = decode ? {
      decode_t: new Float32Array([decode.t]), decode_noise_scale: new Float32Array([decode.s]),
      decode_noise: decode.noise } : {};
    const tiling = this.tiling.vae_decoder;
    const { data, shape } = tiling?.applies(...this.latentShape.slice(-2))
      ? await this.decodeTiles(latents, tiling)
      : await this.runComponent(
        "vae_decoder", "z", latents, [1, ...this.latentShape], "frames", extra);
    const [, , t, H, W] = shape; // (1, 3, T, H, W); a tiled decoder's unclamped: store clamps
    const [video, store] = videoStore(t * H * W * 3, outputType);
    for (let ch = 0; ch < 3; ch++) {
      for (let f = 0; f < t; f++) {
        for (let i = 0; i < H * W; i++) {
          video[(f * H * W + i) * 3 + ch] = store(data[(ch * t + f) * H * W + i]);
        }
      }
    }
    return handBack(video, [t, H, W, 3]);
  }

  // latents (C, T, h, w) decoded a tile at a time, each tile through its size's programs
  // (tileVariant) and blended as it comes (tiles.js) -> {data, shape: (1, 3, T, H, W)}
  async decodeTiles(latents, tiling) {
    const [c, t, h, w] = this.latentShape;
    const base = this.signature(this.keys("vae_decoder")[0], "z", "inputs").slice(-2);
    const [rows, cols] = tiling.starts(h, w);
    let blended = null;
    let frames = 0;
    for (const [i, top] of rows.entries()) {
      for (const [j, left] of cols.entries()) {
        const size = tiling.sizeAt(top, left, h, w);
        const tile = latentTile(latents, [c, t, h, w], top, left, size);
        const { data, shape } = await this.runComponent(
          "vae_decoder", "z", tile, [1, c, t, ...size], "frames", {},
          (v) => tileVariant(v, size, base));
        blended ??= new BlendedTiles(tiling, h, w, shape[1] * shape[2]);
        blended.add(i, j, data, shape[3], shape[4]);
        frames = shape[2];
      }
    }
    return { data: blended.output, shape: [1, 3, frames, blended.H, blended.W] };
  }

  // A component given one host array `input` (C-ordered, `shape`) -> its output `output` as
  // {data, shape} on the host: run once, or piece by piece where the manifest says it is
  // chunked (the first piece through the first variant, each piece's state fed to the next,
  // the outputs joined), holding one piece's activations at a time.
  // asTile: the variant each call runs for the one it would run untiled (a tile's programs)
  async runComponent(name, input, data, shape, output, extra = {}, asTile = (v) => v) {
    const keys = this.keys(name);
    const spec = this.chunking[name]
      || { input, output, axis: 0, size: shape[0], first_variant: null, state: [] };
    const bounds = pieceBounds(spec, shape, name);
    const pieces = [];
    let state = {};
    // inputs besides the chunked one, whole on every piece (a conditioned decoder's)
    const given = Object.fromEntries(Object.entries(extra).map(([n, a]) => [n, this.upload(a)]));
    try {
      for (const [i, [start, stop]] of bounds.entries()) {
        // no first_variant: every piece through the blocks themselves (pieces decoded alone)
        const variant = asTile(i === 0 ? spec.first_variant ?? null : null);
        const temp = [this.upload(sliceAlong(data, shape, spec.axis, start, stop - start))];
        let feeds = null;
        try {
          const then = i + 1 < bounds.length ? keys[0] : null; // the next piece's first block
          feeds = await this.runBlocks(
            keys, { ...state, ...given, [input]: temp[0] }, variant, temp, then);
          const outShape = this.signature(keys[keys.length - 1], output, "outputs", variant);
          pieces.push({ data: await this.read(feeds[output], outShape), shape: outShape });
        } finally { // the state goes on to the next piece; every other buffer is freed
          const next = feeds ? Object.fromEntries(spec.state.map((n) => [n, feeds[n]])) : {};
          const kept = new Set(Object.values(next));
          for (const b of [...temp, ...Object.values(state)]) if (!kept.has(b)) b.destroy();
          state = next;
        }
      }
    } finally {
      for (const b of [...Object.values(state), ...Object.values(given)]) b.destroy();
    }
    return concatAlong(pieces, spec.output_axis ?? spec.axis);
  }

  async decodeFrames(latents, outputType) {
    const [c, t, h, w] = this.latentShape;
    const keys = this.keys("vae_decoder");
    const chunk = this.signature(keys[0], "z", "inputs")[0];
    const outShape = this.signature(keys[keys.length - 1], "frames"); // (chunk, 3, H, W)
    const [, , H, W] = outShape;
    const [video, store] = videoStore(t * H * W * 3, outputType);
    for (let f0 = 0; f0 < t; f0 += chunk) {
      const z = new Float32Array(chunk * c * h * w); // (frames, C, h, w); past the end: zeros
      for (let f = 0; f < chunk && f0 + f < t; f++) {
        for (let ci = 0; ci < c; ci++) {
          z.set(latents.subarray((ci * t + f0 + f) * h * w, (ci * t + f0 + f + 1) * h * w),
                (f * c + ci) * h * w);
        }
      }
      const temp = [];
      const zBuf = this.upload(z);
      temp.push(zBuf);
      const feeds = await this.runBlocks(keys, { z: zBuf }, null, temp);
      const frames = await this.read(feeds.frames, outShape);
      for (const b of temp) b.destroy();
      for (let f = 0; f < chunk && f0 + f < t; f++) {
        for (let y = 0; y < H; y++) {
          for (let x = 0; x < W; x++) {
            for (let ch = 0; ch < 3; ch++) {
              video[(((f0 + f) * H + y) * W + x) * 3 + ch] =
                store(frames[((f * 3 + ch) * H + y) * W + x]);
            }
          }
        }
      }
    }
    return handBack(video, [t, H, W, 3]);
  }

  destroy() {
    this.weights.destroy();
    this.executor.destroy();
  }
}
