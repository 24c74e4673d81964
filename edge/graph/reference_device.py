"""Where the PyTorch reference runs: `edge export --device`.

Every export holds its graphs to the PyTorch blocks' outputs and its package's video to the
family's reference video (diffusers' pipeline for a folder). At real video sizes those
forward passes are most of an export's cost on a CPU (a Wan 1.3B block at 480x832x81 about
a minute, one reference step about an hour here); on a GPU they take seconds. Tracing stays
on the CPU (the graphs are written for the targets' runtimes), so only the forward passes
move: within `reference_device(device)`, a block's forward pass (`run_module`, which
`Block.run` calls) and a family's reference pipeline (`modules_on` around it) run on
`device`, each weight copied there for the call while the CPU's tensors stay as they were
(weights read lazily from a folder or memory-mapped stay so), and their results come back
to the CPU. TF32 is off meanwhile: the reference stays float32, as the graphs compute.

A plain module-level setting rather than a context variable: the Python runtime runs a
streamed reference's blocks on its own threads, which a context variable would not reach.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from edge.graph.shapes_only import active as shapes_only_active

CPU = torch.device("cpu")
CHOICES = "cpu, cuda, cuda:N or auto (cuda where torch sees a GPU, else cpu)"

_device = CPU


class DeviceError(ValueError):
    """A `--device` this machine cannot run the reference on."""


def resolve_device(name: str) -> torch.device:
    """The device `--device NAME` means here; refused in one line naming why (no GPU, a
    torch built without CUDA, an index past the GPUs torch sees)."""
    given = name.strip().lower()
    if given == "auto":
        return torch.device("cuda", 0) if torch.cuda.is_available() else CPU
    try:
        device = torch.device(given)
    except RuntimeError:
        raise DeviceError(f"--device {name!r}: one of {CHOICES}") from None
    if device.type == "cpu":
        return CPU
    if device.type != "cuda":
        raise DeviceError(f"--device {name}: the reference runs on {CHOICES}")
    if not torch.cuda.is_available():
        why = (f"this torch ({torch.__version__}) is built without CUDA"
               if torch.version.cuda is None else "torch sees no CUDA GPU here")
        raise DeviceError(f"--device {name}: {why}; --device cpu runs the reference on the "
                          "CPU")
    index = 0 if device.index is None else device.index
    count = torch.cuda.device_count()
    if index >= count:
        raise DeviceError(f"--device {name}: torch sees {count} GPU(s), cuda:0 to "
                          f"cuda:{count - 1}")
    return torch.device("cuda", index)


def current() -> torch.device:
    """The device reference forward passes run on now."""
    return _device


@contextlib.contextmanager
def reference_device(device: torch.device | str) -> Iterator[None]:
    """Within: reference forward passes run on `device` (float32 matrix products and
    convolutions without TF32 on a GPU)."""
    global _device
    device = torch.device(device)
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    saved = _device
    _device = device
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        _device = saved
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn


def reference_record() -> dict:
    """What an export's `validation` record says of where its reference ran: the device
    off the CPU, nothing on it (as before the option)."""
    return {} if _device.type == "cpu" else {"reference_device": str(_device)}


def _elsewhere() -> bool:
    """Whether forward passes leave the CPU now (a plan's shapes-only pass never does)."""
    return _device.type != "cpu" and not shapes_only_active()


@contextlib.contextmanager
def modules_on(*modules: nn.Module) -> Iterator[None]:
    """Within: the modules' parameters and buffers are copies on the reference device (a
    tensor shared by several modules copied once); after, the very tensors they had. Weights
    without storage (meta: a model built out of core, between reads) are left alone."""
    if not _elsewhere():
        yield
        return
    swapped: list[tuple[dict, str, torch.Tensor]] = []
    copies: dict[int, torch.Tensor] = {}
    try:
        for module in modules:
            for sub in module.modules():
                for table in (sub._parameters, sub._buffers):
                    for name, tensor in table.items():
                        if tensor is None or tensor.is_meta or tensor.device == _device:
                            continue
                        if id(tensor) not in copies:
                            copy = tensor.detach().to(_device)
                            copies[id(tensor)] = (
                                nn.Parameter(copy, requires_grad=tensor.requires_grad)
                                if isinstance(tensor, nn.Parameter) else copy)
                        swapped.append((table, name, tensor))
                        table[name] = copies[id(tensor)]
        yield
    finally:
        for table, name, tensor in reversed(swapped):
            table[name] = tensor


def on_device_of(tensor: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """`tensor` on `other`'s device: for a plain tensor a module keeps outside its parameters
    and buffers (which `modules_on` does not move; a traced graph folds it in as a constant)
    meeting a reference on a GPU. The very tensor where they share a device, as always while
    tracing, so the graphs stay as they were."""
    return tensor if tensor.device == other.device else tensor.to(other.device)


def _moved(values: Sequence, device: torch.device) -> tuple:
    # a tensor already there is itself (Tensor.to makes no copy): nothing moves on the CPU
    return tuple(v.to(device) if isinstance(v, torch.Tensor) else v for v in values)


@torch.no_grad()
def run_module(module: nn.Module, inputs: Sequence,
               weights: dict[str, torch.Tensor] | None = None) -> tuple:
    """`module(*inputs)` on the reference device, its outputs as a tuple on the CPU;
    `weights`: its parameters, by name, for this call (torch.func.functional_call)."""
    device = _device if _elsewhere() else CPU
    with modules_on(module):
        args = _moved(inputs, device)
        out = (module(*args) if weights is None else torch.func.functional_call(
            module, dict(zip(weights, _moved(weights.values(), device), strict=True)), args))
    return _moved(out if isinstance(out, tuple) else (out,), CPU)
