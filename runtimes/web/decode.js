// Weights stored narrower than float32 (a web package's --quantize: exporters/web_storage.py)
// decoded to float32 on the GPU as a block's weights are uploaded, for the WebGPU path's
// kernels, which read float32. Two WGSL kernels written here, since they are the whole of it
// and need no shader extension:
// - half (float16): each 32-bit word holds two, widened exactly by unpack2x16float;
// - int8 with a float32 scale per row: each word holds four, sign-extended by extractBits,
//   then times its row's scale (one float32 rounding, as the exporter's NumPy decoding);
// - int4 with a half scale per group of a row's inputs: each word holds eight nibbles (the
//   first element in the lowest), each the value plus 8, then times its group's scale
//   (widened exactly from its word of two by unpack2x16float).
// The wasm path needs none of this: its ONNX graphs take the stored tensors and decode them.

const WORKGROUP = 256;
const MAX_GROUPS = 65535; // WebGPU maxComputeWorkgroupsPerDimension

const HEAD = `
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<uniform> size: vec4<u32>; // elements, elements a scale covers, threads per grid row
`;

const KERNELS = {
  float16: `${HEAD}
@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
  let i = id.x + id.y * size.z;
  if (2u * i >= size.x) { return; }
  let pair = unpack2x16float(src[i]);
  dst[2u * i] = pair.x;
  if (2u * i + 1u < size.x) { dst[2u * i + 1u] = pair.y; }
}`,
  int8: `${HEAD}
@group(0) @binding(3) var<storage, read> scale: array<f32>;
@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
  let i = id.x + id.y * size.z;
  if (4u * i >= size.x) { return; }
  let word = bitcast<i32>(src[i]);
  for (var k = 0u; k < 4u; k++) {
    let e = 4u * i + k;
    if (e >= size.x) { return; }
    dst[e] = f32(extractBits(word, 8u * k, 8u)) * scale[e / size.y];
  }
}`,
  int4: `${HEAD}
@group(0) @binding(3) var<storage, read> scale: array<u32>; // halves, two a word
@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
  let i = id.x + id.y * size.z;
  if (8u * i >= size.x) { return; }
  let word = src[i];
  for (var k = 0u; k < 8u; k++) {
    let e = 8u * i + k;
    if (e >= size.x) { return; }
    let g = e / size.y;
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
  constructor(device) {
    this.device = device;
    this.pipelines = {};
  }

  pipeline(dtype) {
    if (!this.pipelines[dtype]) {
      const module = this.device.createShaderModule({ code: KERNELS[dtype], label: `decode ${dtype}` });
      this.pipelines[dtype] = this.device.createComputePipeline({ layout: "auto", compute: { module, entryPoint: "main" }, label: `decode ${dtype}` });
    }
    return this.pipelines[dtype];
  }

  // A block's weights on the GPU as float32: {name: GPUBuffer}. bytes: the block's weights
  // (ArrayBuffer); tensors: its manifest table; upload(view, label): a storage buffer of the
  // bytes; storage(bytes, label): an empty one. One submit decodes every stored tensor.
  upload(bytes, tensors, label, upload, storage) {
    const byName = new Map(tensors.map((t) => [t.name, t]));
    const scales = scaleNames(tensors);
    const view = (t) => new Uint8Array(bytes, t.offset, t.bytes);
    const out = {};
    const temporary = [];
    let encoder = null;
    for (const t of tensors) {
      if (scales.has(t.name)) continue;
      if (t.dtype === "float32") {
        out[t.name] = upload(view(t), `${label} ${t.name}`);
        continue;
      }
      if (!KERNELS[t.dtype]) throw new Error(`${label}: weight ${t.name} is stored as ${t.dtype}, which this runtime does not decode`);
      if (Boolean(SCALED[t.dtype]) !== Boolean(t.scale)) throw new Error(`${label}: weight ${t.name} (${t.dtype}) ${t.scale ? "has a scale it should not" : "has no scales"}`);
      const n = elements(t.shape);
      const src = upload(padded(view(t)), `${label} ${t.name} stored`);
      const dst = storage(4 * n, `${label} ${t.name}`);
      const size = this.device.createBuffer({ size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
      const threads = Math.ceil(n / PER_WORD[t.dtype]);
      const groups = Math.max(1, Math.ceil(threads / WORKGROUP));
      const x = Math.min(groups, MAX_GROUPS);
      this.device.queue.writeBuffer(size, 0, new Uint32Array([n, t.scale ? SCALED[t.dtype](t) : 0, x * WORKGROUP, 0]));
      const entries = [{ binding: 0, resource: { buffer: src } }, { binding: 1, resource: { buffer: dst } }, { binding: 2, resource: { buffer: size } }];
      temporary.push(src, size);
      if (t.scale) {
        const scale = upload(padded(view(byName.get(t.scale))), `${label} ${t.scale}`);
        entries.push({ binding: 3, resource: { buffer: scale } });
        temporary.push(scale);
      }
      const pipeline = this.pipeline(t.dtype);
      encoder ||= this.device.createCommandEncoder({ label: `${label} decode` });
      const pass = encoder.beginComputePass();
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, this.device.createBindGroup({ layout: pipeline.getBindGroupLayout(0), entries }));
      pass.dispatchWorkgroups(x, Math.ceil(groups / x), 1);
      pass.end();
      out[t.name] = dst;
    }
    if (encoder) this.device.queue.submit([encoder.finish()]);
    for (const b of temporary) b.destroy(); // freed once the decoding is done
    return out;
  }
}

// writeBuffer takes whole 32-bit words: an int8, int4 or half tensor of odd length padded
function padded(bytes) {
  if (bytes.byteLength % 4 === 0) return bytes;
  const out = new Uint8Array(Math.ceil(bytes.byteLength / 4) * 4);
  out.set(bytes);
  return out;
}
