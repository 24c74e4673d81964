// Replays a block's static launch plan (written by exporters/web/tvm_plan.py) on WebGPU.
//
// A plan lists, in order, every kernel launch of the block with the buffers it binds, its
// grid and its uniform; plus the intermediate storages (TVM's static memory plan) and the
// buffers of the returned tensors. Value ids say where a tensor lives: `input:NAME`,
// `weight:NAME`, `const:N`, `storage:N` (intermediate, at a byte offset) or `output:N`.

import { decodedBytes, scaleNames, WeightDecoder } from "./decode.js";
import { shardHolding } from "./package_files.js";

// a block whose weights or intermediates are larger than the adapter can make or bind
export class AdapterLimitError extends Error {}

const BYTES = { float32: 4, int32: 4, uint32: 4 };
const MAX_GRID = 65535; // WebGPU maxComputeWorkgroupsPerDimension

export function byteSize(shape, dtype) {
  const per = BYTES[dtype];
  if (!per) throw new Error(`dtype ${dtype} has no WebGPU storage type`);
  return shape.reduce((a, b) => a * b, 1) * per;
}

function align4(n) {
  return Math.max(4, Math.ceil(n / 4) * 4);
}

function decodeBase64(text) {
  const raw = atob(text);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}

// TVM's WebGPU kernels fold a grid wider than the device limit into z and skip the
// workgroups past `packGridDimX` (their last index), as TVM's own runtime does.
function dispatchSize(grid) {
  const [x, y, z] = grid;
  if (y > MAX_GRID || z > 1) throw new Error(`grid ${grid} exceeds WebGPU limits`);
  if (x <= MAX_GRID) return { dims: [x, y, 1], pack: x - 1 };
  const zs = Math.ceil(x / MAX_GRID);
  return { dims: [Math.ceil(x / zs), y, zs], pack: x - 1 };
}

// FNV-1a of a string, for short stable keys of kernel choices
function fnv1a(text) {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193) >>> 0;
  return h.toString(16).padStart(8, "0");
}

const CHOICE_STORE = "edge-kernel-choices-v1";

export class PlanExecutor {
  constructor(device, adapterKey = "adapter") {
    this.device = device;
    this.path = "webgpu";
    this.viewsWeights = false; // uploadWeights copies the bytes to the GPU
    this.pipelines = new Map(); // WGSL text -> compute pipeline (pairs share kernels)
    this.uniforms = new Map(); // packGridDimX -> uniform buffer
    // JIT kernel choice: for calls the exporter gave several schedules, the index of the
    // fastest on this adapter, timed once and remembered per adapter (localStorage)
    this.adapterKey = adapterKey;
    this.choices = this.loadChoices();
    this.tuned = { timed: 0, alternative: 0 };
    // Intermediate storages shared by every block: blocks run one at a time, in queue order,
    // and a plan's storages hold nothing from one call to the next, so storage i is one
    // buffer of the largest size any plan asks for (one set per block held 2.27 GB of
    // GPU memory for Wan 1.3B's shapes). Not one buffer for all: a kernel reading one
    // storage and writing another would bind one buffer both read-only and writable, which
    // WebGPU refuses within a dispatch.
    this.storageSizes = []; // index -> bytes, the largest asked for
    this.storages = []; // index -> GPUBuffer, made (or remade larger) at the next bind
    // the latest run's work done (the queue runs in order: every earlier run's too): run()
    // returns once its work is submitted, so without a wait the page races ahead of a slow
    // GPU (settle)
    this.queueDone = null;
  }

  loadChoices() {
    try {
      const all = JSON.parse(globalThis.localStorage?.getItem(CHOICE_STORE) || "{}");
      return new Map(Object.entries(all[this.adapterKey] || {}));
    } catch {
      return new Map();
    }
  }

  saveChoices() {
    try {
      const all = JSON.parse(globalThis.localStorage?.getItem(CHOICE_STORE) || "{}");
      all[this.adapterKey] = Object.fromEntries(this.choices);
      globalThis.localStorage?.setItem(CHOICE_STORE, JSON.stringify(all));
    } catch { /* no storage: choices last for this page only */ }
  }

