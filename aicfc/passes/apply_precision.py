"""apply_precision: Decision IR → Decision IR under a precision policy (`--precision`).

The policy decides how floating-point tensors are stored and which arithmetic a kernel may
use; the planner then chooses, per kernel, among the schedules the policy allows:

    fp32  tensors in f32; contractions in exact fp32 (SIMT FMA); no tensor cores.
    tf32  tensors in f32; contractions may run on tf32 tensor cores (10-bit mantissa inputs,
          fp32 accumulate) when the cost model prefers them over fp32 SIMT.
    fp16  every f32 tensor (inputs, weights, intermediates, outputs) stored as f16; loads
    bf16  convert to fp32, arithmetic and accumulation are fp32, stores round to f16/bf16;
          contractions may run on f16/bf16 tensor cores with fp32 accumulation.

Inputs and outputs keep their f32 type at the bundle's interface: aicf-run converts on the
host. The policy is one recorded rewrite on the plan; each kernel's choice of arithmetic unit
is a schedule parameter (`unit=mma|simt`) that explain shows with what it beat.

Under fp16 and bf16 every floating-point result is rounded to 11 or 8 significant bits when it
is stored, so `exp` and `erf` need not be libm's (about 2 ulp of fp32, 8 and 24 instructions):
kernels use an ex2.approx exponential and a one-reciprocal, one-exponential erf whose errors
((2 + 1.2|x|) fp32 ulp; absolute 5e-7) are over 100x below that rounding
(templates/math.cuh.j2). A second recorded rewrite says so; fp32 and tf32 keep libm.

Two kinds of tensor keep f32 under fp16 and bf16, because rounding them is not a relative
error of the result ([Note: exact angles]):
- an angle: what cos or sin reads, and everything it is computed from. cos(x) with x stored in
  f16 is off by |x|·2⁻¹¹ absolute: at a rotary position of 500 that is 0.25 rad, and the
  inverse frequencies it is the product of are off relatively, as much again;
- a constant compared with something (a cache's slot table, `slot <= position`) whose values
  the storage type does not hold exactly (integers above 2048 in f16): the comparison would
  flip.

    decision m target=sm_90 precision=fp32 { input %x: f32[4,64] ... }
  --precision fp16 gives
    decision m target=sm_90 precision=fp16 { input %x: f16[4,64] ... }
"""
from __future__ import annotations

import numpy as np

from aicfc.errors import AicfError
from aicfc.ir.decision import Plan
from aicfc.ir.lowered import Call, Expr, Load, Rewrite, loads
from aicfc.ir.shared_weights import remember
from aicfc.ir.types import TensorType, Value, Weight, convert

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
STORAGE = {"fp32": "f32", "tf32": "f32", "fp16": "f16", "bf16": "bf16"}
# The tensor-core input type a contraction may use under each policy (None: SIMT only).
MMA_TYPE = {"fp32": None, "tf32": "tf32", "fp16": "f16", "bf16": "bf16"}

_WHY = {
    "fp32": "exact fp32 semantics: contractions use fp32 FMA, never tensor cores",
    "tf32": "tensors stay f32; contractions may use tf32 tensor cores with fp32 accumulation",
    "fp16": "f32 tensors stored as f16 (half the bytes); arithmetic and accumulation in fp32",
    "bf16": "f32 tensors stored as bf16 (half the bytes); arithmetic and accumulation in fp32",
}


# Policies whose kernels use the approximate exp and erf (see the module docstring).
FAST_MATH = ("fp16", "bf16")
SIGNIFICANT_BITS = {"fp16": 11, "bf16": 8}
_FAST_WHY = ("results are stored as {precision} ({bits} significant bits): exp as ex2.approx ((2 + 1.2|x|) fp32 ulp), erf as "
             "Abramowitz-Stegun 7.1.26 with a Taylor series below 1/16 (absolute error 5e-7), over 100x below "
             "the storage rounding; fp32 and tf32 keep libm's expf and erff")


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise AicfError(f"--precision {precision}: choose one of {', '.join(PRECISIONS)}")


_PERIODIC = ("cos", "sin")
_COMPARE = ("eq", "gt", "lt", "ge", "le")


