"""Identical blocks converted to ONNX once per process (exporters/shared/graph_reuse.py): a block
whose traced program, embedded tensors and interface equal an earlier one's gets a copy of
its graph; anything that changes the graph's bytes (a literal, a buffer's values, a shape)
converts again, every copy is validated with its own weights, and the kept graphs are
bounded."""

from __future__ import annotations

import torch
from torch import nn

from edge.exporters.shared import graph_reuse
from edge.graph.blocks import Block


class _Layer(nn.Module):
    def __init__(self, eps: float = 1e-5, offset: float = 0.0) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8, eps=eps)
        self.register_buffer("offset", torch.full((8,), offset))

    def forward(self, x):
        return self.norm(self.linear(x)) + self.offset


def _block(name: str, layer: nn.Module) -> Block:
    return Block("test", name, layer.eval(), ["x"], ["y"], (torch.randn(2, 4, 8),),
                 dynamic_batch=[True])


def _export(blocks: list[Block], root, monkeypatch) -> tuple[int, list[float]]:
    """Export and validate each block's graph, nothing kept from before; (conversions,
    errors)."""
    from edge.exporters.onnx.package import export_validated_graph

    calls = _count_conversions(monkeypatch)
    graph_reuse.forget_graphs()
    errors = [export_validated_graph(b, root / f"{b.name}.onnx", b.key)[1]["max_abs_error"]
              for b in blocks]
    return len(calls), errors


def _count_conversions(monkeypatch) -> list:
    calls = []
    convert = torch.onnx.export
    monkeypatch.setattr(torch.onnx, "export", lambda *a, **k: calls.append(1) or convert(*a, **k))
    return calls


def test_blocks_of_one_architecture_are_converted_once(tmp_path, monkeypatch):
    torch.manual_seed(0)
    blocks = [_block(f"layer_{i}", _Layer()) for i in range(3)]   # other weights each
    conversions, errors = _export(blocks, tmp_path, monkeypatch)
    assert conversions == 1
    assert max(errors) < 1e-5   # each copy run with its own block's weights
    graphs = {(tmp_path / f"layer_{i}.onnx").read_bytes() for i in range(3)}
    assert len(graphs) == 1


def test_a_literal_or_a_buffer_that_differs_converts_again(tmp_path, monkeypatch):
    torch.manual_seed(0)
    blocks = [_block("a", _Layer()), _block("eps", _Layer(eps=1e-3)),
              _block("buffer", _Layer(offset=0.5))]
    conversions, errors = _export(blocks, tmp_path, monkeypatch)
    assert conversions == 3 and max(errors) < 1e-5


def test_a_later_export_copies_the_graphs_an_earlier_one_converted(tmp_path, monkeypatch):
    from edge.exporters.shared.onnx_graph import export_graph

    calls = _count_conversions(monkeypatch)
    graph_reuse.forget_graphs()
    export_graph(_block("first", _Layer()), tmp_path / "a" / "first.onnx")
    export_graph(_block("again", _Layer()), tmp_path / "b" / "again.onnx")
    assert len(calls) == 1
    first, again = (tmp_path / "a" / "first.onnx"), (tmp_path / "b" / "again.onnx")
    assert first.read_bytes() == again.read_bytes()


def test_the_kept_graphs_are_bounded_least_recently_used_first(tmp_path, monkeypatch):
    from edge.exporters.shared.onnx_graph import export_graph

    calls = _count_conversions(monkeypatch)
    graph_reuse.forget_graphs()
    eps = (1e-3, 1e-4, 1e-5)
    for e in eps:
        export_graph(_block(f"eps{e}", _Layer(eps=e)), tmp_path / f"{e}.onnx")
    size = (tmp_path / "1e-05.onnx").stat().st_size
    # room for two graphs: the third pushed out the first
    monkeypatch.setattr(graph_reuse, "LIMIT_BYTES", 2 * size + size // 2)
    graph_reuse.forget_graphs()
    for e in eps:
        export_graph(_block(f"eps{e}", _Layer(eps=e)), tmp_path / f"{e}.onnx")
    assert len(calls) == 6
    export_graph(_block("recent", _Layer(eps=1e-5)), tmp_path / "recent.onnx")
    assert len(calls) == 6   # still kept
    export_graph(_block("oldest", _Layer(eps=1e-3)), tmp_path / "oldest.onnx")
    assert len(calls) == 7   # dropped, converted again


def test_the_packages_identical_blocks_share_their_graph_bytes(exported_package):
    root, manifest = exported_package
    blocks = {f"{c['name']}/{b['name']}": b for c in manifest["components"] for b in c["blocks"]}
    layers = {(root / blocks[f"text_encoder/layer_{i}"]["graph"]).read_bytes() for i in range(6)}
    pairs = {(root / blocks[f"transformer/pair_{i}"]["graph"]).read_bytes() for i in range(4)}
    assert len(layers) == 1 and len(pairs) == 1
    # the weights are each block's own
    weights = {(root / blocks[f"transformer/pair_{i}"]["weights"]["path"]).read_bytes()
               for i in range(4)}
    assert len(weights) == 4


def test_a_graph_records_nothing_of_the_checkout_that_exported_it(tmp_path):
    """torch.onnx gives each node the Python stack trace that made it (absolute paths of the
    exporting checkout) and its modules' qualified names: the graph is written without them,
    so a package names nothing of the machine and is the same bytes from any checkout."""
    from pathlib import Path

    import onnx

    import edge
    from edge.exporters.shared.onnx_graph import export_graph

    graph_reuse.forget_graphs()  # converted here, not copied
    path = tmp_path / "layer.onnx"
    export_graph(_block("layer", _Layer()), path)
    model = onnx.load(str(path))
    assert model.graph.node and not any(n.metadata_props for n in model.graph.node)
    checkout = str(Path(edge.__file__).resolve().parents[1]).encode()
    assert checkout not in path.read_bytes() and b"stack_trace" not in path.read_bytes()