  static async create(adapter) {
    // the adapter's own limits: buffer sizes past the defaults (kernels bind at most the
    // default 8 storage buffers, exporters/web/tvm_plan.py MAX_STORAGE_BUFFERS)
    const limits = {};
    for (const k of ["maxStorageBuffersPerShaderStage", "maxStorageBufferBindingSize",
      "maxBufferSize", "maxComputeInvocationsPerWorkgroup", "maxComputeWorkgroupSizeX"]) {
      limits[k] = adapter.limits[k];
    }
    const device = await adapter.requestDevice({ requiredLimits: limits });
    const i = adapter.info || {};
    return new PlanExecutor(device, [i.vendor, i.architecture, i.device, i.description].join("|"));
  }

  async pipeline(name, wgsl) {
    let p = this.pipelines.get(wgsl);
    if (!p) {
      const module = this.device.createShaderModule({ code: wgsl, label: name });
      p = this.device.createComputePipelineAsync({
        layout: "auto", compute: { module, entryPoint: name }, label: name,
      }).catch(async (err) => {
        // the compiler's own messages say what is wrong with the WGSL
        const info = await module.getCompilationInfo();
        const lines = info.messages.map(
          (m) => `${m.type} at ${m.lineNum}:${m.linePos}: ${m.message}`);
        throw new Error(
          `kernel ${name} does not compile on this adapter: ${lines.join("; ") || err.message}`);
      });
      this.pipelines.set(wgsl, p);
    }
    return p;
  }

  uniform(pack) {
    let u = this.uniforms.get(pack);
    if (!u) {
      u = this.device.createBuffer({
        size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
      });
      this.device.queue.writeBuffer(u, 0, new Uint32Array([pack, 0, 0, 0]));
      this.uniforms.set(pack, u);
    }
    return u;
  }

  storageBuffer(bytes, label) {
    return this.device.createBuffer({
      size: align4(bytes), label,
      usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
    });
  }

  upload(data, label) {
    const bytes = data instanceof ArrayBuffer ? new Uint8Array(data)
      : new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    const buf = this.storageBuffer(bytes.byteLength, label);
    this.device.queue.writeBuffer(buf, 0, bytes, 0, bytes.byteLength);
    return buf;
  }

  // A block's weights from its weights bytes (ArrayBuffer) and manifest table: float32 GPU
  // buffers by name, stored forms decoded on the GPU (decode.js)
  // (written in pieces, a bounded number in flight: decode.js); the bytes may be let go once
  // it resolves
  async uploadWeights(bytes, tensors, label) {
    return this.weightDecoder().uploadBlock(bytes, tensors, label);
  }

  // since the page loaded: the pieces written, the scratch buffer's size, the most bytes
  // written and not yet done, the waits for the queue that bounded them
  uploadFigures() {
    const d = this.weightDecoder();
    return { chunk_bytes: d.chunkBytes, in_flight_limit: d.inFlightBytes, ...d.stats };
  }

  weightDecoder() {
    this.decoder ||= new WeightDecoder(this.device, (n, l) => this.storageBuffer(n, l));
    return this.decoder;
  }

  // Refuse a block whose buffers this adapter cannot make or bind, from its manifest record
  // alone (before any download): each weight is one float32 buffer bound whole, and the
  // plan's largest buffer and binding are recorded at export (`gpu`, exporters/web/tvm_plan.py).
  checkLimits(key, record) {
    const limits = this.device.limits;
    const refuse = (what, bytes, limit) => {
      if (bytes <= limits[limit]) return;
      throw new AdapterLimitError(`block ${key}: ${what} takes ${bytes} bytes on the ` +
                                  `GPU, past this adapter's ${limit} ` +
                                  `of ${limits[limit]} bytes; the WebGPU path cannot ` +
                                  "run this package here (the wasm path can: ?path=wasm)");
    };
    const scales = scaleNames(record.weights.tensors);
    for (const t of record.weights.tensors) {
      if (scales.has(t.name)) continue;
      const bytes = decodedBytes([t]);
      const what = `weight ${t.name} [${t.shape}] ` +
                   `(in ${shardHolding(record, t)}, decoded to float32)`;
      refuse(what, bytes, "maxBufferSize");
      refuse(what, bytes, "maxStorageBufferBindingSize");
    }
    const variants = Object.entries(record.variants || {}).map(([n, v]) => [` variant ${n}`, v]);
    for (const [name, r] of [["", record], ...variants]) {
      if (!r.gpu) continue; // exported before plans recorded their sizes: the weights above
      refuse(`the largest buffer of its launch plan${name} (${r.graph})`, r.gpu.largest_buffer,
             "maxBufferSize");
      refuse(`the largest tensor a kernel of its launch plan${name} (${r.graph}) binds`,
             r.gpu.largest_binding, "maxStorageBufferBindingSize");
    }
  }

