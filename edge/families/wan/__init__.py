"""Wan 2.1 and Wan 2.2 TI2V-5B (diffusers `WanPipeline`), registered: what `edge export` and
the family registry read without loading torch. The family itself is `family.py`."""

from edge.core.declared import Option
from edge.core.tiles import vae_tiles_from
from edge.families.pipeline_options import PIPELINE_OPTIONS

NAME = "wan"
PIPELINE = "WanPipeline"   # model_index.json's _class_name
FOLDER = "a diffusers WanPipeline folder (Wan 2.1, Wan 2.2 TI2V-5B)"
VAE_TILES = Option(
    "vae_tiles", str, "The VAE decoder's tiles and their stride in pixels, TILE:STRIDE or "
    "HxW:HxW (as diffusers' vae.enable_tiling takes them; multiples of the VAE's 8): smaller "
    "tiles, smaller decoder calls on a device; the reference decodes alike. Wan 2.1's decoder "
    "only [default: 256:192, diffusers' own].", parse=vae_tiles_from, group="Video size")
OPTIONS = (*PIPELINE_OPTIONS, VAE_TILES)
