"""A dry run plans from shapes alone (edge/graph/shapes_only.py): no block computes, so a long
video's plan takes as long as a short one's, and it prints the blocks at the asked size and
the activations each call holds (edge/planning/activation_memory.py) and what a generation computes
(edge/planning/compute_cost.py)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from edge.commands import app
from edge.core.budget import parse_size
from edge.graph.attention import score_limit
from edge.graph.blocks import Block
from edge.planning.activation_memory import activation_peak


@pytest.fixture
def block_outputs(monkeypatch) -> list[str]:
    """The type of every tensor a block call returns while the test runs."""
    seen: list[str] = []
    real_run = Block.run

    def recording(self, *inputs):
        out = real_run(self, *inputs)
        seen.extend(type(t).__name__ for t in out)
        return out

    monkeypatch.setattr(Block, "run", recording)
    return seen


def test_a_dry_run_of_a_long_video_computes_nothing(wan_folder, block_outputs):
    """The tiny Wan at 256x512x81 (10 752 transformer tokens): the cut runs every block, but
    on fake tensors only, and the plan shows the full-size inputs."""
    pytest.importorskip("coremltools", reason="the iphone target's plan needs coremltools "
                        "(test extra)")
    result = CliRunner().invoke(app, [
        "export", "--model", str(wan_folder), "--target", "iphone", "--dry-run",
        "--height", "256", "--width", "512", "--frames", "81"])
    assert result.exit_code == 0, result.output
    assert "[2, 16, 21, 32, 64]" in result.output  # the latents: 21 frames of 32 x 64
    assert block_outputs and set(block_outputs) == {"FakeTensor"}
    # and the activations each call holds, the transformer's blocks in one row
    assert "transformer/block_0 .. block_1" in result.output
    assert "largest activation peak" in result.output
    # the decoder in tiles of 32 x 32 latents (256 pixels): a program per tile size
    assert "z [1, 16, 1, 32, 32]" in result.output and "tile_32x16" in result.output
    assert re.search(r"largest call of each stage: text_encoder [\d.]+ [KMG]iB, transformer "
                     r"[\d.]+ [KMG]iB, vae_decoder [\d.]+ [KMG]iB \(a tile\)", result.output)
    # and what a generation computes, the steps of the transformer (Wan's 50) counted
    assert "compute per generation: " in result.output and "(50 steps of " in result.output
    assert "at this machine's float32 matrix-product rate" in result.output


def _block_row(output: str) -> float:
    """MiB of the transformer blocks' activation row of a dry run's output."""
    size, unit = re.search(r"transformer/block_0 \.\. block_1 +([\d.]+) (KiB|MiB|GiB)",
                           output).groups()
    return float(size) * {"KiB": 2**-10, "MiB": 1, "GiB": 2**10}[unit]


def test_device_activations_are_counted_at_the_precision_the_programs_compute(wan_folder):
    """The iPhone's programs compute in float16 (Core ML; Core AI but at fp32): the plan
    counts a call's float activations at two bytes, half what a Core AI fp32 package holds,
    and says so."""
    pytest.importorskip("coreai_torch", reason="the Core AI layout's plan needs coreai-torch "
                        "(the [iphone] extra)")

    def dry_run(*args: str) -> str:
        result = CliRunner().invoke(app, [
            "export", "--model", str(wan_folder), "--target", "iphone", "--dry-run",
            "--height", "256", "--width", "512", "--frames", "81", *args])
        assert result.exit_code == 0, result.output
        return result.output

    half = dry_run("--min-ios", "27", "--quantize", "fp16")
    assert "float16 as the programs compute" in half
    full = dry_run("--min-ios", "27", "--quantize", "fp32")
    assert "(estimated from shapes: float32," in full
    assert _block_row(full) == pytest.approx(2 * _block_row(half), rel=0.01)


def test_a_budget_no_call_fits_is_refused_before_any_work(wan_folder, block_outputs, tmp_path):
    """The tiny Wan at 256x512x81 under 2 MB: its blocks' weights fit, but its calls hold
    tens of MB of activations. The export is refused at once, naming the call, the size and
    both figures; no block computed, nothing written."""
    dest = tmp_path / "wan-onnx"
    result = CliRunner().invoke(app, [
        "export", "--model", str(wan_folder), "--memory-budget", "2MB", "-o", str(dest),
        "--height", "256", "--width", "512", "--frames", "81"])
    assert result.exit_code == 2, result.output
    assert re.search(r"error: (text_encoder|transformer|vae_decoder)/\w+ at 256x512x81 "
                     r"\(height x width x frames\) holds ~[\d.]+ MiB of activations a call",
                     result.output), result.output
    assert "--memory-budget 2.0 MiB" in result.output
    # what to give, rounded up to a whole MiB that fits (a rounded GiB could be the budget
    # given: 1.5 GiB asked of a call needing 1.52)
    least = int(re.search(r"give a budget of at least (\d+)MiB", result.output)[1])
    peak = float(re.search(r"holds ~([\d.]+) MiB", result.output)[1])
    assert peak < least <= peak + 2   # the block's weights: under a MiB here
    assert set(block_outputs) <= {"FakeTensor"} and not dest.exists()


def _mib(printed: str) -> float:
    return parse_size(printed) / 2**20


def test_a_dry_run_under_a_budget_says_what_to_give_the_runtime(wan_folder):
    """The export's budget is the whole run's; the runtime's counts weights alone (the
    loader's). The plan says which run-time budget keeps a run within the export's: the
    budget less the largest call's activations, in whole MiB a user can paste."""
    result = CliRunner().invoke(app, [
        "export", "--model", str(wan_folder), "--dry-run", "--memory-budget", "256MB",
        "--height", "256", "--width", "512", "--frames", "81"])
    assert result.exit_code == 0, result.output
    peak = _mib(re.search(r"largest activation peak ([\d.]+ [KMG]iB)", result.output)[1])
    line = re.search(r"every call fits 256\.0 MiB with the weights kept to [\d.]+ \w+: run "
                     r"with --memory-budget (\d+)MiB for a run within 256\.0 MiB in all "
                     r"\(a run-time budget counts weights alone: the residency above is for "
                     r"256\.0 MiB of weights, and the largest call adds ([\d.]+ [KMG]iB)\)",
                     result.output)
    assert line, result.output
    weights = int(line.group(1))
    assert _mib(line.group(2)) == peak
    # one MiB of rounding (down), and the two printed figures' own rounding
    assert 256 - 1 - 0.1 <= weights + peak <= 256 + 0.1