  // the GPU bytes a block's weights take (what a budget counts)
  heldBytes(tensors) {
    return decodedBytes(tensors);
  }

  // the file holding a block's (or a variant's) graph on this path: its launch plan
  graphOf(record) {
    return record.graph;
  }

  async prepareFrom(bytes, label) {
    return this.prepare(JSON.parse(new TextDecoder().decode(bytes)), label);
  }

  figures() {
    return {
      path: this.path, kernels: this.pipelines.size,
      kernel_choices: { ...this.tuned, remembered: this.choices.size },
      storage_bytes: this.storageSizes.reduce((a, n) => a + align4(n), 0),
    };
  }

  // the shared buffer of storage i, at the largest size any prepared plan asks for; a buffer
  // outgrown is destroyed (work already submitted keeps it until done)
  sharedStorage(i) {
    const bytes = align4(this.storageSizes[i]);
    let buf = this.storages[i];
    if (!buf || buf.size < bytes) {
      buf?.destroy();
      buf = this.storageBuffer(bytes, `storage:${i}`);
      this.storages[i] = buf;
    }
    return buf;
  }

  destroy() {
    this.device.destroy();
  }

  // Compile a block's kernels, make its constant buffers and reserve its intermediate ones.
  // blockFile: {plan, kernels: {name: wgsl}} as the exporter writes it.
  async prepare(blockFile, label = "block") {
    const { plan, kernels } = blockFile;
    // one entry per call: its options (the exporter's schedules), each a list of launches
    const calls = [];
    for (const call of plan.calls) {
      const options = (call.choices || [call.kernels]).map((records) => records.map((k) => {
        const wgsl = kernels[k.kernel];
        if (!wgsl) throw new Error(`${label}: kernel ${k.kernel} missing from the block file`);
        return { call, record: k, pipeline: this.pipeline(k.kernel, wgsl) };
      }));
      const key = options.length > 1
        ? fnv1a(options.map((o) => o.map((l) => kernels[l.record.kernel]).join("")).join("|"))
        : null;
      calls.push({ call, options, key });
    }
    for (const c of calls) {
      for (const o of c.options) for (const l of o) l.pipeline = await l.pipeline;
    }
    const fixed = new Map();
    plan.constants.forEach((c, i) => fixed.set(
      `const:${i}`, this.upload(decodeBase64(c.base64), `${label} const:${i}`)));
    plan.storages.forEach((n, i) => {
      this.storageSizes[i] = Math.max(this.storageSizes[i] ?? 0, n);
    });
    return { label, plan, calls, fixed };
  }

  launches(block) {
    return block.calls.flatMap((c) => c.options[c.key ? (this.choices.get(c.key) ?? 0) : 0]);
  }

  // Time each option of the block's calls not yet decided on this adapter (its buffers bound
  // as in `run`; values do not matter for timing), keep the fastest, remember it.
  async tune(block, inputs, weights, repeats = 3) {
    const open = block.calls.filter((c) => c.key && !this.choices.has(c.key));
    if (!open.length) return;
    const { binding, outputs } = this.bind(block, inputs, weights);
    for (const c of open) {
      if (this.choices.has(c.key)) continue; // the same kernels earlier in this block
      const times = [];
      for (const option of c.options) {
        let best = Infinity;
        const rival = Math.min(...times);
        for (let r = 0; r < repeats && best < 4 * rival; r++) { // a clear loser runs once
          const encoder = this.device.createCommandEncoder();
          const pass = encoder.beginComputePass();
          this.encode(pass, option, binding);
          pass.end();
          const t0 = performance.now();
          this.device.queue.submit([encoder.finish()]);
          await this.device.queue.onSubmittedWorkDone();
          best = Math.min(best, performance.now() - t0);
        }
        times.push(best);
      }
      const pick = times.indexOf(Math.min(...times));
      this.choices.set(c.key, pick);
      this.tuned.timed += 1;
      this.tuned.alternative += pick > 0 ? 1 : 0;
    }
    for (const b of outputs) b.destroy();
    this.saveChoices();
  }

