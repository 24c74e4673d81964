"""What the tests read from exported ONNX graphs' recorded shapes."""

from __future__ import annotations

import onnx


def softmax_rows(graph) -> list[int]:
    """The query rows (the axis before the last) each Softmax of an ONNX graph takes, from
    the shapes the exporter records."""
    model = onnx.shape_inference.infer_shapes(onnx.load(graph))
    shapes = {v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim]
              for v in [*model.graph.value_info, *model.graph.input]}
    return [shapes[n.input[0]][-2] for n in model.graph.node if n.op_type == "Softmax"]


def attention_ops(graph) -> int:
    """How many attentions an ONNX graph computes: its fused MultiHeadAttention nodes and
    the softmaxes of its chunked ones."""
    return sum(n.op_type in ("MultiHeadAttention", "Softmax") for n in onnx.load(graph).graph.node)
