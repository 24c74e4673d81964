"""`edge export --device`: the PyTorch reference (every block's forward pass, the end-to-end
check's reference video) on a GPU, tracing and the package's runs on the CPU.

Here (no GPU): the choices and their refusals, the CPU path unchanged. On a machine where
torch sees a CUDA GPU: each weight moved once and given back as it was, every family's
blocks and reference video on the GPU equal to the CPU's, and an export checked against a
reference computed there."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from edge.commands import app
from edge.core.video_metrics import psnr, snr
from edge.graph.blocks import chained
from edge.graph.reference_device import (
    DeviceError,
    current,
    modules_on,
    reference_device,
    reference_record,
    resolve_device,
    run_module,
)

sys.path.insert(0, str(Path(__file__).parent))
from test_family_contract import DIFFUSERS, model_of  # noqa: E402

GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(
    not GPU, reason="torch sees no CUDA GPU here: the reference on a GPU (edge export "
    "--device cuda) is checked on a machine with one")
runner = CliRunner()
PROMPT = "a red circle moving left"


# ---- the choices ------------------------------------------------------------------------

def test_cpu_and_auto_resolve_to_what_this_machine_has():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")
    assert resolve_device("auto") == (torch.device("cuda", 0) if GPU else torch.device("cpu"))
    assert current() == torch.device("cpu")  # the default, outside any export


@pytest.mark.parametrize("name, message", [
    ("tpu", "--device 'tpu': one of cpu, cuda, cuda:N or auto"),
    ("mps", "--device mps: the reference runs on cpu, cuda"),
    ("cuda:99", "--device cuda:99: " + ("torch sees" if GPU else "")),
])
def test_a_device_it_cannot_use_is_refused_naming_it(name, message):
    with pytest.raises(DeviceError, match="^" + message.replace("(", r"\(")):
        resolve_device(name)


@pytest.mark.skipif(GPU, reason="this machine has a GPU: nothing to refuse")
def test_export_refuses_a_gpu_it_cannot_see_before_any_work(tmp_path):
    dest = tmp_path / "pkg"
    res = runner.invoke(app, ["export", "--device", "cuda", "-o", str(dest)])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    errors = [line for line in res.output.splitlines() if "error:" in line]
    assert len(errors) == 1, res.output
    assert "--device cuda:" in errors[0] and "--device cpu" in errors[0]
    why = "built without CUDA" if torch.version.cuda is None else "no CUDA GPU"
    assert why in errors[0]
    assert not dest.exists()


def test_tiny_soras_reference_stays_on_the_cpu():
    from edge.commands.export import _reference_device

    assert _reference_device("auto", "tiny-sora") == torch.device("cpu")
    assert _reference_device("cpu", "wan") == torch.device("cpu")
    assert _reference_device("auto", "wan") == resolve_device("auto")


@needs_gpu
def test_a_gpu_named_for_tiny_sora_is_refused_saying_why(tmp_path):
    dest = tmp_path / "pkg"
    res = runner.invoke(app, ["export", "--device", "cuda", "-o", str(dest)])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "--device cuda: tiny-sora's reference runs on the CPU" in res.output
    assert not dest.exists()


def test_on_the_cpu_nothing_moves():
    layer = nn.Linear(4, 3)
    weight = layer.weight
    with reference_device("cpu"), modules_on(layer):
        assert layer.weight is weight
        (out,) = run_module(layer, (torch.ones(2, 4),))
    assert torch.equal(out, layer(torch.ones(2, 4)))


def test_a_tensor_already_on_the_device_is_itself():
    """What keeps traced graphs as they were: no copy where devices agree."""
    from edge.graph.reference_device import on_device_of

    table, z = torch.ones(3), torch.zeros(2)
    assert on_device_of(table, z) is table


def test_a_validation_record_names_a_reference_off_the_cpu_only():
    assert reference_record() == {}  # what every record said before the option
    with reference_device("cuda:1"):
        assert reference_record() == {"reference_device": "cuda:1"}
    assert reference_record() == {}


def test_the_setting_is_restored_after_an_error():
    with pytest.raises(RuntimeError, match="inside"), reference_device("meta"):
        assert current() == torch.device("meta")
        raise RuntimeError("inside")
    assert current() == torch.device("cpu")


# ---- on a GPU -----------------------------------------------------------------------------

class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.b.weight = self.a.weight  # one tensor, two modules
        self.register_buffer("offset", torch.arange(8.0))

    def forward(self, x):
        return self.b(self.a(x)) + self.offset


@needs_gpu
def test_each_weight_is_copied_once_and_the_very_tensors_come_back():
    module = Tied()
    before = {n: t for n, t in [*module.named_parameters(), *module.named_buffers()]}
    x = torch.randn(3, 8)
    want = module(x)
    with reference_device("cuda"):
        with modules_on(module):
            assert all(t.is_cuda for t in [*module.parameters(), *module.buffers()])
            assert module.a.weight is module.b.weight
            assert torch.backends.cudnn.allow_tf32 is False
        (got,) = run_module(module, (x,))
    assert got.device.type == "cpu"
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    after = dict([*module.named_parameters(), *module.named_buffers()])
    assert all(after[n] is t for n, t in before.items())


def _cases() -> list[str]:
    # tiny-sora's reference stays on the CPU (`edge export` keeps it there)
    return [*DIFFUSERS, "opensora"]


def _model(request, case: str):
    return request.getfixturevalue("opensora_model") if case == "opensora" else model_of(
        request, case)


def _relative(got: tuple, want: tuple) -> float:
    return max(float((g - w).abs().max()) / max(1.0, float(w.abs().max()))
               for g, w in zip(got, want, strict=True))


@needs_gpu
@pytest.mark.parametrize("case", _cases())
def test_every_block_on_the_gpu_computes_what_it_computes_on_the_cpu(request, case):
    """Each block of each component, on the activations the blocks before it give (as an
    export validates them): the GPU's outputs within float32's reach of the CPU's."""
    model = _model(request, case)
    worst = {}
    for blocks in model.cut().values():
        for block in chained(blocks):
            want = block.reference()
            with reference_device("cuda"):
                got = block.run(*block.example)
            assert all(g.device.type == "cpu" for g in got)
            worst[block.key] = _relative(got, want)
    assert max(worst.values()) < 1e-4, worst


