"""Re-cut a component's blocks: merge adjacent blocks into one, or split a block its family
lets split (tiny-sora: a transformer pair into its spatial and temporal halves; the family's
`Block.splitter`). `edge/planning/plan.py` decides which, for a memory budget.

A merged block runs its members in order and passes tensors on by name, exactly as the
runtime chains blocks, so a component computes the same thing whichever way it is cut
(tested). Its parameters keep the members' names under `parts.<member>.`; a variant of any
member (e.g. "tdtm") becomes a variant of the merged block, the other members running their
base module in it, so variant and base still share one weights file.
"""

from __future__ import annotations

import re
from dataclasses import replace

import torch
from torch import nn

from edge.graph.blocks import Block


class Chain(nn.Module):
    """Member modules run in order; each takes its inputs by name from the tensors so far."""

    def __init__(self, members: list[tuple[str, nn.Module, list[str], list[str]]],
                 inputs: list[str], outputs: list[str]) -> None:
        super().__init__()
        self.parts = nn.ModuleDict({name: module for name, module, _, _ in members})
        self.wiring = [(name, ins, outs) for name, _, ins, outs in members]
        self.inputs, self.outputs = inputs, outputs

    def forward(self, *args: torch.Tensor):
        tensors = dict(zip(self.inputs, args, strict=True))
        for name, ins, outs in self.wiring:
            out = self.parts[name](*(tensors[n] for n in ins))
            tensors.update(zip(outs, out if isinstance(out, tuple) else (out,), strict=True))
        result = tuple(tensors[n] for n in self.outputs)
        return result if len(result) > 1 else result[0]


def kind(name: str) -> str | None:
    """`layer_3` -> `layer`: blocks of one kind repeat; only they are merged together."""
    match = re.fullmatch(r"(.+)_(\d+)", name)
    return match.group(1) if match else None


def _gathered_inputs(blocks: list[Block]) -> tuple[list[str], tuple, list[bool], set[str]]:
    """The inputs a chain of `blocks` takes from outside (with examples and batch flags), and
    every name its members give."""
    inputs, example, dynamic, made = [], [], [], set()
    for b in blocks:
        for name, value, dyn in zip(b.inputs, b.example, b.dynamic_batch, strict=True):
            if name not in made and name not in inputs:
                inputs.append(name)
                example.append(value)
                dynamic.append(dyn)
        made |= set(b.outputs)
    return inputs, tuple(example), dynamic, made


def _chained(blocks: list[Block], outputs: list[str], name: str) -> Block:
    inputs, example, dynamic, _ = _gathered_inputs(blocks)
    module = Chain([(b.name, b.module, b.inputs, b.outputs) for b in blocks], inputs, outputs)
    # an input a member takes from outside as a stand-in, the merged block takes as one
    stand_ins = tuple(n for n in inputs if any(n in b.chained for b in blocks))
    return Block(blocks[0].component, name, module, inputs, outputs, example, dynamic,
                 chained=stand_ins)


def merge(blocks: list[Block], needed_after: set[str]) -> Block:
    """One block computing `blocks` in order. Its outputs are the last member's, any earlier
    member's output that a later block of the component (`needed_after`) takes, and any a
    member gives back under the name of an input of the merged block (state a chunked
    component carries to its next piece)."""
    inputs, _, _, made = _gathered_inputs(blocks)
    last = blocks[-1]
    outputs = list(last.outputs) + sorted(
        n for n in made & (needed_after | set(inputs)) if n not in last.outputs)
    name = f"{blocks[0].name}-{last.name.rsplit('_', 1)[1]}"  # layer_0-5
    variants: dict = {}
    for v in dict.fromkeys(v for b in blocks for v in b.variants):
        members = [b.variant(v) if v in b.variants else b for b in blocks]
        chained = _chained(members, outputs, name)
        # a variant with a signature of its own stays a block; otherwise only its module
        own = any(isinstance(b.variants.get(v), Block) for b in blocks)
        variants[v] = chained if own else chained.module
    return replace(_chained(blocks, outputs, name), variants=variants)


def splittable(block: Block) -> bool:
    return block.splitter is not None


def split(block: Block) -> list[Block]:
    """The blocks that compute `block` in turn, as its family splits it."""
    if block.splitter is None:
        raise ValueError(f"block {block.key} cannot be split (its family does not split it)")
    return block.splitter(block)
