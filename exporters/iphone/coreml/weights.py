"""Read the weights back out of a saved `.mlpackage`, as the device will see them.

CoreML cannot run a prediction on Linux, so the exporter checks what compression did by
reading each block's (fp16, palettized or int8) weights out of the saved ML Program,
decompressing them with coremltools' own constexpr ops, and loading them into the PyTorch
reference block. The converter keeps a parameter's name in its constant's name
(`spatial.attn.q.weight` -> `p_spatial_attn_q_weight_to_fp16[_palettized|_quantized]`);
a parameter that a graph pass moved under another name is found by value instead. A
parameter the converter folded into a computed constant (MiniLM's position table, of which
only the first rows are used, summed with the token-type row) cannot be read back: it keeps
its reference value and is listed as `folded`.

A multifunction `.mlpackage` (a block and its variants as functions sharing one weight file,
exporters/iphone/coreml/package.py) is read function by function: `function` names which.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np
import torch

SUFFIXES = ("_palettized", "_quantized", "_to_fp16")
FOLDED_TOLERANCE = 0.25    # relative max-abs error accepted when matching a folded constant


def import_coremltools():
    """coremltools, with its import-time notes kept quiet: the macOS-only native parts it
    cannot load on Linux (nothing here needs them) and untested torch/scikit-learn
    versions."""
    logging.getLogger("coremltools").setLevel(logging.ERROR)
    import coremltools

    return coremltools


MAIN = "main"   # the function of a single-function program, and a block's own function


def program_functions(mlpackage: Path) -> tuple[list[str], str]:
    """The functions of a saved ML Program and its default one: (["main"], "main") for a
    single-function program."""
    ct = import_coremltools()
    spec = ct.models.MLModel(str(mlpackage), skip_model_load=True).get_spec()
    names = [f.name for f in spec.description.functions]
    return (names, spec.description.defaultFunctionName) if names else ([MAIN], MAIN)


def mil_constants(mlpackage: Path, function: str = MAIN) -> dict[str, np.ndarray]:
    """Every constant tensor of one function of the package, decompressed, by op name."""
    ct = import_coremltools()
    from coremltools.converters.mil.frontend.milproto.load import load as load_mil

    model = ct.models.MLModel(str(mlpackage), skip_model_load=True, function_name=function)
    spec = model.get_spec()
    program = load_mil(spec, spec.specificationVersion, model.weights_dir)
    constants: dict[str, np.ndarray] = {}
    consumed: set[str] = set()    # the parts of a compressed tensor (indices, lut, scale...)
    for op in program.functions[function].operations:
        if op.op_type.startswith("constexpr_"):
            constants[op.name] = np.asarray(op.materialized_val_inference())
            consumed.update(v.op.name for v in op.inputs.values() if v.op is not None)
        elif op.op_type == "const":
            value = op.outputs[0].val
            if isinstance(value, np.ndarray) and value.dtype.kind == "f":
                constants[op.name] = value
    return {k: v for k, v in constants.items() if k not in consumed}


def constant_key(name: str) -> str:
    """MIL constant name -> the torch.export placeholder it came from."""
    changed = True
    while changed:
        changed = False
        for suffix in SUFFIXES:
            if name.endswith(suffix):
                name, changed = name.removesuffix(suffix), True
    return name


def tensor_sizes(constants: dict[str, np.ndarray]) -> dict[str, int]:
    """Each distinct stored tensor (by a digest of its shape and decompressed values) -> its
    element count: two functions over the same weights give the same digests, so the union
    over a block's functions counts each shared tensor once."""
    out = {}
    for value in constants.values():
        value = np.ascontiguousarray(value)
        digest = hashlib.sha256(f"{value.dtype}{value.shape}".encode() + value.tobytes())
        out[digest.hexdigest()] = int(value.size)
    return out


def read_parameters(mlpackage: Path, parameters: dict[str, torch.Tensor],
                    function: str = MAIN, constants: dict[str, np.ndarray] | None = None
                    ) -> tuple[dict[str, torch.Tensor], dict]:
    """The block's parameters as stored in function `function` of `mlpackage` (fp32 tensors
    of the reference shapes), and how each was found: {"by_name": n, "by_value": n,
    "folded": [names]}. `constants`: that function's `mil_constants`, if read already."""
    if constants is None:
        constants = mil_constants(mlpackage, function)
    by_key = {constant_key(k): k for k in constants}
    found, claimed, how = {}, set(), {"by_name": 0, "by_value": 0, "folded": []}
    for name, ref in parameters.items():
        key = by_key.get("p_" + name.replace(".", "_"))
        if key is not None and constants[key].size == ref.numel():
            found[name] = constants[key]
            claimed.add(key)
            how["by_name"] += 1
    for name, ref in parameters.items():
        if name in found:
            continue
        want = ref.detach().numpy().reshape(-1)
        scale = max(float(np.abs(want).max()), 1e-12)
        best, best_err = None, np.inf
        for key, value in constants.items():
            if key in claimed or value.size != want.size:
                continue
            err = float(np.abs(value.reshape(-1).astype(np.float32) - want).max()) / scale
            if err < best_err:
                best, best_err = key, err
        if best is None or best_err > FOLDED_TOLERANCE:
            found[name] = want
            how["folded"].append(name)
            continue
        found[name] = constants[best]
        claimed.add(best)
        how["by_value"] += 1
    tensors = {n: torch.from_numpy(v.astype(np.float32).reshape(parameters[n].shape))
               for n, v in found.items()}
    return tensors, how
