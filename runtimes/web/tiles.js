// A VAE decode in spatial tiles, as the Python runtime does it (edge/core/tiles.py): each
// tile of the latents decoded on its own (every latent frame, its own caches), neighbours
// blended linearly across their overlap (the tile above, then the one to the left, in place)
// and each cut to the stride, as diffusers' AutoencoderKLWan.tiled_decode does. A package of
// static shapes (the web's) has a program per tile size: the first tile's as the blocks
// themselves, the others as `tile_RxC` variants (edge/core/manifest_schema.py tile_variant).

// the manifest's `tiles`: {latent_size: [rows, cols], latent_stride: [rows, cols], scale}
export class Tiling {
  constructor({ latent_size: size, latent_stride: stride, scale }) {
    this.size = size;
    this.stride = stride;
    this.scale = scale;
  }

  // whether latents of this size are decoded in tiles (larger than one tile)
  applies(height, width) {
    return height > this.size[0] || width > this.size[1];
  }

  // each tile's first latent row and first latent column
  starts(height, width) {
    const along = (n, s) => Array.from({ length: Math.ceil(n / s) }, (_, i) => i * s);
    return [along(height, this.stride[0]), along(width, this.stride[1])];
  }

  // [rows, cols] of latent of the tile starting at row `top`, column `left`
  sizeAt(top, left, height, width) {
    return [Math.min(this.size[0], height - top), Math.min(this.size[1], width - left)];
  }

  // the distinct [rows, cols] of latent the tiles take, in starts order (latents one tile
  // holds: one piece of their own size)
  tileSizes(height, width) {
    if (!this.applies(height, width)) return [[height, width]];
    const [rows, cols] = this.starts(height, width);
    const sizes = new Map();
    for (const r of rows) {
      for (const c of cols) {
        const size = this.sizeAt(r, c, height, width);
        sizes.set(size.join("x"), size);
      }
    }
    return [...sizes.values()];
  }

  // output rows, columns a tile shares with the next one down, across
  overlap() {
    return [0, 1].map((k) => (this.size[k] - this.stride[k]) * this.scale);
  }
}

// The variant a tile of `size` [rows, cols] runs for `variant` (null: the block's own), in a
// package whose blocks were traced at the tile size `base`
export function tileVariant(variant, size, base) {
  if (size[0] === base[0] && size[1] === base[1]) return variant;
  const tag = `tile_${size[0]}x${size[1]}`;
  return variant ? `${variant}_${tag}` : tag;
}

// The decoded tiles made into one output of the latents' height x width as they come, in
// starts order, without holding them: each tile (a Float32Array of lead * h * w values,
// lead being every axis before the last two) is blended with the bottom rows of the tile
// above and the right columns of the one before it (kept as strips), and its part up to the
// stride written into `output` (lead * H * W).
export class BlendedTiles {
  constructor(tiling, height, width, lead) {
    this.H = height * tiling.scale;
    this.W = width * tiling.scale;
    this.stride = tiling.stride.map((s) => s * tiling.scale);
    this.extent = tiling.overlap();
    this.columns = tiling.starts(height, width)[1].length;
    this.lead = lead;
    this.output = new Float32Array(lead * this.H * this.W);
    this.above = new Array(this.columns).fill(null); // the row above's bottom strips
    this.below = new Array(this.columns).fill(null); // this row's, so far
    this.left = null;                                // the tile before's right strip
  }

  // tile (i, j) of starts, h x w: row by row, each row's tiles left to right
  add(i, j, tile, h, w) {
    if (i > 0) blendRows(this.above[j], tile, h, w, this.extent[0], this.lead);
    if (j > 0) blendCols(this.left, tile, h, w, this.extent[1], this.lead);
    this.left = strip(tile, h, w, 0, Math.max(w - this.extent[1], 0), this.lead);
    this.below[j] = strip(tile, h, w, Math.max(h - this.extent[0], 0), 0, this.lead);
    if (j === this.columns - 1) {
      this.above = this.below;
      this.below = new Array(this.columns).fill(null);
    }
    const top = i * this.stride[0];
    const left = j * this.stride[1];
    const rows = Math.min(this.stride[0], h, this.H - top);
    const cols = Math.min(this.stride[1], w, this.W - left);
    for (let l = 0; l < this.lead; l++) {
      for (let y = 0; y < rows; y++) {
        const from = (l * h + y) * w;
        this.output.set(tile.subarray(from, from + cols), (l * this.H + top + y) * this.W + left);
      }
    }
  }
}

// the tile's rows from `y0` and columns from `x0` on: {data, h, w}
function strip(tile, h, w, y0, x0, lead) {
  const sh = h - y0;
  const sw = w - x0;
  const data = new Float32Array(lead * sh * sw);
  for (let l = 0; l < lead; l++) {
    for (let y = 0; y < sh; y++) {
      const from = (l * h + y0 + y) * w + x0;
      data.set(tile.subarray(from, from + sw), (l * sh + y) * sw);
    }
  }
  return { data, h: sh, w: sw };
}

// (1 - k/e) of a, k/e of b, each product and the sum rounded to float32 as NumPy's float32
// arrays compute them (edge/core/tiles.py): the same bits as the Python and Swift runtimes
function mix(a, b, k, e) {
  const f = Math.fround;
  return f(f(a * f(1 - k / e)) + f(b * f(k / e)));
}

// row y of the overlap: (1 - y/e) of the tile above's row, y/e of this tile's
function blendRows(above, tile, h, w, extent, lead) {
  const e = Math.min(above.h, h, extent);
  for (let l = 0; l < lead; l++) {
    for (let y = 0; y < e; y++) {
      const a = (l * above.h + above.h - e + y) * above.w;
      const t = (l * h + y) * w;
      for (let x = 0; x < w; x++) tile[t + x] = mix(above.data[a + x], tile[t + x], y, e);
    }
  }
}

function blendCols(left, tile, h, w, extent, lead) {
  const e = Math.min(left.w, w, extent);
  for (let l = 0; l < lead; l++) {
    for (let y = 0; y < h; y++) {
      const a = (l * h + y) * left.w + left.w - e;
      const t = (l * h + y) * w;
      for (let x = 0; x < e; x++) {
        tile[t + x] = mix(left.data[a + x], tile[t + x], x, e);
      }
    }
  }
}
