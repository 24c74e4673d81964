import os
import signal
import time
from pathlib import Path

import pytest
import torch
from shared_builds import built_once, package_once

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# two cores at most a process, shared by pytest-xdist's workers (README's test command)
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // _WORKERS)))


@pytest.fixture(scope="session")
def pipeline():
    from edge.models.tiny_sora import TinySora

    return TinySora.load()


@pytest.fixture(scope="session")
def tiny_sora(pipeline):
    """The shipped tiny-sora as its family's model (what exporters take)."""
    from edge.families.tiny_sora.family import TinySoraModel

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
    from edge.exporters.onnx.package import end_to_end_check, export_onnx

    return package_once(tmp_path_factory, "tiny-sora-onnx", lambda root: export_onnx(
        tiny_sora, root, validate_end_to_end=end_to_end_check(tiny_sora)))


@pytest.fixture(scope="session")
def coreml_package(tmp_path_factory, tiny_sora):
    """tiny-sora exported to CoreML (fp16) once per session, end-to-end check on 6 steps:
    (root, manifest). Copy it before changing it."""
    pytest.importorskip("coremltools", reason="coremltools is in the test extras (pip install "
                        "-e '.[test]'); the CoreML exporter needs it")
    from edge.exporters.iphone.coreml.check import end_to_end_check
    from edge.exporters.iphone.coreml.package import export_coreml

    return package_once(tmp_path_factory, "tiny-sora-iphone", lambda root: export_coreml(
        tiny_sora, root, validate_end_to_end=end_to_end_check(tiny_sora, "fp16", steps=6)))


def coreai_export(model, dest: Path, quantize: str = "fp32", unguided: bool = False,
                  memory_budget: int | None = None) -> dict:
    """`model` through `--target iphone --min-ios 27` (Core AI): the manifest. `unguided`:
    with the transformer's caption-half functions (as `edge export` writes them; left out
    elsewhere for time); `memory_budget`: re-cut for it."""
    pytest.importorskip("coreai_torch", reason="Core AI's converter (coreai-torch, the "
                        "[iphone] extra) is not installed")
    from edge.exporters import ExportOptions, Progress, target

    options = ExportOptions(quantize=quantize, min_ios=27, unguided_variants=unguided,
                            memory_budget=memory_budget)
    module = target("iphone")
    module.check(options)
    prepared = module.prepare(model, options)
    return module.export(model, prepared, dest, options, Progress())


@pytest.fixture(scope="session")
def coreai_package(tmp_path_factory, tiny_sora):
    """tiny-sora exported --min-ios 27 at fp32 once per session, with the caption-half
    functions: (root, manifest). Copy it before changing it."""
    return package_once(tmp_path_factory, "tiny-sora-coreai",
                        lambda root: coreai_export(tiny_sora, root, unguided=True))


# the shared web package's weights files split smaller than the default, so pages read shards
WEB_SMALL_SHARDS = 8 << 20


@pytest.fixture(scope="session")
def tiny_sora_web(tmp_path_factory, tiny_sora):
    """tiny-sora for the web once per session, as the browser tests read it: (root,
    manifest). Without the TDTM variants (they double the transformer's compile time) and
    without the llvm replay of every plan (tests/test_web_plan.py checks replays; the
    browser tests run the plans against PyTorch); with the caption-half programs
    (`unguided`) as `edge export` writes them; onnxruntime-web bundled where its dist is
    here. Copy it before changing it."""
    from browser import ORT_DIST

    from edge.exporters.web.package import export_web

    bundle = ORT_DIST if (ORT_DIST / "ort.wasm.min.mjs").is_file() else None
    return package_once(tmp_path_factory, "tiny-sora-web", lambda root: export_web(
        tiny_sora, root, variants=False, check=False, bundle_ort=bundle,
        shard_bytes=WEB_SMALL_SHARDS, unguided=True))


WAN_SIZE = {"height": 32, "width": 48, "frames": 9}

