import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def pipeline():
    from edge.models.tiny_sora import TinySora

    return TinySora.load()


@pytest.fixture(scope="session")
def classifier():
    from edge.eval.run import load_classifier
    from edge.models.tiny_sora import DEFAULT_WEIGHTS

    return load_classifier(DEFAULT_WEIGHTS)
