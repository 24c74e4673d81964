"""A dry run plans from shapes alone (edge/shapes_only.py): no block computes, so a long
video's plan takes as long as a short one's, and it prints the blocks at the asked size."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from edge.blocks import Block
from edge.commands import app


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
