"""pool_epilogue: Decision IR → Decision IR; a convolution and the max pool that alone reads its
result become one kernel, where the `pool` unit can run it and the planner predicts it faster.

ResNet's stem stores 112x112x64 pixels an image that only the 3x3, stride-2 max pool reads; the pool
keeps a quarter of them. One kernel that computes the convolution's pixels of a tile of pooled
pixels and pools them in shared memory ([Note: pooled tiles] in codegen/conv_pool.py) writes the
quarter alone and reads nothing back: at B32, 51 MB less stored and 51 MB less read.

Eligible: a `conv` kernel whose one stored tensor (its epilogue's result) is read by exactly one
other kernel, a `window` kernel of one op that `conv_pool.pool_window` accepts (a 3x3, stride-2 max
with one pixel of -inf padding over [n, h, w, c]), neither a graph output nor the source of a view.
The merged kernel keeps the convolution's name and position, its ops followed by the pool's, and
stores the pool's result; the window kernel goes. A cost decision: the planner's best predicted time
of the merged kernel against the two apart, both in the record (RULE); `--pin pooled=0` keeps
them apart, `pooled=1` merges wherever `conv_pool` can run the result.

Preconditions: after `channels_last` and `unfold_taps` (the stem's copy and 64-element rows decided),
before `relayout_weights` and `plan_schedules`. A plan-wide `--pin unit=X` of another unit keeps them apart.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from aicfc.codegen import conv_pool, conv_wgmma
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Rewrite
from aicfc.passes.merge_kernels import decide, declined_for_unit, kernel_readers, switch

if TYPE_CHECKING:
    from aicfc.planner.hardware import Profile

PIN = "pooled"
RULE = "conv(x) -> maxpool => one kernel (the convolution's pixels pooled in shared memory)"


def _merged(conv: Kernel, pool: Kernel) -> Kernel:
    return conv.replace(ops=conv.ops + pool.ops, binds=conv.binds + pool.binds, stores=pool.stores,
                        properties=tuple(dict.fromkeys(conv.properties + pool.properties)),
                        rewrites=conv.rewrites + (RULE,))


def _pairs(plan: Plan) -> list[tuple[Kernel, Kernel | str]]:
    """(convolution, its pool kernel or why it has none) for every conv kernel whose result a window
    kernel of a max reads."""
    readers = kernel_readers(plan)
    viewed = {v.source for v in plan.views}
    out = []
    for k in plan.kernels:
        if k.family != "conv" or len(k.stores) != 1:
            continue
        users = readers.get(k.stores[0], [])
        if not any(u.family == "window" and u.ops[0].combiner == "max" for u in users):
            continue   # no max pool reads it (a depthwise convolution, an average pool: not this rewrite's)
        res = k.stores[0]
        if len(users) != 1:
            out.append((k, f"{res!r} has {len(users)} readers"))
        elif res in plan.outputs or res in viewed:
            out.append((k, f"{res!r} is a graph output or a view's source"))
        elif len(users[0].ops) != 1 or users[0].stores != (users[0].ops[0].out,):
            out.append((k, f"kernel {users[0].name} is more than the pool"))
        else:
            why = conv_pool.pool_window(users[0].ops[0], res)
            out.append((k, why or users[0]))
    return out


def pool_epilogue(plan: Plan, pin: dict | None = None, hw: Profile | None = None) -> Plan:
    """`hw`: the profile plan_schedules will plan with (`--profile`; None: the target's own)."""
    if plan.target != conv_wgmma.TARGET or plan.precision not in ("fp16", "bf16"):
        return plan
    forced = switch(pin, PIN, "the convolution and the pool apart", "one kernel wherever the pool unit runs it")
    pairs = _pairs(plan)
    if not pairs:
        return plan
    declined = declined_for_unit(pin, "pool", forced, RULE,
                                 [(conv.stores[0], f"convolution {conv.name}") for conv, _ in pairs])
    if declined:
        return plan.replace(rewrites=plan.rewrites + declined)
    from aicfc.planner.hardware import load_profile
    hw = hw or load_profile(plan.target)
    records = []
    for conv, pool in pairs:
        if isinstance(pool, str):
            records.append(Rewrite(RULE, conv.stores[0], False, f"convolution {conv.name}: {pool}"))
            continue
        merged = _merged(conv, pool)
        new = plan.replace(kernels=tuple(merged if k.name == conv.name else k for k in plan.kernels
                                         if k.name != pool.name))
        why = conv_pool.why_not(merged, new)
        if why:
            records.append(Rewrite(RULE, conv.stores[0], False, f"convolution {conv.name}: {why}"))
            continue
        plan, record = decide(plan, new, conv, pool, merged, RULE, conv.stores[0], "pooling its tiles", forced, PIN, hw)
        records.append(record)
    return plan.replace(rewrites=plan.rewrites + tuple(records))
