"""How a web package stores its weights (`edge export --target web --quantize`).

A page downloads every byte it runs and, on the wasm path, holds them in a 4 GiB heap, so the
web stores weights narrower than the float32 the blocks compute in:

- **fp32**: as computed, nothing decoded;
- **fp16** (the default): every weight as IEEE half (a tensor past half's range stays fp32);
- **8**: each weight of two or more dimensions and at least `INT8_MIN_ELEMENTS` elements as
  symmetric int8 with one float32 scale per row (its first axis: a linear layer's output
  channel), the rest (norms, biases, small tables) as fp16;
- **4**: worded by each family, as the iphone target's `--quantize 4` is, from the same
  rule (`FamilyModel.device_storage["4"]`): a block (or tensor) the phone stores at 4 bits
  (a 4-bit palette or int4) is stored here as int4, one the phone stores at 6 or 8 bits as
  int8, an fp16 one as fp16 (the web has no palettes). Int4: each matrix whose rows split
  into groups of `INT4_GROUP`, symmetric (-7..7, stored as unsigned nibbles offset by 8, two
  a byte, the first in the low nibble) with one half (fp16) scale per group of a row; the other
  large weights (convolutions' kernels) int8 by row, the rest fp16. Groups of 32 inputs are
  the iphone target's int4 grouping (an outlier costs its group, not its row); a half scale
  makes it 4.5 bits a weight (a float32 one would make it 5). Uniform int4
  costs tiny-sora's video 20-30 dB (docs/web.md), which is why no setting stores it alike.

The page decodes a tensor to the float32 the kernels read, exactly as `StoredTensor.
decoded` does here, so the export checks each block's compiled forms against the block run
with the decoded weights at the float32 bound, and records apart what storing costs (the
block with decoded weights against the block as trained: `storage_error`). On the wasm path
the decoding is part of the block's ONNX graph (`Cast`, and a `Mul` by the scales; int4's
nibbles split with `Floor` and `Sub` on floats, which are exact for bytes: onnxruntime-web's
wasm provider runs all of them); on the WebGPU path the page decodes each tensor on the GPU as
it uploads it (runtimes/web/decode.js: WGSL's `unpack2x16float` for half, `extractBits` and
the scale for int8 and int4, no shader extension needed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fnmatch import fnmatch
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edge.core.package import write_weights_file
from edge.graph.blocks import Block
from edge.graph.family_model import FamilyModel, StorageRule

FORMS = ("fp32", "fp16", "8", "4")
DEFAULT_FORM = "fp16"
INT8_MIN_ELEMENTS = 4096   # smaller tensors (norms, biases) cost little and stay fp16
INT4_GROUP = 32            # a row's inputs sharing one int4 scale
INT4_OFFSET = 8            # an int4 value v is stored as the nibble v + 8 (1..15)
HALF_MAX = 65504.0         # the largest finite half
HALF_SMALLEST_NORMAL = np.float16(2.0**-14)
SCALE_SUFFIX = ":scale"    # an int8 tensor's row scales: "<name>:scale"


@dataclass(frozen=True)
class StoredTensor:
    """One weight as the package stores it: `data` in its stored dtype (an int4 tensor: its
    packed bytes, one axis), `scale` the scales of an int8 tensor (float32, one per row) or an
    int4 one (half, rows × groups; else None), `shape` the tensor's own shape."""

    name: str
    data: np.ndarray
    scale: np.ndarray | None = None
    int4_shape: tuple[int, ...] | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.int4_shape or self.data.shape

    @property
    def dtype(self) -> str:
        """The manifest's name for the stored form."""
        return "int4" if self.int4_shape else str(self.data.dtype)

    @cached_property
    def decoded(self) -> np.ndarray:
        """The float32 tensor the block computes with, as the page decodes it: half widened
        exactly; int8 and int4 times their scale, one float32 rounding. Decoded once: the
        export checks a block and each of its variants with it."""
        if self.scale is None:
            return self.data.astype(np.float32)
        if self.int4_shape:
            rows, cols = self.int4_shape
            values = unpack_nibbles(self.data).astype(np.float32) - INT4_OFFSET
            groups = values.reshape(rows, cols // INT4_GROUP, INT4_GROUP)
            scale = self.scale.astype(np.float32)  # a half widens exactly
            return (groups * scale[:, :, None]).reshape(rows, cols)
        rows = self.scale.reshape(-1, *([1] * (self.data.ndim - 1)))
        return self.data.astype(np.float32) * rows

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays the weights file holds for it, in the order the graph takes them."""
        if self.scale is None:
            return {self.name: self.data}
        return {self.name: self.data, self.name + SCALE_SUFFIX: self.scale}


def unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    """Bytes -> their nibbles in order (each byte's low nibble first), as uint8."""
    return np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(-1)


def stored_arrays(stored: list[StoredTensor]) -> dict[str, np.ndarray]:
    """Every array a block's weights file holds, by name, in order: the graph's weight
    inputs, C-ordered (np.require keeps a 0-d tensor 0-d; np.ascontiguousarray makes it 1-d)."""
    return {n: np.require(a, requirements="C") for t in stored for n, a in t.arrays().items()}


def check_form(form: str) -> None:
    if form not in FORMS:
        raise ValueError(f"--quantize {form!r}: the web target stores weights as "
                         f"{', '.join(FORMS)}")


# the iphone target's stored forms (a family's StorageRule names them) -> the web's nearest:
# palettes have no web form, so a 6-bit one is int8 and a 4-bit one int4 in groups
WEB_FORM_OF = {"fp16": "fp16", "int8": "8", "lut6": "8", "lut6-g16": "8", "lut4": "4",
               "lut3": "4", "lut4-g16": "4", "int4-b32": "4"}


@dataclass(frozen=True)
class WebStorage:
    """One `--quantize` setting of the web target: the stored form of each tensor. `rule`:
    the family's (for "4"), else every tensor takes `setting` (wherever its shape allows)."""

    setting: str
    rule: StorageRule | None = None

    def form(self, block_key: str, tensor: str) -> str:
        if self.rule is None:
            return self.setting
        named = next((name for blocks, tensors, name in self.rule.tensors
                      if fnmatch(block_key, blocks) and fnmatch(tensor, tensors)), None)
        named = named or next((name for pattern, name in self.rule.rules
                               if fnmatch(block_key, pattern)), "fp16")
        return WEB_FORM_OF[named]

    def record(self) -> dict:
        """The manifest's `web.storage`: the setting, what it stores how, and a family's
        rule by block (and tensor) pattern."""
        out = {"quantize": self.setting, "rule": RULE_TEXT[self.setting]}
        if self.rule is not None:
            out |= {"blocks": [[p, WEB_FORM_OF[n]] for p, n in self.rule.rules],
                    "tensors": [[b, t, WEB_FORM_OF[n]] for b, t, n in self.rule.tensors],
                    "note": self.rule.note}
        return out


def web_storage(setting: WebStorage | str, model: FamilyModel | None = None) -> WebStorage:
    """The setting `--quantize setting` names for `model` (a ValueError naming the known
    settings, or saying the family has no rule for "4"); a WebStorage is its own setting
    (benchmarks and tests try rules no family words)."""
    if isinstance(setting, WebStorage):
        return setting
    check_form(setting)
    if setting != "4":
        return WebStorage(setting)
    rule = getattr(model, "device_storage", {}).get("4") if model is not None else None
    if rule is None:
        family = getattr(model, "family", "this")
        raise ValueError(f"--quantize 4 is worded by each family and {family} models have no "
                         f"rule for it yet; use one of fp32, fp16, 8")
    unknown = [n for *_, n in (*rule.rules, *rule.tensors) if n not in WEB_FORM_OF]
    if unknown:
        raise ValueError(f"{model.family}'s --quantize 4 names stored form {unknown[0]!r}, "
                         f"which has no web form ({', '.join(WEB_FORM_OF)})")
    return WebStorage(setting, rule)


def as_storage(storage: WebStorage | str) -> WebStorage:
    return storage if isinstance(storage, WebStorage) else WebStorage(storage)


def _takes_int8(shape: tuple[int, ...], form: str) -> bool:
    return form in ("8", "4") and len(shape) >= 2 and math.prod(shape) >= INT8_MIN_ELEMENTS


def _takes_int4(shape: tuple[int, ...], form: str) -> bool:
    return _takes_int8(shape, form) and form == "4" and len(shape) == 2 \
        and shape[1] % INT4_GROUP == 0


def store(name: str, tensor: torch.Tensor, form: str) -> StoredTensor:
    """`tensor` in stored form `form` (one of FORMS)."""
    w = tensor.detach().float().contiguous().numpy()
    if _takes_int4(w.shape, form) and np.abs(w).max() / 7.0 <= HALF_MAX:
        rows, cols = w.shape
        groups = w.reshape(rows, cols // INT4_GROUP, INT4_GROUP)
        # the group's step as a half rounded up (so its largest value stays within 7 steps),
        # no smaller than half's smallest normal: WGSL may flush a subnormal, and a group
        # under 7 of those (4.3e-4) is stored to within 3.1e-5
        step = np.abs(groups).max(axis=2) / 7.0
        scale = step.astype(np.float16)
        low = scale.astype(np.float64) < step
        scale[low] = np.nextafter(scale[low], np.float16(np.inf))
        scale = np.maximum(scale, HALF_SMALLEST_NORMAL)
        q = np.clip(np.rint(groups / scale.astype(np.float32)[:, :, None]), -7, 7)
        nibbles = (q.astype(np.int16) + INT4_OFFSET).astype(np.uint8).reshape(-1, 2)
        return StoredTensor(name, nibbles[:, 0] | (nibbles[:, 1] << 4), scale, (rows, cols))
    if _takes_int8(w.shape, form):
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
    n, shape = tensor.numel(), tuple(tensor.shape)
    if _takes_int4(shape, form):
        return n // 2 + 2 * n // INT4_GROUP
    if _takes_int8(shape, form):
        return n + 4 * shape[0]
    return n * (4 if form == "fp32" else 2)


def stored_weights(block: Block, storage: WebStorage | str) -> list[StoredTensor]:
    """The block's weights as stored: `storage` a setting, or a form for every tensor."""
    storage = as_storage(storage)
    return [store(n, t, storage.form(block.key, n)) for n, t in block.parameters().items()]


def block_stored_bytes(block: Block, storage: WebStorage | str) -> int:
    storage = as_storage(storage)
    return sum(stored_bytes(t, storage.form(block.key, n))
               for n, t in block.parameters().items())


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
    decoded in the graph (a half widened; an int8 or int4 tensor, then its scales,
    multiplied)."""

    def __init__(self, block: Block, stored: list[StoredTensor]) -> None:
        super().__init__()
        self.block = block.module
        self.n_inputs = len(block.inputs)
        self.layout = [(t.name, t.scale is not None, t.int4_shape) for t in stored]

    def forward(self, *args):
        rest = list(args[self.n_inputs:])
        weights = {}
        for name, scaled, int4_shape in self.layout:
            w = rest.pop(0)
            if int4_shape:
                w = _int4_decoded(w, rest.pop(0), int4_shape)
            elif scaled:
                scale = rest.pop(0)
                w = w.float() * scale.reshape(-1, *([1] * (w.dim() - 1)))
            weights[name] = w.float()
        return torch.func.functional_call(self.block, weights, args[:self.n_inputs])


def _int4_decoded(packed: torch.Tensor, scale: torch.Tensor,
                  shape: tuple[int, int]) -> torch.Tensor:
    """The graph's int4 decoding, in float arithmetic that is exact for bytes (the wasm
    provider's bitwise operators on uint8 are not relied on): high = floor(b / 16),
    low = b - 16 high, then (nibble - 8) times the group's scale, as `StoredTensor.decoded`."""
    b = packed.float()
    high = torch.floor(b * (1 / 16))
    low = b - 16 * high
    nibbles = torch.stack([low, high], dim=-1) - INT4_OFFSET
    rows, cols = shape
    groups = nibbles.reshape(rows, cols // INT4_GROUP, INT4_GROUP)
    return (groups * scale.float().unsqueeze(-1)).reshape(rows, cols)


def graph_weights(block: Block, stored: list[StoredTensor]
                  ) -> tuple[nn.Module, list[str], tuple[torch.Tensor, ...]]:
    """What exporters/onnx.export_graph traces for a block with stored weights: the module,
    the weight inputs' names and example tensors (the stored arrays)."""
    arrays = stored_arrays(stored)
    return (StoredWeightsAsInputs(block, stored), list(arrays),
            tuple(torch.from_numpy(a) for a in arrays.values()))


def write_stored(path: Path, stored: list[StoredTensor]) -> list[dict]:
    """The stored arrays in one weights file in the package's flash layout; the manifest's
    tensor table: each array's name, stored dtype (`int4` for packed nibbles), shape (an int4
    tensor's own, not its bytes'), offset and bytes, and for an int8 or int4 tensor `scale`,
    the name of its scales' entry (and an int4 one's `group`, the inputs a scale covers)."""
    arrays = stored_arrays(stored)
    offsets = write_weights_file(path, arrays)
    by_name = {t.name: t for t in stored}
    table = []
    for n, a in arrays.items():
        t = by_name.get(n)
        record = {"name": n, "dtype": t.dtype if t else str(a.dtype),
                  "shape": list(t.shape if t else a.shape), "offset": offsets[n],
                  "bytes": a.nbytes}
        if t is not None and t.scale is not None:
            record["scale"] = n + SCALE_SUFFIX
            if t.int4_shape:
                record["group"] = INT4_GROUP
        table.append(record)
    return table


RULE_TEXT = {
    "fp32": "every weight float32",
    "fp16": "every weight IEEE half (one past its range float32)",
    "8": f"weights of 2+ dimensions and >= {INT8_MIN_ELEMENTS} elements int8 with a float32 "
         "scale per row (first axis), the rest IEEE half",
    "4": f"the family's rule: in blocks it stores at 4 bits, matrices of >= "
         f"{INT8_MIN_ELEMENTS} elements whose rows split into groups of {INT4_GROUP} int4 with "
         "a half scale per group; other weights of 2+ dimensions and as many elements "
         "int8 with a scale per row; the rest IEEE half",
}
