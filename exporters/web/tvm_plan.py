"""A block through TVM: PyTorch -> relax -> WebGPU (WGSL) kernels + a static launch plan.

TVM's own browser runtime (tvmjs with a wasm build of the host code) cannot be built from the
PyPI wheel, so the host side of a compiled relax function is replaced by data: the *launch
plan*. It lists, in order, every kernel call with the buffers it binds, its grid size and its
scalar arguments, plus the intermediate buffers (TVM's static memory plan: storages that calls
share once a value is dead). `runtimes/web/executor.js` replays it; `replay_llvm` replays the
very same plan with an llvm build of the unscheduled kernels, to check the plan on the CPU.

Plan value ids name where a tensor lives: `input:NAME`, `weight:NAME`, `const:N`,
`storage:N` (an intermediate, with a byte offset) or `output:N` (a buffer the plan allocates
for a returned tensor). A reshape makes no call: its value shares the buffer of its source.
"""

from __future__ import annotations

import base64
import contextlib
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.frontend.torch import from_exported_program

from edge.exporters import ExportValidationError
from edge.exporters.shared.graph_reuse import graph_key
from edge.exporters.web.inputs import web_example
from edge.exporters.web.tvm_log import harmless_tvm_warnings_dropped
from edge.exporters.web.tvm_passes import (
    fold_constant_calls,
    fuse_within,
    int32_take_indices,
    narrow_concats,
)
from edge.graph.attention import replaced_sdpa, written_out_attention
from edge.graph.blocks import Block
from edge.graph.token_chunks import token_chunks

# the host side of a WebGPU build (never shipped: the package holds the WGSL alone); its
# vector width given, as LLVM would pick it, so TVM does not warn that it picked it
WGSL_HOST = {"kind": "llvm", "mtriple": "wasm32-unknown-unknown-wasm", "vector-width": 128}
BINDING_OFFSET_ALIGN = 256        # WebGPU minStorageBufferOffsetAlignment
MAX_GRID_X = 65535                # WebGPU maxComputeWorkgroupsPerDimension
# WebGPU's default maxStorageBuffersPerShaderStage, which every adapter gives: a plan whose
# kernels bind no more runs on any of them
MAX_STORAGE_BUFFERS = 8


class PlanError(ExportValidationError):
    """A block the web target cannot express; the message names the block and the reason
    (an op TVM's relax frontend does not take, a kernel WGSL cannot hold)."""


def webgpu_target() -> tvm.target.Target:
    return tvm.target.Target({"kind": "webgpu", "host": WGSL_HOST})


def _plain_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                enable_gqa=False):
    """softmax(q k^T * scale + mask) v written out: torch.export's own decomposition of SDPA
    guards fully masked rows with int8/bool buffers, which WGSL storage arrays cannot hold."""
    if is_causal or dropout_p:
        raise PlanError("causal or dropout attention has no web lowering")
    return written_out_attention(q, k, v, attn_mask, scale, masked_score=-1e4)


def plain_attention() -> contextlib.AbstractContextManager[None]:
    return replaced_sdpa(_plain_sdpa)


_UNSUPPORTED = re.compile(r"Unsupported function types? \[(.*)\]")


def _traced_for_web(block: Block) -> tuple[torch.export.ExportedProgram, str]:
    """The block traced as the web target imports it, and the program's graph_reuse key
    (code, embedded tensors, input and weight shapes): TVM's frontend is a pure function of
    what the key holds, so blocks of one key share one import (BlockCompiler)."""
    example = web_example(block)
    # written out first, then chunked: the chunks are written-out attention
    with plain_attention(), token_chunks(), torch.no_grad():
        program = torch.export.export(block.module.eval(), example)
    return program, graph_key(program, [(str(t.dtype), tuple(t.shape)) for t in (
        *example, *block.module.parameters())])


