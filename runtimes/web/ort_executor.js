// The wasm path: runs blocks' ONNX graphs (graphs/<component>/<block>.onnx, weights as graph
// inputs) with onnxruntime-web's wasm provider, behind the calls Pipeline makes of
// PlanExecutor (executor.js), so one pipeline drives either path.
//
// onnxruntime-web is never run unchecked: its three files are fetched through PackageFiles
// (retries, the Cache API, size + SHA-256 against the manifest's `web.ort`), then the entry
// module is imported from a blob URL of the checked bytes, and the glue module and the
// WebAssembly binary are handed to it the same way (env.wasm.wasmPaths.mjs, wasmBinary).
//
// onnxruntime-web is loaded only when the wasm path is wanted (paths.js), and its failure
// (offline, the CDN blocked, a file that fails its digest) is an OrtUnavailable that paths.js
// catches: the WebGPU path needs none of it, so the page can still run there.
import { PackageError } from "./manifest.js";

// onnxruntime-web could not be had. `detail` says which URL and what failed, without what
// follows from it (the caller knows: the page stops, or runs on WebGPU instead); `url` is the
// file that failed (null where no file was tried), `base` the folder the manifest names.
export class OrtUnavailable extends Error {
  constructor(detail, {
    version = null, base = null, url = null, message = `${detail}; nothing was run`,
  } = {}) {
    super(message);
    Object.assign(this, { detail, version, base, url });
  }
}

// The last failure to load onnxruntime-web on this page ({version, base, url, detail}), or null
// once a load succeeds: the page reads it to say why the wasm path is missing, since the
// pipeline it gets back from a degraded load carries only the path that runs.
let lastFailure = null;
export function ortFailure() {
  return lastFailure;
}

const ENTRY = "ort.wasm.min.mjs";
const GLUE = "ort-wasm-simd-threaded.mjs";
const BINARY = "ort-wasm-simd-threaded.wasm";
// float16 as its bits (onnxruntime-web takes a Uint16Array for it); int8: --quantize 8;
// uint8: an int4 tensor's packed bytes (--quantize 4), which the graph unpacks
const TYPED = {
  float32: Float32Array, int32: Int32Array, float16: Uint16Array, int8: Int8Array,
  uint8: Uint8Array,
};

// The dtype and shape a weights table's tensor is fed as (manifest_schema.fed_as)
function fedAs(t) {
  return t.dtype === "int4" ? ["uint8", [t.bytes]] : [t.dtype, t.shape];
}

// A tensor in page memory: what upload() gives and run() returns on this path.
export class HostTensor {
  constructor(data) { this.data = data; }
  destroy() { this.data = null; }
}

// A view of `data`'s bytes as the dtype's typed array (a copy only where unaligned).
function typed(data, dtype) {
  const Type = TYPED[dtype];
  if (!Type) throw new Error(`dtype ${dtype} is not fed to the wasm path`);
  if (data instanceof Type) return data;
  const bytes = data instanceof ArrayBuffer ? new Uint8Array(data)
    : new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  if (bytes.byteOffset % Type.BYTES_PER_ELEMENT === 0) {
    return new Type(bytes.buffer, bytes.byteOffset, bytes.byteLength / Type.BYTES_PER_ELEMENT);
  }
  return new Type(bytes.slice().buffer);
}

// onnxruntime-web from the manifest's location, every file checked first. files: the
// package's PackageFiles; ortRecord: manifest.web.ort; threads: its threads (null: one a core
// up to 8 where the page is cross-origin isolated; always 1 where it is not). Throws
// OrtUnavailable, remembered for ortFailure().
// onnxruntime-web is imported once per page and thread count: a later load of a package
// naming the same files (by name and SHA-256, wherever they are served from) gets the module
// imported first, its WebAssembly instance and threads included (they are fixed when its first
// session is made); a failed import is forgotten, so a later load tries again.
const imported = new Map();

export async function loadOrt(files, ortRecord, threads = null) {
  const count = threadCount(threads);
  const key = ortRecord?.files
    ? JSON.stringify([count, ortRecord.files.map((f) => [f.name, f.sha256])]) : null;
  try {
    let pending = key && imported.get(key);
    if (!pending) {
      pending = fetchAndImport(files, ortRecord, count);
      if (key) imported.set(key, pending);
    }
    const ort = await pending;
    lastFailure = null;
    return ort;
  } catch (err) {
    if (key) imported.delete(key);
    if (err instanceof OrtUnavailable) {
      lastFailure = { version: err.version, base: err.base, url: err.url, detail: err.detail };
    }
    throw err;
  }
}

// threads need SharedArrayBuffer, which only a cross-origin isolated page has (edge serve
// sends the headers); elsewhere onnxruntime runs on one thread
function threadCount(threads) {
  if (!globalThis.crossOriginIsolated) return 1;
  return threads ?? Math.min(navigator.hardwareConcurrency || 1, 8);
}

