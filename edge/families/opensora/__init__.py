"""Open-Sora 1.2 (STDiT3, its video VAE, RFLOW) from its released checkpoints, registered:
what `edge export` and the family registry read without loading torch. The family itself is
`family.py`; its random-weight writer (`edge scale-model --like opensora-...`) `scale.py`."""

from edge.core.declared import Option
from edge.families.pipeline_options import SIZE_OPTIONS

NAME = "opensora"
PIPELINE = None   # not a diffusers folder: its transformer's config says model_type STDiT3
FOLDER = "an Open-Sora 1.2 folder (transformer/, vae/, text_encoder/, tokenizer/)"
# the frame rate is the model's input (LTX-Video's option of the same name is its RoPE's)
OPTIONS = (*SIZE_OPTIONS, Option("frame_rate", float, "The frames per second the model is "
                                 "told it runs at [default: 24].",
                                 group="Video size"))