def _relax_module(program: torch.export.ExportedProgram, block_key: str) -> tvm.IRModule:
    """The traced block as a relax module `main(*inputs, *weights)` with static shapes; an op
    the relax frontend does not take is refused naming the block and the op."""
    try:
        mod = from_exported_program(program, keep_params_as_input=True)
    except AssertionError as err:  # the frontend's way of listing the ops it lacks
        ops = _UNSUPPORTED.search(str(err))
        if ops is None:
            raise
        raise PlanError(f"block {block_key}: TVM's relax frontend does not take the PyTorch "
                        f"op(s) {ops.group(1)}, so the web target cannot compile it (the onnx "
                        "target may: edge export --target onnx)") from None
    # the frontend keeps the weight values in an attribute of main: drop them, so the module
    # is the block's structure alone (weights are parameters) and equal for equal blocks
    return int32_take_indices(tvm.IRModule({
        gv: f.without_attr("params") if isinstance(f, relax.Function) else f
        for gv, f in mod.functions.items()}))


def lower(mod: tvm.IRModule) -> tvm.IRModule:
    """Relax passes of TVM's GPU pipeline up to the static memory plan, without schedules:
    the result's `main` is the call sequence the launch plan is read from."""
    t = relax.transform
    with webgpu_target():
        # a concatenation kernel binds its inputs and its output
        narrow = narrow_concats(mod, MAX_STORAGE_BUFFERS - 1)
        # a matmul against a transposed weight reads it in place (NT_matmul): legalized
        # apart, the transpose is a kernel of its own writing a weight-sized intermediate
        # at every call (55 MB per feed-forward matrix at Wan 1.3B's shapes)
        legal = tvm.transform.Sequential([
            relax.backend.DispatchSampling(), relax.backend.DispatchSortScan(),
            t.FuseTransposeMatmul(), t.LegalizeOps(), t.AnnotateTIROpPattern(),
            t.FoldConstant()])(narrow)
        # input-independent integer work (tvm_passes) runs here, not as int64 WGSL
        folded = tvm.transform.Sequential([t.FoldConstant(), t.DeadCodeElimination()])(
            fold_constant_calls(legal))
        return tvm.transform.Sequential([
            t.FuseTIR(), t.RewriteDataflowReshape(), t.ToNonDataflow(),
            t.RemovePurityChecking(), t.CallTIRRewrite(), t.StaticPlanBlockMemory(),
            t.AttachGlobalSymbol(),
        ])(fuse_within(folded, MAX_STORAGE_BUFFERS))


def prim_funcs(mod: tvm.IRModule) -> tvm.IRModule:
    return tvm.IRModule({gv: f for gv, f in mod.functions.items()
                         if isinstance(f, tvm.tirx.PrimFunc)})


def _dims(shape) -> list[int]:
    return [int(d) for d in (shape.values if hasattr(shape, "values") else shape)]


@dataclass
class LaunchPlan:
    inputs: list[str]
    weights: list[str]
    values: dict[str, dict] = field(default_factory=dict)     # relax var -> buffer view
    storages: list[int] = field(default_factory=list)         # bytes of each storage
    outputs_alloc: list[dict] = field(default_factory=list)   # {"shape", "dtype"}
    constants: list[np.ndarray] = field(default_factory=list)
    # {"func", "args": [value ids], "kernels", and maybe "scratch": [value ids] (add_scratch)}
    calls: list[dict] = field(default_factory=list)
    results: list[str] = field(default_factory=list)          # value ids returned, in order

    def gpu_sizes(self) -> dict:
        """The largest buffer the plan makes or is handed and the largest tensor a kernel
        binds, in bytes: what an adapter's maxBufferSize and maxStorageBufferBindingSize
        must hold (the manifest records them, so a page refuses before downloading)."""
        def nbytes(v: dict) -> int:
            return int(np.prod(v["shape"])) * np.dtype(v["dtype"]).itemsize

        handed = [nbytes(v) for vid, v in self.values.items()
                  if vid.startswith(("input:", "weight:"))]
        made = [*self.storages, *map(nbytes, self.outputs_alloc),
                *(c.nbytes for c in self.constants)]
        bound = [nbytes(self.values[a]) for c in self.calls
                 for a in c["args"] + c.get("scratch", [])]
        return {"largest_buffer": max(handed + made, default=0),
                "largest_binding": max(bound, default=0)}

    def to_json(self) -> dict:
        """JSON of the plan; constants carry their little-endian bytes in base64."""
        return {"inputs": self.inputs, "weights": self.weights, "values": self.values,
                "storages": self.storages, "outputs_alloc": self.outputs_alloc,
                "constants": [{"shape": list(c.shape), "dtype": str(c.dtype),
                               "base64": base64.b64encode(
                                   np.ascontiguousarray(c).astype(c.dtype.newbyteorder("<"))
                                   .tobytes()).decode("ascii")}
                              for c in self.constants],
                "calls": self.calls, "results": self.results}


