"""A VAE decode in spatial tiles, as diffusers' `AutoencoderKLWan.tiled_decode` does it.

At 480x832 a causal video decoder's full-resolution stages hold gigabytes a latent frame
(Wan 2.1's `up_3`: 96 channels x 4 frames x 480 x 832 and its caches, ~6 GiB in fp32): no
phone and no 8 GB budget holds that. Decoded in overlapping tiles of the latent (256 x 256
pixels, a stride of 192, diffusers' defaults), a call holds one tile's. Each tile runs the
whole decoder over every latent frame with its own caches; neighbouring tiles are blended
linearly across their overlap (the one above, then the one to the left, in place, in
diffusers' order) and each cut to the stride. NumPy only: the runtimes use it.

diffusers blends the decoder's raw output and clamps after; so does edge: a tiled
decoder's graphs give (x + 1) / 2 unclamped, and the runtime clamps to [0, 1] after blending.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


def vae_tiles_from(text: str) -> tuple[int, int, int, int]:
    """`--vae-tiles` as diffusers' `enable_tiling` takes it, in pixels: "TILE:STRIDE" (square)
    or "HxW:HxW" -> (tile height, tile width, stride height, stride width). Refuses, saying
    why, what is not two sizes, a size below 1, or a stride longer than its tile (tiles
    would leave gaps)."""
    def sides(part: str) -> tuple[int, int]:
        values = part.lower().split("x")
        if len(values) not in (1, 2) or not all(v.strip().isdigit() for v in values):
            raise ValueError(f"{text!r}: TILE:STRIDE in pixels (256:192) or HxW:HxW "
                             "(256x320:192x256)")
        numbers = [int(v) for v in values]
        return (numbers[0], numbers[-1])

    parts = str(text).split(":")
    if len(parts) != 2:
        raise ValueError(f"{text!r}: TILE:STRIDE in pixels (256:192) or HxW:HxW "
                         "(256x320:192x256)")
    (th, tw), (sh, sw) = sides(parts[0]), sides(parts[1])
    if min(th, tw, sh, sw) < 1:
        raise ValueError(f"{text!r}: tile and stride sizes must be at least 1 pixel")
    if sh > th or sw > tw:
        raise ValueError(f"{text!r}: the stride ({sh}x{sw}) is longer than the tile "
                         f"({th}x{tw}): tiles would leave gaps")
    return th, tw, sh, sw


@dataclass(frozen=True)
class Tiling:
    latent_size: tuple[int, int]     # (rows, cols) of latent a tile takes at most
    latent_stride: tuple[int, int]   # latent rows, cols from one tile to the next
    scale: int                       # output pixels per latent pixel, each way

    def __post_init__(self) -> None:
        for name in ("latent_size", "latent_stride"):
            value = getattr(self, name)
            if (not isinstance(value, tuple | list) or len(value) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                               for v in value)):
                raise ValueError(f"tiles {name} must be two positive integers, not {value!r}")
        if any(s > n for s, n in zip(self.latent_stride, self.latent_size, strict=True)):
            raise ValueError(f"tiles latent_stride {self.latent_stride} is longer than "
                             f"latent_size {self.latent_size}: tiles would leave gaps")
        if not isinstance(self.scale, int) or isinstance(self.scale, bool) or self.scale < 1:
            raise ValueError(f"tiles scale must be a positive integer, not {self.scale!r}")

    @classmethod
    def from_dict(cls, values: dict) -> Tiling:
        return cls(tuple(values["latent_size"]), tuple(values["latent_stride"]),
                   values["scale"])

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def applies(self, height: int, width: int) -> bool:
        """Whether latents of this size are decoded in tiles (diffusers: larger than one)."""
        return height > self.latent_size[0] or width > self.latent_size[1]

    def starts(self, height: int, width: int) -> tuple[range, range]:
        """Each tile's first latent row and column."""
        return range(0, height, self.latent_stride[0]), range(0, width, self.latent_stride[1])

    def tile_sizes(self, height: int, width: int) -> list[tuple[int, int]]:
        """The distinct (rows, cols) of latent the tiles of latents `height` x `width` take,
        in `starts` order: the first is a whole tile (or the latents, where smaller); those
        at the far edges are cut short. A target of static shapes runs a program per size.
        Latents one tile holds are one piece of their own size (diffusers tiles no more)."""
        if not self.applies(height, width):
            return [(height, width)]
        rows, cols = self.starts(height, width)
        sizes: list[tuple[int, int]] = []
        for r in rows:
            for c in cols:
                if (size := self.size_at(r, c, height, width)) not in sizes:
                    sizes.append(size)
        return sizes

    def size_at(self, row: int, col: int, height: int, width: int) -> tuple[int, int]:
        """(rows, cols) of latent of the tile starting at `row`, `col`."""
        return (min(self.latent_size[0], height - row), min(self.latent_size[1], width - col))

    def tiles_of_work(self, height: int, width: int) -> float:
        """How many whole tiles' work a decode of latents `height` x `width` is: each tile's
        area (those at the far edges are cut short) over a whole tile's; 1 for latents
        decoded in one piece. A convolutional decoder's work grows with its area."""
        if not self.applies(height, width):
            return 1.0
        rows, cols = self.starts(height, width)
        area = (sum(min(self.latent_size[0], height - r) for r in rows)
                * sum(min(self.latent_size[1], width - c) for c in cols))
        return area / (self.latent_size[0] * self.latent_size[1])

    def blend(self, tiles: list[list[np.ndarray]], height: int, width: int) -> np.ndarray:
        """The decoded tiles (rows of (..., H, W) arrays, as `starts` orders them) as one
        output of the latent `height` x `width`. The tiles are blended in place."""
        blended = BlendedTiles(self, height, width)
        for i, row in enumerate(tiles):
            for j, tile in enumerate(row):
                blended.add(i, j, tile)
        return blended.output

    def overlap(self) -> tuple[int, int]:
        """Output rows, columns a tile shares with the next one down, across."""
        return tuple((n - s) * self.scale for n, s in zip(self.latent_size, self.latent_stride,
                                                            strict=True))


