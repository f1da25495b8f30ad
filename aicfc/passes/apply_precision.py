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

    decision m target=sm_90 precision=fp32 { input %x: f32[4,64] ... }
  --precision fp16 gives
    decision m target=sm_90 precision=fp16 { input %x: f16[4,64] ... }
"""
from __future__ import annotations

from aicfc.errors import AicfError
from aicfc.ir.decision import Plan
from aicfc.ir.lowered import Call, Expr, Rewrite
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


def apply_precision(plan: Plan, precision: str) -> Plan:
    check_precision(precision)
    storage = STORAGE[precision]

    def retype(t: TensorType) -> TensorType:
        return TensorType(storage, t.shape) if t.dtype == "f32" else t

    saved = 0
    if storage != "f32":
        saved = sum(t.nbytes - retype(t).nbytes for t in plan.types().values())
    weights = tuple(Weight(w.name, retype(w.type), convert(w.array(), storage)) if w.type.dtype == "f32"
                    and storage != "f32" else w for w in plan.weights)
    kernels = tuple(k.replace(ops=tuple(op.__class__(op.out, retype(op.type), op.combiner, op.reduce, op.body,
                                                     op.origin) for op in k.ops)) for k in plan.kernels)
    views = tuple(v.__class__(v.out, retype(v.type), v.source, v.origin) for v in plan.views)
    records = (Rewrite(f"precision {precision}", "all floating-point tensors", True, _WHY[precision], saved),)
    if precision in FAST_MATH and any(_calls(op.body, ("exp", "erf", "sigmoid", "softplus")) for k in kernels for op in k.ops):
        records += (Rewrite("exp, erf => approximate", "every kernel", True,
                            _FAST_WHY.format(precision=precision, bits=SIGNIFICANT_BITS[precision])),)
    return plan.replace(inputs=tuple(Value(v.name, retype(v.type)) for v in plan.inputs), weights=weights,
                        kernels=kernels, views=views, rewrites=plan.rewrites + records, precision=precision)


def _calls(e: Expr, fns: tuple[str, ...]) -> bool:
    return isinstance(e, Call) and (e.fn in fns or any(_calls(a, fns) for a in e.args))
