"""How a web package stores its weights (`edge export --target web --quantize`).

A page downloads every byte it runs and, on the wasm path, holds them in a 4 GiB heap, so the
web stores weights narrower than the float32 the blocks compute in:

- **fp32**: as computed, nothing decoded;
- **fp16** (the default): every weight as IEEE half (a tensor past half's range stays fp32);
- **8**: each weight of two or more dimensions and at least `INT8_MIN_ELEMENTS` elements as
  symmetric int8 with one float32 scale per row (its first axis: a linear layer's output
  channel), the rest (norms, biases, small tables) as fp16.

The page decodes a tensor to the float32 the kernels read, exactly as `StoredTensor.
decoded` does here, so the export checks each block's compiled forms against the block run
with the decoded weights at the float32 bound, and records apart what storing costs (the
block with decoded weights against the block as trained: `storage_error`). On the wasm path
the decoding is part of the block's ONNX graph (`Cast`, and a `Mul` by the row scales:
onnxruntime-web's wasm provider runs both); on the WebGPU path the page decodes each tensor
on the GPU as it uploads it (runtimes/web/decode.js: WGSL's `unpack2x16float` for half,
sign-extending `extractBits` and the row scale for int8, no shader extension needed).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edge.blocks import Block
from edge.package import write_weights_file

FORMS = ("fp32", "fp16", "8")
DEFAULT_FORM = "fp16"
INT8_MIN_ELEMENTS = 4096   # smaller tensors (norms, biases) cost little and stay fp16
HALF_MAX = 65504.0         # the largest finite half
HALF_SMALLEST_NORMAL = np.float16(2.0**-14)
SCALE_SUFFIX = ":scale"    # an int8 tensor's row scales: "<name>:scale"


@dataclass(frozen=True)
class StoredTensor:
    """One weight as the package stores it: `data` in its stored dtype, `scale` the float32
    row scales of an int8 tensor (else None)."""

    name: str
    data: np.ndarray
    scale: np.ndarray | None = None

    @cached_property
    def decoded(self) -> np.ndarray:
        """The float32 tensor the block computes with, as the page decodes it: half widened
        exactly; int8 times its row's scale, one float32 rounding. Decoded once: the export
        checks a block and each of its variants with it."""
        if self.scale is None:
            return self.data.astype(np.float32)
        rows = self.scale.reshape(-1, *([1] * (self.data.ndim - 1)))
        return self.data.astype(np.float32) * rows

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays the weights file holds for it, in the order the graph takes them."""
        if self.scale is None:
            return {self.name: self.data}
        return {self.name: self.data, self.name + SCALE_SUFFIX: self.scale}


def stored_arrays(stored: list[StoredTensor]) -> dict[str, np.ndarray]:
    """Every array a block's weights file holds, by name, in order: the graph's weight
    inputs, C-ordered (np.require keeps a 0-d tensor 0-d; np.ascontiguousarray makes it 1-d)."""
    return {n: np.require(a, requirements="C") for t in stored for n, a in t.arrays().items()}


def check_form(form: str) -> None:
    if form not in FORMS:
        raise ValueError(f"--quantize {form!r}: the web target stores weights as "
                         f"{', '.join(FORMS)}")


def store(name: str, tensor: torch.Tensor, form: str) -> StoredTensor:
    """`tensor` in stored form `form` (one of FORMS)."""
    w = tensor.detach().float().contiguous().numpy()
    if form == "8" and w.ndim >= 2 and w.size >= INT8_MIN_ELEMENTS:
        rows = w.reshape(w.shape[0], -1)
        scale = (np.abs(rows).max(axis=1) / 127.0).astype(np.float32)
        scale[scale == 0] = 1.0  # an all-zero row: any scale decodes it to zeros
        q = np.clip(np.rint(rows / scale[:, None]), -127, 127).astype(np.int8)
        return StoredTensor(name, q.reshape(w.shape), scale)
    if form == "fp32" or np.abs(w).max(initial=0.0) > HALF_MAX:
        return StoredTensor(name, w)
    half = w.astype(np.float16)
    # WGSL may flush a subnormal half to zero as it unpacks it: stored as zero, the page
    # decodes the same tensor everywhere (they are below 6.1e-5, a rounding's worth)
    half[np.abs(half) < HALF_SMALLEST_NORMAL] = 0
    return StoredTensor(name, half)


