"""What a seed means (edge/core/noise.py): PyTorch's CPU `torch.randn` for that seed, drawn without
torch. Checked against torch itself over many seeds and shapes, including the path under 16
values and the redraw of the last 16; the fixtures the JavaScript and Swift mirrors replay
are still what torch draws; bad seeds are refused; the Python runtime draws diffusers' noise
and refuses a package whose seeds meant something else."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from noise_fixtures import FIXTURE, cases, draws

from edge.core.manifest_schema import MANIFEST
from edge.core.noise import LEGACY_NOISE, MAX_SEED, NOISE, check_seed, torch_randn
from edge.core.package import manifest_digest

TOLERANCE = 2e-6  # torch uses SIMD log/sin/cos for 16 values or more: about 1 float32 ulp


def torch_draw(shape: tuple[int, ...], seed: int) -> np.ndarray:
    generator = torch.Generator("cpu").manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=torch.float32).numpy()


@pytest.mark.parametrize("shape", [(1,), (2,), (3,), (7,), (15,), (16,), (17,), (31,), (32,),
                                   (47,), (1, 16, 3, 5, 7), (16, 9, 10, 11), (2, 16, 21, 60)])
@pytest.mark.parametrize("seed", [0, 1, 3, 42, 2**31, 2**32 - 1, 2**32 + 7, 2**62 + 5,
                                  MAX_SEED])
def test_draws_what_torch_draws(seed, shape):
    got, want = torch_randn(shape, seed), torch_draw(shape, seed)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE)


def test_many_seeds_and_sizes_agree_with_torch():
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(200):
        seed = int(rng.integers(0, 2**63 - 1, dtype=np.int64))
        n = int(rng.choice([rng.integers(1, 40), rng.integers(40, 5000)]))
        worst = max(worst, float(np.abs(torch_randn((n,), seed) - torch_draw((n,), seed)).max()))
    assert worst <= TOLERANCE


def test_only_the_low_32_bits_of_a_seed_count_as_in_torch():
    np.testing.assert_array_equal(torch_randn((40,), 2**32 + 7), torch_randn((40,), 7))


def test_fixtures_for_the_mirrors_are_what_torch_draws():
    recorded = json.loads(FIXTURE.read_text())
    assert recorded["definition"] == NOISE
    assert recorded["cases"] == cases(), "rewrite them: python tests/noise_fixtures.py"
    assert recorded["draws"] == draws(), "rewrite them: python tests/noise_fixtures.py"


@pytest.mark.parametrize("seed, message", [
    (-1, "out of range"), (MAX_SEED + 1, "out of range"), (1.5, "whole number"),
    (True, "whole number"), ("3", "whole number"), (None, "whole number")])
def test_bad_seeds_are_refused(seed, message):
    with pytest.raises(ValueError, match=message):
        check_seed(seed)


def test_runtime_refuses_bad_seeds_and_a_seed_with_latents(exported_package):
    from edge.runtimes.python import Pipeline

    root, _ = exported_package
    pipe = Pipeline.load(root)
    try:
        for seed in (-1, 2**63, 0.5):
            with pytest.raises(ValueError, match="seed"):
                pipe.generate("a red circle", seed=seed, steps=1)
        latents = torch_randn((1, *pipe.latent_shape), 0)
        with pytest.raises(ValueError, match="seed and latents given together"):
            pipe.generate("a red circle", seed=3, latents=latents, steps=1)
        assert pipe.generate("a red circle", seed=MAX_SEED, steps=1).shape[0] == 1
    finally:
        pipe.close()


def test_package_of_another_noise_refuses_a_seed_but_runs_given_latents(exported_package,
                                                                       tmp_path):
    from edge.runtimes.python import Pipeline

    root, _ = exported_package
    old = tmp_path / "old"
    shutil.copytree(root, old)
    manifest = json.loads((old / MANIFEST).read_text())
    assert manifest["noise"] == NOISE
    del manifest["noise"]  # as written before the field: seeds meant NumPy PCG64 noise
    manifest["manifest_sha256"] = manifest_digest(manifest)
    (old / MANIFEST).write_text(json.dumps(manifest))
    pipe = Pipeline.load(old)
    try:
        with pytest.raises(ValueError, match=f"noise '{LEGACY_NOISE}'.*re-export"):
            pipe.generate("a red circle", seed=3, steps=1)
        latents = torch_randn((1, *pipe.latent_shape), 3)
        assert pipe.generate("a red circle", latents=latents, steps=1).shape[0] == 1
    finally:
        pipe.close()


def test_a_draw_of_wan_latents_is_standard_normal():
    """Wan2.1-T2V-1.3B's latents at 480x832x81 (benchmarks/noise.py compares the runtimes'
    times with torch's); here only that the draw is whole and standard normal."""
    values = torch_randn((16, 21, 60, 104), 3)
    assert values.size == math.prod((16, 21, 60, 104)) and np.isfinite(values).all()
    assert abs(values.mean()) < 0.01 and abs(values.std() - 1) < 0.01


def test_the_pages_noise_module_is_what_noise_wat_assembles_to():
    """runtimes/web/noise_wasm.js holds wasmtime's assembly of runtimes/web/noise.wat (run
    `python tools/noise_wasm.py` after changing it), under the 4 KB up to which chromium
    compiles a module synchronously on the main thread (torchRandn stays synchronous)."""
    import importlib.util
    from pathlib import Path

    pytest.importorskip("wasmtime", reason="wasmtime is in the test extras (pip install -e "
                        "'.[test]'); tools/noise_wasm.py assembles the page's kernel with it")
    path = Path(__file__).resolve().parents[1] / "tools" / "noise_wasm.py"
    spec = importlib.util.spec_from_file_location("noise_wasm", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    wasm = tool.assemble(tool.SOURCE.read_text())
    assert wasm[:4] == b"\0asm" and len(wasm) < 4096
    assert tool.TARGET.read_text() == tool.generated(wasm), "run python tools/noise_wasm.py"