# The families' shared test exports trace attention in query chunks of 16 rows (2 KiB of
# scores per video is below every tiny model's rows, so the least rows decide): each
# family's graphs on every target then hold the chunked attention a real-size export has,
# and the end-to-end checks against diffusers' pipelines hold for it (edge/graph/attention.py)
TEST_CHUNK_ROWS = 16


def chunked_attention_for_tests():
    from edge.graph.attention import score_limit

    return score_limit(2048, min_rows=TEST_CHUNK_ROWS)


@pytest.fixture(scope="session")
def wan_folder(tmp_path_factory):
    """A tiny random-weight WanPipeline folder (tests/wan_folder.py), once per session."""
    from wan_folder import make_wan_folder

    return built_once(tmp_path_factory, "wan", lambda f: make_wan_folder(f / "wan")) / "wan"


@pytest.fixture(scope="session")
def wan_folders(tmp_path_factory):
    """Tiny WanPipeline folders with each scheduler Wan ships with (the same weights)."""
    from wan_folder import make_wan_folder

    schedulers = ("unipc", "euler")
    root = built_once(tmp_path_factory, "wan-schedulers", lambda f: [
        make_wan_folder(f / s, scheduler=s) for s in schedulers])
    return {s: root / s for s in schedulers}


@pytest.fixture(scope="session")
def wan_models(wan_folders):
    from edge.families import load_model

    return {s: load_model(f, steps=12, **WAN_SIZE) for s, f in wan_folders.items()}


# the VAE tiling of the tiled-decoder tests' Wan (enable_tiling's tile height, width,
# stride height, width in pixels): its 4 x 6 latents decode as tiles of 4 x 4, 4 x 4, 4 x 2
WAN_TILING = (32, 32, 32, 16)


@pytest.fixture(scope="session")
def wan_tiled(wan_folders):
    """The tiny Wan (UniPC) whose VAE tiles as WAN_TILING: a model of its own (the shared
    ones decode whole frames, 256-pixel tiles holding their video)."""
    from edge.families import load_model

    return load_model(wan_folders["unipc"], steps=12, vae_tiles=WAN_TILING, **WAN_SIZE)


@pytest.fixture(scope="session")
def wan_tiled_coreai_package(tmp_path_factory, wan_tiled):
    """wan_tiled exported --min-ios 27 at fp32 once a run: (root, manifest)."""
    return package_once(tmp_path_factory, "wan-tiled-coreai",
                        lambda root: coreai_export(wan_tiled, root))


# Wan 2.2 TI2V-5B's tests' size: 16x spatial, latents 48 x 3 x 2 x 4
WAN22_SIZE = {"height": 32, "width": 64, "frames": 9}


@pytest.fixture(scope="session")
def wan22_folder(tmp_path_factory):
    """A tiny random-weight Wan 2.2 TI2V-5B folder (tests/wan_folder.py version "2.2")."""
    from wan_folder import make_wan_folder

    return built_once(tmp_path_factory, "wan22", lambda f: make_wan_folder(
        f / "wan22", version="2.2")) / "wan22"


@pytest.fixture(scope="session")
def wan22(wan22_folder):
    from edge.families import load_model

    return load_model(wan22_folder, steps=8, **WAN22_SIZE)


@pytest.fixture(scope="session")
def wan22_package(tmp_path_factory, wan22):
    """The tiny Wan 2.2 exported to ONNX once per session: (root, manifest)."""
    return onnx_packages(tmp_path_factory, "wan22-onnx", {"pkg": wan22})["pkg"]


@pytest.fixture(scope="session")
def wan22_iphone_package(tmp_path_factory, wan22):
    """The tiny Wan 2.2 exported to CoreML (fp16) with its end-to-end check: (root,
    manifest). Copy it before changing it."""
    return package_once(tmp_path_factory, "wan22-iphone", lambda root: iphone_export(wan22, root))