def _constant_array(const) -> np.ndarray:
    value = getattr(const, "value", None)
    value = getattr(const, "data", None) if value is None else value
    return value.numpy()


def _int(expr) -> int:
    return int(getattr(expr, "value", expr))


def _view(buffer: str, offset: int, shape, dtype: str) -> dict:
    return {"buffer": buffer, "offset": int(offset), "shape": _dims(shape), "dtype": str(dtype)}


def read_plan(mod: tvm.IRModule, inputs: list[str], weights: list[str], key: str) -> LaunchPlan:
    """The launch plan of a lowered module's `main` (see `lower`), whose parameters are the
    block's `inputs` then its `weights` in that order (torch.export's own names, e.g.
    `p_linear_weight`, are replaced by the block's parameter names)."""
    main = mod["main"]
    n_inputs = len(inputs)
    names = list(inputs) + list(weights)
    if len(main.params) != len(names):
        raise PlanError(f"block {key}: relax main takes {len(main.params)} tensors, the block "
                        f"has {n_inputs} inputs and {len(weights)} weights")
    plan = LaunchPlan(inputs=list(inputs), weights=list(weights))
    ids: dict[relax.Var, str] = {}
    for p, name in zip(main.params, names, strict=True):
        kind = "input" if len(ids) < n_inputs else "weight"
        ids[p] = f"{kind}:{name}"
        plan.values[ids[p]] = _view(ids[p], 0, p.ty.shape, p.ty.dtype)
    storage_ids: dict[relax.Var, int] = {}
    tuples: dict[relax.Var, list] = {}

    def value_of(arg) -> str:
        if isinstance(arg, tvm.ir.expr.Constant):
            data = _constant_array(arg)
            if data.dtype == np.int64:
                data = data.astype(np.int32)
            vid = f"const:{len(plan.constants)}"
            plan.constants.append(data)
            plan.values[vid] = _view(vid, 0, data.shape, str(data.dtype))
            return vid
        if isinstance(arg, relax.Var) and arg in ids:
            return ids[arg]
        raise PlanError(f"block {key}: kernel argument {arg} is not a tensor the plan knows")

    body = main.body
    for binding_block in body.blocks:
        for b in binding_block.bindings:
            if not isinstance(b, relax.VarBinding):
                raise PlanError(f"block {key}: unsupported binding {type(b).__name__}")
            var, value = b.var, b.value
            if isinstance(value, relax.Var):
                ids[var] = ids[value]
                continue
            if isinstance(value, tvm.ir.expr.Tuple | relax.Tuple):
                tuples[var] = list(value.fields)
                continue
            if isinstance(value, tvm.ir.expr.TupleGetItem | relax.TupleGetItem):
                ids[var] = value_of(tuples[value.tuple_value][value.index])
                continue
            if not isinstance(value, relax.Call):
                raise PlanError(f"block {key}: unsupported binding {value}")
            op = value.op
            if isinstance(op, tvm.ir.GlobalVar):
                plan.calls.append({"func": op.name_hint,
                                   "args": [value_of(a) for a in value.args]})
                continue
            name = op.name
            if name == "relax.memory.alloc_storage":
                storage_ids[var] = len(plan.storages)
                plan.storages.append(_int(value.args[0].values[0]))
            elif name == "relax.memory.alloc_tensor":
                storage, offset, shape = value.args[0], value.args[1], value.args[2]
                off = _int(offset)
                if off % BINDING_OFFSET_ALIGN:
                    raise PlanError(f"block {key}: tensor offset {off} is not "
                                    f"{BINDING_OFFSET_ALIGN}-byte aligned")
                vid = f"{var.name}"
                ids[var] = vid
                plan.values[vid] = _view(f"storage:{storage_ids[storage]}", off, shape,
                                         var.ty.dtype)
            elif name == "relax.builtin.alloc_tensor":
                vid = f"output:{len(plan.outputs_alloc)}"
                plan.outputs_alloc.append({"shape": _dims(value.args[0]),
                                           "dtype": str(var.ty.dtype)})
                ids[var] = vid
                plan.values[vid] = _view(vid, 0, value.args[0], var.ty.dtype)
            elif name == "relax.reshape":
                src = plan.values[value_of(value.args[0])]
                vid = var.name
                ids[var] = vid
                plan.values[vid] = dict(src, shape=_dims(var.ty.shape))
            else:
                raise PlanError(f"block {key}: relax op {name} has no web lowering")
    result = body.body
    fields = tuples.get(result, [result]) if isinstance(result, relax.Var) else (
        list(result.fields) if hasattr(result, "fields") else [result])
    plan.results = [value_of(f) for f in fields]
    return plan


