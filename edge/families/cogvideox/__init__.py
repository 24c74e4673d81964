"""CogVideoX 1.0, 2B and 5B (diffusers `CogVideoXPipeline`), registered: what `edge export` and
the family registry read without loading torch. The family itself is `family.py`."""

from edge.families.pipeline_options import PIPELINE_OPTIONS

NAME = "cogvideox"
PIPELINE = "CogVideoXPipeline"   # model_index.json's _class_name
FOLDER = "a diffusers CogVideoXPipeline folder (CogVideoX 2B, 5B)"
OPTIONS = PIPELINE_OPTIONS
