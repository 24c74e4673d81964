"""LTX-Video 0.9.x (diffusers `LTXPipeline`), registered: what `edge export` and the family
registry read without loading torch, its own export options among them. The family itself is
`family.py`."""

from edge.core.declared import Option
from edge.families.pipeline_options import PIPELINE_OPTIONS

NAME = "ltx"
PIPELINE = "LTXPipeline"   # model_index.json's _class_name
FOLDER = "a diffusers LTXPipeline folder (LTX-Video 0.9.x)"
OPTIONS = (
    *PIPELINE_OPTIONS,
    Option("frame_rate", float, "The frames per second the positions are scaled for "
           "(LTXPipeline's frame_rate) [default: 25].", group="Video size"),
    Option("decode_timestep", float, "With a timestep-conditioned decoder (0.9.5+): the "
           "decode timestep the package defaults to, in [0, 1] (LTXPipeline's "
           "decode_timestep) [default: 0].", group="Sampler"),
    Option("decode_noise_scale", float, "With a timestep-conditioned decoder: how much decode "
           "noise the package mixes into the latents by default, in [0, 1] (LTXPipeline's "
           "decode_noise_scale) [default: the decode timestep].", group="Sampler"),
)