def onnx_packages(tmp_path_factory, name: str, models: dict) -> dict:
    """Each of `models` exported to ONNX under the run's folder `name`, once a run:
    {key: (root, manifest)}."""
    from edge.core.package import read_manifest
    from edge.exporters.onnx.package import export_onnx

    def export(folder):
        with chunked_attention_for_tests():
            for k, m in models.items():
                export_onnx(m, folder / k)

    root = built_once(tmp_path_factory, name, export)
    return {k: (root / k, read_manifest(root / k)) for k in models}


@pytest.fixture(scope="session")
def wan_packages(tmp_path_factory, wan_models):
    """wan_models exported to ONNX once per session: {scheduler: (root, manifest)}."""
    return onnx_packages(tmp_path_factory, "wan-onnx", wan_models)


@pytest.fixture(scope="session")
def wan_model(wan_folder):
    """The tiny Wan folder as its family's model, at the tests' video size and 8 steps."""
    from edge.families import load_model

    return load_model(wan_folder, steps=8, **WAN_SIZE)


@pytest.fixture(scope="session")
def wan_iphone_package(tmp_path_factory, wan_model):
    """The tiny Wan exported to CoreML (fp16, the transformer's caption-half functions
    too, as the CLI writes it) once per session, end-to-end check against diffusers'
    WanPipeline: (root, manifest). Copy it before changing it."""
    return package_once(tmp_path_factory, "wan-iphone", lambda root: iphone_export(
        wan_model, root, unguided=True))


# Open-Sora 1.2's tiny checkpoint and the original code's outputs for it (its README says how
# they were made), and the size they were made at
OPENSORA_FIXTURE = Path(os.environ.get("EDGE_OPENSORA_FIXTURE", Path(__file__).resolve().parents[2]
                                       / "shared" / "fixtures" / "opensora-1.2-tiny"))
OPENSORA_SIZE = {"height": 64, "width": 96, "frames": 34}
OPENSORA_PROMPT = "a red circle moving left"   # the fixture's prompt case


@pytest.fixture(scope="session")
def opensora_model():
    """The fixture's checkpoint as the opensora family's model, at its size and 2 steps."""
    from edge.families import load_model

    if not OPENSORA_FIXTURE.is_dir():
        pytest.skip(f"the Open-Sora fixture is not at {OPENSORA_FIXTURE} (set "
                    "EDGE_OPENSORA_FIXTURE)")
    return load_model(OPENSORA_FIXTURE, **OPENSORA_SIZE, steps=2)


@pytest.fixture(scope="session")
def opensora_package(tmp_path_factory, opensora_model):
    """opensora_model exported to ONNX once per session: (root, manifest)."""
    return onnx_packages(tmp_path_factory, "opensora-onnx", {"pkg": opensora_model})["pkg"]


@pytest.fixture(scope="session")
def opensora_iphone_package(tmp_path_factory, opensora_model):
    """opensora_model exported to CoreML (fp16, end-to-end check) once per session: (root,
    manifest). Copy it before changing it."""
    return package_once(tmp_path_factory, "opensora-iphone",
                        lambda root: iphone_export(opensora_model, root))


def iphone_export(model, root, unguided: bool = False):
    """`model` exported to CoreML (fp16) with the end-to-end check against its family's
    diffusers pipeline, those weights swapped in: the manifest. `unguided`: the
    transformer's caption-half functions too."""
    pytest.importorskip("coremltools", reason="coremltools is in the test extras (pip install "
                        "-e '.[test]'); the CoreML exporter needs it")
    from edge.exporters.iphone.coreml.check import end_to_end_check
    from edge.exporters.iphone.coreml.package import export_coreml

    with chunked_attention_for_tests():
        return export_coreml(model, root, validate_end_to_end=end_to_end_check(model, "fp16"),
                             unguided=unguided)


# CogVideoX's and LTX-Video's tests' size: 17 frames are 5 latent frames (both VAEs are 4x in
# time); 32 x 64 pixels is not the tiny CogVideoX transformer's own 32 x 48, so 2B's sin-cos
# table is rebuilt
FAMILY_SIZE = {"height": 32, "width": 64, "frames": 17}
COG_SHAPES = ("2b", "5b")
LTX_KINDS = ("plain", "timestep")
# the timestep-conditioned LTX: a frame rate other than LTXPipeline's 25, and the decode
# settings LTX's examples use for 0.9.1+ as its defaults
LTX_DECODE = {"frame_rate": 24, "decode_timestep": 0.05, "decode_noise_scale": 0.025}
LTX_OPTIONS = {"plain": {}, "timestep": LTX_DECODE}


