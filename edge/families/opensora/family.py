"""Open-Sora 1.2 text-to-video (STDiT3, its video VAE, RFLOW) from a local folder of its
released checkpoints, which are not a diffusers pipeline:

    FOLDER/transformer/   hpcai-tech/OpenSora-STDiT-v3 as released (config.json, model_type
                          STDiT3; model.safetensors)
    FOLDER/vae/           hpcai-tech/OpenSora-VAE-v1.2 as released (config.json, model_type
                          VideoAutoencoderPipeline; model.safetensors with the 2D VAE inside)
    FOLDER/text_encoder/  a T5 v1.1 encoder in transformers' layout (DeepFloyd/t5-v1_1-xxl)
    FOLDER/tokenizer/     its tokenizer

The model code is edge's (stdit3.py, vae.py, pipeline.py in this folder; the cut in
blocks.py), checked against the original implementation's outputs (tests/test_opensora.py).
Nothing downloads: the VAE config's `vae_2d.from_pretrained` names the 2D VAE's diffusers
folder, whose weights are already in the checkpoint; its architecture is read from a config
of that name beside the VAE's config.json when there is one, else it is the SDXL VAE's (what
the released config names).

Sizes: whole chunks of `micro_frame_size` (17) frames, sides whole patches of the latent grid
(multiples of 16). Defaults as Open-Sora's v1.2 inference config: 30 steps, guidance 7,
24 fps, 51 frames; 240 x 432, the 240p 16:9 size nearest Open-Sora's 240 x 426 that fits the
patch grid. The prompt is encoded as given (Open-Sora's script appends " aesthetic score:
6.5.", which `reference(..., aesthetic=True)` does too, never silently).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import torch

from edge.core.files import kind_of
from edge.core.package import write_null_caption
from edge.core.sampler import SamplerSettings
from edge.families import FamilyError
from edge.families.config_check import (
    check_against_weights,
    check_layer_counts,
    stored_tensors,
)
from edge.families.folder import check_component_files, read_json
from edge.families.opensora import NAME
from edge.families.pipeline_run import Accepted, PipelineModel, with_steps
from edge.graph.blocks import Block, Chunking
from edge.graph.family_model import Shapes, StorageRule
from edge.graph.reference_device import modules_on

PARTS = ("transformer", "vae", "text_encoder", "tokenizer")
DEFAULT_SIZE = {"height": 240, "width": 432, "frames": 51}
SPATIAL = 8                    # pixels per latent cell (the 2D VAE's)
NUM_TRAIN_TIMESTEPS = 1000
# the SDXL VAE's architecture (PixArt-alpha/pixart_sigma_sdxlvae_T5_diffusers, vae/), which
# the released VAE config names and whose weights the checkpoint holds
SDXL_VAE = {"in_channels": 3, "out_channels": 3, "latent_channels": 4,
            "block_out_channels": [128, 256, 512, 512], "layers_per_block": 2,
            "norm_num_groups": 32, "act_fn": "silu", "sample_size": 1024,
            "down_block_types": ["DownEncoderBlock2D"] * 4,
            "up_block_types": ["UpDecoderBlock2D"] * 4,
            "scaling_factor": 0.13025, "force_upcast": True}
# the VAE checkpoint's encoding half: stored, not needed to sample
VAE_ENCODER_KEYS = ("temporal_vae.encoder.", "temporal_vae.quant_conv.",
                    "spatial_vae.module.encoder.", "spatial_vae.module.quant_conv.")


# ---------------------------------------------------------------- the folder and its configs

def check_parts(folder: Path) -> None:
    for part in PARTS:
        kind = kind_of(folder / part)
        if kind != "a folder":
            raise FamilyError(f"{folder / part}: {kind if kind == 'missing' else 'is ' + kind}"
                              f"; an Open-Sora folder holds {', '.join(p + '/' for p in PARTS)}")
        check_component_files(folder / part)


def model_type(path: Path, want: str,
               what: str = "{want!r} here (Open-Sora 1.2's released checkpoints)") -> dict:
    """The config at `path`, refused unless its model_type is `want`; `what` says what the
    family takes there."""
    cfg = read_json(path)
    if cfg.get("model_type") != want:
        raise FamilyError(f"{path}: model_type {cfg.get('model_type')!r}; the opensora family "
                          f"takes {what.format(want=want)}")
    return cfg


def dataclass_config(cls, cfg: dict, path: Path, where: str = ""):
    """`cls` (a config dataclass) from the JSON fields of its names, each checked against the
    default's type; a missing field keeps the default."""
    values = {}
    for f in fields(cls):
        if f.name not in cfg:
            continue
        value, default = cfg[f.name], f.default
        if isinstance(default, tuple):
            ok = isinstance(value, list) and all(isinstance(v, type(default[0])) for v in value)
            value = tuple(value) if ok else value
        elif isinstance(default, bool | str | int):  # an int field takes no 2.5 (nor true)
            ok = type(value) is type(default)
        else:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok:
            raise FamilyError(f"{path}: {where}{f.name}={cfg[f.name]!r}; must be like "
                              f"{default!r}")
        values[f.name] = value
    return cls(**values)


