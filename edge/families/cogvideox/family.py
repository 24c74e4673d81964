"""CogVideoX 1.0 text-to-video, 2B and 5B (diffusers `CogVideoXPipeline`): T5 v1.1 text
encoder, `CogVideoXTransformer3DModel`, `AutoencoderKLCogVideoX`, `CogVideoXDDIMScheduler`,
from a local diffusers pipeline folder.

Cuts (each chained component equals the diffusers component; tests/test_cogvideox.py):
  text_encoder  embeddings, layer_0 (gives the relative position bias), layer_1 ..
                layer_{N-1} (take it), final (edge/families/t5.py); no mask: CogVideoX
                encodes the padded ids alone
  transformer   prologue (time embedding; caption projection; patch embedding plus, for 2B,
                the 3D sin-cos position table; for 5B, the 3D rotary cos/sin tables; both
                computed at the export size and stored as weights), block_0 .. block_{N-1}
                (joint attention over [caption; video] tokens: each block takes and gives
                both), epilogue (final norms, proj_out, unpatchify)
  vae_decoder   head (latents to the decoder's layout and scale, conv_in, mid block),
                up_0 .. up_3, out (spatial norm, conv_out, to [0, 1])

Latents are (B, F, C, h, w), frames before channels, as diffusers lays them out and draws
their noise. The VAE decoder runs as diffusers runs it: two latent frames per call after a
first call of two or three (an odd count's first frame decodes alone in time), each causal
convolution's cache of the last two frames carried between calls (a chunked component). The
calls cannot be cut finer: the decoder's group norms span the frames of one call, and its
time upsamplers treat an odd call's first frame apart, so other pieces give another video.
Every stage takes the call's latents too (CogVideoX's spatial norms condition on them).

The 2B's position table: diffusers builds it for the config's sample size and, at another
size, rebuilds it in place inside forward (`.data[...].copy_()`: tracing exports that
silently wrong, dynamo refuses it); here it is computed once at the export size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from edge.families.cogvideox import NAME
from edge.families.cogvideox.folder_checks import (
    check_components,
    check_folder,
    check_video_size,
    load_pipeline,
    sampler_settings,
)
from edge.families.cogvideox.networks import (
    FRAME_BATCH,
    CogVideoXBlockCut,
    CogVideoXEpilogue,
    CogVideoXPrologue,
    MergedCogVideoXBlock,
    decoder_stages,
    first_call_frames,
)
from edge.families.pipeline_run import (
    Accepted,
    PipelineModel,
    load_family,
    with_steps,
)
from edge.families.t5 import cut_t5_encoder
from edge.graph.blocks import Block, Chunking
from edge.graph.family_model import Shapes
from edge.graph.lazy_weights import materialized


@dataclass
class CogVideoXModel(PipelineModel):
    family = NAME

    def __post_init__(self) -> None:
        self.chunked = {"vae_decoder": Chunking(
            input="z", output="frames", axis=1, size=FRAME_BATCH, first_variant="first",
            first_size=first_call_frames(self.latent_shape[0]), output_axis=2)}

    @property
    def text_tokens(self) -> int:
        return self.pipe.transformer.config.max_text_seq_length

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        pipe = self.pipe
        return ((self.frames - 1) // pipe.vae_scale_factor_temporal + 1,
                pipe.transformer.config.in_channels,
                self.height // pipe.vae_scale_factor_spatial,
                self.width // pipe.vae_scale_factor_spatial)

    def _ids(self, prompts: list[str]) -> torch.Tensor:
        return self.pipe.tokenizer(prompts, padding="max_length", max_length=self.text_tokens,
                                   truncation=True, add_special_tokens=True,
                                   return_tensors="pt").input_ids

    def cut(self, shapes: Shapes | None = None) -> dict[str, list[Block]]:
        shapes = shapes or self.shapes("onnx")
        ids = self._ids(["a red circle moving left", "the dog"][:shapes.prompts])
        return {"text_encoder": cut_t5_encoder(self.pipe.text_encoder.encoder, ids),
                "transformer": self._cut_transformer(shapes.guidance_batch),
                "vae_decoder": self._cut_vae_decoder(shapes.videos)}

    def _rope(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not self.pipe.transformer.config.use_rotary_positional_embeddings:
            return None
        return self.pipe._prepare_rotary_positional_embeddings(
            self.height, self.width, self.latent_shape[0], torch.device("cpu"))

    def _cut_transformer(self, batch: int) -> list[Block]:
        model = self.pipe.transformer
        g = torch.Generator().manual_seed(0)
        latent = torch.randn(batch, *self.latent_shape, generator=g)
        t = torch.randint(0, self.sampler.num_train_timesteps, (batch,), generator=g).float()
        t = t / self.sampler.num_train_timesteps
        caption = torch.randn(batch, self.text_tokens, model.config.text_embed_dim, generator=g)
        rope = self._rope()
        pro_out = ["x", "context", "temb", "t_mod"] + ([] if rope is None
                                                       else ["rope_cos", "rope_sin"])
        pro = Block("transformer", "prologue",
                    CogVideoXPrologue(model, self.latent_shape, rope,
                                      self.sampler.num_train_timesteps).eval(),
                    ["latent", "t", "caption"], pro_out, (latent, t, caption), [True] * 3,
                    dynamic_outputs=[True] * 4 + [False] * (len(pro_out) - 4))
        feeds = dict(zip(pro_out, pro.run(*pro.example), strict=True))
        blocks = [pro]
        block_in = ["x", "context", "temb"] + pro_out[4:]
        frames = self.latent_shape[0]
        # blocks take the prologue's activations as stand-ins (Block.chained), made real
        # by edge.graph.blocks.chained as the exporters run them: the cut runs no block
        for i, b in enumerate(model.transformer_blocks):
            merged = MergedCogVideoXBlock(b, frames, self.text_tokens,
                                          feeds["x"].shape[1] // frames)
            variants = {"tdtm": merged.eval()} if frames > 1 else {}
            blocks.append(Block("transformer", f"block_{i}", CogVideoXBlockCut(b).eval(),
                                block_in, ["x", "context"], tuple(feeds[n] for n in block_in),
                                [True] * 3 + [False] * (len(block_in) - 3), variants,
                                chained=("x", "context")))
        blocks.append(Block("transformer", "epilogue",
                            CogVideoXEpilogue(model, self.latent_shape).eval(), ["x", "temb"],
                            ["velocity"], (feeds["x"], feeds["temb"]), [True, True],
                            chained=("x",)))
        return blocks

    def _cut_vae_decoder(self, videos: int) -> list[Block]:
        """One block per stage, run once per decoder call (`chunked`); its variant "first" is
        the first call's. `videos`: the batch traced."""
        g = torch.Generator().manual_seed(1)
        z = torch.randn(videos, *self.latent_shape, generator=g)
        first_frames = self.chunked["vae_decoder"].first_size
        first_x = z[:, :first_frames]
        # a later call's frames; a video with none still gets its later graphs, traced on a
        # stand-in call of the first frames repeated
        x = z[:, first_frames:first_frames + FRAME_BATCH]
        if x.shape[1] < FRAME_BATCH:
            x = first_x[:, :1].repeat(1, FRAME_BATCH, 1, 1, 1)
        firsts = dict(decoder_stages(self.pipe.vae, first=True))
        blocks = []
        first_zq = zq = None  # the head makes them
        for i, (name, stage) in enumerate(decoder_stages(self.pipe.vae, first=False)):
            first_stage = firsts[name]
            ins = ["z" if i == 0 else "h"] + (["zq"] if stage.takes_zq else [])
            first_in = (first_x, first_zq) if stage.takes_zq else (first_x,)
            later_in = (x, zq) if stage.takes_zq else (x,)
            with torch.no_grad(), materialized(stage), materialized(first_stage):
                first_out = first_stage(*first_in)
                stage.paths = first_stage.paths
                made = len(first_out) - len(stage.paths)  # tensors before the caches
                out = stage(*later_in, *first_out[made:])
            state = [f"{name}_cache_{k}" for k in range(len(stage.paths))]
            outs = ["frames" if name == "out" else "h"] + (["zq"] if made == 2 else [])
            first = Block("vae_decoder", name, first_stage.eval(), ins, outs + state, first_in,
                          [True] * len(ins))
            blocks.append(Block("vae_decoder", name, stage.eval(), ins + state, outs + state,
                                later_in + tuple(first_out[made:]),
                                [True] * (len(ins) + len(state)), {"first": first}))
            if made == 2:
                first_zq, zq = first_out[1], out[1]
            first_x, x = first_out[0], out[0]
        return blocks

    def pipeline_options(self, seed: int | None,
                         dynamic_guidance: bool | None = None) -> dict:
        """`reference(..., dynamic_guidance=)`: CogVideoXPipeline's use_dynamic_cfg (default:
        the sampler's setting)."""
        return {"use_dynamic_cfg": self.sampler.dynamic_guidance if dynamic_guidance is None
                else dynamic_guidance}