@pytest.fixture(scope="session")
def cog_folders(tmp_path_factory):
    """Tiny CogVideoX folders of both shapes: 2B's sin-cos positions, 5B's rotary ones."""
    from cogvideox_folder import make_cogvideox_folder

    root = built_once(tmp_path_factory, "cogvideox", lambda f: [
        make_cogvideox_folder(f / s, rotary=s == "5b") for s in COG_SHAPES])
    return {s: root / s for s in COG_SHAPES}


@pytest.fixture(scope="session")
def cog_models(cog_folders):
    from edge.families import load_model

    return {s: load_model(f, steps=6, **FAMILY_SIZE) for s, f in cog_folders.items()}


@pytest.fixture(scope="session")
def cog_packages(tmp_path_factory, cog_models):
    """Both shapes exported to ONNX once per session: {shape: (root, manifest)}."""
    return onnx_packages(tmp_path_factory, "cogvideox-onnx", cog_models)


@pytest.fixture(scope="session")
def ltx_folders(tmp_path_factory):
    """Tiny LTX-Video folders: 0.9.0's plain decoder, and a timestep-conditioned one."""
    from ltx_folder import make_ltx_folder

    root = built_once(tmp_path_factory, "ltx", lambda f: [
        make_ltx_folder(f / k, timestep_decoder=k == "timestep") for k in LTX_KINDS])
    return {k: root / k for k in LTX_KINDS}


@pytest.fixture(scope="session")
def ltx_models(ltx_folders):
    from edge.families import load_model

    return {k: load_model(f, steps=4, **FAMILY_SIZE, **LTX_OPTIONS[k])
            for k, f in ltx_folders.items()}


@pytest.fixture(scope="session")
def ltx_packages(tmp_path_factory, ltx_models):
    """Both decoders' packages exported to ONNX once per session: {kind: (root, manifest)}."""
    return onnx_packages(tmp_path_factory, "ltx-onnx", ltx_models)


@pytest.fixture(scope="session")
def cog_iphone_package(tmp_path_factory, cog_models):
    """The tiny CogVideoX of 5B's shape (rotary positions) exported to CoreML once per session:
    (root, manifest). Copy it before changing it."""
    return package_once(tmp_path_factory, "cogvideox-iphone",
                        lambda root: iphone_export(cog_models["5b"], root))


@pytest.fixture(scope="session")
def ltx_plain_iphone_package(tmp_path_factory, ltx_models):
    """The tiny LTX-Video with 0.9.0's plain decoder exported to CoreML (fp16): (root,
    manifest). Copy it before changing it."""
    return package_once(tmp_path_factory, "ltx-plain-iphone",
                        lambda root: iphone_export(ltx_models["plain"], root))


@pytest.fixture(scope="session")
def ltx_iphone_package(tmp_path_factory, ltx_models):
    """The tiny LTX-Video with a timestep-conditioned decoder (0.9.5's shape; LTX's decode
    timestep and noise scale) exported to CoreML once per session: (root, manifest). Copy it
    before changing it."""
    return package_once(tmp_path_factory, "ltx-iphone",
                        lambda root: iphone_export(ltx_models["timestep"], root))


@pytest.fixture(scope="session")
def browser():
    """Debian's headless chromium, one for the session's browser tests (tests/browser.py);
    skips a test that asks for it where there is none."""
    from browser import chromium

    with chromium() as b:
        yield b


