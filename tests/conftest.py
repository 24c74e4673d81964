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


@pytest.fixture(scope="session")
def coreml_package(tmp_path_factory, tiny_sora):
    """tiny-sora exported to CoreML (fp16) once per session, end-to-end check on 6 steps:
    (root, manifest). Copy it before changing it."""
    pytest.importorskip("coremltools", reason="coremltools is in the test extras (pip install "
                        "-e '.[test]'); the CoreML exporter needs it")
    from exporters.coreml import export_coreml
    from exporters.coreml_check import end_to_end_check

    root = tmp_path_factory.mktemp("coreml") / "tiny-sora-iphone"
    manifest = export_coreml(tiny_sora, root, validate_end_to_end=end_to_end_check(
        tiny_sora, "fp16", steps=6))
    return root, manifest


WAN_SIZE = {"height": 32, "width": 48, "frames": 9}


@pytest.fixture(scope="session")
def wan_folder(tmp_path_factory):
    """A tiny random-weight WanPipeline folder (tests/wan_folder.py), once per session."""
    from wan_folder import make_wan_folder

    return make_wan_folder(tmp_path_factory.mktemp("wan") / "wan")


@pytest.fixture(scope="session")
def wan_folders(tmp_path_factory):
    """Tiny WanPipeline folders with each scheduler Wan ships with (the same weights)."""
    from wan_folder import make_wan_folder

    root = tmp_path_factory.mktemp("wan")
    return {s: make_wan_folder(root / s, scheduler=s) for s in ("unipc", "euler")}


@pytest.fixture(scope="session")
def wan_models(wan_folders):
    from edge.families import load_model

    return {s: load_model(f, steps=12, **WAN_SIZE) for s, f in wan_folders.items()}


@pytest.fixture(scope="session")
def wan_packages(tmp_path_factory, wan_models):
    """wan_models exported to ONNX once per session: {scheduler: (root, manifest)}."""
    from exporters.onnx import export_onnx

    root = tmp_path_factory.mktemp("wan-onnx")
    return {s: (root / s, export_onnx(m, root / s)) for s, m in wan_models.items()}


@pytest.fixture(scope="session")
def wan_model(wan_folder):
    """The tiny Wan folder as its family's model, at the tests' video size and 8 steps."""
    from edge.families import load_model

    return load_model(wan_folder, steps=8, **WAN_SIZE)


@pytest.fixture(scope="session")
def wan_iphone_package(tmp_path_factory, wan_model):
    """The tiny Wan exported to CoreML (fp16) once per session, end-to-end check against
    diffusers' WanPipeline: (root, manifest). Copy it before changing it."""
    root = tmp_path_factory.mktemp("wan-iphone") / "pkg"
    return root, iphone_export(wan_model, root)


def iphone_export(model, root):
    """`model` exported to CoreML (fp16) with the end-to-end check against its family's
    diffusers pipeline, those weights swapped in: the manifest."""
    pytest.importorskip("coremltools", reason="coremltools is in the test extras (pip install "
                        "-e '.[test]'); the CoreML exporter needs it")
    from exporters.coreml import export_coreml
    from exporters.coreml_check import end_to_end_check

    return export_coreml(model, root, validate_end_to_end=end_to_end_check(model, "fp16"))


FAMILY_SIZE = {"height": 32, "width": 64, "frames": 17}   # CogVideoX's and LTX-Video's tests'


@pytest.fixture(scope="session")
def cog_iphone_package(tmp_path_factory):
    """A tiny CogVideoX of 5B's shape (rotary positions) exported to CoreML once per session:
    (root, manifest, its folder). Copy it before changing it."""
    from cogvideox_folder import make_cogvideox_folder

    from edge.families import load_model

    root = tmp_path_factory.mktemp("cogvideox-iphone")
    folder = make_cogvideox_folder(root / "model", rotary=True)
    model = load_model(folder, steps=6, **FAMILY_SIZE)
    return root / "pkg", iphone_export(model, root / "pkg"), folder


LTX_DECODE = {"frame_rate": 24, "decode_timestep": 0.05, "decode_noise_scale": 0.025}


@pytest.fixture(scope="session")
def ltx_iphone_package(tmp_path_factory):
    """A tiny LTX-Video with a timestep-conditioned decoder (0.9.5's shape; LTX's decode
    timestep and noise scale) exported to CoreML once per session: (root, manifest, its
    folder). Copy it before changing it."""
    from ltx_folder import make_ltx_folder

    from edge.families import load_model

    root = tmp_path_factory.mktemp("ltx-iphone")
    folder = make_ltx_folder(root / "model", timestep_decoder=True)
    model = load_model(folder, steps=4, **FAMILY_SIZE, **LTX_DECODE)
    return root / "pkg", iphone_export(model, root / "pkg"), folder


@pytest.fixture(scope="session")
def browser():
    """Debian's headless chromium, one for the session's browser tests (tests/browser.py);
    skips a test that asks for it where there is none."""
    from browser import chromium

    with chromium() as b:
        yield b
