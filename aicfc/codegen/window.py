"""Schedule family `window`: a reduction over several axes or through guarded loads (a max or
average pool, a depthwise convolution, LRN's channel window), computed directly: one output
per thread, the window's taps in nested loops, the element-wise consumer (an average's
divisor, a bias and activation) applied to the accumulator before the store.

Neighbouring threads take neighbouring outputs (the innermost variable fastest), so the taps
they read at one loop step are neighbours too and the loads coalesce; windows overlap, so most
re-reads hit in L1/L2 (the cost model counts each input once from DRAM).

Vectors (`vec`, not searched: the widest every access allows, as in `pointwise`): where the
window has no epilogue and every tap reads the input contiguously along the output's innermost
variable (a pool over a channels-last image: the channel), a thread takes `vec` consecutive
outputs and each tap is one 16-byte load (its padding guard tested once for the group, which
`vector.kind` checks) instead of `vec` 2-byte ones. ResNet-50's max pool at B32 measured 62 us
with one channel a thread.

Parameter space: threads per block. Constraints: the planner's (threads, registers).
"""
from __future__ import annotations

import math
from typing import Mapping

from aicfc.codegen import vector
from aicfc.codegen.cexpr import Emitter
from aicfc.codegen.common import decompose, render, signature, store_line
from aicfc.codegen.row_reduce import COMBINE, INIT
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Affine, is_integer_compute, loads
from aicfc.ir.types import TensorType

SPACE = {"threads": (64, 128, 256, 512)}
# An integer compute's accumulator ([Note: Integer computes]): int64.
INT_INIT = {"sum": "0LL", "prod": "1LL", "max": "(-9223372036854775807LL - 1)", "min": "9223372036854775807LL"}
INT_COMBINE = {"sum": "({0} + {1})", "prod": "({0} * {1})", "max": "max({0}, {1})", "min": "min({0}, {1})"}


def vector_width(k: Kernel, types: Mapping[str, TensorType]) -> int:
    """Outputs per thread: the widest vector every tap's load moves contiguously along the
    innermost output variable (1 where any does not, or the kernel has an epilogue)."""
    red = k.ops[0]
    if len(k.ops) != 1 or not red.domain_vars or is_integer_compute(red.type.dtype, red.body, types):
        return 1
    inner = red.domain_vars[-1]
    accesses = list(dict.fromkeys(loads(red.body)))
    width, _ = vector.widest([types[ld.buffer].dtype for ld in accesses] + [red.type.dtype], red.type.shape[-1])
    while width > 1 and not all(vector.kind(ld, types, inner, width) == vector.CONTIGUOUS for ld in accesses):
        width //= 2
    return width


def space(k: Kernel, plan: Plan) -> list[dict]:
    vec = vector_width(k, plan.types())
    return [{"threads": t} | ({"vec": vec} if vec > 1 else {}) for t in SPACE["threads"]]


def launch(k: Kernel, p: Mapping) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    return (math.ceil(k.ops[0].type.numel / (p["threads"] * p.get("vec", 1))), 1, 1), (p["threads"], 1, 1), 0


def static_smem(k: Kernel, p: Mapping) -> int:
    return 0


def render_kernel(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str) -> str:
    red = k.ops[0]
    sig = signature(k, types)
    if p.get("vec", 1) > 1:
        return _render_vector(k, p, types, name, sig)
    names = {v: v for v in red.domain_vars + red.reduce_vars}
    integer = is_integer_compute(red.type.dtype, red.body, types)   # [Note: Integer computes]
    em = Emitter(sig.params, types, prefix="v", integer=integer)
    value = em.emit(red.body, names)
    combine = INT_COMBINE if integer else COMBINE
    body = em.take() + [f"acc = {combine[red.combiner].format('acc', value)};"]
    if len(k.ops) == 2:
        epi = k.ops[1]
        epi_em = Emitter(sig.params, types, prefix="e", integer=is_integer_compute(epi.type.dtype, epi.body, types))
        out = epi_em.emit(epi.body, names, {red.out: "acc"})
        epilogue = epi_em.take() + [store_line(epi, dict(k.binds[1]), out, sig.params, names)]
    else:
        epilogue = [store_line(red, {v: Affine.var(v) for v in red.domain_vars}, "acc", sig.params, names)]
    return render("window.cu.j2", name=name, combiner=red.combiner, reduce=list(red.reduce),
                  shape=list(red.type.shape), threads=p["threads"], idx=sig.index_type, signature=sig.text,
                  numel=red.type.numel, vec=0, decompose=decompose("t", list(zip(red.domain_vars, red.type.shape)),
                                                            sig.index_type),
                  init=(INT_INIT if integer else INIT)[red.combiner], acc_type="long long" if integer else "float",
                  loops=list(zip(red.reduce_vars, red.reduce)), body=body, epilogue=epilogue,
                  guarded=any(ld.fill is not None for ld in loads(red.body)))


def _render_vector(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str, sig) -> str:
    """`vec` consecutive outputs along the innermost variable per thread (`vector_width`)."""
    red = k.ops[0]
    vec = p["vec"]
    inner = red.domain_vars[-1]
    names = {v: v for v in red.domain_vars + red.reduce_vars}
    em = Emitter(sig.params, types, prefix="v")
    values, lines = {}, []
    for n, ld in enumerate(dict.fromkeys(loads(red.body))):
        values[ld] = f"a{n}[e]"
        lines += [f"float a{n}[{vec}];"] + vector.load_lines(ld, vector.CONTIGUOUS, vec, f"a{n}", sig.params, types,
                                                             names, inner, "first")
    value = em.emit(red.body, names, {}, values)
    body = lines + ["#pragma unroll", f"for (int e = 0; e < {vec}; ++e) {{"] + [f"  {x}" for x in em.take()] + [
        f"  acc[e] = {COMBINE[red.combiner].format('acc[e]', value)};", "}"]
    store = vector.store_line(tuple(Affine.var(v) for v in red.domain_vars), red.type, sig.params[red.out], names,
                              inner, "first", vec, "acc")
    variables = list(zip(red.domain_vars, red.type.shape))
    return render("window.cu.j2", name=name, combiner=red.combiner, reduce=list(red.reduce),
                  shape=list(red.type.shape), threads=p["threads"], idx=sig.index_type, signature=sig.text,
                  numel=red.type.numel, vec=vec,
                  decompose=decompose("t", variables[:-1] + [("first", variables[-1][1])], sig.index_type),
                  init=INIT[red.combiner], acc_type="float", loops=list(zip(red.reduce_vars, red.reduce)),
                  body=body, epilogue=[store], guarded=any(ld.fill is not None for ld in loads(red.body)))
