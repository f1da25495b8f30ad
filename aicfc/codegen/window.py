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

Runs (`PX`, searched where vectors are): a thread takes PX consecutive vectors along the next variable
out (a depthwise convolution's output column) and names every distinct load of its PX outputs' taps
once: neighbouring outputs of a stride-1 3x3 window share two of each row's three columns, and the
filter's taps serve all PX. [Note: window runs].

Parameter space: threads per block; on vectors also PX, and tiles (TILE=1 with their own keys,
codegen/window_tile.py: a block's taps read from a copy in shared memory; measured slower, so planned only under
--pin NODE:TILE=1, plan_schedules.OPT_IN). No key is named `unit`, so a plan-wide --pin unit=... of the
GEMM and convolution families leaves windows alone. Constraints: the planner's (threads, registers, shared memory).

[Note: window runs]
A depthwise convolution on vectors issues, per 16-byte tap: the load, its address and guard, and a
conversion per element, for the image and again for the filter, then one FMA per element.
MobileNetV2's 3x3 over 32 x 112 x 112 x 32 at B32 issued 402 instructions a thread (ncu, an H200,
session 34): issue-bound at 28.6 us where its 51 MB move in ~12. With PX outputs a thread along the
output column, the taps are unrolled here (at most MAX_RUN_TAPS) and each (tap, output) load is
re-indexed to its element (`run_loads`): loads that land on the same element are one load (a
stride-1 row of KW taps over PX outputs reads PX + KW - 1 columns, not PX·KW), and a filter tap,
the same for every output of the run, is loaded and converted once. The cost model counts a
thread's instructions from the same list (planner/cost.py, `_window_cost`).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Mapping

from aicfc.codegen import vector, window_tile
from aicfc.codegen.cexpr import Emitter
from aicfc.codegen.common import decompose, render, signature, store_line
from aicfc.codegen.row_reduce import COMBINE, INIT
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Affine, Load, is_integer_compute, loads, map_loads, reindex
from aicfc.ir.types import TensorType

SPACE = {"threads": (64, 128, 256, 512), "PX": (1, 2, 4)}
MAX_RUN_TAPS = 64        # taps a thread's run unrolls (a 7x7 window: 49)
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


def run_lengths(k: Kernel) -> tuple[int, ...]:
    """The PX a vector kernel may take: those dividing the extent of the variable next to the
    innermost, where the window's taps are few enough to unroll."""
    red = k.ops[0]
    if len(red.domain_vars) < 2 or math.prod(red.reduce) > MAX_RUN_TAPS or red.combiner not in COMBINE:
        return (1,)
    return tuple(x for x in SPACE["PX"] if red.type.shape[-2] % x == 0)


def space(k: Kernel, plan: Plan) -> list[dict]:
    types = plan.types()
    vec = vector_width(k, types)
    if vec == 1:
        return [{"threads": t} for t in SPACE["threads"]]
    return ([{"threads": t, "vec": vec, "PX": x} for t in SPACE["threads"] for x in run_lengths(k)]
            + window_tile.space(k, types, vec))


def declined(k: Kernel, plan: Plan) -> list[tuple[dict, str]]:
    vec = vector_width(k, plan.types())
    why = window_tile.why_not(without_unit_taps(k), plan.types(), vec)
    return [({"TILE": 1}, why)] if why and vec > 1 else []


def launch(k: Kernel, p: Mapping) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    if p.get("TILE"):
        return (window_tile.tiles(k, p), 1, 1), (p["threads"], 1, 1), 0
    per_thread = p.get("vec", 1) * p.get("PX", 1)
    return (math.ceil(k.ops[0].type.numel / (p["threads"] * per_thread)), 1, 1), (p["threads"], 1, 1), 0


def run_loads(k: Kernel, px: int, run: str | None = None) -> list[tuple[int, dict[Load, Load]]]:
    """A thread's run of `px` outputs along `run` (default: the variable next to the innermost),
    its taps unrolled: for each (output j of the run, tap) of the window, j and {a load of the
    body: that load at this output and tap}, the run's variable standing for its first output /
    px. Loads equal here read the same element ([Note: window runs]). `k` has its unit taps removed."""
    red = k.ops[0]
    run = run or red.domain_vars[-2]
    out = []
    for tap in itertools.product(*(range(n) for n in red.reduce)):
        fix = {r: Affine.of({}, c) for r, c in zip(red.reduce_vars, tap)}
        for j in range(px):
            at = fix | {run: Affine.of({run: px}, j)}
            out.append((j, {ld: reindex(ld, tuple(a.substitute(at) for a in ld.index)) for ld in loads(red.body)}))
    return out


