"""tiny-sora, the default model the project trains and ships, registered: what `edge export`
and the family registry read without loading torch. The family itself is `family.py`."""

NAME = "tiny-sora"
PIPELINE = None   # a weights folder with tiny-sora.json, not a diffusers folder
FOLDER = "a tiny-sora weights folder (with tiny-sora.json)"
OPTIONS = ()      # its video size and sampler come with its weights
# its reference runs on the CPU whatever --device says: why, as a refusal says it
REFERENCE_ON_CPU = "its fixed tiny size takes seconds there"