# ---- the workers ------------------------------------------------------------------------------
# pytest-xdist hands tests to its workers one by one, so the tests of a module-scoped export
# (test_web_wan.py's Wan web package, test_web_families.py's per family) landed on both
# workers and each built it: minutes of the suite twice. Such tests are one xdist group
# (`--dist loadgroup`, pyproject's addopts). Where a test's module fixtures are all
# parametrized (test_web_families.py: one export per family) each parameter is a group of its
# own, so the families' exports still share out over the workers; a module fixture without
# parameters (test_web_browser.py's package, under its parametrized pages) keeps the module
# one group, or it would be built once per group. tryfirst: xdist's own hook reads the groups
# off the items after this one has set them.

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        here = item.nodeid.split("::")[0]
        shared = sorted(name for name, defs in info.name2fixturedefs.items()
                        if defs and defs[-1].scope == "module"
                        and defs[-1].baseid.split("::")[0] == here)
        if not shared:
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        group = item.module.__name__
        if all(name in params for name in shared):
            group = "-".join([group, *(str(params[name]) for name in shared)])
        item.add_marker(pytest.mark.xdist_group(group))


class _GroupsKept:
    """Fail the grouped tests where `--dist loadgroup` did not group them: xdist marks a
    grouped test by its node id ("...@group"), and a pytest that ignores the mark (9.2 with
    xdist 3.8) spreads a module's tests over both workers, each building its exports: minutes
    lost without a word. (Failing the tests says so readably; an error raised at collection
    reaches the terminal as xdist's INTERNALERROR.) A plugin of its own: the conftest's hook
    above must run before xdist's, this one after."""

    lost: str = ""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        if config.getvalue("loadgroup"):
            self.lost = next((item.nodeid for item in items if "@" not in item.nodeid
                              and item.get_closest_marker("xdist_group")), "")

    def pytest_runtest_setup(self, item):
        if self.lost and item.get_closest_marker("xdist_group"):
            pytest.fail(f"--dist loadgroup did not group the tests (pytest "
                        f"{pytest.__version__} left {self.lost} without its group): install "
                        "the test extra's pytest (pip install -e '.[test]')", pytrace=False)


# Where suite time goes, fixture by fixture and worker by worker: with $EDGE_FIXTURE_TIMES set,
# every session- or module-scoped fixture that took over 5 s appends a line there (worker,
# seconds, scope, name, the test that asked) — an export built on both workers shows twice
# (one built once a run, tests/shared_builds.py, shows a second line only where the other
# worker waited over 5 s for it). Each worker's last line, scope `finished`, is how long it
# ran (the controller's, `main`, the run's wall): two far apart say the wall waits on one
# worker's share, not on the work.
# A plugin of its own: a conftest's hook is not called for the session's fixtures (pytest
# calls it through the session node, which lies above this folder).

class _FixtureTimes:
    def __init__(self, path: str) -> None:
        self.path = path
        self.worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.started = time.perf_counter()

    def _line(self, took: float, scope: str, name: str, nodeid: str) -> None:
        with open(self.path, "a") as out:
            out.write(f"{self.worker}\t{took:.1f}\t{scope}\t{name}\t{nodeid}\n")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        start = time.perf_counter()
        yield
        took = time.perf_counter() - start
        if fixturedef.scope in ("session", "module") and took > 5:
            param = getattr(request, "param", "")
            name = fixturedef.argname + (f"[{param}]" if param != "" else "")
            self._line(took, fixturedef.scope, name, request.node.nodeid)

    def pytest_sessionfinish(self, session):
        self._line(time.perf_counter() - self.started, "finished", "worker", "")


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):   # where xdist renames grouped tests
        config.pluginmanager.register(_GroupsKept(), "edge-groups-kept")
    if os.environ.get("EDGE_FIXTURE_TIMES"):
        config.pluginmanager.register(_FixtureTimes(os.environ["EDGE_FIXTURE_TIMES"]),
                                      "edge-fixture-times")


# for subprocess.Popen(preexec_fn=...) where a test interrupts the child
def sigint_as_at_a_terminal() -> None:
    """In the child: SIGINT's default action, so Python installs its KeyboardInterrupt
    handler. A job a shell starts in the background (`&`, nohup) ignores SIGINT, and a child
    inherits that: the signal these tests send would then do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