class _Mlp(torch.nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(dim, hidden), torch.nn.Linear(hidden, dim)

    def forward(self, x):
        return self.down(self.up(x).relu())


class _Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def test_the_activation_peak_counts_what_is_alive_at_once():
    """x -> up -> relu -> down: at its peak the input, `up`'s output and relu's (made while
    `up`'s is still referenced) are alive, nothing else."""
    x = torch.randn(2, 1000, 16)
    block = Block("t", "mlp", _Mlp(16, 64), ["x"], ["y"], (x,), [True])
    hidden = 2 * 1000 * 64 * 4
    assert activation_peak(block) == x.nbytes + 2 * hidden


def test_chunked_attention_lowers_the_estimated_peak():
    """One attention of 4 096 tokens x 2 heads: whole, its scores (128 MiB) are in the peak;
    in chunks of 1 MiB of scores, a few chunks are."""
    qkv = tuple(torch.randn(1, 2, 4096, 8) for _ in range(3))
    block = Block("t", "attention", _Attention(), ["q", "k", "v"], ["out"], qkv, [True] * 3)
    scores = 2 * 4096 * 4096 * 4
    with score_limit(2**62):
        whole = activation_peak(block)
    with score_limit(2**20):
        chunked = activation_peak(block)
    assert whole >= 2 * scores  # the scaled scores and their softmax
    assert chunked < 8 * 2**20 + 4 * qkv[0].nbytes
