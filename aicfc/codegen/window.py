"""Schedule family `window`: a reduction over several axes or through guarded loads (a max or
average pool, a depthwise convolution, LRN's channel window), computed directly: one output
per thread, the window's taps in nested loops, the element-wise consumer (an average's
divisor, a bias and activation) applied to the accumulator before the store.

Neighbouring threads take neighbouring outputs (the innermost variable fastest), so the taps
they read at one loop step are neighbours too and the loads coalesce; windows overlap, so most
re-reads hit in L1/L2 (the cost model counts each input once from DRAM).

Vectors (`vec`, not searched: the widest every access allows, as in `pointwise`): where every
tap reads contiguously (or broadcasts) along the output's innermost variable (a pool or a
depthwise convolution over a channels-last image: the channel; the depthwise weight is stored
channel-last for it, [Note: a depthwise weight, channel last] in passes/relayout_weights.py), a
thread takes `vec` consecutive outputs and each tap is one 16-byte load (its padding guard
tested once for the group, which `vector.kind` checks) instead of `vec` 2-byte ones; a one-to-one
epilogue (bias, activation, residual) runs on each output and the group leaves in one store.
ResNet-50's max pool at B32 measured 62 us with one channel a thread; MobileNetV2's depthwise
convolutions at B32 ran at 370-420 GB/s so, and at 1.5-3.5 TB/s with 8 channels a thread (an
H200, benchmarks/results/cnn_profiles_session15_h200.txt).

Parameter space: threads per block. Constraints: the planner's (threads, registers).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping

from aicfc.codegen import vector
from aicfc.codegen.cexpr import Emitter
from aicfc.codegen.common import decompose, render, signature, store_line
from aicfc.codegen.row_reduce import COMBINE, INIT
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Affine, Load, is_integer_compute, loads, map_loads
from aicfc.ir.types import TensorType

SPACE = {"threads": (64, 128, 256, 512)}
# An integer compute's accumulator ([Note: Integer computes]): int64.
INT_INIT = {"sum": "0LL", "prod": "1LL", "max": "(-9223372036854775807LL - 1)", "min": "9223372036854775807LL"}
INT_COMBINE = {"sum": "({0} + {1})", "prod": "({0} * {1})", "max": "max({0}, {1})", "min": "min({0}, {1})"}


def without_unit_taps(k: Kernel) -> Kernel:
    """The kernel with every reduction variable of extent 1 read as 0 (a depthwise convolution's
    one input channel a group: `x[.., i3 + r0]` is `x[.., i3]`), so that it does not hide a
    contiguous access from `vector.kind`."""
    red = k.ops[0]
    zero = {v: Affine.of({}, 0) for v, n in zip(red.reduce_vars, red.reduce) if n == 1}
    if not zero:
        return k

    def fix(ld: Load) -> Load:
        return dataclasses.replace(ld, index=tuple(a.substitute(zero) if isinstance(a, Affine) else a for a in ld.index))
    return k.replace(ops=(dataclasses.replace(red, body=map_loads(red.body, fix)),) + k.ops[1:])


def _identity_epilogue(k: Kernel) -> bool:
    """A second op that maps the window's outputs one to one (its bind is the identity over the
    window's domain and its output has the window's shape): an epilogue the vectors can carry."""
    red, epi = k.ops
    return (epi.type.shape == red.type.shape and len(k.binds[1]) == len(red.domain_vars)
            and all(a == Affine.var(v) for v, a in k.binds[1]) and {v for v, _ in k.binds[1]} == set(red.domain_vars))


def vector_width(k: Kernel, types: Mapping[str, TensorType]) -> int:
    """Outputs per thread: the widest vector every tap's load (and every load of an epilogue)
    moves contiguously, or broadcasts, along the innermost output variable (1 where one does
    neither, or an epilogue is not one to one)."""
    k = without_unit_taps(k)
    red = k.ops[0]
    if len(k.ops) > 2 or not red.domain_vars or is_integer_compute(red.type.dtype, red.body, types):
        return 1
    accesses = list(dict.fromkeys(loads(red.body)))
    dtypes = [types[ld.buffer].dtype for ld in accesses] + [red.type.dtype]
    if len(k.ops) == 2:
        epi = k.ops[1]
        if not _identity_epilogue(k) or is_integer_compute(epi.type.dtype, epi.body, types):
            return 1
        extra = [ld for ld in dict.fromkeys(loads(epi.body)) if ld.buffer != red.out]
        accesses += extra
        dtypes += [types[ld.buffer].dtype for ld in extra] + [epi.type.dtype]
    inner = red.domain_vars[-1]
    width, _ = vector.widest(dtypes, red.type.shape[-1])
    while width > 1 and not all(vector.kind(ld, types, inner, width) in (vector.CONTIGUOUS, vector.BROADCAST)
                                for ld in accesses):
        width //= 2
    # a window read only by broadcasts (a pool of one channel) gains nothing from vectors
    if not any(vector.kind(ld, types, inner, width) == vector.CONTIGUOUS for ld in loads(red.body)):
        return 1
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


def _vector_loads(lds, vec: int, prefix: str, sig, types, names, inner: str) -> tuple[dict, list[str]]:
    """`vec` elements of each access, from `first` on along `inner`: {load: C element} and the lines."""
    values, lines = {}, []
    for n, ld in enumerate(dict.fromkeys(lds)):
        values[ld] = f"{prefix}{n}[e]"
        lines += [f"float {prefix}{n}[{vec}];"] + vector.load_lines(ld, vector.kind(ld, types, inner, vec), vec,
                                                                    f"{prefix}{n}", sig.params, types, names, inner,
                                                                    "first")
    return values, lines


def _render_vector(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str, sig) -> str:
    """`vec` consecutive outputs along the innermost variable per thread (`vector_width`); an
    epilogue runs on each of them, then one vector store."""
    k = without_unit_taps(k)
    red = k.ops[0]
    vec = p["vec"]
    inner = red.domain_vars[-1]
    names = {v: v for v in red.domain_vars + red.reduce_vars}
    em = Emitter(sig.params, types, prefix="v")
    values, lines = _vector_loads(loads(red.body), vec, "a", sig, types, names, inner)
    value = em.emit(red.body, names, {}, values)
    body = lines + ["#pragma unroll", f"for (int e = 0; e < {vec}; ++e) {{"] + [f"  {x}" for x in em.take()] + [
        f"  acc[e] = {COMBINE[red.combiner].format('acc[e]', value)};", "}"]
    index = tuple(Affine.var(v) for v in red.domain_vars)
    if len(k.ops) == 2:
        epi = k.ops[1]
        epi_em = Emitter(sig.params, types, prefix="w")
        epi_values, epilogue = _vector_loads([ld for ld in loads(epi.body) if ld.buffer != red.out], vec, "b", sig,
                                             types, names, inner)
        out = epi_em.emit(epi.body, names, {red.out: "acc[e]"}, epi_values)
        epilogue += [f"float o[{vec}];", "#pragma unroll", f"for (int e = 0; e < {vec}; ++e) {{"] + [
            f"  {x}" for x in epi_em.take()] + [f"  o[e] = {out};", "}"]
        epilogue.append(vector.store_line(index, epi.type, sig.params[epi.out], names, inner, "first", vec, "o"))
    else:
        epilogue = [vector.store_line(index, red.type, sig.params[red.out], names, inner, "first", vec, "acc")]
    variables = list(zip(red.domain_vars, red.type.shape))
    return render("window.cu.j2", name=name, combiner=red.combiner, reduce=list(red.reduce),
                  shape=list(red.type.shape), threads=p["threads"], idx=sig.index_type, signature=sig.text,
                  numel=red.type.numel, vec=vec,
                  decompose=decompose("t", variables[:-1] + [("first", variables[-1][1])], sig.index_type),
                  init=INIT[red.combiner], acc_type="float", loops=list(zip(red.reduce_vars, red.reduce)),
                  body=body, epilogue=epilogue, guarded=any(ld.fill is not None for ld in loads(red.body)))
