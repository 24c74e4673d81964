"""Blocks: the units that exporters compile and runtimes load one by one.

A block is a module with named tensor inputs and outputs and its own parameters. Chained in
order, a component's blocks compute exactly what the component computes (each family tests
its own cut). A chunked component (`Chunking`) runs its chain once per chunk of its input,
carrying named state from one chunk to the next. How a model is cut is its family's business
(edge/families/); everything downstream (planning, exporters, runtimes) sees only blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch import nn

from edge.core.manifest_schema import UNGUIDED, unguided_variant
from edge.core.pieces import piece_bounds
from edge.graph.lazy_weights import materialized
from edge.graph.reference_device import run_module
from edge.graph.shapes_only import shapes_only


@dataclass
class Block:
    component: str
    name: str
    module: nn.Module
    inputs: list[str]
    outputs: list[str]
    example: tuple[torch.Tensor, ...]      # example inputs, batch first
    dynamic_batch: list[bool] = field(default_factory=list)  # per input
    # other computations of this block with the same parameters (the very same tensors, same
    # names): a module takes the block's inputs and gives its outputs (e.g. {"tdtm": the
    # temporally merged pair}); a Block declares its own inputs, example and output shapes
    # (e.g. {"first": the first chunk of a chunked component, without the carried state})
    variants: dict[str, nn.Module | Block] = field(default_factory=dict)
    # per output: whether its first axis is the batch (default: every output's is)
    dynamic_outputs: list[bool] | None = None
    # the height and width of every video-shaped (B, C, T, H, W) input and output are
    # dynamic where a target allows it (ONNX): a tiled decoder's graph takes any tile
    dynamic_space: bool = False
    # how the planner may split this block for a memory budget (its family's answer: the
    # blocks that compute it in turn); None: it cannot be split
    splitter: Callable[[Block], list[Block]] | None = None
    # inputs whose example only has the right shape and dtype (the cut ran nothing to make
    # it: at 480p a transformer's forward pass is many minutes and a gigabyte of activations
    # per block): `chained` gives them the activations the blocks before compute
    chained: tuple[str, ...] = ()
    # the outputs on the example, once computed (`reference`); a copy made by replace()
    # starts without them
    _reference: tuple[torch.Tensor, ...] | None = field(default=None, init=False, repr=False,
                                                        compare=False)

    @property
    def key(self) -> str:
        return f"{self.component}/{self.name}"

    def parameters(self) -> dict[str, torch.Tensor]:
        return {n: p.detach() for n, p in self.module.named_parameters()}

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters().values())

    def variant(self, name: str) -> Block:
        """Variant `name` as a block of its own (its signature, this block's parameters)."""
        found = self.variants[name]
        if isinstance(found, Block):
            return replace(found, component=self.component, name=self.name, variants={})
        return replace(self, module=found, variants={})

    @torch.no_grad()
    def run(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # a model larger than memory has its weights read for the call (edge/graph/lazy_weights.py);
        # the pass runs where the reference does (`edge export --device`), outputs on the CPU
        with materialized(self.module):
            return run_module(self.module, inputs)

    def output_shapes(self) -> tuple[torch.Tensor, ...]:
        """The outputs' shapes and dtypes on the example, as tensors that hold no values
        (edge/graph/shapes_only.py): a block's signature without its forward pass."""
        if self._reference is not None:
            return self._reference
        with shapes_only():
            return self.run(*self.example)

    def reference(self) -> tuple[torch.Tensor, ...]:
        """The PyTorch outputs on the example, computed once: what an exporter validates a
        block against, and what `chained` feeds the next block."""
        if self._reference is None:
            self._reference = self.run(*self.example)
        return self._reference


def chained(blocks: list[Block], computed_only: bool = False) -> Iterator[Block]:
    """A component's blocks in order, each a copy whose `chained` inputs hold the outputs of
    those names that the blocks before it computed on their own examples (the first block's
    stand-ins kept): an exporter validates each block on the activations it will see while
    memory holds one block's, not every block's. The copy keeps its `reference` outputs, so
    an exporter that validates against them runs the block's forward pass once.
    `computed_only`: a block whose reference the exporter did not ask for passes nothing on
    (the next block gets the last outputs computed, of the same shapes where it repeats the
    block that computed them), so a block left unvalidated costs no forward pass."""
    wanted = {name for block in blocks for name in block.chained}
    carried: dict[str, torch.Tensor] = {}
    for block in blocks:
        example = tuple(carried.get(name, value) if name in block.chained else value
                        for name, value in zip(block.inputs, block.example, strict=True))
        current = replace(block, example=example)
        yield current
        if computed_only and current._reference is None:
            continue
        if wanted & set(current.outputs):
            carried.update((name, value) for name, value
                           in zip(current.outputs, current.reference(), strict=True)
                           if name in wanted)


def with_unguided(block: Block, optional: bool = True) -> Block:
    """The block with variants at the caption's half of its batch: `unguided` (its module)
    and, where `optional`, `<name>_unguided` for each variant that is a module of the same
    signature (TDTM). A call without guidance (guidance 1, or after the cutoff) runs the
    caption's rows alone; a target of static shapes (the web, the phone) needs a program of
    that shape to save the null caption's half. Each takes the first half of every input
    whose first axis is the batch (the caption's rows: runtimes put them first)."""
    batch = block.example[block.dynamic_batch.index(True)].shape[0]
    if batch % 2:
        raise ValueError(f"block {block.key}: a batch of {batch} has no caption half")
    example = tuple(value[:batch // 2] if dynamic else value
                    for value, dynamic in zip(block.example, block.dynamic_batch, strict=True))
    modules = {UNGUIDED: block.module}
    if optional:
        modules |= {unguided_variant(name): module for name, module in block.variants.items()
                    if isinstance(module, nn.Module)}
    halves = {name: Block(block.component, block.name, module, block.inputs, block.outputs,
                          example, block.dynamic_batch, dynamic_outputs=block.dynamic_outputs,
                          dynamic_space=block.dynamic_space)
              for name, module in modules.items()}
    return replace(block, variants=block.variants | halves)


class EncoderLayerBlock(nn.Module):
    """One layer of a Hugging Face text encoder that takes an additive attention bias (MiniLM,
    UMT5): hidden, attention_bias -> hidden."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, hidden: torch.Tensor, attention_bias: torch.Tensor) -> torch.Tensor:
        out = self.layer(hidden, attention_mask=attention_bias)
        return out[0] if isinstance(out, tuple) else out


@dataclass(frozen=True)
class Chunking:
    """A component run chunk by chunk: `input` split along `axis` into pieces of `size` (the
    first piece `first_size`, where the family's own decode makes it longer), the blocks run
    on each piece in turn (the first piece through their `first_variant`, which takes no
    state), each state output fed to the same-named input on the next piece, and the pieces
    of `output` concatenated along `output_axis` (default `axis`). Memory then holds one
    piece's activations, not the whole input's (Wan's causal VAE decoder, frame by frame;
    CogVideoX's, two latent frames at a time after a first piece of two or three).
    `first_variant` None: pieces decoded alone (Open-Sora's temporal VAE, 17-frame chunk by
    chunk), every piece through the blocks themselves; such blocks carry no state."""

    input: str
    output: str
    axis: int
    size: int
    first_variant: str | None = None
    first_size: int | None = None
    output_axis: int | None = None

    def state(self, blocks: list[Block]) -> list[str]:
        """The carried tensors: inputs of the (later-piece) blocks that neither the piece
        nor an earlier block gives."""
        made, state = {self.input}, []
        for b in blocks:
            state += [n for n in b.inputs if n not in made and n not in state]
            made |= set(b.outputs)
        return state

    def to_dict(self, blocks: list[Block]) -> dict:
        # the optional fields are written only where they differ from the default, so
        # packages of decoders cut in equal pieces read as before in every runtime
        extra = {k: v for k, v in (("first_variant", self.first_variant),
                                   ("first_size", self.first_size),
                                   ("output_axis", self.output_axis)) if v is not None}
        state = self.state(blocks)
        if state and self.first_variant is None:
            raise ValueError(f"chunked {self.input} -> {self.output}: the blocks carry "
                             f"{state[0]!r} from piece to piece, so the first piece needs a "
                             "first_variant that takes none")
        return {"input": self.input, "output": self.output, "axis": self.axis,
                "size": self.size, **extra, "state": state}


@torch.no_grad()
def run_chain(blocks: list[Block], feeds: dict[str, torch.Tensor],
              variant: str | None = None) -> dict[str, torch.Tensor]:
    """Blocks in order as a runtime chains them (`variant` where a block has it); returns
    `feeds` with every block's outputs added by name."""
    for block in blocks:
        b = block.variant(variant) if variant in block.variants else block
        outputs = b.run(*(feeds[n] for n in b.inputs))
        feeds = feeds | dict(zip(b.outputs, outputs, strict=True))
    return feeds


def run_chunked(blocks: list[Block], chunking: Chunking, feeds: dict[str, torch.Tensor]
                ) -> dict[str, torch.Tensor]:
    """A chunked component as a runtime runs it; returns {output: the whole output}."""
    whole, state, pieces = feeds[chunking.input], {}, []
    names = chunking.state(blocks)
    bounds = piece_bounds(whole.shape[chunking.axis], chunking.size, chunking.first_size)
    for i, (start, stop) in enumerate(bounds):
        piece = whole.narrow(chunking.axis, start, stop - start)
        got = run_chain(blocks, feeds | state | {chunking.input: piece},
                        chunking.first_variant if i == 0 else None)
        pieces.append(got[chunking.output])
        state = {n: got[n] for n in names}
    axis = chunking.axis if chunking.output_axis is None else chunking.output_axis
    return {chunking.output: torch.cat(pieces, axis)}


class TorchBlockSession:
    """A block run in PyTorch, answering onnxruntime's `run` (the Python runtime's
    `BlockSession`), its inputs cast to its example's dtypes. `fed_weights`: its parameters
    are the weights fed beside the inputs (the runtime's loader streams the package's), else
    its module's own (read from the folder for each call where it was loaded out of core)."""

    def __init__(self, block: Block, fed_weights: bool = False) -> None:
        self.block = block
        self.dtypes = [e.dtype for e in block.example]
        self.weight_names = list(block.parameters()) if fed_weights else None

    @torch.no_grad()
    def run(self, output_names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        inputs = tuple(torch.from_numpy(np.ascontiguousarray(feeds[n])).to(d)
                       for n, d in zip(self.block.inputs, self.dtypes, strict=True))
        if self.weight_names is None:
            # a model loaded out of core: the block's weights read for the call, then dropped
            with materialized(self.block.module):
                out = self.block.run(*inputs)
        else:
            weights = {n: torch.from_numpy(np.asarray(feeds[n])) for n in self.weight_names}
            out = run_module(self.block.module, inputs, weights)
        outputs = dict(zip(self.block.outputs, out, strict=True))
        return [outputs[n.removeprefix("out:")].numpy().astype(np.float32)
                for n in output_names]


def torch_block_opener(blocks: dict[str, Block], fed_weights: bool = False
                       ) -> Callable[[str, dict], TorchBlockSession]:
    """`Pipeline.load`'s `open_block` over `blocks` (by key): each block and variant the
    package names ("component/block", "#variant") run in PyTorch (`TorchBlockSession`); the
    caption-half variants an exporter adds (`with_unguided`) are made here the same way."""

    def open_block(key: str, record: dict) -> TorchBlockSession:
        base, _, variant = key.partition("#")
        block = blocks[base]
        if variant.endswith(UNGUIDED) and variant not in block.variants:
            block = with_unguided(block)
        return TorchBlockSession(block.variant(variant) if variant else block, fed_weights)

    return open_block
