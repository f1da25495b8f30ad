"""Schedule family `scatter`: a ScatterND over state, run in place over the updates only.

The kernel's ops are ScatterND's functional form (passes/lower_data.py `scatter_nd`: %y.hit,
%y.val, %y = select(hit, val, x)); `declare_state` chose this family because y and x are one
buffer (state), so every element no index names already holds x. The kernel then iterates
over the updates (Q index tuples x the remaining axes), one thread per element: it reads the
index tuple, wraps negative ids, skips ids outside their axis (the functional form writes
nothing there either), and stores the update's value (the val body's chosen term, which may
carry inlined producers such as a rotary map) at its element of y. Duplicate ids (undefined
in ONNX) race; the functional form sums them.

Parameter space: threads per block.
"""
from __future__ import annotations

import math
from typing import Mapping

from aicfc.codegen.cexpr import Emitter
from aicfc.codegen.common import decompose, render, signature, store_line
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Affine, Call, Compute, Expr, Load
from aicfc.ir.types import TensorType

SPACE = {"threads": (64, 128, 256, 512)}


def parts(k: Kernel) -> tuple[Compute, Compute, Compute, list[tuple[Expr, int]]]:
    """(hit, val, y, [(the wrapped id expression, the axis it indexes)...])."""
    hit, val, y = k.ops
    terms: list[Call] = []

    def walk(e: Expr) -> None:
        if isinstance(e, Call) and e.fn == "and":
            for a in e.args:
                walk(a)
        elif isinstance(e, Call) and e.fn == "eq":
            terms.append(e)
    walk(hit.body)
    ids = []
    for eq in terms:
        iota = eq.args[1]
        assert isinstance(iota, Load)
        (axis_var,) = iota.index
        ids.append((eq.args[0], int(axis_var.terms[0][0][1:])))
    return hit, val, y, ids


def domain(k: Kernel) -> tuple[int, list[int]]:
    """(Q, the remaining axes of y) the kernel iterates over."""
    hit, val, y, ids = parts(k)
    axes = {a for _, a in ids}
    return val.reduce[0], [d for d in range(len(y.type.shape)) if d not in axes]


def numel(k: Kernel) -> int:
    count, rest = domain(k)
    return count * math.prod(k.ops[-1].type.shape[d] for d in rest)


def space(k: Kernel, plan: Plan) -> list[dict]:
    return [{"threads": t} for t in SPACE["threads"]]


def launch(k: Kernel, p: Mapping) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    return (math.ceil(numel(k) / p["threads"]), 1, 1), (p["threads"], 1, 1), 0


def static_smem(k: Kernel, p: Mapping) -> int:
    return 0


def render_kernel(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str) -> str:
    hit, val, y, ids = parts(k)
    count, rest = domain(k)
    shape = y.type.shape
    sig = signature(k, types)
    idx = sig.index_type
    variables = [("r0", count)] + [(f"i{d}", shape[d]) for d in rest]
    names = {v: v for v, _ in variables}
    em = Emitter(sig.params, types, prefix="v")
    lines = decompose("t", variables, idx)
    for e, a in ids:
        wrapped = em.emit(e, names)
        lines += em.take() + [f"const long long i{a} = (long long)({wrapped});",
                              f"if (i{a} < 0 || i{a} >= {shape[a]}) return;   // outside the axis: no write"]
    select = val.body
    assert isinstance(select, Call) and select.fn == "select"
    value = em.emit(select.args[1], names)
    lines += em.take()
    at = {**names, **{f"i{a}": f"i{a}" for _, a in ids}}
    lines.append(store_line(y, {v: Affine.var(v) for v in y.domain_vars}, value, sig.params, at))
    return render("scatter.cu.j2", name=name, count=count, row=numel(k) // count, state=y.out, threads=p["threads"],
                  idx=idx, numel=numel(k), signature=sig.text, body=lines)
