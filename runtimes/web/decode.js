// Weights stored narrower than float32 (a web package's --quantize: exporters/web/storage.py)
// decoded to float32 on the GPU as a block's weights are uploaded, for the WebGPU path's
// kernels, which read float32. Three WGSL kernels written here, since they are the whole of
// it and need no shader extension:
// - half (float16): each 32-bit word holds two, widened exactly by unpack2x16float;
// - int8 with a float32 scale per row: each word holds four, sign-extended by extractBits,
//   then times its row's scale (one float32 rounding, as the exporter's NumPy decoding);
// - int4 with a half scale per group of a row's inputs: each word holds eight nibbles (the
//   first element in the lowest), each the value plus 8, then times its group's scale
//   (widened exactly from its word of two by unpack2x16float).
// The wasm path needs none of this: its ONNX graphs take the stored tensors and decode them.
//
// A block is uploaded in pieces of at most `chunkBytes`, each written into one scratch
// buffer and decoded from it (queue order: a write lands after the decoding before it is
// done), with at most `inFlightBytes` written and not yet done: a whole block's stored
// copy on the GPU and the browser's staging copy of it (93 MB each for a Wan 1.3B block
// at fp16) would otherwise sit beside its float32 weights until the block is decoded.

const WORKGROUP = 256;
const MAX_GROUPS = 65535; // WebGPU maxComputeWorkgroupsPerDimension
export const CHUNK_BYTES = 8 << 20;
export const IN_FLIGHT_BYTES = 16 << 20;

// p: elements in the tensor, elements a scale covers, threads per grid row, the piece's
// first word in the tensor, words in the piece
const HEAD = `
struct Piece { elements: u32, per_scale: u32, row_threads: u32, first_word: u32, words: u32 }
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<uniform> p: Piece;
`;

// the word of the piece this thread decodes and its first element in the tensor
const WORD = (perWord) => `
  let i = id.x + id.y * p.row_threads;
  if (i >= p.words) { return; }
  let first = ${perWord}u * (p.first_word + i);`;

const KERNELS = {
  float16: `${HEAD}
@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(global_invocation_id) id: vec3<u32>) {${WORD(2)}
  let pair = unpack2x16float(src[i]);
  dst[first] = pair.x;
  if (first + 1u < p.elements) { dst[first + 1u] = pair.y; }
}`,
  int8: `${HEAD}
@group(0) @binding(3) var<storage, read> scale: array<f32>;
@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(global_invocation_id) id: vec3<u32>) {${WORD(4)}
  let word = bitcast<i32>(src[i]);
  for (var k = 0u; k < 4u; k++) {
    let e = first + k;
    if (e >= p.elements) { return; }
    dst[e] = f32(extractBits(word, 8u * k, 8u)) * scale[e / p.per_scale];
  }
}`,
  int4: `${HEAD}
@group(0) @binding(3) var<storage, read> scale: array<u32>; // halves, two a word
@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(global_invocation_id) id: vec3<u32>) {${WORD(8)}
  let word = src[i];
  for (var k = 0u; k < 8u; k++) {
    let e = first + k;
    if (e >= p.elements) { return; }
    let g = e / p.per_scale;
    dst[e] = f32(i32(extractBits(word, 4u * k, 4u)) - 8) * unpack2x16float(scale[g / 2u])[g % 2u];
  }
}`,
};
const PER_WORD = { float16: 2, int8: 4, int4: 8 };
// the stored forms decoded with a scale, and the elements one scale covers
const SCALED = { int8: (t) => elements(t.shape) / (t.shape[0] || 1), int4: (t) => t.group };

function elements(shape) {
  return shape.reduce((a, b) => a * b, 1);
}

// The names of the tensors that are another's row scales (consumed by its decoding).
export function scaleNames(tensors) {
  return new Set(tensors.filter((t) => t.scale).map((t) => t.scale));
}

// GPU bytes a block's weights take once decoded: float32 for every tensor but the scales.
export function decodedBytes(tensors) {
  const scales = scaleNames(tensors);
  return tensors.filter((t) => !scales.has(t.name)).reduce((n, t) => n + 4 * elements(t.shape), 0);
}

export class WeightDecoder {
  // storage(bytes, label): an empty storage buffer the page's kernels can bind
  constructor(device, storage, { chunkBytes = CHUNK_BYTES, inFlightBytes = IN_FLIGHT_BYTES } = {}) {
    if (chunkBytes % 4 !== 0 || chunkBytes <= 0) {
      throw new Error(`WeightDecoder: chunkBytes ${chunkBytes} is not a positive multiple of 4`);
    }
    this.device = device;
    this.storage = storage;
    this.chunkBytes = chunkBytes;
    this.inFlightBytes = inFlightBytes;
    this.pipelines = {};
    this.scratch = null; // the stored piece being decoded (chunkBytes at most)
    // the piece's uniform (Piece in the kernels)
    this.piece = device.createBuffer({
      size: 32, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST, label: "decode piece",
    });
    this.unsettled = 0; // bytes written since the queue was last seen empty
    this.stats = { pieces: 0, queue_waits: 0, scratch_bytes: 0, peak_in_flight_bytes: 0 };
  }

