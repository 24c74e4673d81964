import Foundation

/// A VAE decode in spatial tiles, as edge/core/tiles.py does it (and diffusers'
/// AutoencoderKLWan.tiled_decode): each tile of the latents decoded on its own (every latent
/// frame, its own caches), neighbours blended linearly across their overlap (the tile above,
/// then the one to the left, in place) and each cut to the stride. An iphone package has a
/// program per tile size: the first tile's as the blocks themselves, the others as
/// `tile_RxC` variants (edge/core/manifest_schema.py tile_variant). The manifest's `tiles`.
public struct Tiling: Decodable, Equatable {
    public let latentSize: [Int]     // (rows, cols) of latent a tile takes at most
    public let latentStride: [Int]   // latent rows, cols from one tile to the next
    public let scale: Int            // output pixels per latent pixel, each way

    public init(latentSize: [Int], latentStride: [Int], scale: Int) {
        (self.latentSize, self.latentStride, self.scale) = (latentSize, latentStride, scale)
    }

    /// Nil where the tiling is valid, else what is wrong (Tiling.__post_init__'s checks).
    public var problem: String? {
        for (name, value) in [("latent_size", latentSize), ("latent_stride", latentStride)]
        where value.count != 2 || value.contains(where: { $0 < 1 }) {
            return "tiles \(name) must be two positive integers, not \(value)"
        }
        if zip(latentStride, latentSize).contains(where: { $0 > $1 }) {
            return "tiles latent_stride \(latentStride) is longer than latent_size " +
                "\(latentSize): tiles would leave gaps"
        }
        return scale < 1 ? "tiles scale must be a positive integer, not \(scale)" : nil
    }

    /// Whether latents of this size are decoded in tiles (larger than one tile).
    public func applies(height: Int, width: Int) -> Bool {
        height > latentSize[0] || width > latentSize[1]
    }

    /// Each tile's first latent row, and first latent column.
    public func starts(height: Int, width: Int) -> (rows: [Int], cols: [Int]) {
        (Array(stride(from: 0, to: height, by: latentStride[0])),
         Array(stride(from: 0, to: width, by: latentStride[1])))
    }

    /// The latent rows and columns of the tile starting at (`row`, `col`).
    public func size(row: Int, col: Int, height: Int, width: Int) -> [Int] {
        [min(latentSize[0], height - row), min(latentSize[1], width - col)]
    }

    /// The distinct [rows, cols] of latent the tiles take, in starts order (latents one
    /// tile holds: one piece of their own size).
    public func tileSizes(height: Int, width: Int) -> [[Int]] {
        if !applies(height: height, width: width) { return [[height, width]] }
        let (rows, cols) = starts(height: height, width: width)
        var sizes: [[Int]] = []
        for r in rows {
            for c in cols {
                let s = size(row: r, col: c, height: height, width: width)
                if !sizes.contains(s) { sizes.append(s) }
            }
        }
        return sizes
    }

    /// Output rows, columns a tile shares with the next one down, across.
    public var overlap: [Int] { (0..<2).map { (latentSize[$0] - latentStride[$0]) * scale } }

    /// The variant a tile of `size` runs for `variant` (nil: the block's own), in a package
    /// whose blocks were traced at the tile size `base`.
    public static func tileVariant(_ variant: String?, size: [Int], base: [Int]) -> String? {
        if size == base { return variant }
        let tag = "tile_\(size[0])x\(size[1])"
        return variant.map { "\($0)_\(tag)" } ?? tag
    }
}

/// The decoded tiles made into one output as they come, in starts order, without holding
/// them: each tile (`lead` x h x w values, lead being every axis before the last two) is
/// blended with the bottom rows of the tile above and the right columns of the one before it
/// (kept as strips) and its part up to the stride written into `output` (lead x H x W).
public struct BlendedTiles {
    public let height: Int, width: Int   // of the output, in pixels
    public private(set) var output: [Float]
    let stride: [Int], extent: [Int], columns: Int, lead: Int
    var above: [Strip?], below: [Strip?], left: Strip?

    struct Strip { let data: [Float]; let h: Int; let w: Int }

    public init(_ tiling: Tiling, latentHeight: Int, latentWidth: Int, lead: Int) {
        (height, width) = (latentHeight * tiling.scale, latentWidth * tiling.scale)
        stride = tiling.latentStride.map { $0 * tiling.scale }
        extent = tiling.overlap
        columns = tiling.starts(height: latentHeight, width: latentWidth).cols.count
        self.lead = lead
        output = [Float](repeating: 0, count: lead * height * width)
        above = Array(repeating: nil, count: columns)
        below = Array(repeating: nil, count: columns)
        left = nil
    }

    /// Tile (i, j) of starts, h x w: row by row, each row's tiles left to right.
    public mutating func add(_ i: Int, _ j: Int, _ tile: [Float], h: Int, w: Int) {
        var tile = tile
        if i > 0, let strip = above[j] { Self.blendRows(strip, &tile, h, w, extent[0], lead) }
        if j > 0, let strip = left { Self.blendCols(strip, &tile, h, w, extent[1], lead) }
        left = Self.strip(tile, h, w, y0: 0, x0: max(w - extent[1], 0), lead)
        below[j] = Self.strip(tile, h, w, y0: max(h - extent[0], 0), x0: 0, lead)
        if j == columns - 1 {
            above = below
            below = Array(repeating: nil, count: columns)
        }
        let (top, leftEdge) = (i * stride[0], j * stride[1])
        let rows = min(stride[0], h, height - top), cols = min(stride[1], w, width - leftEdge)
        for l in 0..<lead {
            for y in 0..<rows {
                let from = (l * h + y) * w, to = (l * height + top + y) * width + leftEdge
                output.replaceSubrange(to..<(to + cols), with: tile[from..<(from + cols)])
            }
        }
    }

    static func strip(_ tile: [Float], _ h: Int, _ w: Int, y0: Int, x0: Int,
                      _ lead: Int) -> Strip {
        let (sh, sw) = (h - y0, w - x0)
        var data = [Float](); data.reserveCapacity(lead * sh * sw)
        for l in 0..<lead {
            for y in 0..<sh {
                let from = (l * h + y0 + y) * w + x0
                data.append(contentsOf: tile[from..<(from + sw)])
            }
        }
        return Strip(data: data, h: sh, w: sw)
    }

    // row y of the overlap: (1 - y/e) of the tile above's row, y/e of this tile's
    static func blendRows(_ above: Strip, _ tile: inout [Float], _ h: Int, _ w: Int,
                          _ extent: Int, _ lead: Int) {
        let e = min(above.h, h, extent)
        for l in 0..<lead {
            for y in 0..<e {
                let a = (l * above.h + above.h - e + y) * above.w, t = (l * h + y) * w
                let (keep, take) = (Float(1 - Double(y) / Double(e)), Float(Double(y) / Double(e)))
                for x in 0..<w { tile[t + x] = above.data[a + x] * keep + tile[t + x] * take }
            }
        }
    }

    static func blendCols(_ left: Strip, _ tile: inout [Float], _ h: Int, _ w: Int,
                          _ extent: Int, _ lead: Int) {
        let e = min(left.w, w, extent)
        for l in 0..<lead {
            for y in 0..<h {
                let a = (l * h + y) * left.w + left.w - e, t = (l * h + y) * w
                for x in 0..<e {
                    let (keep, take) = (Float(1 - Double(x) / Double(e)),
                                        Float(Double(x) / Double(e)))
                    tile[t + x] = left.data[a + x] * keep + tile[t + x] * take
                }
            }
        }
    }
}
