"""A block as an ONNX graph, and its check against PyTorch: what the onnx target writes for
every block and the web target for its wasm path.

Each graph takes its block's weights as ordinary inputs after the activations instead of
embedding them, so a runtime alone decides when weight bytes are read (exporters/onnx/package.py
lays them out in files). Its attention never holds a whole score matrix: onnxruntime's fused
MultiHeadAttention where there is no mask, query chunks elsewhere (edge/graph/attention.py).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from edge.core.manifest_schema import TILE_AXES
from edge.exporters.shared.graph_reuse import copy_of_earlier, graph_key, remember
from edge.exporters.shared.onnx_registry import reused_torchlib_registry
from edge.exporters.shared.onnx_rewrites import without_quadratic_rules
from edge.exporters.shared.validation import check_validation as check_bound
from edge.exporters.shared.validation import output_error
from edge.graph.blocks import Block
from edge.graph.token_chunks import token_chunks

# fp32 max-abs error per block against PyTorch, for outputs up to 1 in magnitude; larger ones
# (a random model's activations reach thousands) are held to it relative to their largest
BLOCK_TOLERANCE = 1e-4


def graph_output(name: str) -> str:
    """ONNX forbids one name as both graph input and output (a layer maps `hidden` to
    `hidden`), so graph outputs carry a prefix; the manifest keeps the plain names."""
    return f"out:{name}"


class WeightsAsInputs(nn.Module):
    """Wraps a block so its parameters become graph inputs after the activations."""

    def __init__(self, block: Block) -> None:
        super().__init__()
        self.block = block.module
        self.n_inputs = len(block.inputs)
        self.names = list(block.parameters())

    def forward(self, *args):
        weights = dict(zip(self.names, args[self.n_inputs:], strict=True))
        return torch.func.functional_call(self.block, weights, args[:self.n_inputs])


def _multi_head_attention_schema() -> onnx.defs.OpSchema:
    """The part of onnxruntime's MultiHeadAttention schema edge uses (onnx carries no schema
    of onnxruntime's own operators, and onnxscript needs one to emit a node)."""
    from onnx.defs import OpSchema

    tensor = OpSchema.FormalParameter
    return OpSchema(
        "MultiHeadAttention", "com.microsoft", 1,
        inputs=[tensor("query", "T"), tensor("key", "T"), tensor("value", "T")],
        outputs=[tensor("output", "T")],
        type_constraints=[("T", ["tensor(float)"], "float")],
        attributes=[OpSchema.Attribute("num_heads", OpSchema.AttrType.INT, "heads"),
                    OpSchema.Attribute("scale", OpSchema.AttrType.FLOAT, "scale")])


def _multi_head_attention(q, k, v, heads: int, scale: float):
    """edge::attention as onnxruntime's MultiHeadAttention (com.microsoft): query, key and
    value as (batch, tokens, heads × head dim), the layout in which its CPU kernel runs flash
    attention (measured: 16 384 tokens, 4 heads in a 239 MB peak against 4.5 GB for the
    written-out softmax). Back to (batch, heads, tokens, head dim) after."""
    from onnxscript import opset18 as op
    from onnxscript.values import Op, Opset

    multi_head_attention = Op(Opset("com.microsoft", 1), "MultiHeadAttention",
                              _multi_head_attention_schema())

    def tokens_first(x):  # (B, H, S, d) -> (B, S, H*d); 0 keeps a (dynamic) dimension
        return op.Reshape(op.Transpose(x, perm=[0, 2, 1, 3]), op.Constant(value_ints=[0, 0, -1]))

    out = multi_head_attention(tokens_first(q), tokens_first(k), tokens_first(v),
                               num_heads=heads, scale=scale)
    out = op.Reshape(out, op.Constant(value_ints=[0, 0, heads, -1]))
    return op.Transpose(out, perm=[0, 2, 1, 3])


def traced(module: nn.Module, args: tuple, shapes: tuple) -> torch.export.ExportedProgram:
    """torch.export as torch.onnx.export's own first capture does it (non-strict, sizes 0
    and 1 not specialised, a batch range narrowed as torch suggests when a guard needs it)."""
    from torch.fx.experimental import _config as fx_config

    with fx_config.patch(backed_size_oblivious=True):
        try:
            return torch.export.export(module, args, dynamic_shapes=shapes, strict=False)
        except torch._dynamo.exc.UserError as err:
            refined = torch.export.dynamic_shapes.refine_dynamic_shapes_from_suggested_fixes(
                err.msg, shapes)
            return torch.export.export(module, args, dynamic_shapes=refined, strict=False)


