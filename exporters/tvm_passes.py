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