def transformer_config(folder: Path):
    from edge.families.opensora.stdit3 import STDiT3Config

    path = folder / "transformer" / "config.json"
    cfg = dataclass_config(STDiT3Config, model_type(path, "STDiT3"), path)
    for f in fields(cfg):  # sizes and counts; before any division by them
        value = getattr(cfg, f.name)
        if type(value) is int and value < 1:
            raise FamilyError(f"{path}: {f.name}={value}; must be at least 1")
    if not (math.isfinite(cfg.mlp_ratio) and 0 < cfg.mlp_ratio <= 64):
        raise FamilyError(f"{path}: mlp_ratio={cfg.mlp_ratio}; must be a number in (0, 64]")
    # the depth against the blocks the weights number (headers only), as the diffusers
    # families' counts: building ten million blocks, even without storage, would not end
    check_layer_counts(path, {"depth": cfg.depth}, stored_tensors(folder / "transformer"))
    if len(cfg.patch_size) != 3 or min(cfg.patch_size) < 1:
        raise FamilyError(f"{path}: patch_size={list(cfg.patch_size)}; must be three positive "
                          "integers")
    if cfg.hidden_size % cfg.num_heads or cfg.head_dim % 2:
        raise FamilyError(f"{path}: hidden_size={cfg.hidden_size} over num_heads="
                          f"{cfg.num_heads} must give an even head width")
    return cfg


@dataclass(frozen=True)
class VAEConfigs:
    temporal: object            # TemporalVAEConfig
    spatial: dict               # the 2D VAE's diffusers AutoencoderKL config
    micro_frame_size: int


def vae_configs(folder: Path) -> VAEConfigs:
    from edge.families.opensora.vae import TemporalVAEConfig

    path = folder / "vae" / "config.json"
    cfg = model_type(path, "VideoAutoencoderPipeline")
    parts = {k: cfg.get(k) for k in ("vae_temporal", "vae_2d")}
    for key, kind in (("vae_temporal", "VAE_Temporal"), ("vae_2d", "VideoAutoencoderKL")):
        if not isinstance(parts[key], dict) or parts[key].get("type") != kind:
            raise FamilyError(f"{path}: {key} must be an object of type {kind!r}")
    temporal = dataclass_config(TemporalVAEConfig, parts["vae_temporal"], path, "vae_temporal.")
    if len(temporal.temporal_downsample) != len(temporal.channel_multipliers) - 1:
        raise FamilyError(f"{path}: vae_temporal.temporal_downsample needs one entry fewer "
                          "than channel_multipliers")
    micro = cfg.get("micro_frame_size")
    if isinstance(micro, bool) or not isinstance(micro, int) or micro < 1:
        raise FamilyError(f"{path}: micro_frame_size={micro!r}; must be a positive integer")
    for key in ("scale", "shift"):
        if cfg.get(key) is not None and (not isinstance(cfg[key], list)
                                         or len(cfg[key]) != temporal.embed_dim):
            raise FamilyError(f"{path}: {key} must list {temporal.embed_dim} numbers")
    name, sub = parts["vae_2d"].get("from_pretrained"), parts["vae_2d"].get("subfolder")
    beside = (folder / "vae" / name / (sub if isinstance(sub, str) else "") / "config.json"
              if isinstance(name, str) else None)
    spatial = (read_json(beside) if beside is not None and kind_of(beside) == "a file"
               else dict(SDXL_VAE))
    return VAEConfigs(temporal, spatial, micro)


