// The demo page: loads the package it is served from, then generates on request. Lives at
// the top of a web package, beside runtime/ (edge export --target web copies both in). It uses
// the embedding API of docs/web.md only: what the runtime's package, edge-video-runtime
// (runtime/package.json; index.html's import map resolves the name), exports.
import {
  Pipeline, WebGpuUnavailable, adapterInfo, formatSize as mb, ortFailure,
} from "edge-video-runtime";

const $ = (id) => document.getElementById(id);
// state.unavailable: {webgpu, wasm}, why a path cannot run here (null: it can, or was not
// tried); wasm is onnxruntime-web's failure {version, base, url, detail}
const state = { pipe: null, budget: null, busy: false, unavailable: { webgpu: null, wasm: null } };
window.edgeDemo = state; // for tests and the console: state.pipe, state.lastFrames

function fail(err) {
  const box = err instanceof WebGpuUnavailable ? $("gpu-missing") : $("error");
  box.textContent = err.message;
  box.hidden = false;
  state.error = err.message;
  // NoPathAvailable (paths.js): both paths' reasons
  if (err.reasons) state.unavailable = err.reasons;
}

// The page runs on WebGPU although onnxruntime-web could not be loaded (only tried on a
// software adapter, where the wasm path is usually much faster): say why it is missing, as
// that is why this page is slow and what to fix (the network, or --bundle-ort at export).
function showWasmMissing(pipe) {
  const missing = pipe.path.name === "webgpu" ? ortFailure() : null;
  state.unavailable = { webgpu: null, wasm: missing };
  $("wasm-missing").hidden = !missing;
  if (!missing) return;
  $("wasm-missing").textContent = `The wasm path is missing: ${missing.detail}. The model ` +
    "runs on WebGPU instead (slower on a software GPU adapter); a package exported with " +
    "--bundle-ort carries onnxruntime-web itself.";
}

// a note that is not an error: the model runs, something about it the user should know
function notice(text) {
  let box = $("notice");
  if (!box) {
    box = document.createElement("p");
    box.id = "notice";
    $("error").after(box);
  }
  box.textContent = text;
  box.hidden = false;
  state.notice = text;
}

async function load() {
  const budget = $("budget").value.trim() || null;
  if (state.pipe && budget === state.budget) return state.pipe;
  if (state.pipe) state.pipe.destroy();
  state.pipe = null;
  state.budget = budget;
  if ($("notice")) $("notice").hidden = true; // said again below if it still holds
  const base = new URL(".", location.href).href;
  state.pipe = await Pipeline.load(base, {
    budget, path: askedPath, threads: askedThreads,
    onCacheFailure: notice,
    onProgress: (got, total) => {
      $("download").max = total; $("download").value = got;
      $("download-text").textContent = `${mb(got)} / ${mb(total)}`;
    },
  });
  const m = state.pipe.manifest;
  $("model").textContent = `${m.model} (${m.target})`;
  if (!$("steps").value) $("steps").value = m.sampler.steps;
  const path = state.pipe.path;
  const runsOn = path.name === "wasm" ? "the CPU (onnxruntime-web, wasm)" : "the GPU (WebGPU)";
  const pinned = state.pipe.loadFigures.pinned.length;
  $("path").textContent = `Runs on: ${runsOn}, because ${path.why}` +
    `; weights stored as ${m.web?.storage?.quantize ?? "fp32"}, held in ${path.held_in}` +
    (path.budget === null ? " (no budget: every block kept)"
      : ` under a ${mb(path.budget)} budget, ${pinned} of ${state.pipe.blocks.size} blocks ` +
        "kept, the rest streamed from storage");
  showWasmMissing(state.pipe);
  if (state.pipe.adapter) {
    const info = adapterInfo(state.pipe.adapter);
    $("adapter").textContent =
      `GPU: ${info.vendor} ${info.architecture} ${info.description}`.trim() +
      `; shader-f16: ${info.shaderF16 ? "yes" : "no"}` +
      (path.name === "webgpu" ? `; kernels compiled: ${state.pipe.loadFigures.kernels}` : "");
  }
  showExpected();
  return state.pipe;
}

// the expected time of the steps asked for, from the block timed at load
function showExpected() {
  if (!state.pipe) return;
  const steps = Number($("steps").value) || state.pipe.manifest.sampler.steps;
  const [block, ms] = Object.entries(state.pipe.loadFigures.block_ms)[0];
  const seconds = state.pipe.expectedTransformerSeconds(steps);
  const about = seconds < 10 ? seconds.toFixed(1) : seconds.toFixed(0);
  $("expected").textContent = `Expected: about ${about} s of denoising for ${steps} steps ` +
    `(${block} took ${ms.toFixed(1)} ms here), fewer with leap or the step cache`;
  state.expectedSeconds = seconds;
}