def export_graph(block: Block, path: Path, fused_attention: bool = True,
                 weight_inputs: tuple[nn.Module, list[str], tuple] | None = None) -> None:
    """The block as an ONNX graph, weights as inputs after the activations. Its attention
    never holds a whole score matrix: onnxruntime's fused MultiHeadAttention where it has no
    mask (`fused_attention`), query chunks elsewhere (edge/graph/attention.py). `weight_inputs`:
    (module, weight input names, their example tensors) where the weights are fed otherwise
    than as the block's float32 parameters (a web package's stored forms)."""
    module, weight_names, weights = weight_inputs or (
        WeightsAsInputs(block), list(block.parameters()), tuple(block.parameters().values()))
    shapes = dynamic_axes(block) + [None] * len(weights)
    path.parent.mkdir(parents=True, exist_ok=True)
    # the exporter's constant folder logs harmless "Evaluation failed" notes, and its op
    # registry four "torchvision is not installed" lines per graph; keep them quiet
    logging.getLogger("onnxscript").setLevel(logging.ERROR)
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    input_names = block.inputs + weight_names
    output_names = [graph_output(n) for n in block.outputs]
    convert = functools.partial(
        torch.onnx.export, input_names=input_names, output_names=output_names, dynamo=True,
        external_data=False, verbose=False,
        custom_translation_table={torch.ops.edge.attention.default: _multi_head_attention})
    with warnings.catch_warnings(), without_quadratic_rules(), reused_torchlib_registry():
        warnings.simplefilter("ignore")
        with token_chunks(fused_attention=fused_attention):
            # traced once: the program keys the graph (an identical block's is copied,
            # exporters/shared/graph_reuse.py) and is what onnx converts
            try:
                program = traced(module, block.example + weights, (tuple(shapes),))
            except Exception:  # torch.onnx's capture has strategies this one lacks: its own
                convert(module, block.example + weights, str(path),
                        dynamic_shapes=(tuple(shapes),))
                without_trace_metadata(path)
                return
        key = graph_key(program, (input_names, output_names, fused_attention, [
            (str(t.dtype), tuple(t.shape)) for t in block.example + weights],
            block.dynamic_batch))
        if copy_of_earlier(key, path):
            return
        # the shapes again: onnx then names the dynamic axes "batch", as for a module
        convert(program, (), str(path), dynamic_shapes=(tuple(shapes),))
    without_trace_metadata(path)
    remember(key, path)


def without_trace_metadata(path: Path) -> None:
    """Rewrite the graph at `path` without the metadata torch.onnx gives each node: the
    Python stack trace that made it (absolute paths of the exporting machine's checkout, so
    a shipped package would name them) and the qualified names of the modules around it.
    Nothing runs on them; without them a package is the same bytes from any checkout."""
    model = onnx.load(str(path))
    strip_node_metadata(model)
    onnx.save(model, str(path))


def strip_node_metadata(model: onnx.ModelProto) -> None:
    """Clear every node's metadata_props in `model`: its graph, the graphs nested in its
    nodes' attributes (an If's or a Loop's body) and its functions."""
    graphs, nodes = [model.graph], [n for f in model.functions for n in f.node]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            nodes.append(node)
            for attribute in node.attribute:
                graphs += ([attribute.g] if attribute.HasField("g") else []) + list(
                    attribute.graphs)
    for node in nodes:
        del node.metadata_props[:]


MAX_BATCH = 4096
VIDEO_RANK = 5  # (B, C, T, H, W): the inputs whose height and width `dynamic_space` frees


def dynamic_axes(block: Block) -> list[dict | None]:
    """torch.export's dynamic axes of each input: the batch where `dynamic_batch` says, the
    height and width of a video-shaped input where `dynamic_space` does."""
    # bounded: a graph whose batch folds in frames (B*F) otherwise meets int32 size guards
    # torch cannot refine (Open-Sora's 2D decoder); no call batches more than this
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    height, width = (torch.export.Dim(name, min=1) for name in TILE_AXES)
    axes = []
    for t, d in zip(block.example, block.dynamic_batch, strict=True):
        found = ({0: batch} if d else {}) | (
            {3: height, 4: width} if block.dynamic_space and t.dim() == VIDEO_RANK else {})
        axes.append(found or None)
    return axes


def check_validation(validation: dict, what: str) -> None:
    """`validation.check_validation` at the ONNX bound, BLOCK_TOLERANCE."""
    check_bound(validation, what, BLOCK_TOLERANCE)


def validate_block(block: Block, graph: Path, want: tuple[torch.Tensor, ...],
                   weights: dict[str, np.ndarray] | None = None) -> dict:
    """`output_error` of the ONNX graph against the PyTorch block's outputs `want` on its
    example inputs; `weights`: the graph's weight inputs where they are not the block's
    parameters (a web package's stored forms)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    feed = {n: t.numpy() for n, t in zip(block.inputs, block.example, strict=True)}
    feed |= weights if weights is not None else {
        n: t.numpy() for n, t in block.parameters().items()}
    return output_error(session.run([graph_output(n) for n in block.outputs], feed), want)


def computation_digest(graph: Path) -> str:
    """sha256 of what an ONNX graph computes: the file less its metadata. torch.onnx writes
    the traced program's range constraints there, whose symbol names differ between traces
    of one block (Wan's at 480x832x81, in token chunks), so such graphs differ as files in
    those bytes alone."""
    return model_digest(onnx.load(str(graph)))


def model_digest(model: onnx.ModelProto) -> str:
    """`computation_digest` of a loaded graph (its model and graph metadata cleared)."""
    del model.metadata_props[:]
    del model.graph.metadata_props[:]
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()