def check_text_encoder(folder: Path, caption_channels: int) -> None:
    path = folder / "text_encoder" / "config.json"
    cfg = model_type(path, "t5", "a T5 v1.1 encoder ({want!r})")
    if cfg.get("d_model") != caption_channels:
        raise FamilyError(f"{path}: d_model={cfg.get('d_model')!r}, but "
                          f"{folder / 'transformer' / 'config.json'} has caption_channels="
                          f"{caption_channels}: the transformer must take the encoder's width")


def check_video_size(cfg, vae: VAEConfigs, height: int, width: int, frames: int) -> None:
    """Whole 17-frame chunks; sides whole patches of latent cells."""
    for name, value, patch in (("height", height, cfg.patch_size[1]),
                               ("width", width, cfg.patch_size[2])):
        multiple = SPATIAL * patch
        if isinstance(value, bool) or not isinstance(value, int) or value < multiple \
                or value % multiple:
            raise FamilyError(f"--{name} {value}: Open-Sora needs a positive multiple of "
                              f"{multiple} (its VAE's {SPATIAL} x patch {patch})")
    micro = vae.micro_frame_size
    if isinstance(frames, bool) or not isinstance(frames, int) or frames < micro \
            or frames % micro:
        raise FamilyError(f"--frames {frames}: Open-Sora decodes whole chunks of {micro} "
                          f"frames (e.g. {micro}, {2 * micro}, {3 * micro})")


