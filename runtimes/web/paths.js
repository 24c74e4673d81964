// Which path runs a web package's blocks here: our WebGPU kernels (executor.js) or
// onnxruntime-web's wasm provider (ort_executor.js).
//
// No WebGPU (no navigator.gpu, or no adapter) -> wasm. A hardware adapter -> WebGPU. A
// software adapter (isFallbackAdapter, or one of the CPU rasterisers by name: WebGPU emulated
// on the CPU) -> both paths are timed on one transformer block and the faster is kept,
// remembered per adapter and model in localStorage, as the kernel choices are. A package
// without the WebGPU path (`edge export --web-paths wasm`) runs wasm whatever the adapter.
//
// onnxruntime-web (the wasm path's engine) is fetched only where the wasm path may run, and
// where it cannot be had (offline, the CDN blocked, a file failing its digest) a page with an
// adapter runs on WebGPU, which needs none of it; only with neither path does the choice stop,
// naming both reasons. A page that asked for ?path=wasm is refused rather than switched to
// WebGPU behind its back (it asked to see that path), and told how to run on WebGPU.
import { PlanExecutor } from "./executor.js";
import { OrtExecutor, OrtUnavailable } from "./ort_executor.js";

const STORE = "edge-path-choice-v1";
const SOFTWARE_ADAPTERS = /swiftshader|llvmpipe|lavapipe|softpipe|basic render|\bwarp\b/i;
const TYPED = { float32: Float32Array, int32: Int32Array };

export async function findAdapter() {
  if (typeof navigator === "undefined" || !navigator.gpu) {
    return { adapter: null, reason: "this browser has no WebGPU (navigator.gpu is missing)" };
  }
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) {
    return {
      adapter: null,
      reason: "WebGPU gives no GPU adapter (disabled or blocklisted for this GPU)",
    };
  }
  return { adapter, reason: null };
}

export function adapterLabel(adapter) {
  const i = adapter.info || {};
  return [i.vendor, i.architecture, i.description].filter(Boolean).join(" ") || "unnamed adapter";
}

