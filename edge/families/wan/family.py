"""Wan 2.1 and Wan 2.2 TI2V-5B text-to-video (diffusers `WanPipeline`): UMT5 text encoder,
`WanTransformer3DModel`, `AutoencoderKLWan`, from a local diffusers pipeline folder. Wan 2.2's
per-token timesteps (`expand_timesteps`: all equal in text to video) are one per video here;
its residual VAE (48 channels, RGB in 2x2 patches) is cut like Wan 2.1's, its up blocks'
duplicated shortcut and the final unpatchify written at rank 5 (`duplicate_up`, `unpatchify`).

Cuts (each chained component equals the diffusers component; tests/test_wan.py):
  text_encoder  embeddings (token embedding; the attention mask as an additive bias),
                layer_0 .. layer_{N-1} (each UMT5 layer computes its own relative position
                bias inside), final (final norm; states past the prompt zeroed, as
                WanPipeline does before the transformer sees them; edge/families/t5.py)
  transformer   prologue (patch embedding, RoPE cos/sin from tables stored as weights,
                condition embedder: time -> temb and the 6-row modulation, text -> context),
                block_0 .. block_{N-1} (each with a "tdtm" variant: temporal token merging
                of consecutive latent frames around both attentions), epilogue (modulated
                norm, proj_out, unpatchify)
  vae_decoder   head (latents denormalised, post_quant_conv, conv_in, mid block),
                up_0 .. up_3, out (norm, conv_out, clamp, to [0, 1]): run once per latent
                frame, each stage's feature cache an explicit input and output

The VAE decoder is causal in time and diffusers decodes it latent frame by latent frame with a
feature cache (each causal convolution keeps the last two frames it saw). The runtime does the
same (a chunked component, `edge.graph.blocks.Chunking`): each stage takes one frame's activations
and its cache, and gives the next stage's activations and its new cache, which the runtime
hands back to the stage on the next frame. The first frame runs each stage's "first" variant
(no cache in; the 3D upsamplers do not double it in time). Memory holds one frame's
activations and the caches, not the whole clip's: decoding a stage over the whole clip at
once would need 12 GB for one activation of the last stage at Wan's 81 frames of 480x832.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from edge.core.manifest_schema import tile_variant
from edge.core.tiles import Tiling
from edge.families import FamilyError
from edge.families.pipeline_run import (
    Accepted,
    PipelineModel,
    load_family,
    with_steps,
)
from edge.families.t5 import cut_umt5_encoder
from edge.families.wan import NAME
from edge.families.wan.folder_checks import (
    DEFAULT_SIZE,
    TEXT_TOKENS,
    check_components,
    check_folder,
    check_video_size,
    load_pipeline,
    sampler_settings,
)
from edge.families.wan.networks import (
    MergedWanBlock,
    WanBlock,
    WanEpilogue,
    WanPrologue,
    cut_vae_decoder,
)
from edge.graph.blocks import Block, Chunking
from edge.graph.family_model import Shapes, StorageRule
from edge.graph.lazy_weights import materialized

# --quantize 4 on the device, measured at Wan 2.1 1.3B's shapes (docs/benchmarks.md, "Wan's
# 4"). The transformer (92% of those bytes) and the text encoder (the real UMT5-XXL is 4x the
# transformer) take 4 bits, as int4 with a scale per 32 inputs: on a transformer block its
# output error is that of 4-bit tables per group of 16 channels (0.53% against 0.47%), which
# cost 14x the conversion time (72 s a block: over an hour for the 30 blocks and their TDTM
# functions). The VAE decoder stays at int8: at 4 bits each stage's output is 10% off, and a
# 4-bit decoder was what sank tiny-sora's rule on Wan (26.5 dB). End to end 41.8 dB, 0.1 dB
# under the text encoder at int8.
STORAGE_4 = StorageRule(
    (("text_encoder/*", "int4-b32"), ("transformer/*", "int4-b32"), ("vae_decoder/*", "int8")),
    psnr_floor_db=35.0,
    note="the text encoder and the transformer at 4 bits, as int4 with a scale per 32 "
         "inputs; the VAE decoder at int8")


@dataclass
class WanModel(PipelineModel):
    family = NAME
    text_tokens: int = TEXT_TOKENS
    # the causal VAE decoder runs latent frame by latent frame, its caches carried
    chunked: dict[str, Chunking] = field(kw_only=True, default_factory=lambda: {
        "vae_decoder": Chunking(input="z", output="frames", axis=2, size=1,
                                first_variant="first")})
    device_storage: dict[str, StorageRule] = field(
        kw_only=True, default_factory=lambda: {"4": STORAGE_4})
    clean = "wan"  # WanPipeline's prompt_clean

    @property
    def tiled(self) -> dict[str, Tiling]:
        """The decoder in spatial tiles, as the pipeline's VAE tiles it (its tile size and
        stride; diffusers' defaults 256 and 192 pixels, edge/core/tiles.py). Wan 2.2's decoder
        (RGB in patches) is not tiled yet."""
        vae = self.pipe.vae
        if vae.config.patch_size is not None:
            return {}
        scale = vae.spatial_compression_ratio
        return {"vae_decoder": Tiling(
            (vae.tile_sample_min_height // scale, vae.tile_sample_min_width // scale),
            (vae.tile_sample_stride_height // scale, vae.tile_sample_stride_width // scale),
            scale)}

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        vae = self.pipe.vae
        return (vae.config.z_dim, (self.frames - 1) // self.pipe.vae_scale_factor_temporal + 1,
                self.height // self.pipe.vae_scale_factor_spatial,
                self.width // self.pipe.vae_scale_factor_spatial)

    def _ids(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        from diffusers.pipelines.wan.pipeline_wan import prompt_clean

        enc = self.pipe.tokenizer([prompt_clean(p) for p in prompts], padding="max_length",
                                  max_length=self.text_tokens, truncation=True,
                                  add_special_tokens=True, return_attention_mask=True,
                                  return_tensors="pt")
        return enc.input_ids, enc.attention_mask

    def cut(self, shapes: Shapes | None = None) -> dict[str, list[Block]]:
        shapes = shapes or self.shapes("onnx")
        ids, mask = self._ids(["a red circle moving left", "the dog"][:shapes.prompts])
        return {"text_encoder": cut_umt5_encoder(self.pipe.text_encoder.encoder, ids, mask),
                "transformer": self._cut_transformer(shapes.guidance_batch),
                "vae_decoder": self._cut_vae_decoder(shapes)}

    def _cut_transformer(self, batch: int) -> list[Block]:
        model = self.pipe.transformer
        g = torch.Generator().manual_seed(0)
        latent = torch.randn(batch, *self.latent_shape, generator=g)
        t = torch.rand(batch, generator=g)
        caption = torch.randn(batch, self.text_tokens, model.config.text_dim, generator=g)
        pro = Block("transformer", "prologue", WanPrologue(model, self.latent_shape).eval(),
                    ["latent", "t", "caption"],
                    ["x", "t_mod", "temb", "context", "rope_cos", "rope_sin"],
                    (latent, t, caption), [True, True, True],
                    dynamic_outputs=[True, True, True, True, False, False])
        # the prologue's outputs are real; a block's input "x" is the prologue's as a
        # stand-in of its shape, made real by `edge.graph.blocks.chained` where an exporter runs
        # the blocks (at 480p the forward pass it saves is ~15 minutes here, and the
        # examples ~100 MB a block)
        x, t_mod, temb, context, cos, sin = pro.run(*pro.example)
        blocks = [pro]
        frames = self.latent_shape[1] // model.config.patch_size[0]
        for i, b in enumerate(model.blocks):
            variants = {"tdtm": MergedWanBlock(b, frames).eval()} if frames > 1 else {}
            blocks.append(Block("transformer", f"block_{i}", WanBlock(b).eval(),
                                ["x", "t_mod", "context", "rope_cos", "rope_sin"], ["x"],
                                (x, t_mod, context, cos, sin), [True, True, True, False, False],
                                variants, chained=("x",)))
        blocks.append(Block("transformer", "epilogue", WanEpilogue(model, self.latent_shape),
                            ["x", "temb"], ["velocity"], (x, temb), [True, True],
                            chained=("x",)))
        return blocks

    def _cut_vae_decoder(self, shapes: Shapes) -> list[Block]:
        """One block per stage, run once per latent frame (`chunked`); its variant "first"
        is the first frame's. `shapes.videos`: the batch traced (a dynamic batch traced at 1
        would be specialised to 1). A tiled decoder (`shapes.tiled_decoder`) leaves its
        frames unclamped for the runtime to blend and then clamp (edge/core/tiles.py): ONNX's
        graphs take any tile's height and width, traced, validated and estimated at one
        tile (what a call runs); a target of static shapes (`shapes.static_tiles`) gets
        blocks at the first tile of this video's latents and a variant per other tile size
        (`tile_RxC`, `first_tile_RxC`), or the whole frame where one tile holds it."""
        g = torch.Generator().manual_seed(1)
        z = torch.randn(shapes.videos, *self.latent_shape, generator=g)
        tiling = self.tiled.get("vae_decoder") if shapes.tiled_decoder else None
        if tiling is None or (shapes.static_tiles and not tiling.applies(*z.shape[-2:])):
            return self._decoder_stages(z, tiled=False, dynamic=False)
        if not shapes.static_tiles:
            rows, cols = tiling.latent_size
            return self._decoder_stages(z[..., :rows, :cols], tiled=True, dynamic=True)
        sizes = tiling.tile_sizes(*z.shape[-2:])
        blocks = self._decoder_stages(z[..., :sizes[0][0], :sizes[0][1]], tiled=True,
                                      dynamic=False)
        for size in sizes[1:]:
            stages = self._decoder_stages(z[..., :size[0], :size[1]], tiled=True,
                                          dynamic=False)
            for block, stage in zip(blocks, stages, strict=True):
                block.variants[tile_variant(None, size, sizes[0])] = replace(stage, variants={})
                block.variants[tile_variant("first", size, sizes[0])] = stage.variants["first"]
        return blocks

    def _decoder_stages(self, z: torch.Tensor, tiled: bool, dynamic: bool) -> list[Block]:
        """The decoder's stage blocks for latents `z` (each with its variant "first"):
        `tiled` leaves the frames unclamped, `dynamic` frees their height and width."""
        # a one-frame video runs only "first"; its later-frame graphs get a stand-in frame
        first_x, x = z[:, :, :1], z[:, :, 1:2] if z.shape[2] > 1 else z[:, :, :1]
        firsts = dict(cut_vae_decoder(self.pipe.vae, first=True, clamp=not tiled))
        blocks = []
        for i, (name, stage) in enumerate(cut_vae_decoder(self.pipe.vae, first=False,
                                                          clamp=not tiled)):
            x_in, x_out = ("z" if i == 0 else "h"), ("frames" if name == "out" else "h")
            with torch.no_grad(), materialized(stage), materialized(firsts[name]):
                first_out = firsts[name](first_x)
                # the second frame, after the first frame's cache: the shapes every later
                # frame has
                out = stage(x, *first_out[1:])
            # CoreML feature names take no "."
            state = [f"{name}_cache_{k}" for k in range(len(first_out) - 1)]
            dyn = [True] * (1 + len(state))
            first = Block("vae_decoder", name, firsts[name].eval(), [x_in], [x_out, *state],
                          (first_x,), [True], dynamic_space=dynamic)
            block = Block("vae_decoder", name, stage.eval(), [x_in, *state], [x_out, *state],
                          (x, *first_out[1:]), dyn, {"first": first}, dynamic_space=dynamic)
            blocks.append(block)
            first_x, x = first_out[0], out[0]
        return blocks


def check_size(folder: Path) -> dict[str, int]:
    """The small size an export's end-to-end check may run at (`--check small`): two latent
    frames, two patches a side."""
    shapes = check_components(folder)
    return {"height": 2 * shapes.spatial * shapes.patch[1],
            "width": 2 * shapes.spatial * shapes.patch[2], "frames": shapes.temporal + 1}


def accepts(folder: Path, height: int | None = None, width: int | None = None,
            frames: int | None = None, steps: int | None = None,
            sigmas: tuple[float, ...] | None = None) -> Accepted:
    """The one place that says what this family takes, from the folder's JSON files alone
    (nothing loaded, seconds at most): every component, the components against each other,
    the scheduler as edge's sampler, the video size against the model. Returns the size and
    the sampler; refuses anything else with a FamilyError naming the file, field or option."""
    given = {"height": height, "width": width, "frames": frames}
    size = {k: DEFAULT_SIZE[k] if v is None else v for k, v in given.items()}
    check_folder(folder)
    shapes = check_components(folder)
    check_video_size(shapes, **size)
    config = folder / "scheduler" / "scheduler_config.json"
    sampler = sampler_settings(config)
    return Accepted(size, with_steps(sampler, steps, sigmas))


def load(folder: Path, out_of_core: bool | None = None,
         vae_tiles: tuple[int, int, int, int] | None = None, **options) -> WanModel:
    """The folder's WanPipeline as an edge model; `options`: what `accepts` takes.
    `out_of_core`: build the models without weights and read each block's when it is
    exported (default: when the float32 weights exceed half this machine's memory).
    `vae_tiles`: the decoder's tile and stride in pixels (enable_tiling's four), checked
    against the folder before anything loads."""
    if vae_tiles is not None:
        check_vae_tiles(folder, vae_tiles)
    model = load_family(folder, accepts, load_pipeline, WanModel, out_of_core, **options)
    if vae_tiles is not None:
        model.pipe.vae.enable_tiling(*vae_tiles)
    return model


def check_vae_tiles(folder: Path, vae_tiles: tuple[int, int, int, int]) -> None:
    """--vae-tiles for this folder's VAE: a decoder that tiles (not Wan 2.2's, RGB in
    patches), and sizes that are whole latent cells."""
    shapes = check_components(folder)
    scale = shapes.spatial
    if shapes.decoder_patch is not None:
        raise FamilyError(f"--vae-tiles: {folder / 'vae' / 'config.json'} is Wan 2.2's decoder "
                          "(RGB in patches), which edge does not tile")
    names = ("tile height", "tile width", "stride height", "stride width")
    for name, value in zip(names, vae_tiles, strict=True):
        if value % scale:
            raise FamilyError(f"--vae-tiles: the {name} ({value} pixels) is not a multiple of "
                              f"the VAE's {scale} pixels a latent cell")
