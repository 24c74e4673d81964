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
def tiny_sora(pipeline):
    """The shipped tiny-sora as its family's model (what exporters take)."""
    from edge.families.tiny_sora import TinySoraModel

    return TinySoraModel(pipeline)


@pytest.fixture(scope="session")
def classifier():
    from edge.eval.run import load_classifier
    from edge.models.tiny_sora import DEFAULT_WEIGHTS

    return load_classifier(DEFAULT_WEIGHTS)


@pytest.fixture(scope="session")
def exported_package(tmp_path_factory, tiny_sora):
    """tiny-sora exported to ONNX once per test session: (root, manifest). Copy it before
    changing it."""
    from exporters.onnx import end_to_end_check, export_onnx

    root = tmp_path_factory.mktemp("export") / "tiny-sora-onnx"
    manifest = export_onnx(tiny_sora, root, validate_end_to_end=end_to_end_check(tiny_sora))
    return root, manifest