class BlendedTiles:
    """`Tiling.blend`'s output made as the tiles come, in `starts` order, without holding
    them: each tile is blended with the bottom rows of the one above and the right columns
    of the one before it (all a later tile reads of it: those strips are kept, the rest let
    go) and its part up to the stride written into the output. By their shapes, at
    480x832x81 the 15 decoded tiles held together are 0.64 GB of float32, the strips 0.08
    GB (at 17 frames 0.13 GB and 0.02 GB)."""

    def __init__(self, tiling: Tiling, height: int, width: int) -> None:
        self.size = (height * tiling.scale, width * tiling.scale)
        self.stride = tuple(s * tiling.scale for s in tiling.latent_stride)
        self.extent = tiling.overlap()
        self.columns = len(tiling.starts(height, width)[1])
        self.output: np.ndarray | None = None
        self._above: list[np.ndarray | None] = [None] * self.columns  # the row above's
        self._below: list[np.ndarray | None] = [None] * self.columns  # this row's, so far
        self._left: np.ndarray | None = None

    def add(self, i: int, j: int, tile: np.ndarray) -> None:
        """Tile (i, j) of `starts`: row by row, each row's tiles left to right."""
        if i > 0:
            _blend_rows(self._above[j], tile, self.extent[0])
        if j > 0:
            _blend_cols(self._left, tile, self.extent[1])
        # from the end by a start index, so that no overlap keeps nothing (-0: is all)
        self._left = tile[..., max(tile.shape[-1] - self.extent[1], 0):].copy()
        self._below[j] = tile[..., max(tile.shape[-2] - self.extent[0], 0):, :].copy()
        if j == self.columns - 1:
            self._above, self._below = self._below, [None] * self.columns
        if self.output is None:
            self.output = np.empty((*tile.shape[:-2], *self.size), tile.dtype)
        top, left = i * self.stride[0], j * self.stride[1]
        rows = min(self.stride[0], tile.shape[-2], self.size[0] - top)
        cols = min(self.stride[1], tile.shape[-1], self.size[1] - left)
        self.output[..., top:top + rows, left:left + cols] = tile[..., :rows, :cols]


def _blend_rows(above: np.ndarray, tile: np.ndarray, extent: int) -> None:
    # row y of the overlap: (1 - y/e) of the tile above's row, y/e of this tile's
    e = min(above.shape[-2], tile.shape[-2], extent)
    for y in range(e):
        tile[..., y, :] = above[..., y - e, :] * (1 - y / e) + tile[..., y, :] * (y / e)


def _blend_cols(left: np.ndarray, tile: np.ndarray, extent: int) -> None:
    e = min(left.shape[-1], tile.shape[-1], extent)
    for x in range(e):
        tile[..., x] = left[..., x - e] * (1 - x / e) + tile[..., x] * (x / e)