  pipeline(dtype) {
    if (!this.pipelines[dtype]) {
      const module = this.device.createShaderModule({
        code: KERNELS[dtype], label: `decode ${dtype}`,
      });
      this.pipelines[dtype] = this.device.createComputePipeline({
        layout: "auto", compute: { module, entryPoint: "main" }, label: `decode ${dtype}`,
      });
    }
    return this.pipelines[dtype];
  }

  // Write one piece, bytes (a Uint8Array), into buffer at offset, waiting first for the
  // queue where more than inFlightBytes would be written and not yet done. A piece not a
  // whole number of words is padded (writeBuffer takes whole 32-bit words).
  async write(buffer, offset, bytes) {
    if (this.unsettled > 0 && this.unsettled + bytes.byteLength > this.inFlightBytes) {
      await this.device.queue.onSubmittedWorkDone();
      this.unsettled = 0;
      this.stats.queue_waits += 1;
    }
    const words = padded(bytes);
    this.device.queue.writeBuffer(buffer, offset, words, 0, words.byteLength);
    this.unsettled += words.byteLength;
    this.stats.pieces += 1;
    this.stats.peak_in_flight_bytes = Math.max(this.stats.peak_in_flight_bytes, this.unsettled);
  }

  // bytes into a new buffer, in pieces of chunkBytes
  async upload(bytes, label) {
    const buffer = this.storage(bytes.byteLength, label);
    for (let at = 0; at < bytes.byteLength; at += this.chunkBytes) {
      await this.write(buffer, at, bytes.subarray(at, at + this.chunkBytes));
    }
    return buffer;
  }

  // the scratch buffer, grown to hold a piece of a stored tensor of `bytes`
  scratchFor(bytes) {
    const need = Math.min(this.chunkBytes, Math.ceil(bytes / 4) * 4);
    if (!this.scratch || this.scratch.size < need) {
      this.scratch?.destroy(); // freed once the work queued with it is done
      this.scratch = this.storage(need, "decode scratch");
      this.stats.scratch_bytes = this.scratch.size;
    }
    return this.scratch;
  }

  // One stored tensor decoded into a new float32 buffer, piece by piece.
  async decode(t, stored, scale, label) {
    const n = elements(t.shape);
    const dst = this.storage(4 * n, `${label} ${t.name}`);
    const src = this.scratchFor(stored.byteLength);
    const pipeline = this.pipeline(t.dtype);
    const entries = [
      { binding: 0, resource: { buffer: src } }, { binding: 1, resource: { buffer: dst } },
      { binding: 2, resource: { buffer: this.piece } },
    ];
    if (scale) entries.push({ binding: 3, resource: { buffer: scale } });
    const group = this.device.createBindGroup({ layout: pipeline.getBindGroupLayout(0), entries });
    const perScale = t.scale ? SCALED[t.dtype](t) : 0;
    for (let at = 0; at < stored.byteLength; at += this.chunkBytes) {
      const piece = stored.subarray(at, at + this.chunkBytes);
      const words = Math.ceil(piece.byteLength / 4);
      const groups = Math.max(1, Math.ceil(words / WORKGROUP));
      const x = Math.min(groups, MAX_GROUPS);
      await this.write(src, 0, piece);
      this.device.queue.writeBuffer(
        this.piece, 0, new Uint32Array([n, perScale, x * WORKGROUP, at / 4, words, 0, 0, 0]));
      const encoder = this.device.createCommandEncoder({ label: `${label} decode` });
      const pass = encoder.beginComputePass();
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(x, Math.ceil(groups / x), 1);
      pass.end();
      this.device.queue.submit([encoder.finish()]);
    }
    return dst;
  }

  // A block's weights on the GPU as float32: {name: GPUBuffer}. bytes: the block's weights
  // (ArrayBuffer); tensors: its manifest table. The bytes may be let go once this returns.
  async uploadBlock(bytes, tensors, label) {
    const byName = new Map(tensors.map((t) => [t.name, t]));
    const scales = scaleNames(tensors);
    const view = (t) => new Uint8Array(bytes, t.offset, t.bytes);
    const out = {};
    for (const t of tensors) {
      if (scales.has(t.name)) continue;
      if (t.dtype === "float32") {
        out[t.name] = await this.upload(view(t), `${label} ${t.name}`);
        continue;
      }
      if (!KERNELS[t.dtype]) {
        throw new Error(`${label}: weight ${t.name} is stored ` +
                        `as ${t.dtype}, which this runtime does not decode`);
      }
      if (Boolean(SCALED[t.dtype]) !== Boolean(t.scale)) {
        throw new Error(`${label}: weight ${t.name} ` +
                        `(${t.dtype}) ${t.scale ? "has a scale it should not" : "has no scales"}`);
      }
      const scale = t.scale
        ? await this.upload(view(byName.get(t.scale)), `${label} ${t.scale}`) : null;
      out[t.name] = await this.decode(t, view(t), scale, label);
      scale?.destroy(); // freed once its decoding is done
    }
    return out;
  }
}

// writeBuffer takes whole 32-bit words: a piece of odd length padded
function padded(bytes) {
  if (bytes.byteLength % 4 === 0) return bytes;
  const out = new Uint8Array(Math.ceil(bytes.byteLength / 4) * 4);
  out.set(bytes);
  return out;
}
