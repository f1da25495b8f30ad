"""Schedule family `scatter`: a ScatterND over state, run in place over the updates only.

The kernel's ops are ScatterND's functional form (passes/lower_data.py `scatter_nd`: %y.hit,
%y.val, %y = select(hit, val, x)); `declare_state` chose this family because y and x are one
buffer (state), so every element no index names already holds x. The kernel then iterates
over the updates (Q index tuples x the remaining axes), one thread per element: it reads the
index tuple, wraps negative ids, skips ids outside their axis (the functional form writes
nothing there either), and stores the update's value (the val body's chosen term, which may
carry inlined producers such as a rotary map) at its element of y. Duplicate ids (undefined
in ONNX) race; the functional form sums them.

[Note: a scatter's rows as vectors]
A thread takes `vec` consecutive elements of the updates' innermost axis (the state's own
innermost, unindexed axis, stride 1): the index tuple is read once for the group, each value
operand as one 16-byte vector where it is contiguous along that axis ([Note: Vector access] in
codegen/vector.py; a strided one element by element), and the group is stored as one vector.
A prefill's K/V cache rows (512 updates of 8 heads x 64 halves) were 2-byte loads and stores
from 64-thread blocks: 5.2 us measured on an H200 for 0.5 MB written (session 19, call 1),
against 1.26 predicted. `vec` is not searched: the widest every access allows, as in pointwise.

Parameter space: threads per block (`vec` as above).
"""
from __future__ import annotations

import math
from typing import Mapping

from aicfc.codegen import vector
from aicfc.codegen.cexpr import Emitter
from aicfc.codegen.common import decompose, render, signature, store_line
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Affine, Call, Compute, Expr, Load, index_vars, is_integer_compute, loads
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


def value_expr(k: Kernel) -> Expr:
    """The update's value: the chosen term of the val body's select(match, value, 0)."""
    select = k.ops[1].body
    assert isinstance(select, Call) and select.fn == "select"
    return select.args[1]


def vector_width(k: Kernel, types: Mapping[str, TensorType]) -> tuple[int, str]:
    """(vec, why not wider) along the state's innermost axis ([Note: a scatter's rows as vectors])."""
    _, _, y, ids = parts(k)
    _, rest = domain(k)
    last = len(y.type.shape) - 1
    if not rest or rest[-1] != last:
        return 1, "the ids index the state's innermost axis: no run of elements to move as a vector"
    inner = f"i{last}"
    value = value_expr(k)
    accesses = list(dict.fromkeys(loads(value)))
    if is_integer_compute(y.type.dtype, value, types):
        return 1, "an integer state is moved element by element"
    if any(inner in {v for a in ld.index for v in index_vars(a)} for e, _ in ids for ld in loads(e)):
        return 1, f"the ids vary along {inner}"
    return vector.widest([types[ld.buffer].dtype for ld in accesses] + [y.type.dtype], y.type.shape[last])


def space(k: Kernel, plan: Plan) -> list[dict]:
    vec, _ = vector_width(k, plan.types())
    return [{"threads": t, "vec": vec} for t in SPACE["threads"]]


def declined(k: Kernel, plan: Plan) -> list[tuple[dict, str]]:
    vec, why = vector_width(k, plan.types())
    full = vector.full_width([k.ops[-1].type.dtype])
    return [({"vec": full}, why)] if vec < full and why else []


def launch(k: Kernel, p: Mapping) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    return (math.ceil(numel(k) // p.get("vec", 1) / p["threads"]), 1, 1), (p["threads"], 1, 1), 0


def static_smem(k: Kernel, p: Mapping) -> int:
    return 0


def render_kernel(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str) -> str:
    hit, val, y, ids = parts(k)
    count, rest = domain(k)
    shape = y.type.shape
    sig = signature(k, types)
    idx = sig.index_type
    vec = p.get("vec", 1)
    variables = [("r0", count)] + [(f"i{d}", shape[d]) for d in rest]
    names = {v: v for v, _ in variables}
    em = Emitter(sig.params, types, prefix="v")
    if vec > 1:   # the innermost variable runs over first .. first + vec - 1
        inner = variables[-1][0]
        variables[-1] = ("first", variables[-1][1])
        names[inner] = "first"
    lines = decompose("t" if vec == 1 else f"(t * {vec})", variables, idx)
    for e, a in ids:
        wrapped = em.emit(e, names)
        lines += em.take() + [f"const long long i{a} = (long long)({wrapped});",
                              f"if (i{a} < 0 || i{a} >= {shape[a]}) return;   // outside the axis: no write"]
    at = {**names, **{f"i{a}": f"i{a}" for _, a in ids}}
    if vec == 1:
        value = em.emit(value_expr(k), names)
        lines += em.take()
        lines.append(store_line(y, {v: Affine.var(v) for v in y.domain_vars}, value, sig.params, at))
    else:   # [Note: a scatter's rows as vectors]
        loaded, values = vector.group_loads(list(dict.fromkeys(loads(value_expr(k)))), em, sig.params, types,
                                            {**names, inner: inner}, inner, vec, "e")
        lines += loaded
        value = em.emit(value_expr(k), {**names, inner: "(first + e)"}, {}, values)
        lines += [f"float o[{vec}];", "#pragma unroll", f"for (int e = 0; e < {vec}; ++e) {{"]
        lines += ["  " + x for x in em.take()] + [f"  o[e] = {value};", "}"]
        index = tuple(Affine.var(v) for v in y.domain_vars)
        lines.append(vector.store_line(index, y.type, sig.params[y.out], {**at, inner: inner}, inner, "first", vec, "o"))
    return render("scatter.cu.j2", name=name, count=count, row=numel(k) // count, state=y.out, threads=p["threads"],
                  idx=idx, numel=numel(k) // vec, vec=vec, signature=sig.text, body=lines)