# ---- WebGPU kernels ------------------------------------------------------------------------


def _children(stmt) -> list:
    out = []
    for attr in ("seq", "body", "block", "init", "then_case", "else_case"):
        child = getattr(stmt, attr, None)
        if child is None:
            continue
        out.extend(child if attr == "seq" else [child])
    return out


def _thread_tag(stmt) -> str | None:
    if isinstance(stmt, tvm.tirx.For) and stmt.thread_binding is not None:
        return stmt.thread_binding.thread_tag
    return None


def kernel_launches(func: tvm.tirx.PrimFunc) -> list[tuple[list[int], list]]:
    """Each kernel launch of a scheduled PrimFunc, in program order (one per outermost
    thread-bound loop nest): its grid (blockIdx x, y, z extents) and the variables of the
    buffers it stores to."""
    launches: list[tuple[list[int], list]] = []

    def inside(stmt, grid: list[int], stored: list) -> None:
        tag = _thread_tag(stmt)
        if tag and tag.startswith("blockIdx."):
            grid["xyz".index(tag[-1])] *= int(stmt.extent)
        if isinstance(stmt, tvm.tirx.BufferStore):
            data = stmt.buffer.data  # a parameter's variable, or tirx.buffer_data(it)
            stored.append(data.args[0] if isinstance(data, tvm.ir.Call) else data)
        for c in _children(stmt):
            inside(c, grid, stored)

    def outside(stmt) -> None:
        if _thread_tag(stmt):
            grid, stored = [1, 1, 1], []
            inside(stmt, grid, stored)
            launches.append((grid, stored))
            return
        for c in _children(stmt):
            outside(c)

    outside(func.body)
    return launches


def _param_index(func: tvm.tirx.PrimFunc, name: str, stored: list) -> int | None:
    """The parameter a kernel binds as `name`. Parameters may share a name (topi's split
    names every output T_split, one kernel writing each), so among those the one the kernel
    stores to; None when no parameter or not one tells."""
    same = [i for i, p in enumerate(func.params) if p.name == name]
    if len(same) > 1:
        same = [i for i in same if any(func.params[i].same_as(v) for v in stored)]
    return same[0] if len(same) == 1 else None


def schedule(mod: tvm.IRModule, tiled_matmul: bool = True) -> tvm.IRModule:
    """dlight's default GPU schedules on every PrimFunc (TVM's generic GPU choice).
    `tiled_matmul=False` leaves out the Matmul rule: matmuls then get the GEMV or the plain
    one-thread-per-output schedule, the alternative the page may time against it."""
    import tvm.s_tir.dlight as dl

    rules = [dl.gpu.Matmul()] if tiled_matmul else []
    rules += [dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction()]
    with webgpu_target():
        return dl.ApplyDefaultSchedule(*(_skipped_where_it_fails(r) for r in rules),
                                       dl.gpu.Fallback())(mod)


def _skipped_where_it_fails(rule):
    """A dlight rule that raises on a PrimFunc it was not written for (its Matmul asserts on
    a matmul of one row, as a one-token transformer makes: Wan at 1 frame 16 x 16) as a rule
    that does not apply there, so the next rule schedules it."""
    import tvm.s_tir.dlight as dl

    class Tolerant(dl.ScheduleRule):
        def apply(self, func, target, tunable):
            try:
                return rule.apply(func, target, tunable)
            except Exception:  # noqa: BLE001 (dlight rules raise anything: asserts, TVM errors)
                return None

        def is_target_available(self, target):
            return rule.is_target_available(target)

    return Tolerant()