  encode(pass, launches, binding) {
    for (const { call, record, pipeline } of launches) {
      const { dims, pack } = dispatchSize(record.grid);
      // a binding past the call's arguments is one of its scratch buffers: what a kernel
      // leaves in global memory for the next kernel of the call (tvm_plan.add_scratch)
      const values = call.scratch ? call.args.concat(call.scratch) : call.args;
      const entries = record.bindings.map(
        (arg, slot) => ({ binding: slot, resource: binding(values[arg]) }));
      entries.push({ binding: record.uniform_binding, resource: { buffer: this.uniform(pack) } });
      pass.setPipeline(pipeline);
      pass.setBindGroup(
        0, this.device.createBindGroup({ layout: pipeline.getBindGroupLayout(0), entries }));
      pass.dispatchWorkgroups(...dims);
    }
  }

  // The buffer of every value of a run: fixed ones, the given inputs and weights, fresh
  // output buffers.
  bind(block, inputs, weights) {
    const { plan, fixed, label } = block;
    const buffers = new Map(fixed);
    plan.storages.forEach((_, i) => buffers.set(`storage:${i}`, this.sharedStorage(i)));
    for (const name of plan.inputs) {
      if (!inputs[name]) throw new Error(`${label}: input ${name} not given`);
      buffers.set(`input:${name}`, inputs[name]);
    }
    for (const name of plan.weights) {
      if (!weights[name]) throw new Error(`${label}: weight ${name} not loaded`);
      buffers.set(`weight:${name}`, weights[name]);
    }
    const outputs = plan.outputs_alloc.map((o, i) => {
      const b = this.storageBuffer(byteSize(o.shape, o.dtype), `${label} output:${i}`);
      buffers.set(`output:${i}`, b);
      return b;
    });
    const binding = (vid) => {
      const v = plan.values[vid];
      return {
        buffer: buffers.get(v.buffer), offset: v.offset, size: align4(byteSize(v.shape, v.dtype)),
      };
    };
    return { buffers, outputs, binding };
  }

  // Run a prepared block. inputs/weights: {name: GPUBuffer}. Returns {result index: GPUBuffer}
  // as a list in the plan's result order; the caller owns (and destroys) them.
  run(block, inputs, weights) {
    const { plan, label } = block;
    const { buffers, outputs, binding } = this.bind(block, inputs, weights);
    const encoder = this.device.createCommandEncoder({ label });
    const pass = encoder.beginComputePass({ label });
    this.encode(pass, this.launches(block), binding);
    pass.end();
    // a result that is not a whole output buffer (a view of an input, a storage, a reshape
    // at an offset) is copied out, so what is returned never aliases the plan's buffers
    const results = plan.results.map((vid) => {
      const v = plan.values[vid];
      const src = buffers.get(v.buffer);
      const n = byteSize(v.shape, v.dtype);
      if (v.buffer.startsWith("output:") && v.offset === 0 && src.size === align4(n)) return src;
      const dst = this.storageBuffer(n, `${label} result`);
      encoder.copyBufferToBuffer(src, v.offset, dst, 0, align4(n));
      return dst;
    });
    this.device.queue.submit([encoder.finish()]);
    this.queueDone = this.device.queue.onSubmittedWorkDone();
    const kept = new Set(results);
    for (const b of outputs) if (!kept.has(b)) b.destroy();
    return results;
  }

  // Wait until the runs queued so far are done.
  async settle() {
    await this.queueDone?.catch(() => {});
  }

  // fn() once the runs queued so far are done (a destroyed buffer is freed only then)
  afterDone(fn) {
    if (this.queueDone) this.queueDone.then(fn, fn);
    else fn();
  }

  async read(buffer, bytes) {
    const staging = this.device.createBuffer({
      size: align4(bytes), usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
    });
    const encoder = this.device.createCommandEncoder();
    encoder.copyBufferToBuffer(buffer, 0, staging, 0, align4(bytes));
    this.device.queue.submit([encoder.finish()]);
    await staging.mapAsync(GPUMapMode.READ);
    const copy = staging.getMappedRange(0, align4(bytes)).slice(0, bytes);
    staging.unmap();
    staging.destroy();
    return copy;
  }
}
