"""Blocks: the units that exporters compile and runtimes load one by one.

A block is a module with named tensor inputs and outputs and its own parameters. Chained in
order, a component's blocks compute exactly what the component computes (each family tests
its own cut). How a model is cut is its family's business (edge/families/); everything
downstream (planning, exporters, runtimes) sees only blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class Block:
    component: str
    name: str
    module: nn.Module
    inputs: list[str]
    outputs: list[str]
    example: tuple[torch.Tensor, ...]      # example inputs, batch first
    dynamic_batch: list[bool] = field(default_factory=list)  # per input
    # other computations of this block with the same inputs, outputs and parameters (the
    # very same tensors, same names), e.g. {"tdtm": the temporally merged pair}
    variants: dict[str, nn.Module] = field(default_factory=dict)
    # per output: whether its first axis is the batch (default: every output's is)
    dynamic_outputs: list[bool] | None = None

    @property
    def key(self) -> str:
        return f"{self.component}/{self.name}"

    def parameters(self) -> dict[str, torch.Tensor]:
        return {n: p.detach() for n, p in self.module.named_parameters()}

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters().values())

    @torch.no_grad()
    def run(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.module(*inputs)
        return out if isinstance(out, tuple) else (out,)


class EncoderLayerBlock(nn.Module):
    """One layer of a Hugging Face text encoder that takes an additive attention bias (MiniLM,
    UMT5): hidden, attention_bias -> hidden."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, hidden: torch.Tensor, attention_bias: torch.Tensor) -> torch.Tensor:
        out = self.layer(hidden, attention_mask=attention_bias)
        return out[0] if isinstance(out, tuple) else out