_SECTION = re.compile(r"^// Function: (\S+)\n//-+\n", re.M)
_BINDING = re.compile(r"@group\(0\) @binding\((\d+)\) var<(storage, \w+|uniform)> (\w+) : ([^;]+);")
_POD = re.compile(r"struct PODArgs \{([^}]*)\}")


# TVM prints infinity as `inff`, which WGSL does not have (and a constant expression that
# evaluates to infinity is a shader-creation error): the largest finite float stands in, the
# same bound for every finite value (clip(x, max=inf) is min(x, FLT_MAX)).
_INF = re.compile(r"\binff\b")
FLT_MAX_WGSL = "0x1.fffffep+127f"


def split_wgsl(source: str) -> dict[str, str]:
    """TVM's WebGPU module source -> {kernel name: WGSL of that kernel alone}."""
    parts = _SECTION.split(_INF.sub(FLT_MAX_WGSL, source))
    kernels: dict[str, str] = {}
    for name, text in zip(parts[1::2], parts[2::2], strict=True):
        if text.strip():
            kernels[name] = text.strip() + "\n"
    return kernels


def scratch_buffers(func: tvm.tirx.PrimFunc) -> list:
    """The buffers a scheduled PrimFunc keeps in global memory from one of its kernels to the
    next: what dlight's fallback schedule leaves where no rule fused a reduction (a softmax
    over one key: its row maxima and sums, each written by a kernel the next one reads). TVM's
    own runtime allocates them as workspace; the web plan gives each a scratch buffer."""
    root = func.body.block if hasattr(func.body, "block") else None
    return [b for b in getattr(root, "alloc_buffers", []) if b.scope() == "global"]


def kernel_records(func_name: str, func: tvm.tirx.PrimFunc, wgsl: dict[str, str],
                   key: str) -> list[dict]:
    """For each launch of a PrimFunc: kernel name, which call arguments it binds (in binding
    order; past the function's parameters, its scratch buffers: `scratch_buffers`), its grid,
    and its uniform fields."""
    launches = kernel_launches(func)
    scratch = [b.name for b in scratch_buffers(func)]
    names = [f"{func_name}_kernel"] + [f"{func_name}_kernel_{i}"
                                       for i in range(1, len(launches))]
    records = []
    for name, (grid, stored) in zip(names, launches, strict=True):
        if name not in wgsl:
            raise PlanError(f"block {key}: kernel {name} missing from the WGSL source")
        text = wgsl[name]
        bindings, uniform = [], None
        for index, kind, var, ty in _BINDING.findall(text):
            if kind == "uniform":
                uniform = int(index)
                continue
            if not re.fullmatch(r"array<(f32|i32|u32)>", ty.strip()):
                raise PlanError(f"block {key}: kernel {name} binds {var} as {ty.strip()}, "
                                "which the web executor does not support")
            buffer = var.removesuffix("_ptr")
            index = _param_index(func, buffer, stored)
            if index is None and scratch.count(buffer) == 1:
                index = len(func.params) + scratch.index(buffer)
            if index is None:
                raise PlanError(f"block {key}: kernel {name} binds {var}, which names no "
                                f"one parameter of {func_name}")
            bindings.append(index)
        if len(bindings) > MAX_STORAGE_BUFFERS:
            raise PlanError(f"block {key}: kernel {name} binds {len(bindings)} storage buffers, "
                            f"more than the {MAX_STORAGE_BUFFERS} every WebGPU adapter gives")
        pod = _POD.search(text)
        fields = [f.split(":")[0].strip() for f in pod.group(1).split(",") if f.strip()] \
            if pod else []
        if fields != ["packGridDimX"]:
            raise PlanError(f"block {key}: kernel {name} takes scalar arguments {fields}; "
                            "only static shapes are supported")
        if grid[1] > MAX_GRID_X:
            raise PlanError(f"block {key}: kernel {name} grid {grid} exceeds WebGPU limits")
        records.append({"kernel": name, "bindings": bindings, "uniform_binding": uniform,
                        "grid": grid})
    return records


