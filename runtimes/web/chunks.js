// A chunked component's pieces (the manifest's `chunked`: Wan's causal VAE decoder runs one
// latent frame at a time, its caches carried from piece to piece): cutting a C-ordered
// array along one axis and joining the outputs back, as the Python runtime's np.take and
// np.concatenate do.

const product = (dims) => dims.reduce((a, b) => a * b, 1);

// data (C-ordered, `shape`) -> the `size` entries from `start` along `axis`, same layout
export function sliceAlong(data, shape, axis, start, size) {
  const outer = product(shape.slice(0, axis));
  const inner = product(shape.slice(axis + 1));
  const out = new data.constructor(outer * size * inner);
  for (let o = 0; o < outer; o++) {
    const from = (o * shape[axis] + start) * inner;
    out.set(data.subarray(from, from + size * inner), o * size * inner);
  }
  return out;
}

// pieces: [{data, shape}] equal but along `axis` -> {data, shape} joined along it
export function concatAlong(pieces, axis) {
  const shape = pieces[0].shape.slice();
  shape[axis] = pieces.reduce((n, p) => n + p.shape[axis], 0);
  const outer = product(shape.slice(0, axis));
  const inner = product(shape.slice(axis + 1));
  const out = new pieces[0].data.constructor(product(shape));
  let at = 0; // where along the axis the piece starts
  for (const p of pieces) {
    const run = p.shape[axis] * inner;
    for (let o = 0; o < outer; o++) {
      out.set(p.data.subarray(o * run, (o + 1) * run), (o * shape[axis] + at) * inner);
    }
    at += p.shape[axis];
  }
  return { data: out, shape };
}

// [start, stop) of each piece of the chunked axis: a first piece of `first_size` (default
// `size`; CogVideoX's decoder takes two or three latent frames first), then pieces of `size`
// (edge/core/pieces.py piece_bounds)
export function pieceBounds(spec, shape, component) {
  const n = shape[spec.axis];
  const size = spec.size;
  const first = spec.first_size ?? size;
  if (n < first || (n - first) % size) {
    throw new Error(`component ${component}: ${spec.input} has ${n} along ` +
                    `axis ${spec.axis}: ${n} along the chunked axis is ` +
                    `not a first piece of ${first} and pieces of ${size}`);
  }
  const bounds = [[0, first]];
  for (let a = first; a < n; a += size) bounds.push([a, a + size]);
  return bounds;
}