function draw(video, frame) {
  const [, H, W] = video.shape;
  const canvas = $("video");
  const small = new OffscreenCanvas(W, H);
  const img = new ImageData(W, H);
  const px = video.frames.subarray(frame * H * W * 3, (frame + 1) * H * W * 3);
  for (let i = 0; i < H * W; i++) {
    img.data[4 * i] = px[3 * i];
    img.data[4 * i + 1] = px[3 * i + 1];
    img.data[4 * i + 2] = px[3 * i + 2];
    img.data[4 * i + 3] = 255;
  }
  small.getContext("2d").putImageData(img, 0, 0);
  // 256 pixels on the longer side, the video's own aspect (Wan's are wider than tall)
  const scale = 256 / Math.max(H, W);
  if (canvas.width !== Math.round(W * scale) || canvas.height !== Math.round(H * scale)) {
    canvas.width = Math.round(W * scale);
    canvas.height = Math.round(H * scale);
  }
  const ctx = canvas.getContext("2d");
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(small, 0, 0, canvas.width, canvas.height);
}

function play(video) {
  clearInterval(state.timer);
  let frame = 0;
  draw(video, 0);
  state.timer = setInterval(() => {
    frame = (frame + 1) % video.shape[0];
    draw(video, frame);
  }, 125);
}

// options come from the form; a test may pass `latents` (Python's initial noise; `noise`, its
// old name, is taken too) instead of the seed. The seed field's text goes to the runtime as
// typed (a decimal string: seeds run to 2^63 - 1, past a Number's exact integers), which
// refuses what is not a seed before any work.
export async function generate(extra = {}) {
  if (state.busy) return null;
  state.busy = true;
  $("generate").disabled = true;
  $("error").hidden = true;
  try {
    const pipe = await load();
    const { noise, ...rest } = extra;
    const given = noise ? { ...rest, latents: noise } : rest;
    const seed = given.latents ? {} : { seed: $("seed").value.trim() };
    const options = {
      ...seed, steps: Number($("steps").value), leap: $("leap").checked,
      merge_steps: Number($("merge").value), cache_threshold: Number($("cache").value),
      onStep: (done, total) => {
        $("steps-progress").max = total; $("steps-progress").value = done;
        $("step-text").textContent = `${done} / ${total}`;
      },
      ...given,
    };
    const video = await pipe.generate($("prompt").value, options);
    state.lastFrames = video;
    play(video);
    const f = pipe.lastRun;
    const lf = pipe.loadFigures;
    const pathLines = pipe.path.name === "webgpu" ? [
      `load: fetch ${lf.fetch_s.toFixed(2)} s (${lf.from_cache} ` +
      `files from cache), kernels ${lf.compile_s.toFixed(2)} s`,
      `kernel choice: ${lf.kernel_choices.timed} timed now ` +
      `(${lf.kernel_choices.alternative} took the alternative schedule) ` +
      `in ${lf.tune_s.toFixed(2)} s, ${lf.kernel_choices.remembered} remembered for this GPU`,
    ] : [
      `load: fetch ${lf.fetch_s.toFixed(2)} s (${lf.from_cache} files from cache), ` +
      `${lf.sessions} onnxruntime sessions ${lf.compile_s.toFixed(2)} s, ${lf.threads} threads`,
    ];
    const w = f.weights;
    pathLines.push(`weights (${w.stored_as}) in ${w.held_in}: ${lf.pinned.length} blocks kept, ` +
      `${f.weight_uploads} placed this run, peak ${mb(w.peak_held_bytes)}` +
      (w.budget === null ? "" : ` of a ${mb(w.budget)} budget`) +
      (w.streamed_reads ? `; streamed ${mb(w.streamed_bytes)} from storage in ` +
        `${w.streamed_reads} reads (${w.read_s.toFixed(2)} s reading, ` +
        `${w.read_wait_s.toFixed(2)} s waited)` : ""));
    $("timings").textContent = [
      `total ${f.wall_s.total.toFixed(2)} s: text ${f.wall_s.text_encoder.toFixed(2)} s, ` +
      `transformer ${f.wall_s.transformer.toFixed(2)} s ` +
      `(${f.transformer_calls} calls), VAE ${f.wall_s.vae_decoder.toFixed(2)} s`,
      ...pathLines,
      f.sampler.leap_at !== null ? `leapt after ${f.sampler.leap_at} steps` : "",
      f.prompt_truncated ? "the prompt was longer than the model reads and was truncated" : "",
    ].filter(Boolean).join("\n");
    state.lastRun = f;
    return f;
  } catch (err) {
    fail(err);
    throw err;
  } finally {
    state.busy = false;
    $("generate").disabled = false;
  }
}
state.generate = generate;

// ?budget=64MB&seed=1 preset the controls before the package loads; ?path=wasm or
// ?path=webgpu runs that path instead of the one the page would choose; ?threads=2 gives the
// wasm path that many threads (fewer than the cores where other work shares them)
const params = new URLSearchParams(location.search);
const askedPath = params.get("path");
const askedThreads = params.has("threads") ? Number(params.get("threads")) : null;
for (const [key, value] of params) if ($(key) && $(key).tagName === "INPUT") $(key).value = value;
$("steps").addEventListener("input", showExpected);
$("form").addEventListener("submit", (e) => { e.preventDefault(); generate().catch(() => {}); });
load().then(() => {
  $("generate").disabled = false;
  state.ready = true;
}, (err) => {
  fail(err);
  state.ready = false;
});
