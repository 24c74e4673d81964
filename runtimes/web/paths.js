// Which path runs a web package's blocks here: our WebGPU kernels (executor.js) or
// onnxruntime-web's wasm provider (ort_executor.js).
//
// No WebGPU (no navigator.gpu, or no adapter) -> wasm. A hardware adapter -> WebGPU. A
// software adapter (isFallbackAdapter, or one of the CPU rasterisers by name: WebGPU emulated
// on the CPU) -> both paths are timed on one transformer block and the faster is kept,
// remembered per adapter and model in localStorage, as the kernel choices are.
import { PlanExecutor } from "./executor.js";
import { OrtExecutor } from "./ort_executor.js";

const STORE = "edge-path-choice-v1";
const SOFTWARE_ADAPTERS = /swiftshader|llvmpipe|lavapipe|softpipe|basic render|\bwarp\b/i;
const TYPED = { float32: Float32Array, int32: Int32Array };

export async function findAdapter() {
  if (typeof navigator === "undefined" || !navigator.gpu) {
    return { adapter: null, reason: "this browser has no WebGPU (navigator.gpu is missing)" };
  }
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) return { adapter: null, reason: "WebGPU gives no GPU adapter (disabled or blocklisted for this GPU)" };
  return { adapter, reason: null };
}

export function adapterLabel(adapter) {
  const i = adapter.info || {};
  return [i.vendor, i.architecture, i.description].filter(Boolean).join(" ") || "unnamed adapter";
}

export function isSoftwareAdapter(adapter) {
  const i = adapter.info || {};
  return Boolean(i.isFallbackAdapter || adapter.isFallbackAdapter) || SOFTWARE_ADAPTERS.test([i.vendor, i.architecture, i.device, i.description].join(" "));
}

function loadStore() {
  try {
    return JSON.parse(globalThis.localStorage?.getItem(STORE) || "{}");
  } catch {
    return {};
  }
}

export function rememberedChoice(key) {
  return loadStore()[key] || null;
}

function remember(key, choice) {
  try {
    const all = loadStore();
    all[key] = choice;
    globalThis.localStorage?.setItem(STORE, JSON.stringify(all));
  } catch { /* no storage: the choice lasts for this page */ }
}

export async function createExecutor(path, adapter, files) {
  return path === "wasm" ? OrtExecutor.create(files, files.manifest.web.ort) : PlanExecutor.create(adapter);
}

// Milliseconds one call of a block takes on an executor: inputs of zeros, outputs read back
// (so queued GPU work has finished). One warm-up call compiles kernels or sets up the
// session; then calls repeat for at least `runs` and for up to a second (WebAssembly runs
// baseline code until the browser's optimizing compiler catches up, a few calls in), and the
// median of the later half is the figure.
export async function timeBlock(executor, prepared, record, weights, runs = 3) {
  const once = async () => {
    const inputs = {};
    for (const s of record.inputs) inputs[s.name] = executor.upload(new TYPED[s.dtype](s.shape.reduce((a, b) => a * b, 1)));
    const t0 = performance.now();
    const outs = await executor.run(prepared, inputs, weights);
    for (let i = 0; i < outs.length; i++) await executor.read(outs[i], 4);
    const ms = performance.now() - t0;
    for (const b of [...outs, ...Object.values(inputs)]) b.destroy();
    return ms;
  };
  await once();
  const times = [];
  const started = performance.now();
  while (times.length < runs || (times.length < 24 && performance.now() - started < 1000)) times.push(await once());
  const later = times.slice(times.length >> 1).sort((a, b) => a - b);
  return later[later.length >> 1];
}

// One transformer block's graph and weights on an executor, for timing.
async function prepareProbe(executor, probe) {
  const prepared = await executor.prepareFrom(probe.graphs[executor.path], probe.key, probe.record);
  const weights = {};
  for (const t of probe.record.weights.tensors) weights[t.name] = executor.upload(new Uint8Array(probe.weightBytes, t.offset, t.bytes));
  return { prepared, weights };
}

export async function probeBlock(executor, probe) {
  const { prepared, weights } = await prepareProbe(executor, probe);
  const ms = await timeBlock(executor, prepared, probe.record, weights);
  for (const w of Object.values(weights)) w.destroy();
  return ms;
}

// -> {path, why, executor, timings}. asked: "webgpu" or "wasm" to skip the choice (the page's
// ?path=), or null. probe: {key, record, graphs: {webgpu, wasm} bytes, weightBytes}, fetched
// on demand by getProbe() (only a software adapter needs it).
export async function choosePath({ files, gpu, asked = null, modelKey, getProbe }) {
  const paths = (files.manifest.web && files.manifest.web.paths) || ["webgpu"];
  const make = async (path) => createExecutor(path, gpu.adapter, files);
  if (asked) {
    if (!paths.includes(asked)) throw new Error(`path ${JSON.stringify(asked)}: this package has ${paths.join(" and ")}`);
    if (asked === "webgpu" && !gpu.adapter) throw new Error(`path webgpu was asked for, but ${gpu.reason}`);
    return { path: asked, why: "asked for in the page's address (?path=)", executor: await make(asked), timings: null };
  }
  if (!gpu.adapter) {
    if (!paths.includes("wasm")) return { path: null, why: gpu.reason, executor: null, timings: null };
    return { path: "wasm", why: `${gpu.reason}: the CPU runs the model through onnxruntime-web`, executor: await make("wasm"), timings: null };
  }
  const label = adapterLabel(gpu.adapter);
  if (!paths.includes("wasm") || !isSoftwareAdapter(gpu.adapter)) {
    return { path: "webgpu", why: `GPU adapter ${label}`, executor: await make("webgpu"), timings: null };
  }
  const key = `${label}|${modelKey}`;
  const known = rememberedChoice(key);
  if (known) {
    return { path: known.path, why: `software GPU adapter (${label}): ${describe(known.timings)}, timed earlier on this adapter`, executor: await make(known.path), timings: known.timings };
  }
  const probe = await getProbe();
  const timings = { block: probe.key };
  const executors = {};
  for (const path of ["wasm", "webgpu"]) {
    executors[path] = await make(path);
    timings[`${path}_ms`] = await probeBlock(executors[path], probe);
  }
  const path = timings.wasm_ms <= timings.webgpu_ms ? "wasm" : "webgpu";
  executors[path === "wasm" ? "webgpu" : "wasm"].destroy();
  remember(key, { path, timings });
  return { path, why: `software GPU adapter (${label}): ${describe(timings)}, timed now`, executor: executors[path], timings };
}

function describe(t) {
  const faster = t.wasm_ms <= t.webgpu_ms ? "wasm" : "WebGPU";
  return `${faster} was faster on ${t.block} (wasm ${t.wasm_ms.toFixed(1)} ms, WebGPU ${t.webgpu_ms.toFixed(1)} ms)`;
}