def run_body(k: Kernel, vec: int, px: int, run: str, em: Emitter, load, outside) -> list[str]:
    """The lines of a run's taps, for the direct unit's runs and the tiles alike: for each (output j,
    tap) of `run_loads` along `run`, the loads not yet held (`load(ld, at)`: the lines that fill a
    C array with `at`, and its name), then the body on them combined into acc[j]. `outside(j, tap)`
    names the variables a use outside a load reads. `k` has its unit taps removed."""
    red = k.ops[0]
    taps = list(itertools.product(*(range(n) for n in red.reduce)))
    held: dict[Load, str] = {}
    lines = []
    for i, (j, at) in enumerate(run_loads(k, px, run)):
        for ld, here in at.items():
            if here not in held:
                more, held[here] = load(ld, here)
                lines += more
        tap = {r: str(c) for r, c in zip(red.reduce_vars, taps[i // px])}
        value = em.emit(red.body, outside(j) | tap, {}, {ld: f"{held[here]}[e]" for ld, here in at.items()})
        lines += ["#pragma unroll", f"for (int e = 0; e < {vec}; ++e) {{"] + [f"  {x}" for x in em.take()] + [
            f"  acc[{j}][e] = {COMBINE[red.combiner].format(f'acc[{j}][e]', value)};", "}"]
    return lines


def epilogue_loads(k: Kernel, px: int, run: str | None = None) -> list[tuple[int, dict[Load, Load]]]:
    """`run_loads` of the epilogue's own loads (a bias, a residual) at each output of the run."""
    if len(k.ops) < 2:
        return []
    red, epi = k.ops
    run = run or red.domain_vars[-2]
    lds = [ld for ld in dict.fromkeys(loads(epi.body)) if ld.buffer != red.out]
    return [(j, {ld: reindex(ld, tuple(a.substitute({run: Affine.of({run: px}, j)}) for a in ld.index)) for ld in lds})
            for j in range(px)]


def static_smem(k: Kernel, p: Mapping) -> int:
    return p.get("SMEM", 0)


def render_kernel(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str) -> str:
    red = k.ops[0]
    sig = signature(k, types)
    if p.get("TILE"):
        return window_tile.render_kernel(k, p, types, name, sig)
    if p.get("PX", 1) > 1:
        return _render_runs(k, p, types, name, sig)
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
                  numel=red.type.numel, vec=0, runs=0, decompose=decompose("t", list(zip(red.domain_vars, red.type.shape)),
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
                  numel=red.type.numel, vec=vec, runs=0,
                  decompose=decompose("t", variables[:-1] + [("first", variables[-1][1])], sig.index_type),
                  init=INIT[red.combiner], acc_type="float", loops=list(zip(red.reduce_vars, red.reduce)),
                  body=body, epilogue=epilogue, guarded=any(ld.fill is not None for ld in loads(red.body)))


def _render_runs(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str, sig) -> str:
    """`vec` outputs along the innermost variable times PX along the next one per thread, each
    distinct load of the run once ([Note: window runs])."""
    k = without_unit_taps(k)
    red = k.ops[0]
    vec, px = p["vec"], p["PX"]
    inner, run = red.domain_vars[-1], red.domain_vars[-2]
    names = {v: v for v in red.domain_vars}
    held: dict[Load, str] = {}

    def load(ld: Load, at: Load, prefix: str) -> list[str]:
        if at in held:
            return []
        held[at] = f"{prefix}{len(held)}"
        return [f"float {held[at]}[{vec}];"] + vector.load_lines(at, vector.kind(ld, types, inner, vec), vec, held[at],
                                                                 sig.params, types, names, inner, "first")

    def at_output(j: int) -> dict[str, str]:
        """The variables' C names at output j of the run (for a use outside a load)."""
        return {**names, run: f"({px} * {run} + {j})"}

    def body_load(ld: Load, at: Load) -> tuple[list[str], str]:
        lines = load(ld, at, "a")
        return lines, held[at]

    body = run_body(k, vec, px, run, Emitter(sig.params, types, prefix="v"), body_load, at_output)
    epilogue = []
    extra = dict(epilogue_loads(k, px))
    for j in range(px):
        index = tuple(Affine.var(v) if v != run else Affine.of({run: px}, j) for v in red.domain_vars)
        if len(k.ops) == 2:
            epi = k.ops[1]
            for ld, here in extra[j].items():
                epilogue += load(ld, here, "b")
            epi_em = Emitter(sig.params, types, prefix=f"w{j}_")
            out = epi_em.emit(epi.body, at_output(j), {red.out: f"acc[{j}][e]"},
                              {ld: f"{held[here]}[e]" for ld, here in extra[j].items()})
            epilogue += ["{", f"  float o[{vec}];", "#pragma unroll", f"  for (int e = 0; e < {vec}; ++e) {{"] + [
                f"    {x}" for x in epi_em.take()] + [f"    o[e] = {out};", "  }",
                f"  {vector.store_line(index, epi.type, sig.params[epi.out], names, inner, 'first', vec, 'o')}", "}"]
        else:
            epilogue.append("{ " + vector.store_line(index, red.type, sig.params[red.out], names, inner, "first", vec,
                                                     f"acc[{j}]") + " }")
    variables = list(zip(red.domain_vars, red.type.shape))
    variables = variables[:-2] + [(run, variables[-2][1] // px), ("first", variables[-1][1])]
    return render("window.cu.j2", name=name, combiner=red.combiner, reduce=list(red.reduce),
                  shape=list(red.type.shape), threads=p["threads"], idx=sig.index_type, signature=sig.text,
                  numel=red.type.numel // px, vec=vec, runs=px, decompose=decompose("t", variables, sig.index_type),
                  init=INIT[red.combiner], acc_type="float", loops=[], body=body, epilogue=epilogue,
                  guarded=any(ld.fill is not None for ld in loads(red.body)))
