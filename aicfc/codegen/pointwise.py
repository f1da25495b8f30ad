"""Schedule family `pointwise`: one thread per element (or `items` elements), any fused map.

Parameter space: threads per block x items per thread. Consecutive threads take consecutive
elements, so every access whose innermost index is the innermost variable is coalesced.
"""
from __future__ import annotations

import math
from typing import Mapping

from aicfc.codegen.cexpr import Emitter
from aicfc.codegen.common import decompose, render, signature, store_line
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.types import TensorType

SPACE = {"threads": (64, 128, 256, 512, 1024), "items": (1, 2, 4, 8)}


def space(k: Kernel, plan: Plan) -> list[dict]:
    return [{"threads": t, "items": i} for t in SPACE["threads"] for i in SPACE["items"]]


def launch(k: Kernel, p: Mapping) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    numel = k.ops[-1].type.numel
    return (math.ceil(numel / (p["threads"] * p["items"])), 1, 1), (p["threads"], 1, 1), 0


def static_smem(k: Kernel, p: Mapping) -> int:
    return 0


def render_kernel(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str) -> str:
    (op,) = k.ops
    sig = signature(k, types)
    names = {v: v for v in op.domain_vars}
    em = Emitter(sig.params, types, prefix="v")
    value = em.emit(op.body, names)
    body = em.take()
    variables = list(zip(op.domain_vars, op.type.shape))
    return render("pointwise.cu.j2", name=name, shape=list(op.type.shape), numel=op.type.numel,
                  threads=p["threads"], items=p["items"], idx=sig.index_type, signature=sig.text,
                  decompose=decompose("t", variables, sig.index_type), body=body,
                  stores=[store_line(op, dict(k.binds[0]), value, sig.params, names)])
