"""The training entry point runs every stage and writes a folder the pipeline loads."""
import json

import pytest

from edge.eval.run import load_classifier
from edge.models.tiny_sora import TinySora
from edge.train import SMOKE_RECIPE, train_tiny_sora


@pytest.mark.slow  # trains every component
def test_smoke_training_writes_loadable_weights(tmp_path):
    log = train_tiny_sora(tmp_path / "w", SMOKE_RECIPE, checkpoint_every=1)
    for key in ("vae_seconds", "transformer_seconds", "classifier_seconds", "total_seconds",
                "vae_scaling_factor"):
        assert key in log
    assert (tmp_path / "w" / "checkpoints" / "transformer-2.safetensors").is_file()
    config = json.loads((tmp_path / "w" / "tiny-sora.json").read_text())
    assert config["training"]["recipe"]["transformer_steps"] == 2
    pipe = TinySora.load(tmp_path / "w")
    assert pipe.generate("a red circle moving left", steps=2).shape == (1, 16, 32, 32, 3)
    load_classifier(tmp_path / "w")