@needs_gpu
@pytest.mark.parametrize("case", _cases())
def test_the_reference_video_on_the_gpu_is_the_cpus(request, case):
    """The family's reference video (diffusers' pipeline, Open-Sora's sampling) drawn on the
    GPU from the same seed: the CPU's, far closer than videos from other noise are."""
    model = _model(request, case)
    want = model.generate(PROMPT, seed=0)
    with reference_device("cuda"):
        got = model.generate(PROMPT, seed=0)
        other = model.generate(PROMPT, seed=1)
    assert got.shape == want.shape and got.dtype == np.uint8
    assert psnr(got, want) >= 40 and snr(got, want) >= 20, (psnr(got, want), snr(got, want))
    # another seed lands far off: the figures above can tell a wrong video
    assert snr(other, want) < snr(got, want) - 10


@needs_gpu
def test_an_export_holds_its_graphs_to_a_reference_on_the_gpu(wan_folders, tmp_path):
    """`edge export --device cuda`: blocks and the end-to-end check against diffusers'
    pipeline run on the GPU, the graphs (traced on the CPU) within the usual bounds."""
    dest = tmp_path / "pkg"
    res = runner.invoke(app, ["export", "--model", str(wan_folders["euler"]), "--height", "32",
                              "--width", "48", "--frames", "9", "--steps", "3", "--device",
                              "cuda", "--check", "full", "-o", str(dest)])
    assert res.exit_code == 0, res.output
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["validation"]["identical"] or manifest["validation"]["psnr_db"] >= 40
    assert manifest["validation"]["reference_device"] == "cuda:0"
    errors = [b["validation"]["max_abs_error"] for c in manifest["components"]
              for b in c["blocks"]]
    assert errors and max(errors) < 1e-3
