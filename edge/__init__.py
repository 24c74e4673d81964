"""edge: an on-device inference toolkit for diffusion text-to-video models."""

__version__ = "0.1.0"

import logging as _logging

# The name pip installs it by: `edge` on the package index is an unrelated project (Directed
# Edge's API bindings, 2014), so `pip install edge` would bring that. The import name and the
# command stay `edge`.
DISTRIBUTION = "edge-video"

# torchao (which Core AI's quantizer, coreai-opt, brings with the [iphone] extra) logs at import
# that its CUDA kernels are absent and that torch deprecates its enum registrations, and
# diffusers imports it whenever it is installed: nothing there concerns an export or a
# generation on this machine, and every command would print it.
for _name in ("torchao", "torch.utils._pytree", "diffusers.quantizers.torchao.torchao_quantizer"):
    _logging.getLogger(_name).setLevel(_logging.ERROR)