async function fetchAndImport(files, ortRecord, threads) {
  if (!ortRecord) {
    const detail = "this package has no wasm path (exported before edge had one): export it again";
    throw new OrtUnavailable(detail, { message: detail });
  }
  const { version } = ortRecord;
  const base = new URL(ortRecord.base, files.base).href;
  const bytes = {};
  for (const f of ortRecord.files) {
    const record = { path: new URL(f.name, base).href, bytes: f.bytes, sha256: f.sha256 };
    try {
      bytes[f.name] = await files.fetchFile(record);
    } catch (err) {
      const why = err instanceof PackageError ? err.message : `${err.name}: ${err.message}`;
      throw new OrtUnavailable(`onnxruntime-web ${version} could not be loaded ` +
                               `from ${base} (${why})`, { version, base, url: record.path });
    }
  }
  const blobUrl = (name) => URL.createObjectURL(
    new Blob([bytes[name]], { type: "text/javascript" }));
  let ort;
  try {
    ort = await import(blobUrl(ENTRY));
  } catch (err) {
    const detail = `onnxruntime-web ${version} (${base}${ENTRY}) did not load: ${err.message}`;
    throw new OrtUnavailable(detail, { version, base, url: `${base}${ENTRY}`, message: detail });
  }
  ort.env.wasm.wasmPaths = { mjs: blobUrl(GLUE) };
  ort.env.wasm.wasmBinary = bytes[BINARY];
  ort.env.wasm.numThreads = threads;
  return ort;
}

export class OrtExecutor {
  constructor(ort) {
    this.ort = ort;
    this.path = "wasm";
    this.viewsWeights = true; // the weights fed are views of the block's bytes
    this.sessions = [];
  }

  static async create(files, ortRecord, threads = null) {
    return new OrtExecutor(await loadOrt(files, ortRecord, threads));
  }

  // the file holding a block's (or a variant's) graph on this path
  graphOf(record) {
    return record.wasm.graph;
  }

  // bytes: the ONNX graph; block: the block's manifest record (inputs, outputs, tensors)
  async prepareFrom(bytes, label, block) {
    let session;
    try {
      session = await this.ort.InferenceSession.create(new Uint8Array(bytes), {
        executionProviders: ["wasm"], graphOptimizationLevel: "all",
        // idle threads wait rather than spin: spinning takes the cores other tabs and
        // programs want (the Python runtime's measure: docs/benchmarks.md)
        extra: { session: { intra_op: { allow_spinning: "0" } } },
      });
    } catch (err) {
      throw new Error(`block ${label}: onnxruntime-web could not load its graph (${err.message})`);
    }
    this.sessions.push(session);
    return { session, block, label };
  }

  upload(data) {
    return new HostTensor(data);
  }

  // A block's weights as stored (the graph decodes them): {tensor name: HostTensor}
  async uploadWeights(bytes, tensors) {
    return Object.fromEntries(tensors.map(
      (t) => [t.name, new HostTensor(new Uint8Array(bytes, t.offset, t.bytes))]));
  }

  // nothing is copied anywhere (the WebGPU executor's: pieces written to the GPU)
  uploadFigures() {
    return null;
  }

  // the page memory a block's weights take
  heldBytes(tensors) {
    return tensors.reduce((n, t) => n + t.bytes, 0);
  }

  // inputs: {name: HostTensor}; weights: {tensor name: HostTensor of its bytes}
  async run(prepared, inputs, weights) {
    const { ort } = this;
    const feeds = {};
    for (const s of prepared.block.inputs) {
      feeds[s.name] = new ort.Tensor(s.dtype, typed(inputs[s.name].data, s.dtype), s.shape);
    }
    for (const t of prepared.block.weights.tensors) {
      const [dtype, shape] = fedAs(t);
      feeds[t.name] = new ort.Tensor(dtype, typed(weights[t.name].data, dtype), shape);
    }
    const results = await prepared.session.run(feeds);
    return prepared.block.outputs.map((s) => {
      const out = results[`out:${s.name}`];
      if (!out) throw new Error(`block ${prepared.label}: the graph gave no output ${s.name}`);
      return new HostTensor(out.data);
    });
  }

  // a call is done when run() returns: nothing is left in flight
  async settle() {}

  afterDone(fn) {
    fn();
  }

  async read(tensor, bytes) {
    const d = tensor.data;
    return d.buffer.slice(d.byteOffset, d.byteOffset + bytes);
  }

  figures() {
    return {
      path: this.path, sessions: this.sessions.length, threads: this.ort.env.wasm.numThreads,
    };
  }

  destroy() {
    for (const s of this.sessions) s.release().catch(() => {});
    this.sessions = [];
  }
}