export function isSoftwareAdapter(adapter) {
  const i = adapter.info || {};
  return Boolean(i.isFallbackAdapter || adapter.isFallbackAdapter)
    || SOFTWARE_ADAPTERS.test([i.vendor, i.architecture, i.device, i.description].join(" "));
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

// threads: onnxruntime-web's threads on the wasm path (null: its default, see loadOrt)
export async function createExecutor(path, adapter, files, threads = null) {
  return path === "wasm" ? OrtExecutor.create(files, files.manifest.web.ort, threads)
    : PlanExecutor.create(adapter);
}

// No path can run here (or not the one asked for). reasons: {webgpu, wasm}, each null or why
// that path cannot run (wasm: the OrtUnavailable's {version, base, url, detail}), for the page
// to show and tests to read. The message begins with onnxruntime-web's failure, as the
// wasm-only error did before WebGPU could stand in (except where ?path=wasm was asked for).
export class NoPathAvailable extends Error {
  constructor(message, reasons) {
    super(message);
    this.reasons = reasons;
  }
}

// The wasm executor, or {missing: OrtUnavailable} where onnxruntime-web could not be had;
// any other error (a bug, not the network) still stops the load.
async function tryWasm(files, threads) {
  try {
    return { executor: await createExecutor("wasm", null, files, threads), missing: null };
  } catch (err) {
    if (!(err instanceof OrtUnavailable)) throw err;
    return { executor: null, missing: err };
  }
}

function ortReason(err) {
  return { version: err.version, base: err.base, url: err.url, detail: err.detail };
}

// onnxruntime-web is missing and so is WebGPU (gpu.reason)
function neitherPath(missing, gpu) {
  return new NoPathAvailable(`${missing.message}. The WebGPU path ` +
                             `cannot run instead: ${gpu.reason}.`,
    { webgpu: gpu.reason, wasm: ortReason(missing) });
}

// ?path=wasm asked for the wasm path and onnxruntime-web is missing: refused, saying whether
// the page would run without the ?path= (it would on WebGPU where there is an adapter)
function askedWasmMissing(missing, gpu) {
  const instead = gpu.adapter
    ? "open the page without ?path=wasm to run on WebGPU"
    : `the WebGPU path cannot run instead: ${gpu.reason}`;
  return new NoPathAvailable("?path=wasm asks for the wasm path, " +
                             `but ${missing.detail}; nothing was run: ${instead}.`,
    { webgpu: gpu.adapter ? null : gpu.reason, wasm: ortReason(missing) });
}

// Milliseconds one call of a block takes on an executor: inputs of zeros, outputs read back
// (so queued GPU work has finished). One warm-up call compiles kernels or sets up the
// session; then calls repeat for at least `runs` and for up to a second (WebAssembly runs
// baseline code until the browser's optimizing compiler catches up, a few calls in), and the
// median of the later half is the figure.
export async function timeBlock(executor, prepared, record, weights, runs = 3) {
  const once = async () => {
    const inputs = {};
    for (const s of record.inputs) {
      inputs[s.name] = executor.upload(new TYPED[s.dtype](s.shape.reduce((a, b) => a * b, 1)));
    }
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
  while (times.length < runs || (times.length < 24 && performance.now() - started < 1000)) {
    times.push(await once());
  }
  const later = times.slice(times.length >> 1).sort((a, b) => a - b);
  return later[later.length >> 1];
}

// One transformer block's graph and weights on an executor, for timing.
async function prepareProbe(executor, probe) {
  const prepared = await executor.prepareFrom(probe.graphs[executor.path], probe.key, probe.record);
  const weights = await executor.uploadWeights(
    probe.weightBytes, probe.record.weights.tensors, probe.key);
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
// on demand by getProbe() (only a software adapter needs it). Throws NoPathAvailable where
// neither path can run (or the asked one cannot); see the top of this file. threads: the wasm
// path's (createExecutor).
export async function choosePath({ files, gpu, asked = null, modelKey, getProbe,
  threads = null }) {
  const paths = (files.manifest.web && files.manifest.web.paths) || ["webgpu"];
  // a wasm-only package is, for its wasm path's refusals, as if there were no adapter
  const noPlans = {
    adapter: null, reason: "this package has no WebGPU path (exported with --web-paths wasm)",
  };
  const webgpu = async (why, timings = null) => ({
    path: "webgpu", why, executor: await createExecutor("webgpu", gpu.adapter, files), timings,
  });
  if (asked) {
    if (!paths.includes(asked)) {
      throw new Error(`path ${JSON.stringify(asked)}: this package has ${paths.join(" and ")}`);
    }
    const why = "asked for in the page's address (?path=)";
    if (asked === "webgpu") {
      if (!gpu.adapter) throw new Error(`path webgpu was asked for, but ${gpu.reason}`);
      return webgpu(why);
    }
    const wasm = await tryWasm(files, threads);
    if (!wasm.executor) {
      throw askedWasmMissing(wasm.missing, paths.includes("webgpu") ? gpu : noPlans);
    }
    return { path: "wasm", why, executor: wasm.executor, timings: null };
  }
  if (!gpu.adapter) {
    if (!paths.includes("wasm")) {
      return { path: null, why: gpu.reason, executor: null, timings: null };
    }
    const wasm = await tryWasm(files, threads);
    if (!wasm.executor) throw neitherPath(wasm.missing, gpu);
    return {
      path: "wasm", why: `${gpu.reason}: the CPU runs the model through onnxruntime-web`,
      executor: wasm.executor, timings: null,
    };
  }
  if (!paths.includes("webgpu")) {
    // nothing to choose between, and no plan to run or time on the adapter
    const wasm = await tryWasm(files, threads);
    if (!wasm.executor) throw neitherPath(wasm.missing, noPlans);
    return {
      path: "wasm",
      why: "this package has the wasm path only: the CPU runs the model through onnxruntime-web",
      executor: wasm.executor, timings: null,
    };
  }
  const label = adapterLabel(gpu.adapter);
  if (!paths.includes("wasm") || !isSoftwareAdapter(gpu.adapter)) {
    return webgpu(`GPU adapter ${label}`);
  }
  // a software adapter: the wasm path is usually far faster, so its absence is worth saying
  // (the page shows onnxruntime-web's failure itself, from ortFailure(): the detail is long)
  const withoutWasm = () => webgpu(`software GPU adapter (${label}), and onnxruntime-web, ` +
                                   "which the wasm path needs, could not be loaded");
  const key = `${label}|${modelKey}`;
  const known = rememberedChoice(key);
  if (known) {
    const why = `software GPU adapter (${label}): ${describe(known.timings)}, ` +
                "timed earlier on this adapter";
    if (known.path === "webgpu") return webgpu(why, known.timings);
    const wasm = await tryWasm(files, threads);
    if (!wasm.executor) return withoutWasm();
    return { path: "wasm", why, executor: wasm.executor, timings: known.timings };
  }
  // onnxruntime-web first: where it is missing there is nothing to time (and nothing is
  // remembered, so a later visit that reaches it times both paths)
  const wasm = await tryWasm(files, threads);
  if (!wasm.executor) return withoutWasm();
  const probe = await getProbe();
  const timings = { block: probe.key };
  const executors = { wasm: wasm.executor };
  timings.wasm_ms = await probeBlock(executors.wasm, probe);
  executors.webgpu = await createExecutor("webgpu", gpu.adapter, files);
  timings.webgpu_ms = await probeBlock(executors.webgpu, probe);
  const path = timings.wasm_ms <= timings.webgpu_ms ? "wasm" : "webgpu";
  executors[path === "wasm" ? "webgpu" : "wasm"].destroy();
  remember(key, { path, timings });
  return {
    path, why: `software GPU adapter (${label}): ${describe(timings)}, timed now`,
    executor: executors[path], timings,
  };
}

function describe(t) {
  const faster = t.wasm_ms <= t.webgpu_ms ? "wasm" : "WebGPU";
  return `${faster} was faster on ${t.block} (wasm ${t.wasm_ms.toFixed(1)} ` +
         `ms, WebGPU ${t.webgpu_ms.toFixed(1)} ms)`;
}
