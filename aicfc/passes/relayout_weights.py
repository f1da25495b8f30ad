"""relayout_weights: Decision IR → Decision IR with constant GEMM operands stored K-major where
the Hopper engine needs them so, and a window's constant operand stored with the dimension its
outputs' innermost variable walks last, where the window's vector loads need it so.

A weight is a constant: its layout is the compiler's to choose, and the model's interface does
not see it. Storing W[..., k, n] as W'[..., n, k] and swapping the last two index entries of
every load of it is an identity (each load reads the same element). The rule applies where
it makes a schedule legal that was not: tf32 `wgmma` reads K-major operands only
(`codegen/gemm_wgmma.py`), and exported MatMul/Gemm weights are [K, N] (N-major); and the TMA
needs 16-byte strides, which a row of N = 50257 fp16 elements (a vocabulary projection) is not
while a row of K = 768 is. Otherwise fp16/bf16 wgmma reads either layout (its transpose bit),
and their weights keep the layout ONNX gave.

GEMV_RULE: a one-row fp16/bf16 gemv (a decode step's projection) reads its weight K-major where the planner
predicts its best schedule faster so ([Note: the gemv over a K-major weight] in codegen/gemm_gemv.py: no
split-k merge across blocks; rotary epilogues and the gated gate/up pairs included, [Note: a rotary gemv over a
K-major weight]), and so does a gemv of 2-8 rows on tensor cores ([Note: the tensor-core
gemv over a K-major weight], the gated pairs included; `--pin kmajor=one` leaves those [K, N], the default until
session 69); a bundle's plans share one copy of the weights, so compile_plans decides it for
all of them ([Note: one layout for a bundle's plans] in driver.py) and every plan, the prefill's GEMMs included
(wgmma and mma read either layout), reads the weight so. `--pin kmajor=0` keeps every weight [K, N].

Preconditions: after apply_precision (the weight's bytes are final), before plan_schedules.
Declined, with the reason: a weight that a view aliases (the view would read the old layout),
one read by a guarded or filled load, one of rank below 2. (Swapping the last two index
entries is an identity whatever those entries are.)

    kernel k0 gemm { y[i0, i1] = sum_r0 x[i0, r0] * w[r0, i1] }     w: f32[768, 3072]
  becomes
    kernel k0 gemm { y[i0, i1] = sum_r0 x[i0, r0] * w[i1, r0] }     w: f32[3072, 768]

[Note: a depthwise weight, channel last]
A depthwise convolution over a channels-last image is a `window` kernel whose outputs' innermost
variable is the channel: its taps read the image along the channel, 8 fp16 channels in one
16-byte load (codegen/window.py's vectors), but ONNX's weight [C, 1, kh, kw] puts the channel
first, so the weight's taps are 9 elements apart and the kernel fell back to one output per
thread (MobileNetV2 at B32 on an H200: its depthwise convolutions ran at 370-420 GB/s, 740 of
the model's 1290 us, benchmarks/results/cnn_profiles_session15_h200.txt). The weight is stored
[1, kh, kw, C] instead: moving one dimension last, and the same entry of every load's index
with it, is an identity. Applied where a window kernel reads a constant through an index whose
only entry that uses the innermost variable is that variable itself, not already last; declined
like the GEMM rule (views, guarded loads).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping

import numpy as np

from aicfc.codegen import gemm, gemm_gemv, gemm_wgmma
from aicfc.codegen.cexpr import flat_offset
from aicfc.errors import AicfError
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Affine, Load, Rewrite, loads, map_loads
from aicfc.ir.shared_weights import remember
from aicfc.ir.types import ITEMSIZE, TensorType, Weight
from aicfc.planner.hardware import Profile

RULE = "weight[.., k, n] => weight[.., n, k] (K-major for wgmma)"
GEMV_RULE = "weight[k, n] => weight[n, k] (a decode gemv of 1-8 rows adds each column's k-rows in one block: no split-k merge)"
GEMV_PIN = "kmajor"   # --pin kmajor=0: every gemv's weight [K, N]; 1 (the default; tc, its name until session 69, too):
                      # one-row gemvs' weights K-major where predicted faster, and 2-8 row gemvs' (tensor-core steps
                      # over K-major weights: [Note: the tensor-core gemv over a K-major weight]); one: one-row gemvs'
                      # alone (the default until session 69); compile_plans passes the bundle's choice as "+"-joined
                      # names (and the word one where it was given)
DECIDING = ("1", "tc", "one")   # the pin's values under which the planner's predictions decide
ONE_ROW = "one"
WINDOW_RULE = "weight[.., c, ..] => weight[.., c] (the window's vector loads along its innermost variable)"


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


def gemv_candidates(plan: Plan, tensor_cores: bool = False) -> tuple[set[str], set[str]]:
    """([Note: the gemv over a K-major weight] in codegen/gemm_gemv.py) the constant [K, N] weights a one-row
    fp16/bf16 gemv of this plan could read K-major (one row, or 2-8 on tensor cores: [Note: the tensor-core gemv over
    a K-major weight] in codegen/gemm_gemv.py), and those a gemv needs [K, N]: one whose rows are not whole 16-byte
    vectors along k.

    A gated (SwiGLU) gemv's weight, its interleaved gate/up pairs, is offered like the others and decided by the
    predictions. From session 47 to 71 a rule kept it [K, N] at one row: K-major it ran 17.7 us against 12.6 (the 1 B
    Llama's, session 47) where the K-major unit's terms of then predicted it faster. With MB ([Note: the K-major
    gemv's register budget]) it no longer lost, nor clearly gained (session 50, an H200, the 4-layer B1 decode plan
    with `--pin kmajor=NAMES` adding the gate/up weights, 7 alternating rounds;
    benchmarks/results/decode_session50_h200.txt, call 5): 158.9 us against 159.6 at the planner's K-major pick (BN
    16, 4 warps, KS 2, U 2), 158.2 with BN 32, 8 warps, KS 2, U 4 pinned; session 59 (9 rounds,
    last_norm_ab_session59_h200.txt) the generate step 0.1571 ms K-major against 0.1562; session 72 (an H100,
    `benchmarks/b1_round.sh gk`, 3 rounds, gk_b1_session72_h100.txt) 192.4 us against 193.9 at the pick, 194.6 at
    BN 32, 8 warps, U 4. The terms now predict the pair slower K-major (the 1 B Llama: 16.08 us against 14.06 before
    the L2 fill's and the tail steps' credits; the plan 182.9 us against 172.3), so the cost keeps it [K, N], as the
    rule did, and `explain` shows both predictions; what the A/Bs say is that those terms read the K-major pair
    about 2 us a layer high (each pair timed alone would fit them; not done: no device time)."""
    maybe: set[str] = set()
    keep: set[str] = set()
    if plan.precision not in ("fp16", "bf16"):
        return maybe, keep
    weights, types = {w.name for w in plan.weights}, plan.types()
    for k in plan.kernels:
        if k.family != "gemm":
            continue
        c, m, n, kk, batch = gemm.dims(k)
        rows = m * math.prod(e for _, e in batch)
        if c.b.buffer not in weights or c.n is None or rows > gemm_gemv.MAX_ROWS:
            continue   # a GEMM of many rows reads either layout (wgmma's transpose bit, mma's ldmatrix)
        t = types[c.b.buffer]
        off = flat_offset(c.b.index, t)
        if len(t.shape) != 2 or off.coeff(c.n) != 1 or off.coeff("r0") != t.shape[-1]:
            continue
        a = flat_offset(c.a.index, types[c.a.buffer])
        fits = kk % gemm_gemv.VEC == 0 and a.coeff("r0") == 1 and a.const % gemm_gemv.VEC == 0
        # 2-8 rows: the tensor-core steps read either layout ([Note: the tensor-core gemv over a K-major weight]);
        # offered unless `--pin kmajor=one`
        (maybe if fits and (rows == 1 or tensor_cores and rows >= gemm_gemv.TC_MIN_ROWS) else keep).add(c.b.buffer)
    return maybe - keep, keep


def gemv_times(plan: Plan, hw: Profile, candidates: set[str],
               pin: Mapping[str, str] | None = None) -> dict[str, tuple[float, float]]:
    """Each of `candidates`: name -> (its readers' best predicted time over the weight [K, N], over it K-major), us,
    among the schedules `pin` leaves them ([Note: a layout under the user's pins]). Readers of the same structure (a
    model's layers, unless a node's own pins set one apart) are ranked once."""
    from aicfc.passes.plan_schedules import node_pins, own_pins, pinned_best, structure
    by_node = node_pins(pin or {})[1]
    times: dict[str, tuple[float, float]] = {}
    seen: dict = {}
    for name in sorted(candidates):
        w = next(w for w in plan.weights if w.name == name)
        shape = w.type.shape[1:] + w.type.shape[:1]
        trial = plan.replace(weights=tuple(Weight(x.name, dataclasses.replace(x.type, shape=shape), x.data)
                                           if x.name == name else x for x in plan.weights))
        before = after = 0.0
        binds = [False, False]
        for k in plan.kernels:
            if not any(ld.buffer == name for op in k.ops for ld in loads(op.body)):
                continue
            moved = k.replace(ops=tuple(dataclasses.replace(op, body=map_loads(
                op.body, lambda ld: _move_last(ld, 0) if ld.buffer == name else ld)) for op in k.ops))
            own = tuple(sorted((key, str(v)) for key, v in own_pins(k, by_node).items()))
            key = (structure(k, plan.types()), structure(moved, trial.types()), own)
            if key not in seen:
                seen[key] = (pinned_best(k, plan, hw, pin), pinned_best(moved, trial, hw, pin))
            (b, b_binds), (a, a_binds) = seen[key]
            before, after = before + b, after + a
            binds = [binds[0] or b_binds, binds[1] or a_binds]
        # [Note: a layout under the user's pins]
        if binds == [False, True] and math.isfinite(after):
            before = math.inf
        elif binds == [True, False] and math.isfinite(before):
            after = math.inf
        times[name] = (before, after)
    return times

# [Note: a layout under the user's pins]
# The layout is decided before the schedules, so it weighs each layout's readers among the schedules the user's `--pin`
# leaves them, as plan_schedules will apply them (a node's own pins always, a plan-wide pin where the reader's space
# has its keys): a layout whose readers the pins leave no schedule is predicted inf (`--pin TC=0` at 2-8 rows, where
# every gemv over a K-major weight is on tensor cores: under session 69's default the pin failed with "no feasible
# gemm candidate", session 72's H100), and where the plan-wide pins bind the readers in one layout alone (`--pin KM=1
# KS=2`: no [K, N] schedule has those keys) and some schedule there meets them, that layout is taken, since the other
# would leave the pins binding nothing.


def _window_wanted(k: Kernel, weights: dict[str, Weight]) -> list[tuple[str, int]]:
    """(weight, dimension) pairs a window kernel reads with that dimension's entry exactly its
    outputs' innermost variable, the only entry that uses it, and not the last
    ([Note: a depthwise weight, channel last])."""
    if k.family != "window" or not k.ops[0].domain_vars:
        return []
    inner = k.ops[0].domain_vars[-1]
    out = []
    for ld in loads(k.ops[0].body):
        if ld.buffer not in weights or len(ld.index) < 2 or not all(isinstance(a, Affine) for a in ld.index):
            continue
        uses = [d for d, a in enumerate(ld.index) if a.coeff(inner)]
        if len(uses) == 1 and uses[0] != len(ld.index) - 1 and ld.index[uses[0]] == Affine.var(inner):
            out.append((ld.buffer, uses[0]))
    return out


def _move_last(ld: Load, dim: int) -> Load:
    return dataclasses.replace(ld, index=ld.index[:dim] + ld.index[dim + 1:] + (ld.index[dim],))


def relayout_weights(plan: Plan, hw: Profile, pin: Mapping[str, str] | None = None) -> Plan:
    """`pin`'s GEMV_PIN: "0" keeps every gemv's weight [K, N]; "1" (the default, or "tc") stores K-major those of
    this plan's one-row and 2-8 row (tensor-core) gemvs predicted faster so (`gemv_times`); "one" those of its
    one-row gemvs alone; a "+"-joined list of weight names (compile_plans' choice for every plan of a bundle, which
    stores one copy; with the word one where it was given) stores those K-major, less those a gemv of this plan
    needs [K, N] (recorded as declined: compile_plans reads them)."""
    weights = {w.name: w for w in plan.weights}
    types = plan.types()
    # weight -> (the dimension moved last, why, rule); the GEMM rule swaps the last two
    wanted: dict[str, tuple[int, str, str]] = {}
    for k in plan.kernels:
        if (w := _wanted(k, plan, weights, types)):
            wanted[w[0]] = (len(weights[w[0]].type.shape) - 2, w[1], RULE)
    choice = str((pin or {}).get(GEMV_PIN, "1"))
    words = set(choice.split("+"))
    maybe, keep = gemv_candidates(plan, ONE_ROW not in words) if choice != "0" else (set(), set())
    times = gemv_times(plan, hw, maybe, pin) if choice in DECIDING else {}
    wants = {name: t for name, t in times.items() if t[1] < t[0]}
    gemv = set(wants) if choice in DECIDING else set() if choice == "0" else words - {"tc", ONE_ROW}
    unknown = sorted(gemv - set(weights))
    if unknown:
        raise AicfError(f"--pin {GEMV_PIN}={choice}: no weight named {unknown[0]!r}; give 0, 1, one or weight names "
                        "joined by +")
    refused = [Rewrite(GEMV_RULE, name, False, "a gemv of this plan needs it [K, N] (2-8 rows under --pin "
                       "kmajor=one: tensor-core steps over [K, N]; or rows not whole 16-byte vectors along k)")
               for name in sorted(gemv & keep)]
    # a candidate the planner predicts no faster K-major: the comparison is the decision's record, as an applied one's
    refused += [Rewrite(GEMV_RULE, name, False, f"its readers' best schedules are predicted no faster over it K-major: "
                        f"{before:.2f} us [K, N] against {after:.2f} ([Note: the gemv over a K-major weight])"
                        if math.isfinite(after) else "the --pin given leaves its readers no schedule over it K-major or "
                        "binds only their schedules over it [K, N] ([Note: a layout under the user's pins])")
                for name, (before, after) in sorted(times.items()) if name not in wants]
    for name in sorted(gemv - keep):
        if name not in wanted and len(weights[name].type.shape) == 2:
            why = (("the --pin given binds its readers' schedules over it K-major alone ([Note: a layout under the "
                    "user's pins])" if not math.isfinite(wants[name][0]) else
                    f"a gemv then adds each column's k-rows in one block, no split-k merge: predicted "
                    f"{wants[name][0]:.2f} -> {wants[name][1]:.2f} us ([Note: the gemv over a K-major weight])")
                   if name in wants else
                   "another plan of the bundle reads it with a gemv over it K-major (one copy of the weights)")
            wanted[name] = (0, why, GEMV_RULE)
    for k in plan.kernels:
        for name, dim in _window_wanted(k, weights):
            if name not in wanted:
                wanted[name] = (dim, "its taps are then one vector along the window's innermost variable", WINDOW_RULE)
    if not wanted:
        return plan.replace(rewrites=plan.rewrites + tuple(refused)) if refused else plan
    records, done = list(refused), {}
    aliased = {v.source for v in plan.views}
    for name, (dim, why, rule) in wanted.items():
        w = weights[name]
        readers = [ld for k in plan.kernels for op in k.ops for ld in loads(op.body) if ld.buffer == name]
        if name in aliased:
            records.append(Rewrite(rule, name, False, "a view reads the weight in its ONNX layout"))
            continue
        if len(w.type.shape) < 2 or any(ld.guard or ld.fill is not None for ld in readers):
            records.append(Rewrite(rule, name, False, "a load of it is guarded or the weight is not a matrix"))
            continue
        done[name] = (dim, rule)
        shape = w.type.shape[:dim] + w.type.shape[dim + 1:] + (w.type.shape[dim],)
        records.append(Rewrite(rule, name, True, f"{why}; stored as [{', '.join(map(str, shape))}]"))
    if not done:
        return plan.replace(rewrites=plan.rewrites + tuple(records))
    return _relaid(plan, done).replace(rewrites=plan.rewrites + tuple(records))


def _relaid(plan: Plan, done: Mapping[str, tuple[int, str]]) -> Plan:
    """`plan` with each weight of `done` (name -> (the dimension moved last, the rule)) so stored and every load
    of it so indexed."""
    new_weights = []
    for w in plan.weights:
        if w.name in done:
            # moved as raw elements of their storage size (bf16 has no numpy type of its own), once for all the
            # plans of a bundle ([Note: weights shared by a bundle's plans] in ir/shared_weights.py)
            axis = done[w.name][0]
            data = remember(("move last", axis, w.type), w.data,
                            lambda w=w, axis=axis: np.ascontiguousarray(np.moveaxis(w.raw(), axis, -1)).tobytes())
            shape = w.type.shape[:axis] + w.type.shape[axis + 1:] + (w.type.shape[axis],)
            w = Weight(w.name, dataclasses.replace(w.type, shape=shape), data)
        new_weights.append(w)

    def load(ld: Load) -> Load:
        return _move_last(ld, done[ld.buffer][0]) if ld.buffer in done else ld
    kernels = []
    for k in plan.kernels:
        rules = tuple(dict.fromkeys(done[ld.buffer][1] for op in k.ops for ld in loads(op.body) if ld.buffer in done))
        kernels.append(k.replace(ops=tuple(dataclasses.replace(op, body=map_loads(op.body, load)) for op in k.ops),
                                 rewrites=k.rewrites + rules))
    return plan.replace(weights=tuple(new_weights), kernels=tuple(kernels))