def stored_bytes(tensor: torch.Tensor, form: str) -> int:
    """Bytes `store` gives `tensor` by its shape alone (a half out of range aside): for a
    dry run, which stores nothing."""
    n = tensor.numel()
    if form == "8" and tensor.dim() >= 2 and n >= INT8_MIN_ELEMENTS:
        return n + 4 * tensor.shape[0]
    return n * (4 if form == "fp32" else 2)


def stored_weights(block: Block, form: str) -> list[StoredTensor]:
    return [store(n, t, form) for n, t in block.parameters().items()]


def decoded_parameters(stored: list[StoredTensor]) -> dict[str, torch.Tensor]:
    return {t.name: torch.from_numpy(t.decoded) for t in stored}


@torch.no_grad()
def run_decoded(block: Block, stored: list[StoredTensor]) -> tuple[torch.Tensor, ...]:
    """The block's outputs on its example with the decoded weights: what the page computes,
    and the reference its compiled forms are checked against."""
    out = torch.func.functional_call(block.module, decoded_parameters(stored), block.example)
    return out if isinstance(out, tuple) else (out,)


class StoredWeightsAsInputs(nn.Module):
    """A block whose weights are graph inputs in their stored forms, after the activations,
    decoded in the graph (a half widened; an int8 tensor, then its row scales, multiplied)."""

    def __init__(self, block: Block, stored: list[StoredTensor]) -> None:
        super().__init__()
        self.block = block.module
        self.n_inputs = len(block.inputs)
        self.layout = [(t.name, t.scale is not None) for t in stored]

    def forward(self, *args):
        rest = list(args[self.n_inputs:])
        weights = {}
        for name, scaled in self.layout:
            w = rest.pop(0).float()
            if scaled:
                scale = rest.pop(0)
                w = w * scale.reshape(-1, *([1] * (w.dim() - 1)))
            weights[name] = w
        return torch.func.functional_call(self.block, weights, args[:self.n_inputs])


def graph_weights(block: Block, stored: list[StoredTensor]
                  ) -> tuple[nn.Module, list[str], tuple[torch.Tensor, ...]]:
    """What exporters/onnx.export_graph traces for a block with stored weights: the module,
    the weight inputs' names and example tensors (the stored arrays)."""
    arrays = stored_arrays(stored)
    return (StoredWeightsAsInputs(block, stored), list(arrays),
            tuple(torch.from_numpy(a) for a in arrays.values()))


def write_stored(path: Path, stored: list[StoredTensor]) -> list[dict]:
    """The stored arrays in one weights file in the package's flash layout; the manifest's
    tensor table: each array's name, stored dtype, shape, offset and bytes, and for an int8
    tensor `scale`, the name of its row scales' entry."""
    arrays = stored_arrays(stored)
    offsets = write_weights_file(path, arrays)
    scaled = {t.name for t in stored if t.scale is not None}
    return [{"name": n, "dtype": str(a.dtype), "shape": list(a.shape), "offset": offsets[n],
             "bytes": a.nbytes} | ({"scale": n + SCALE_SUFFIX} if n in scaled else {})
            for n, a in arrays.items()]


def storage_record(form: str) -> dict:
    """The manifest's `web.storage`: the setting and what it stores how."""
    return {"quantize": form,
            "rule": {"fp32": "every weight float32",
                     "fp16": "every weight IEEE half (one past its range float32)",
                     "8": f"weights of 2+ dimensions and >= {INT8_MIN_ELEMENTS} elements int8 "
                          "with a float32 scale per row (first axis), the rest IEEE half"}[form]}