def sampler_settings(height: int, width: int, frames: int) -> SamplerSettings:
    """RFLOW as Open-Sora's v1.2 inference config sets it (edge's `rflow`): its shift the
    timestep transform's ratio for this size."""
    from edge.families.opensora.pipeline import GUIDANCE, STEPS, time_shift

    return SamplerSettings(steps=STEPS, guidance=GUIDANCE, shift=time_shift(height, width, frames),
                           num_train_timesteps=NUM_TRAIN_TIMESTEPS, scheduler="rflow",
                           leap_min_steps=STEPS // 2)


def check_size(folder: Path) -> dict[str, int]:
    """The small size an export's end-to-end check may run at (`--check small`): one chunk
    of frames, two patches a side."""
    cfg, vae = transformer_config(folder), vae_configs(folder)
    return {"height": 2 * SPATIAL * cfg.patch_size[1], "width": 2 * SPATIAL * cfg.patch_size[2],
            "frames": vae.micro_frame_size}


def accepts(folder: Path, height: int | None = None, width: int | None = None,
            frames: int | None = None, steps: int | None = None,
            frame_rate: float | None = None) -> Accepted:
    """What this family takes, from the folder's JSON files alone (nothing loaded): the four
    parts, their configs against each other, the video size against the model. Refuses
    anything else with a FamilyError naming the file, field or option."""
    from edge.families.opensora.pipeline import FPS

    check_parts(folder)
    cfg, vae = transformer_config(folder), vae_configs(folder)
    check_text_encoder(folder, cfg.caption_channels)
    given = {"height": height, "width": width, "frames": frames}
    size = {k: DEFAULT_SIZE[k] if v is None else v for k, v in given.items()}
    check_video_size(cfg, vae, **size)
    rate = FPS if frame_rate is None else frame_rate
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= 1000:
        raise FamilyError(f"--frame-rate {frame_rate}: must be a number of frames per second "
                          "in (0, 1000]")
    return Accepted(size, with_steps(sampler_settings(**size), steps), {"fps": float(rate)})


# ---------------------------------------------------------------- loading

def stored_except(component: Path, skipped: tuple[str, ...] = ()) -> dict:
    """{name: header} of the component's stored tensors but those under `skipped` prefixes
    (the VAE's encoding half, which sampling never reads)."""
    return {k: v for k, v in stored_tensors(component).items() if not k.startswith(skipped)}


def load_weights(component: Path, module: torch.nn.Module,
                 skipped: tuple[str, ...] = ()) -> torch.nn.Module:
    """The tensors of `component` (but `skipped` prefixes) as float32 in place of `module`'s
    own, a module built on the meta device whose keys `check_against_weights` found stored: the read
    tensors become its parameters (no second copy of the weights is allocated)."""
    from safetensors.torch import load_file

    state = {}
    for path in sorted(component.glob("*.safetensors")):
        state |= {k: v.float() for k, v in load_file(path).items() if not k.startswith(skipped)}
    module.load_state_dict(state, strict=True, assign=True)
    left = [n for n, t in [*module.named_parameters(), *module.named_buffers()] if t.is_meta]
    if left:  # a tensor outside the state dict (a non-persistent buffer) was never made
        raise FamilyError(f"{component}: {left[0]} was not loaded")
    return module


def load_pipeline(folder: Path):
    """The folder's components in float32 as an OpenSoraPipeline; notes on weights stored in
    another dtype."""
    from diffusers import AutoencoderKL
    from transformers import AutoTokenizer, T5EncoderModel

    from edge.families.folder import stored_dtypes
    from edge.families.opensora.pipeline import OpenSoraPipeline
    from edge.families.opensora.stdit3 import STDiT3
    from edge.families.opensora.vae import OpenSoraVAE

    cfg, vae_cfg = transformer_config(folder), vae_configs(folder)
    with torch.device("meta"):
        transformer = STDiT3(cfg)
        try:
            spatial = AutoencoderKL.from_config(vae_cfg.spatial)
        except (TypeError, ValueError) as err:
            raise FamilyError(f"{folder / 'vae'}: the 2D VAE's config builds no AutoencoderKL "
                              f"({err})") from None
        vae = OpenSoraVAE(vae_cfg.temporal, spatial, vae_cfg.micro_frame_size)
    # both checked from the headers before either is read
    check_against_weights(folder / "transformer", STDiT3, transformer,
                          stored_except(folder / "transformer"))
    check_against_weights(folder / "vae", OpenSoraVAE, vae,
                          stored_except(folder / "vae", VAE_ENCODER_KEYS))
    transformer = load_weights(folder / "transformer", transformer)
    vae = load_weights(folder / "vae", vae, VAE_ENCODER_KEYS)
    try:
        text_encoder = T5EncoderModel.from_pretrained(folder / "text_encoder",
                                                      local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(folder / "tokenizer", local_files_only=True)
    except (OSError, ValueError) as err:
        raise FamilyError(f"{folder}: the text encoder or tokenizer does not load: "
                          f"{str(err).strip()[:300]}") from None
    notes = [f"{folder / name}: weights stored as {', '.join(sorted(kinds))}, converted to "
             "float32 (packages hold float32)"
             for name in ("transformer", "vae", "text_encoder")
             if (kinds := stored_dtypes(folder / name) - {"F32"})]
    pipe = OpenSoraPipeline(transformer.eval(), vae.eval(), text_encoder.float().eval(),
                            tokenizer)
    return pipe, notes


# ---------------------------------------------------------------- the family's model

def to_uint8(video: torch.Tensor) -> np.ndarray:
    """Video (B, 3, T, H, W) about [-1, 1] -> uint8 (B, T, H, W, 3), as the runtimes round
    their [0, 1] frames."""
    frames = ((video.clamp(-1, 1) + 1) / 2).permute(0, 2, 3, 4, 1).numpy()
    return np.round(frames * 255).astype(np.uint8)


# --quantize 4 for Open-Sora, measured at the released shapes (docs/benchmarks.md "Open-Sora's
# 4"). Wan's rule (the text encoder and the transformer int4 with a scale per 32 inputs, the
# decoder int8) gives 26.9 dB, under the 35 dB floor: the loss is on the caption's path.
# With the weights rounded as the programs store them, every tensor at int8 gives 42.5 dB,
# then the pairs' MLPs at 4 bits (half the transformer's bytes) 42.3, their self-attention
# 41.7, but their cross-attention 33.0, and the text encoder alone 30.7. So the pairs take
# 4 bits but their cross-attention, and the caption's other readers (the text encoder, the
# prologue's caption projection) and the decoder stay at int8.
STORAGE_4 = StorageRule(
    (("transformer/pair_*", "int4-b32"), ("*", "int8")),
    psnr_floor_db=35.0,
    note="the transformer's pairs at 4 bits (int4 with a scale per 32 inputs) but their "
         "cross-attention; the cross-attention, the text encoder, the prologue's caption "
         "projection and the decoder at int8 (the caption's path loses the video at 4 bits)",
    tensors=(("transformer/pair_*", "*cross_attn*", "int8"),))


@dataclass
class OpenSoraModel(PipelineModel):
    fps: float = 24.0               # the frame rate the model is told (--frame-rate)
    family = NAME
    device_storage: dict[str, StorageRule] = field(
        kw_only=True, default_factory=lambda: {"4": STORAGE_4})

    @property
    def text_tokens(self) -> int:
        return self.pipe.text_tokens

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        return (self.pipe.transformer.cfg.in_channels, self.pipe.vae.latent_frames(self.frames),
                self.height // SPATIAL, self.width // SPATIAL)

    def cut(self, shapes: Shapes | None = None) -> dict[str, list[Block]]:
        from edge.families.t5 import cut_t5_encoder

        shapes = shapes or self.shapes("onnx")
        ids, mask = self.pipe.tokenize(["a red circle moving left", "the dog"][:shapes.prompts])
        return {"text_encoder": cut_t5_encoder(self.pipe.text_encoder.encoder, ids, mask),
                "transformer": self._cut_transformer(shapes.guidance_batch),
                "vae_decoder": self._cut_vae_decoder(shapes.videos)}

    def _cut_transformer(self, batch: int) -> list[Block]:
        from edge.families.opensora.blocks import cut_transformer_modules

        model, tokens = self.pipe.transformer, self.text_tokens
        g = torch.Generator().manual_seed(0)
        latent = torch.randn(batch, *self.latent_shape, generator=g)
        t = torch.rand(batch, generator=g)
        caption = torch.randn(batch, tokens, model.cfg.caption_channels, generator=g)
        # captions of different lengths, as prompts are
        mask = (torch.arange(tokens) < torch.arange(1, batch + 1)[:, None] * 5).long()
        prologue, pairs, epilogue = cut_transformer_modules(model, self.latent_shape,
                                                            self.height, self.width, self.fps)
        pro_out = ["x", "temb", "t_mlp", "t_mod", "y", "y_bias"]
        pro = Block("transformer", "prologue", prologue, ["latent", "t", "caption",
                                                          "caption_mask"], pro_out,
                    (latent, t, caption, mask), [True] * 4)
        feeds = dict(zip(pro_out, pro.run(*pro.example), strict=True))
        blocks = [pro]
        pair_in = ["x", "t_mlp", "y", "y_bias"]
        frames = model.grid(self.latent_shape)[0]
        # blocks take the prologue's activations as stand-ins (Block.chained), made real
        # by edge.graph.blocks.chained as the exporters run them: the cut runs no block
        for i, (pair, merged) in enumerate(pairs):
            blocks.append(Block("transformer", f"pair_{i}", pair, pair_in, ["x"],
                                tuple(feeds[n] for n in pair_in), [True] * 4,
                                {"tdtm": merged} if frames > 1 else {}, chained=("x",)))
        blocks.append(Block("transformer", "epilogue", epilogue, ["x", "temb"], ["velocity"],
                            (feeds["x"], feeds["temb"]), [True, True], chained=("x",)))
        return blocks

    def _cut_vae_decoder(self, videos: int) -> list[Block]:
        from edge.families.opensora.blocks import cut_decoder_modules

        c, _, h, w = self.latent_shape
        piece = self.chunked["vae_decoder"].size if "vae_decoder" in self.chunked \
            else self.latent_shape[1]
        x = torch.randn(videos, c, piece, h, w, generator=torch.Generator().manual_seed(1))
        blocks, name_in = [], "z"
        stages = cut_decoder_modules(self.pipe.vae)
        for i, (name, module) in enumerate(stages):
            name_out = ("latents_2d" if name == "temporal"
                        else "frames" if i == len(stages) - 1 else "h")
            block = Block("vae_decoder", name, module, [name_in], [name_out], (x,), [True])
            (x,) = block.run(x)
            blocks.append(block)
            name_in = name_out
        return blocks

    def package_fields(self, root: Path, raw_null_caption: bool = False) -> dict:
        """The diffusers families' fields, with the learned null caption in place of a
        negative prompt, masked as the prompt is (`null_caption_mask`), and the frame rate
        the model is told."""
        fields = super().package_fields(root, raw_null_caption)
        del fields["negative_prompt"]
        fields["conditioning"] = write_null_caption(
            root, self.pipe.transformer.y_embedder.y_embedding.numpy(), raw_null_caption)
        fields["null_caption_mask"] = "prompt"
        fields["video"]["frame_rate"] = self.fps
        return fields

    @torch.no_grad()
    def reference(self, prompt: str, latents: np.ndarray | None = None,
                  negative_prompt: str | None = None, steps: int | None = None,
                  guidance: float | None = None,
                  on_step: Callable[[int, int], None] | None = None,
                  seed: int | None = None, output_type: str = "np",
                  aesthetic: bool = False) -> np.ndarray:
        """Open-Sora's sampling on edge's model: uint8 video (B, T, H, W, 3) (output_type
        "latent": the denoised latents, float32 (B, C, T, h, w)) from these initial latents or
        those torch.randn draws for `seed`. `aesthetic`: Open-Sora's script's suffix appended
        to the prompt. The unconditional half is the learned null caption (a negative prompt
        is not Open-Sora's guidance: refused)."""
        if negative_prompt:
            raise ValueError("negative_prompt: Open-Sora guides against its learned null "
                             "caption; it takes no negative prompt")
        start = self.start(latents, seed)
        if aesthetic:
            from edge.families.opensora.pipeline import AESTHETIC_SUFFIX

            prompt = prompt + AESTHETIC_SUFFIX
        pipe = self.pipe
        # where the reference runs (`edge export --device`)
        with modules_on(pipe.transformer, pipe.vae, pipe.text_encoder):
            out = pipe(prompt, self.height, self.width, self.frames,
                       steps=self.sampler.steps if steps is None else steps,
                       guidance=self.sampler.guidance if guidance is None else guidance,
                       fps=self.fps, on_step=on_step,
                       output_type="latent" if output_type == "latent" else "pt",
                       **start).cpu()
        return out.numpy() if output_type == "latent" else to_uint8(out)


def load(folder: Path, **options) -> OpenSoraModel:
    """The folder's Open-Sora 1.2 as an edge model at this size; `options`: what `accepts`
    takes."""
    accepted = accepts(folder, **options)
    pipe, notes = load_pipeline(folder)
    # the decoder runs chunk by chunk: each micro_frame_size chunk (17 frames, 5 latent
    # frames) is decoded alone by Open-Sora's temporal VAE, so a piece needs no state and
    # memory holds one chunk's activations
    chunked = {"vae_decoder": Chunking(input="z", output="frames", axis=2,
                                       size=pipe.vae.micro_z)}
    return OpenSoraModel(pipe, folder, sampler=accepted.sampler, notes=notes,
                         name=folder.resolve().name, chunked=chunked, **accepted.size,
                         **accepted.own)