def compile_wgsl(scheduled: tvm.IRModule, key: str) -> dict[str, str]:
    try:
        executable = tvm.compile(scheduled, target=webgpu_target())
    except RuntimeError as err:  # TVM raises its own (InternalError) as RuntimeError
        first = str(err).strip().splitlines()[0][:300]
        why = " (WGSL has no 64-bit integers)" if "int64" in first or "i64" in first else ""
        raise PlanError(f"block {key}: {_refused_kernel(scheduled)}TVM's WebGPU code generator "
                        f"refused it: {first}{why}") from None
    device_module = executable.imports[0] if not hasattr(executable, "mod") else \
        executable.mod.imports[0]
    return split_wgsl(device_module.inspect_source())


def _refused_kernel(scheduled: tvm.IRModule) -> str:
    """"kernel NAME: " for the first function that does not compile alone (a failed build's
    message does not say which), else ""."""
    for gv, func in scheduled.functions.items():
        try:
            tvm.compile(tvm.IRModule({gv: func}), target=webgpu_target())
        except RuntimeError:
            return f"kernel {gv.name_hint}: "
    return ""


ALT_SUFFIX = "__alt"


def alternative_kernels(lowered: tvm.IRModule, funcs: set[str], key: str
                        ) -> dict[str, tuple[list[dict], dict[str, str]]]:
    """Another schedule of the matmul kernels (see `schedule(tiled_matmul=False)`), for the
    page to time on the user's adapter: {func: (launch records, {kernel: WGSL})}, kernel
    names suffixed `__alt`; only funcs whose kernels come out different."""
    matmuls = {f for f in funcs if "matmul" in f}
    if not matmuls:
        return {}
    module = tvm.IRModule({gv: f for gv, f in prim_funcs(lowered).functions.items()
                           if gv.name_hint in matmuls})
    scheduled = schedule(module, tiled_matmul=False)
    wgsl = compile_wgsl(scheduled, key)
    out = {}
    for func in matmuls:
        if scratch_buffers(scheduled[func]):
            continue  # the call's scratch buffers are its first schedule's (add_scratch)
        records = kernel_records(func, scheduled[func], wgsl, key)
        texts = {}
        for r in records:
            name = r["kernel"]
            r["kernel"] = name + ALT_SUFFIX
            texts[r["kernel"]] = re.sub(rf"\bfn {re.escape(name)}\(",
                                        f"fn {r['kernel']}(", wgsl[name])
        out[func] = (records, texts)
    return out


# An alternative that launches this many times the workgroups of TVM's tiled matmul is not
# offered: one workgroup per output of a large matmul was 25-40x slower in every trial (on
# SwiftShader), and timing it at page load would cost more than it could save. What remains
# are the attention matmuls (batched, small), where the alternative was up to 6x faster.
MAX_ALT_WORKGROUPS_RATIO = 4


def _workgroups(records: list[dict]) -> int:
    return sum(int(np.prod(r["grid"])) for r in records)


def add_scratch(plan: LaunchPlan, scratch: dict[str, list[dict]]) -> None:
    """Give each call of a function with scratch buffers ({func: [{"shape", "dtype"}]}, in
    `scratch_buffers` order) its `scratch`: values its kernels bind past the call's `args`.
    The n-th scratch buffer of every call is a view of one storage, as large as the largest:
    a call's scratch lives only while its kernels run, and calls run one after another."""
    first = len(plan.storages)  # the n-th scratch buffer's storage: first + n
    plan.storages += [0] * max(map(len, scratch.values()), default=0)
    for call in plan.calls:
        for n, spec in enumerate(scratch.get(call["func"], [])):
            nbytes = int(np.prod(spec["shape"])) * np.dtype(spec["dtype"]).itemsize
            plan.storages[first + n] = max(plan.storages[first + n], nbytes)
            vid = f"scratch:{call['func']}:{n}"
            plan.values[vid] = _view(f"storage:{first + n}", 0, spec["shape"], spec["dtype"])
            call.setdefault("scratch", []).append(vid)


