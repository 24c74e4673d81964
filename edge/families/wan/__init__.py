"""Wan 2.1 and Wan 2.2 TI2V-5B (diffusers `WanPipeline`), registered: what `edge export` and
the family registry read without loading torch. The family itself is `family.py`."""

from edge.families.pipeline_options import PIPELINE_OPTIONS

NAME = "wan"
PIPELINE = "WanPipeline"   # model_index.json's _class_name
FOLDER = "a diffusers WanPipeline folder (Wan 2.1, Wan 2.2 TI2V-5B)"
OPTIONS = PIPELINE_OPTIONS
