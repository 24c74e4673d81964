// The wasm path: runs blocks' ONNX graphs (graphs/<component>/<block>.onnx, weights as graph
// inputs) with onnxruntime-web's wasm provider, behind the calls WebPipeline makes of
// PlanExecutor (executor.js), so one pipeline drives either path.
//
// onnxruntime-web is never run unchecked: its three files are fetched through PackageFiles
// (retries, the Cache API, size + SHA-256 against the manifest's `web.ort`), then the entry
// module is imported from a blob URL of the checked bytes, and the glue module and the
// WebAssembly binary are handed to it the same way (env.wasm.wasmPaths.mjs, wasmBinary).
import { PackageError } from "./loader.js";

export class OrtUnavailable extends Error {}

const ENTRY = "ort.wasm.min.mjs";
const GLUE = "ort-wasm-simd-threaded.mjs";
const BINARY = "ort-wasm-simd-threaded.wasm";
const TYPED = { float32: Float32Array, int32: Int32Array };

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
  const bytes = data instanceof ArrayBuffer ? new Uint8Array(data) : new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  if (bytes.byteOffset % Type.BYTES_PER_ELEMENT === 0) return new Type(bytes.buffer, bytes.byteOffset, bytes.byteLength / Type.BYTES_PER_ELEMENT);
  return new Type(bytes.slice().buffer);
}

// onnxruntime-web from the manifest's location, every file checked first. files: the
// package's PackageFiles; ortRecord: manifest.web.ort.
export async function loadOrt(files, ortRecord) {
  if (!ortRecord) throw new OrtUnavailable("this package has no wasm path (exported before edge had one): export it again");
  const base = new URL(ortRecord.base, files.base).href;
  const bytes = {};
  for (const f of ortRecord.files) {
    const record = { path: new URL(f.name, base).href, bytes: f.bytes, sha256: f.sha256 };
    try {
      bytes[f.name] = await files.fetchFile(record);
    } catch (err) {
      const why = err instanceof PackageError ? err.message : `${err.name}: ${err.message}`;
      throw new OrtUnavailable(`onnxruntime-web ${ortRecord.version} could not be loaded from ${base} (${why}); nothing was run`);
    }
  }
  const blobUrl = (name) => URL.createObjectURL(new Blob([bytes[name]], { type: "text/javascript" }));
  let ort;
  try {
    ort = await import(blobUrl(ENTRY));
  } catch (err) {
    throw new OrtUnavailable(`onnxruntime-web ${ortRecord.version} (${base}${ENTRY}) did not load: ${err.message}`);
  }
  ort.env.wasm.wasmPaths = { mjs: blobUrl(GLUE) };
  ort.env.wasm.wasmBinary = bytes[BINARY];
  // threads need SharedArrayBuffer, which only a cross-origin isolated page has (edge serve
  // sends the headers); elsewhere onnxruntime runs on one thread
  ort.env.wasm.numThreads = globalThis.crossOriginIsolated ? Math.min(navigator.hardwareConcurrency || 1, 8) : 1;
  return ort;
}

export class OrtExecutor {
  constructor(ort) {
    this.ort = ort;
    this.path = "wasm";
    this.sessions = [];
  }

  static async create(files, ortRecord) {
    return new OrtExecutor(await loadOrt(files, ortRecord));
  }

  // the file holding a block's (or a variant's) graph on this path
  graphOf(record) {
    return record.wasm.graph;
  }

  // bytes: the ONNX graph; block: the block's manifest record (inputs, outputs, tensors)
  async prepareFrom(bytes, label, block) {
    let session;
    try {
      session = await this.ort.InferenceSession.create(new Uint8Array(bytes), { executionProviders: ["wasm"], graphOptimizationLevel: "all" });
    } catch (err) {
      throw new Error(`block ${label}: onnxruntime-web could not load its graph (${err.message})`);
    }
    this.sessions.push(session);
    return { session, block, label };
  }

  upload(data) {
    return new HostTensor(data);
  }

  // inputs: {name: HostTensor}; weights: {tensor name: HostTensor of its bytes}
  async run(prepared, inputs, weights) {
    const { ort } = this;
    const feeds = {};
    for (const s of prepared.block.inputs) feeds[s.name] = new ort.Tensor(s.dtype, typed(inputs[s.name].data, s.dtype), s.shape);
    for (const t of prepared.block.weights.tensors) feeds[t.name] = new ort.Tensor(t.dtype, typed(weights[t.name].data, t.dtype), t.shape);
    const results = await prepared.session.run(feeds);
    return prepared.block.outputs.map((s) => {
      const out = results[`out:${s.name}`];
      if (!out) throw new Error(`block ${prepared.label}: the graph gave no output ${s.name}`);
      return new HostTensor(out.data);
    });
  }

  async read(tensor, bytes) {
    const d = tensor.data;
    return d.buffer.slice(d.byteOffset, d.byteOffset + bytes);
  }

  figures() {
    return { path: this.path, sessions: this.sessions.length, threads: this.ort.env.wasm.numThreads };
  }

  destroy() {
    for (const s of this.sessions) s.release().catch(() => {});
    this.sessions = [];
  }
}