def check_size(folder: Path) -> dict[str, int]:
    """The small size an export's end-to-end check may run at (`--check small`): a few
    latent frames, two patches a side."""
    shapes = check_components(folder)
    side = 2 * shapes.spatial * shapes.patch
    return {"height": side, "width": side, "frames": 2 * shapes.temporal + 1}


def accepts(folder: Path, height: int | None = None, width: int | None = None,
            frames: int | None = None, steps: int | None = None,
            sigmas: tuple[float, ...] | None = None) -> Accepted:
    """What this family takes, from the folder's JSON files alone (nothing loaded): every
    component, the components against each other, the scheduler as edge's sampler, the
    video size (default: the transformer's own) against the model. Refuses anything else
    with a FamilyError naming the file, field or option."""
    check_folder(folder)
    shapes = check_components(folder)
    given = {"height": height, "width": width, "frames": frames}
    size = {k: own if v is None else v for (k, v), own in zip(given.items(), shapes.sample,
                                                              strict=True)}
    check_video_size(shapes, **size)
    sampler = sampler_settings(folder / "scheduler" / "scheduler_config.json")
    return Accepted(size, with_steps(sampler, steps, sigmas))


def load(folder: Path, out_of_core: bool | None = None, **options) -> CogVideoXModel:
    """The folder's CogVideoXPipeline as an edge model; `options`: what `accepts` takes.
    `out_of_core`: build the models without weights and read each block's when it is
    exported (default: when the float32 weights exceed half this machine's memory)."""
    return load_family(folder, accepts, load_pipeline, CogVideoXModel, out_of_core, **options)
