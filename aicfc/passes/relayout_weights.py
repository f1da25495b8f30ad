"""relayout_weights: Decision IR → Decision IR with constant GEMM operands stored K-major where
the Hopper engine needs them so.

A weight is a constant: its layout is the compiler's to choose, and the model's interface does
not see it. Storing W[..., k, n] as W'[..., n, k] and swapping the last two index entries of
every load of it is an identity (each load reads the same element). The rule applies where
it makes a schedule legal that was not: tf32 `wgmma` reads K-major operands only
(`codegen/gemm_wgmma.py`), and exported MatMul/Gemm weights are [K, N] (N-major); and the TMA
needs 16-byte strides, which a row of N = 50257 fp16 elements (a vocabulary projection) is not
while a row of K = 768 is. Otherwise fp16/bf16 wgmma reads either layout (its transpose bit),
and their weights keep the layout ONNX gave.

Preconditions: after apply_precision (the weight's bytes are final), before plan_schedules.
Declined, with the reason: a weight that a view aliases (the view would read the old layout),
one read by a guarded or filled load, one of rank below 2. (Swapping the last two index
entries is an identity whatever those entries are.)

    kernel k0 gemm { y[i0, i1] = sum_r0 x[i0, r0] * w[r0, i1] }     w: f32[768, 3072]
  becomes
    kernel k0 gemm { y[i0, i1] = sum_r0 x[i0, r0] * w[i1, r0] }     w: f32[3072, 768]
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from aicfc.codegen import gemm, gemm_wgmma
from aicfc.codegen.cexpr import flat_offset
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Load, Rewrite, loads, map_loads
from aicfc.ir.types import ITEMSIZE, TensorType, Weight

RULE = "weight[.., k, n] => weight[.., n, k] (K-major for wgmma)"


def _wanted(k: Kernel, plan: Plan, weights: dict[str, Weight], types: Mapping[str, TensorType]) -> tuple[str, str] | None:
    """(the weight this GEMM reads N-major as its B operand, why it should be K-major), if any:
    tf32 wgmma reads K-major operands only; a row of N elements that is not a multiple of 16
    bytes (vocabulary projections: N = 50257) is no TMA stride, a row of K elements may be."""
    if k.family != "gemm" or plan.target != gemm_wgmma.TARGET or plan.precision not in ("tf32", "fp16", "bf16"):
        return None
    c = gemm.dims(k)[0]
    if c.b.buffer not in weights or c.n is None:
        return None
    t = types[c.b.buffer]
    off = flat_offset(c.b.index, t)
    if off.coeff("r0") == 1 or off.coeff(c.n) != 1 or len(t.shape) < 2 or t.shape[-1] != gemm.dims(k)[2]:
        return None
    esize = ITEMSIZE[t.dtype]
    if plan.precision == "tf32":
        return c.b.buffer, "tf32 wgmma reads K-major operands only"
    if (t.shape[-1] * esize) % 16 and (t.shape[-2] * esize) % 16 == 0:
        return c.b.buffer, f"a row of {t.shape[-1]} elements is no TMA stride (16-byte multiples), one of {t.shape[-2]} is"
    return None


def _swap(ld: Load) -> Load:
    return dataclasses.replace(ld, index=ld.index[:-2] + (ld.index[-1], ld.index[-2]))


def relayout_weights(plan: Plan) -> Plan:
    weights = {w.name: w for w in plan.weights}
    types = plan.types()
    wanted = dict(w for k in plan.kernels if (w := _wanted(k, plan, weights, types)))
    if not wanted:
        return plan
    records, done = [], set()
    aliased = {v.source for v in plan.views}
    for name, why in wanted.items():
        w = weights[name]
        readers = [ld for k in plan.kernels for op in k.ops for ld in loads(op.body) if ld.buffer == name]
        if name in aliased:
            records.append(Rewrite(RULE, name, False, "a view reads the weight in its ONNX layout"))
            continue
        if len(w.type.shape) < 2 or any(ld.guard or ld.fill is not None for ld in readers):
            records.append(Rewrite(RULE, name, False, "a load of it is guarded or the weight is not a matrix"))
            continue
        done.add(name)
        records.append(Rewrite(RULE, name, True, f"{why}; stored as "
                                                 f"[{', '.join(map(str, w.type.shape[:-2] + w.type.shape[::-1][:2]))}]"))
    if not done:
        return plan.replace(rewrites=plan.rewrites + tuple(records))
    new_weights = []
    for w in plan.weights:
        if w.name in done:
            # moved as raw elements of their storage size (bf16 has no numpy type of its own)
            arr = np.ascontiguousarray(np.swapaxes(w.raw(), -1, -2))
            w = Weight(w.name, dataclasses.replace(w.type, shape=tuple(arr.shape)), arr.tobytes())
        new_weights.append(w)

    def load(ld: Load) -> Load:
        return _swap(ld) if ld.buffer in done else ld
    kernels = []
    for k in plan.kernels:
        reads = any(ld.buffer in done for op in k.ops for ld in loads(op.body))
        kernels.append(k.replace(ops=tuple(dataclasses.replace(op, body=map_loads(op.body, load)) for op in k.ops),
                                 rewrites=k.rewrites + ((RULE,) if reads else ())))
    kernels = tuple(kernels)
    return plan.replace(weights=tuple(new_weights), kernels=kernels, rewrites=plan.rewrites + tuple(records))