def _read_under(e: Expr, fns: tuple[str, ...], inside: bool = False) -> set[str]:
    """Buffers loaded anywhere below a call of one of `fns` in `e`."""
    if isinstance(e, Load):
        return {ld.buffer for ld in loads(e)} if inside else set()
    if isinstance(e, Call):
        deeper = inside or e.fn in fns
        return set().union(*(_read_under(a, fns, deeper) for a in e.args))
    return set()


def exact_f32(plan: Plan, storage: str) -> dict[str, str]:
    """The tensors that stay f32 under `storage` ([Note: exact angles]), with why."""
    producers = {op.out: op for k in plan.kernels for op in k.ops}
    sources = {v.out: v.source for v in plan.views}
    keep: dict[str, str] = {}
    stack = [b for k in plan.kernels for op in k.ops for b in _read_under(op.body, _PERIODIC)]
    while stack:
        name = stack.pop()
        if name in keep:
            continue
        keep[name] = "an angle cos/sin reads (or a factor of one): its absolute error is the result's"
        if name in sources:
            stack.append(sources[name])
        if name in producers:
            stack.extend(ld.buffer for ld in loads(producers[name].body))
    weights = {w.name: w for w in plan.weights}
    for k in plan.kernels:
        for op in k.ops:
            for name in _read_under(op.body, _COMPARE):
                w = weights.get(name)
                if w is not None and w.type.dtype == "f32" and name not in keep:
                    values = w.array()
                    rounded = values.astype(np.float16).astype(np.float32) if storage == "f16" else _bf16(values)
                    if not np.array_equal(rounded, values):
                        keep[name] = f"compared, and {storage} does not hold its values exactly"
    return keep


def _bf16(values: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).view(np.float32)


def _converted(w: Weight, storage: str) -> bytes:
    """`w`'s values in `storage`, converted once for all the plans of a bundle ([Note: weights shared by a
    bundle's plans] in ir/shared_weights.py)."""
    return remember(("convert", storage, w.type), w.data, lambda: convert(w.array(), storage))


def apply_precision(plan: Plan, precision: str) -> Plan:
    check_precision(precision)
    storage = STORAGE[precision]
    keep = exact_f32(plan, storage) if storage != "f32" else {}

    def retype(t: TensorType, name: str = "") -> TensorType:
        return TensorType(storage, t.shape) if t.dtype == "f32" and name not in keep else t

    saved = 0
    if storage != "f32":
        saved = sum(t.nbytes - retype(t, n).nbytes for n, t in plan.types().items())
    weights = tuple(Weight(w.name, retype(w.type, w.name), _converted(w, storage)) if w.type.dtype == "f32"
                    and storage != "f32" and w.name not in keep else w for w in plan.weights)
    kernels = tuple(k.replace(ops=tuple(op.__class__(op.out, retype(op.type, op.out), op.combiner, op.reduce, op.body,
                                                     op.origin) for op in k.ops)) for k in plan.kernels)
    for v in plan.views:   # a view shares its source's bytes, so its storage type
        if v.source in keep and v.out not in keep:
            keep[v.out] = f"a view of {v.source!r}"
    views = tuple(v.__class__(v.out, retype(v.type, v.out), v.source, v.origin) for v in plan.views)
    records = (Rewrite(f"precision {precision}", "all floating-point tensors", True, _WHY[precision], saved),)
    records += tuple(Rewrite(f"precision {precision}: keep f32", name, True, why) for name, why in sorted(keep.items())
                     if plan.types().get(name, TensorType("i64", ())).dtype == "f32")
    if precision in FAST_MATH and any(_calls(op.body, ("exp", "erf", "sigmoid", "softplus")) for k in kernels for op in k.ops):
        records += (Rewrite("exp, erf => approximate", "every kernel", True,
                            _FAST_WHY.format(precision=precision, bits=SIGNIFICANT_BITS[precision])),)
    return plan.replace(inputs=tuple(Value(v.name, retype(v.type)) for v in plan.inputs), weights=weights,
                        kernels=kernels, views=views, rewrites=plan.rewrites + records, precision=precision)


def _calls(e: Expr, fns: tuple[str, ...]) -> bool:
    return isinstance(e, Call) and (e.fn in fns or any(_calls(a, fns) for a in e.args))
