"""Relax rewrites that keep 64-bit integers out of a block's WebGPU kernels.

WGSL has no 64-bit integer type, and TVM's WebGPU code generator refuses a kernel that
computes with one. PyTorch writes indices as int64, so blocks that compute integer tensors
need rewriting first (tiny-sora's blocks compute none; Wan's do):

- `int32_take_indices`: a constant index of `take` (torch's `x[:, :, -1]` imports as
  `take(x, const(-1, int64))`) becomes a non-negative int32 constant;
- `fold_constant_calls`: a kernel call whose arguments are all constants is run once at export
  (llvm) and replaced by its result. TVM's FoldConstant leaves calls without tensor arguments
  (`full`, `arange`) alone, and with them everything computed from them: UMT5's relative
  position buckets (int64 arithmetic on two aranges), which depend only on the static
  sequence length. Folded, each layer's plan carries the buckets as one int32 constant
  (its sequence length squared, 4 bytes each) feeding a float gather of the layer's weights.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

CALL_TIR = tvm.ir.Op.get("relax.call_tir")
TAKE = tvm.ir.Op.get("relax.take")


def _is_constant(expr) -> bool:
    return isinstance(expr, tvm.ir.expr.Constant)


def _rewrite_calls(mod: tvm.IRModule, rewrite) -> tvm.IRModule:
    """Apply `rewrite(call) -> expr` to every call of every relax function, innermost first."""

    @relax.expr_functor.mutator
    class Rewriter(relax.PyExprMutator):
        def visit_call_(self, call):
            return rewrite(self.visit_expr_post_order(call))

    rewriter = Rewriter(mod)
    out = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            out[gv] = rewriter.visit_expr(func)
    return out


def int32_take_indices(mod: tvm.IRModule) -> tvm.IRModule:
    """Constant int64 indices of `take` as non-negative int32 (their values fit: they index
    a static axis)."""

    def rewrite(call):
        if call.op != TAKE or not _is_constant(call.args[1]):
            return call
        index = call.args[1].value.numpy()
        if index.dtype != np.int64:
            return call
        axis = int(call.attrs.axis)
        size = int(call.args[0].ty.shape[axis])
        index = np.mod(index, size).astype(np.int32)
        return relax.op.take(call.args[0], relax.const(index, "int32"), axis=axis,
                             mode=call.attrs.mode)

    return _rewrite_calls(mod, rewrite)


def fold_constant_calls(mod: tvm.IRModule) -> tvm.IRModule:
    """Run every `call_tir` whose arguments are all constants (none at all included) with an
    llvm build, and put its result in its place. For a legalized module; follow with
    FoldConstant to fold what the new constants feed."""
    dev = tvm.cpu()

    def rewrite(call):
        if call.op != CALL_TIR:
            return call
        args = list(call.args[1].fields)
        if not all(_is_constant(a) for a in args):
            return call
        gv = call.args[0]
        func = mod[gv].with_attr("global_symbol", gv.name_hint)
        lib = tvm.compile(tvm.IRModule({gv: func}), target="llvm")
        out_ty = call.ty_args[0]
        result = tvm.runtime.empty([int(d) for d in out_ty.shape], str(out_ty.dtype), dev)
        lib[gv.name_hint](*[tvm.runtime.tensor(a.value.numpy(), dev) for a in args], result)
        value = result.numpy()
        return relax.const(value, str(value.dtype))

    return _rewrite_calls(mod, rewrite)


CONCAT = tvm.ir.Op.get("relax.concat")
OPAQUE = 8   # TVM's OpPatternKind kOpaque: a kernel FuseOps fuses with nothing


def narrow_concats(mod: tvm.IRModule, max_inputs: int) -> tvm.IRModule:
    """Every concatenation of more than `max_inputs` tensors as a tree of concatenations of at
    most `max_inputs`, each an opaque kernel.

    A WebGPU kernel binds each tensor it reads or writes as a storage buffer, and adapters
    need not give a kernel more than 8 (maxStorageBuffersPerShaderStage); chunked attention
    joins its chunks with one concatenation per call, dozens of inputs at real sizes. Narrow
    alone is not enough: FuseOps joins a chain of injective kernels back into one, so the
    tree's nodes are marked opaque (AnnotateTIROpPattern keeps a pattern already set)."""
    from tvm import topi

    @relax.expr_functor.mutator
    class Narrower(relax.PyExprMutator):
        def visit_call_(self, call):
            call = self.visit_expr_post_order(call)
            if call.op != CONCAT or not isinstance(call.args[0], relax.Tuple) \
                    or len(call.args[0].fields) <= max_inputs:
                return call
            axis = int(call.attrs.axis)
            parts = list(call.args[0].fields)
            while len(parts) > 1:
                groups = [parts[i:i + max_inputs] for i in range(0, len(parts), max_inputs)]
                parts = [group[0] if len(group) == 1 else self._join(group, axis)
                         for group in groups]
            return parts[0]

        def _join(self, group, axis):
            joined = self.builder_.call_te(
                topi.concatenate, group, axis, primfunc_name_hint="concatenate_narrow",
                primfunc_attrs={"op_pattern": OPAQUE})
            return self.builder_.emit(joined)

    narrower = Narrower(mod)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            narrower.builder_.update_func(gv, narrower.visit_expr(func))
    return narrower.builder_.get()


def _kernel_buffers(func: relax.Function) -> int:
    """Storage buffers the kernel of a fused function binds: its tensor parameters and its
    outputs."""
    ret = func.ret_ty
    outputs = len(ret.fields) if isinstance(ret, relax.TupleType) else 1
    return outputs + sum(isinstance(p.ty, relax.TensorType) for p in func.params)


def _called_kernels(func: relax.Function) -> list[tuple[tvm.ir.GlobalVar, int]]:
    """The kernels a fused function calls, each with its count of tensor inputs."""
    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op == CALL_TIR:
            found.append((expr.args[0], len(expr.args[1].fields)))

    relax.analysis.post_order_visit(func.body, visit)
    return found


def fuse_within(mod: tvm.IRModule, max_buffers: int, rounds: int = 32) -> tvm.IRModule:
    """FuseOps, each fused kernel binding at most `max_buffers` storage buffers.

    TVM's relax FuseOps has no bound on a fused function's arguments, and injective chains
    over many tensors (Wan 2.2's decoder adds up a stage's duplicated branches) fuse into
    one kernel binding more buffers than WebGPU promises. So: fuse; where a fused kernel is
    too wide, its member kernel with the most inputs is made opaque (fused with nothing) in
    the unfused module, and fusion runs again; a kernel that cannot be narrowed so is left
    to the plan's check, which names it. The mark is the member's PrimFunc's, so every call
    of that PrimFunc in the block (an `add` of the same shapes) stops fusing too: coarser
    than needed, and only in blocks that had a kernel too wide."""
    for _ in range(rounds):
        fused = relax.transform.FuseOps()(mod)
        wide = [f for f in fused.functions.values()
                if isinstance(f, relax.Function) and f.attrs is not None
                and "Primitive" in f.attrs and _kernel_buffers(f) > max_buffers]
        if not wide:
            return fused
        marked = False
        for func in wide:
            candidates = [(inputs, gv) for gv, inputs in _called_kernels(func)
                          if int(mod[gv].attrs.get("op_pattern", OPAQUE)) != OPAQUE]
            if candidates:
                _, gv = max(candidates, key=lambda c: c[0])
                mod = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs)
                mod[gv] = mod[gv].with_attr("op_pattern", OPAQUE)
                marked = True
        if not marked:
            return fused
    return relax.transform.FuseOps()(mod)