def build_webgpu(lowered: tvm.IRModule, plan: LaunchPlan, key: str,
                 choices: bool = True) -> tuple[dict[str, str], dict[str, list[dict]]]:
    """Schedule and compile the plan's kernels for WebGPU; fills each call's `kernels` (and
    `scratch`: `add_scratch`) and returns ({kernel name: WGSL}, the scratch buffers of each
    function). With `choices`, a call whose kernels have another schedule also gets
    `choices`: [its kernels, the alternative's], timed by the page (JIT choice)."""
    scheduled = schedule(prim_funcs(lowered))
    wgsl = compile_wgsl(scheduled, key)
    used: dict[str, str] = {}
    records = {}
    funcs = {call["func"] for call in plan.calls}
    scratch = {f: specs for f in sorted(funcs) if (specs := [
        {"shape": _dims(b.shape), "dtype": str(b.dtype)} for b in scratch_buffers(scheduled[f])])}
    add_scratch(plan, scratch)
    alternatives = alternative_kernels(lowered, funcs, key) if choices else {}
    for call in plan.calls:
        func = call["func"]
        if func not in records:
            records[func] = kernel_records(func, scheduled[func], wgsl, key)
        call["kernels"] = records[func]
        for r in records[func]:
            used[r["kernel"]] = wgsl[r["kernel"]]
        if func in alternatives:
            alt_records, texts = alternatives[func]
            same = [used[r["kernel"]] for r in records[func]] == [
                texts[r["kernel"]].replace(ALT_SUFFIX + "(", "(") for r in alt_records]
            if not same and _workgroups(alt_records) <= MAX_ALT_WORKGROUPS_RATIO * \
                    _workgroups(records[func]):
                call["choices"] = [records[func], alt_records]
                used.update(texts)
    return used, scratch


# ---- CPU replay of the plan ---------------------------------------------------------------


def replay_llvm(lowered: tvm.IRModule, plan: LaunchPlan, inputs: list[np.ndarray],
                weights: list[np.ndarray], library=None) -> list[np.ndarray]:
    """Run the launch plan exactly as the web executor does (same buffers, offsets, call
    order, reshapes as shared buffers), with the kernels built for llvm instead of WebGPU."""
    lib = library or tvm.compile(prim_funcs(lowered), target="llvm")
    buffers: dict[str, np.ndarray] = {}
    for name, a in zip(plan.inputs, inputs, strict=True):
        buffers[f"input:{name}"] = np.ascontiguousarray(a).view(np.uint8).reshape(-1).copy()
    for name, a in zip(plan.weights, weights, strict=True):
        buffers[f"weight:{name}"] = np.ascontiguousarray(a).view(np.uint8).reshape(-1).copy()
    for i, c in enumerate(plan.constants):
        buffers[f"const:{i}"] = np.ascontiguousarray(c).view(np.uint8).reshape(-1).copy()
    for i, n in enumerate(plan.storages):
        buffers[f"storage:{i}"] = np.zeros(n, np.uint8)
    for i, o in enumerate(plan.outputs_alloc):
        n = int(np.prod(o["shape"])) * np.dtype(o["dtype"]).itemsize
        buffers[f"output:{i}"] = np.zeros(n, np.uint8)

    def view(vid: str) -> np.ndarray:
        v = plan.values[vid]
        dt = np.dtype(v["dtype"])
        n = int(np.prod(v["shape"])) * dt.itemsize
        return buffers[v["buffer"]][v["offset"]:v["offset"] + n].view(dt).reshape(v["shape"])

    dev = tvm.cpu()
    for call in plan.calls:
        args = [tvm.runtime.tensor(view(a).copy(), dev) for a in call["args"]]
        lib[call["func"]](*args)
        for a, t in zip(call["args"], args, strict=True):
            view(a)[...] = t.numpy()
    return [view(r).copy() for r in plan.results]


# ---- one block, end to end ----------------------------------------------------------------


