"""Tiles blended as diffusers' `AutoencoderKLWan.tiled_decode` blends them (edge/core/tiles.py),
made as the tiles come without holding them."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

from edge.core.tiles import BlendedTiles, Tiling

# a latent of 13 x 17 in tiles of 4 x 6 at a stride of 3 x 4, 2 pixels a latent: tiles start
# at rows 0, 3, 6, 9, 12 (the last 1 high) and columns 0, 4, 8, 12, 16 (the last 1 wide)
TILING = Tiling(latent_size=(4, 6), latent_stride=(3, 4), scale=2)
HEIGHT, WIDTH = 13, 17


def decoded_tiles(seed: int = 0) -> list[list[np.ndarray]]:
    """Random (1, 3, 2, H, W) tiles of the sizes a decoder gives at TILING's starts."""
    rng = np.random.default_rng(seed)
    rows, cols = TILING.starts(HEIGHT, WIDTH)
    return [[rng.standard_normal((1, 3, 2, min(4, HEIGHT - i) * 2, min(6, WIDTH - j) * 2),
                                 dtype=np.float32) for j in cols] for i in rows]


def diffusers_blend(tiles: list[list[np.ndarray]]) -> np.ndarray:
    """diffusers' own loop and blend functions over the same tiles."""
    from diffusers import AutoencoderKLWan

    rows = [[torch.from_numpy(t.copy()) for t in row] for row in tiles]
    extent = TILING.overlap()
    stride = [s * TILING.scale for s in TILING.latent_stride]
    result = []
    for i, row in enumerate(rows):
        parts = []
        for j, tile in enumerate(row):
            if i > 0:
                tile = AutoencoderKLWan.blend_v(None, rows[i - 1][j], tile, extent[0])
            if j > 0:
                tile = AutoencoderKLWan.blend_h(None, row[j - 1], tile, extent[1])
            parts.append(tile[..., :stride[0], :stride[1]])
        result.append(torch.cat(parts, dim=-1))
    return torch.cat(result, dim=-2)[..., :HEIGHT * 2, :WIDTH * 2].numpy()


def test_tiles_blend_as_diffusers_blends_them():
    pytest.importorskip("diffusers", reason="diffusers (export extra) is not installed")
    tiles = decoded_tiles()
    want = diffusers_blend(tiles)
    got = TILING.blend(tiles, HEIGHT, WIDTH)
    assert got.shape == want.shape == (1, 3, 2, HEIGHT * 2, WIDTH * 2)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    # the overlaps were blended: cropping and joining the tiles alone gives another output
    stride = [s * TILING.scale for s in TILING.latent_stride]
    joined = np.concatenate([np.concatenate([t[..., :stride[0], :stride[1]] for t in row], -1)
                             for row in decoded_tiles()], -2)[..., :HEIGHT * 2, :WIDTH * 2]
    assert np.abs(got - joined).max() > 0.1


def test_blended_tiles_hold_no_tile_once_added():
    tiles = decoded_tiles()
    want = TILING.blend([[t.copy() for t in row] for row in tiles], HEIGHT, WIDTH)
    blended = BlendedTiles(TILING, HEIGHT, WIDTH)
    gone = []
    for i, row in enumerate(tiles):
        for j in range(len(row)):
            tile, row[j] = row[j], None
            gone.append(weakref.ref(tile))
            blended.add(i, j, tile)
            del tile
    gc.collect()
    assert all(ref() is None for ref in gone)  # only copies of their strips are kept
    np.testing.assert_array_equal(blended.output, want)


def test_tile_sizes_are_the_distinct_sizes_in_starts_order():
    """What a package of static shapes holds a program for: the first tile's size, then each
    other size as the tiles meet it (the last row's and column's are cut short)."""
    # columns from 12 and 16 are cut to 5 and 1 wide, the row from 12 to 1 high
    assert TILING.tile_sizes(HEIGHT, WIDTH) == [(4, 6), (4, 5), (4, 1), (1, 6), (1, 5), (1, 1)]
    assert TILING.tile_sizes(4, 6) == [(4, 6)]   # one tile holds the latents
    assert TILING.tile_sizes(3, 5) == [(3, 5)]   # smaller than a tile: its own size
    # Wan 2.1 at 480 x 832: latents 60 x 104, 32-latent tiles at a stride of 24
    assert Tiling((32, 32), (24, 24), 8).tile_sizes(60, 104) == [(32, 32), (32, 8), (12, 32),
                                                                 (12, 8)]


@pytest.mark.parametrize("text, words", [
    ("256", "TILE:STRIDE"), ("a:b", "TILE:STRIDE"), ("1x2x3:4", "HxW:HxW"),
    ("256:300", "the stride (300x300) is longer than the tile (256x256)"),
    ("0:0", "at least 1 pixel")])
def test_vae_tiles_text_is_refused_saying_why(text, words):
    from edge.core.tiles import vae_tiles_from

    with pytest.raises(ValueError) as err:
        vae_tiles_from(text)
    assert repr(text) in str(err.value) and words in str(err.value)


def test_vae_tiles_text_reads_as_enable_tiling_takes_it():
    from edge.core.tiles import vae_tiles_from

    assert vae_tiles_from("256:192") == (256, 256, 192, 192)
    assert vae_tiles_from("256x320:192X256") == (256, 320, 192, 256)
