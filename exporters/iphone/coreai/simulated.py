"""coreai-opt's weight quantization simulated on the PyTorch block, so a compressed Core AI
program can be held to what it should compute, not only to the float32 block.

`--quantize 8` and Wan's `4` store weights through coreai-opt 0.4.0's `quantize_weights`, on
the float16 program: each constant of more than 1 024 values that a matrix product, a 2-D
convolution or a gather reads becomes symmetric integers and a float16 scale per output
channel (int8) or per output channel and block of 32 inputs (int4 "per_block"), dequantized
before its use. `simulated_block` gives the block with those weights in place of its own, as
the program holds them: float16, quantized with coreai-opt's formula in float16 arithmetic
(`coreai_opt/coreai_utils/_utils/quantize_utils.py`: scale = (2 max|w| + 1e-6) / (qmax -
qmin), q = clip(round(w / scale), qmin, qmax), qmin = -qmax: -127..127, -7..7), dequantized
as q * scale. The program then differs from it by its float16 compute alone, where against
the float32 block the quantization's own error comes on top.

Which axis is a weight's output channel is coreai-opt's rule, read here from the PyTorch
graph the converter is given (`weight_axes`): a linear layer's, a 2-D convolution's and an
embedding's weight by its rows (axis 0), blocks along axis 1; a matrix product's operand by
the product's output (the second operand's columns, the first's rows).

Why by hand: coreai-opt quantizes Core AI programs, not PyTorch modules, and its PyTorch-side
quantizer simulates other schemes (activations, per-tensor observers).
"""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import torch
from torch.export import ExportedProgram

from edge.graph.blocks import Block
from edge.graph.lazy_weights import materialized

THRESHOLD = 1024   # coreai-opt's weight_num_threshold: tensors of at most this many keep
# the aten ops whose weight operand Core AI reads through a matrix product, a 2-D
# convolution or a gather, and (output axis, input axis) of that operand
_READS = {
    (torch.ops.aten.linear.default, 1): (0, 1),
    (torch.ops.aten.conv2d.default, 1): (0, 1),
    (torch.ops.aten.embedding.default, 0): (0, 1),
    (torch.ops.aten.matmul.default, 1): (-1, -2),
    (torch.ops.aten.matmul.default, 0): (-2, -1),
    (torch.ops.aten.mm.default, 1): (-1, -2),
    (torch.ops.aten.mm.default, 0): (-2, -1),
    (torch.ops.aten.bmm.default, 1): (-1, -2),
    (torch.ops.aten.bmm.default, 0): (-2, -1),
}
QRANGE = {"int8": 127, "int4": 7}


def weight_axes(program: ExportedProgram, prefix: str = "") -> dict[str, tuple[int, int]]:
    """The weights (parameters and buffers) coreai-opt compresses in the program made from
    `program`: their names (less `prefix`, a wrapper's) -> (output channel axis, input channel
    axis), non-negative."""
    signature = program.graph_signature
    tensors = signature.inputs_to_parameters | signature.inputs_to_buffers
    state = program.state_dict | dict(program.constants)
    varying = _varying(program)
    found = {}
    for node in program.graph.nodes:
        name = tensors.get(node.name)
        if node.op != "placeholder" or name is None:
            continue
        value = state[name]
        if value.numel() <= THRESHOLD or not value.is_floating_point():
            continue
        reads = set()
        for user in node.users:
            if not any(a in varying for a in user.args if a is not node):
                # every operand constant (a position table at fixed positions): the
                # converter folds the op into a constant that no reader compresses
                reads.add(None)
                continue
            positions = [i for i, a in enumerate(user.args) if a is node]
            reads |= {_READS.get((user.target, i)) for i in positions}
        if not reads or None in reads:
            continue   # read otherwise too (added, scaled): coreai-opt leaves it as it is
        if len(reads) > 1:
            reads = {(0, 1)}   # readers that disagree: coreai-opt's defaults
        out_axis, in_axis = reads.pop()
        rank = value.dim()
        found[name.removeprefix(prefix)] = (out_axis % rank, in_axis % rank)
    return found


def _varying(program: ExportedProgram) -> set:
    """The graph's nodes that depend on the block's inputs (the rest are constants)."""
    inputs = set(program.graph_signature.user_inputs)
    varying = set()
    for node in program.graph.nodes:
        if node.op == "placeholder":
            if node.name in inputs:
                varying.add(node)
        elif any(a in varying for a in node.all_input_nodes):
            varying.add(node)
    return varying


def quantized(weight: np.ndarray, axes: tuple[int, int], dtype: str,
              block_size: int | None) -> np.ndarray:
    """`weight` (float16) as coreai-opt stores it and the program reads it back: symmetric
    `dtype` integers with a float16 scale per output channel (and per `block_size` inputs),
    times their scale, float16."""
    w = weight.astype(np.float16)
    out_axis, in_axis = axes
    shape, reduce = [], []   # the blocked shape, and the axes each scale spans
    for axis, size in enumerate(w.shape):
        if axis == out_axis:
            shape.append(size)
        elif axis == in_axis and block_size:
            if size % block_size:
                return w   # coreai-opt leaves a weight whose blocks do not divide it
            shape += [size // block_size, block_size]
            reduce.append(len(shape) - 1)
        else:
            shape.append(size)
            reduce.append(len(shape) - 1)
    blocked = w.reshape(shape)
    top = np.max(np.abs(blocked), axis=tuple(reduce), keepdims=True)
    q = QRANGE[dtype]
    # coreai-opt's (max - min + 1e-6) / (qmax - qmin), symmetric: min = -max, qmin = -qmax
    scale = (top + top + np.float16(1e-6)) / np.float16(2 * q)
    # an all-zero channel: its scale underflows float16 to 0 and 0/0 is NaN, which the stored
    # integers cannot hold; times the zero scale it reads back as 0 whatever they hold
    with np.errstate(invalid="ignore", divide="ignore"):
        levels = np.nan_to_num(np.clip(np.round(blocked / scale), -q, q))
    return (levels * scale).astype(np.float16).reshape(w.shape)


def simulated_block(block: Block, axes: dict[str, tuple[int, int]], stored: dict) -> Block:
    """`block` with each tensor of `axes` (a parameter's or a buffer's name) replaced by what
    the program stores for it (`stored`: the stored form's record, {"dtype", "granularity",
    "block_size"}), in float32."""
    with materialized(block.module):   # a model larger than memory: this block's, read now
        module = copy.deepcopy(block.module)
    block_size = stored.get("block_size", 32) if stored["granularity"] == "per_block" else None
    tensors = dict(module.named_parameters()) | dict(module.named_buffers())
    with torch.no_grad():
        for name, axis in axes.items():
            t = tensors[name]
            t.copy_(torch.from_numpy(quantized(t.detach().numpy(), axis, stored["dtype"],
                                               block_size).astype(np.float32)))
    return replace(block, module=module)