@dataclass
class CompiledBlock:
    """A block's launch plan, its WGSL kernels and the llvm build that checks the plan."""

    source: tvm.IRModule       # the imported relax module, before lowering
    lowered: tvm.IRModule
    plan: LaunchPlan
    wgsl: dict[str, str]
    scratch: dict[str, list[dict]] = field(default_factory=dict)  # build_webgpu's
    built: dict = field(default_factory=dict)  # the llvm builds, made on the first replay;
    # shared by blocks of one structure

    def replay(self, inputs: list[np.ndarray], weights: list[np.ndarray],
               flops: int = 0) -> list[np.ndarray]:
        """`flops`: the block's work (edge.planning.compute_cost.block_flops), which picks how hard
        LLVM optimizes the kernels."""
        target = replay_target(flops)
        key = str(target)
        if key not in self.built:
            self.built[key] = tvm.compile(prim_funcs(self.lowered), target=target)
        return replay_llvm(self.lowered, self.plan, inputs, weights, self.built[key])


# LLVM's optimizations cost seconds a build and pay off only on real work. Measured on a
# tiny Wan transformer block (21 MFLOP): build and first run 4.5 s optimized, 1.4 s at
# opt-level 0, each later run 20-50 ms either way; the unoptimized kernels run ~2.5x slower,
# so past ~1 GFLOP a block's replay is worth the optimizing build
OPTIMIZED_REPLAY_FLOPS = 10**9


def replay_target(flops: int) -> tvm.target.Target:
    if flops >= OPTIMIZED_REPLAY_FLOPS:
        return tvm.target.Target("llvm")
    return tvm.target.Target({"kind": "llvm", "opt-level": 0})


class BlockCompiler:
    """Compiles blocks for the web target. Blocks of one structure (a model's pairs or
    encoder layers: same code and shapes, other weights) share one compilation, since the
    weights are parameters of the relax module, not constants in it; blocks of one traced
    program share one import too (TVM's frontend takes seconds a block). The `limit` most
    recently used of each are kept (compiled code and modules only, no weights)."""

    def __init__(self, limit: int = 64) -> None:
        self._imports: OrderedDict[str, tvm.IRModule] = OrderedDict()   # by graph_key
        self._cache: OrderedDict[int, CompiledBlock] = OrderedDict()    # by structural hash
        self._limit = limit
        self._lock = threading.Lock()

    def _recall(self, kept: OrderedDict, key):
        with self._lock:
            value = kept.get(key)
            if value is not None:
                kept.move_to_end(key)
            return value

    def _keep(self, kept: OrderedDict, key, value) -> None:
        with self._lock:
            kept[key] = value
            while len(kept) > self._limit:
                kept.popitem(last=False)

    def _import(self, block: Block) -> tvm.IRModule:
        program, key = _traced_for_web(block)
        mod = self._recall(self._imports, key)
        if mod is None:
            mod = _relax_module(program, block.key)
            self._keep(self._imports, key, mod)
        return mod

    def compile(self, block: Block) -> CompiledBlock:
        mod = self._import(block)
        weights = list(dict(block.module.named_parameters()))
        digest = tvm_ffi.structural_hash(mod)
        cached = self._recall(self._cache, digest)
        if cached is not None and tvm_ffi.structural_equal(mod, cached.source):
            plan = read_plan(cached.lowered, block.inputs, weights, block.key)
            for call, done in zip(plan.calls, cached.plan.calls, strict=True):
                call["kernels"] = done["kernels"]
                if "choices" in done:  # the alternative schedules the page times
                    call["choices"] = done["choices"]
            add_scratch(plan, cached.scratch)
            return CompiledBlock(mod, cached.lowered, plan, cached.wgsl, cached.scratch,
                                 cached.built)
        with harmless_tvm_warnings_dropped():
            lowered = lower(mod)
        plan = read_plan(lowered, block.inputs, weights, block.key)
        wgsl, scratch = build_webgpu(lowered, plan, block.key)
        compiled = CompiledBlock(mod, lowered, plan, wgsl, scratch)
        self._keep(self._cache, digest, compiled)
        return compiled


_shared_compiler = BlockCompiler()


def shared_compiler() -> BlockCompiler:
    """The process's compiler: a later export of a structure compiled before (another
    scheduler, budget or weights of one architecture) reuses its kernels."""
    return _shared_compiler

