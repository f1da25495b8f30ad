"""channels_last: Decision IR → Decision IR; the tensors of a convolution chain stored
channels-last (NHWC) where that lets the Hopper engine's implicit GEMM run the convolution.

The layout of an intermediate tensor is the compiler's: moving its channel axis (axis 1) to the
end, X[n, c, s..] => X'[n, s.., c], and moving index entry 1 of every access of it to the end
with it, is an identity (each access reads the element it read). A kernel that writes such a
tensor iterates over the new shape instead: its loop variables are renamed (i1 -> the last, the
others one down), a bijection of its domain, so every value it computes is the same. Views
that only reshape the spatial axes ([n, c, h·w] of [n, c, h, w], the 1x1 convolutions that
became matrix products) keep reading the same elements after the same move. Constant filters
W[o, c, kh, kw] move the same way, W'[o, kh, kw, c], at compile time.

Why (`codegen/conv_wgmma.py`): the implicit GEMM on wgmma flattens k = (kh, kw, c) with c
innermost, so a k-block of an A row (an output pixel) is 16-byte runs of the input's channels,
which the producer gathers with `cp.async` into the swizzled layout wgmma reads, and B is the
[OC, KH·KW·C] filter, K-major, loaded by the TMA. Under NCHW neither holds and the convolution
stays on `mma.sync`, gathering element by element.

Rules (records `Rewrite(rule, tensor, applied, reason, bytes)`; the bytes are what the decision
adds to the plan's traffic: 0 for a relabelled intermediate, the copy's read and write for an
input):
- RULE: an intermediate read by an eligible convolution as its image, or written by one, is
  stored NHWC when its writer kernel can be renamed (every op of it a rank-4 compute whose
  stored outputs are intermediates too) and every view of it reshapes only spatial axes;
  else declined with the reason (a graph input/output keeps ONNX's layout: the interface).
- INPUT_RULE: a graph input read by an eligible convolution is copied once to NHWC by a
  `pointwise` kernel (read + write of the tensor: its predicted bytes), and the convolution
  reads the copy, where that pays for itself: the planner's best predicted times of the
  convolutions reading the copy plus the copy's must beat those of the same convolutions
  reading the input NCHW (on their old schedules); both figures are in the record. `--pin
  unit=wgmma` (or `unit=taps`) makes every copy; `--pin unit=stem` (or `NODE:unit=stem`) keeps the
  inputs of the convolutions it pins NCHW (codegen/conv_stem.py reads either layout).
- WEIGHT_RULE: the filter of every convolution whose image is now NHWC.
- ROWS_RULE: a 1x1 convolution's GEMM written channels-last takes the image as its first
  operand (`pixels_as_rows`) where the planner's best predicted time of that orientation is
  no worse than the other's; both figures are in the record.

Eligible: target sm_90, precision fp16/bf16, a `conv` kernel whose contraction is one image
load X[i0, c, h(..), w(..)] (c a reduction variable used nowhere else in the index) times one
constant filter W[o, c, kh, kw] with C % 8 == 0 (16-byte runs of fp16/bf16), or any C where X is
a graph input and the filter is read by this convolution alone (the stem, C = 3): the input's
copy then writes C rounded up to a multiple of 8 channels, zeros past C, the filter gets as many
zero channels at compile time and the convolution sums over them (0·0 adds nothing); whether
that copy pays is the cost decision above. Grouped and depthwise convolutions read X at
c + g·C/G: not eligible (they stay on the `conv` / `window` families).

Preconditions: after apply_precision (dtypes final), before relayout_weights and plan_schedules.

    kernel k0 conv { y[i0, i1, i2, i3] = sum mul(load(x, [i0, r0, i2+r1-1, i3+r2-1]), load(w, [i1, r0, r1, r2])) }
  becomes (x an intermediate of [2, 64, 14, 14], y too)
    kernel k0 conv { y[i0, i1, i2, i3] = sum mul(load(x, [i0, i1+r1-1, i2+r2-1, r0]), load(w, [i3, r1, r2, r0])) }
    with x: [2, 14, 14, 64], y: [2, 14, 14, 64], w: [64, 3, 3, 64]
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Mapping

import numpy as np

from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Affine, Compute, Load, Rewrite, loads, map_loads, substitute, view_base
from aicfc.ir.properties import contraction, implicit_gemm, properties
from aicfc.ir.types import TensorType, Weight

if TYPE_CHECKING:
    from aicfc.planner.hardware import Profile

RULE = "x[n, c, s..] => x[n, s.., c] (channels-last for the wgmma implicit GEMM)"
INPUT_RULE = "input x[n, c, s..] => copy to x[n, s.., c] once (channels-last for the wgmma implicit GEMM)"
WEIGHT_RULE = "w[o, c, kh, kw] => w[o, kh, kw, c] (K-major filter for the wgmma implicit GEMM)"
ROWS_RULE = "w[o, c]·x[n, p, c] => x[n, p, c]·w[o, c] (a channels-last 1x1 GEMM: pixels as rows)"
TARGET = "sm_90"
FAMILIES = ("conv", "pointwise", "gemm", "window")   # writers renamed; the others read through moved accesses
CHANNEL_RUN = 8   # channels per 16-byte run of fp16/bf16


def conv_operands(k: Kernel, weights: Mapping[str, Weight]) -> tuple[Load, Load, str] | str:
    """(image load, filter load, the channel's reduction variable) of an eligible convolution,
    in the layout ONNX gives (channel at index 1), or why it is not one."""
    if k.family != "conv":
        return "not a convolution kernel"
    g = implicit_gemm(k.ops[0])
    if g is None:
        return "not an implicit GEMM"
    a, b = g.a, g.b
    if b.buffer not in weights:
        a, b = b, a
    if b.buffer not in weights or a.buffer in weights:
        return "the filter is not a constant"
    if len(a.index) != 4 or len(b.index) != 4 or any(not isinstance(x, Affine) for x in a.index + b.index):
        return "not a 2-D convolution"
    c = a.index[1]
    if len(c.terms) != 1 or c.const or c.terms[0][1] != 1 or not c.terms[0][0].startswith("r"):
        return "the image's channel is not one reduction variable (grouped or depthwise)"
    rc = c.terms[0][0]
    if any(x.coeff(rc) for i, x in enumerate(a.index) if i != 1):
        return "the channel variable indexes a spatial axis too"
    one = k.ops[0].extents()[rc] == 1 and b.index[1] == Affine()   # one channel: the filter reads index 0 there
    if (b.index[1] != c and not one) or any(x.coeff(rc) for i, x in enumerate(b.index) if i != 1):
        return "the filter's channel axis is not the image's"
    if any(x.const or (x.terms and (len(x.terms) != 1 or x.terms[0][1] != 1)) for x in b.index):
        return "the filter is not read at plain variables (or 0)"
    return a, b, rc


def to_last(t: TensorType) -> TensorType:
    s = t.shape
    return dataclasses.replace(t, shape=(s[0],) + s[2:] + (s[1],))


def moved(ld: Load) -> Load:
    """`ld` on the channels-last tensor: index entry 1 moved to the end, its guard with it."""
    r = len(ld.index)
    pos = {0: 0, 1: r - 1} | {d: d - 1 for d in range(2, r)}
    return dataclasses.replace(ld, index=(ld.index[0],) + ld.index[2:] + (ld.index[1],),
                               guard=tuple(sorted(pos[d] for d in ld.guard)))


def renaming(rank: int) -> dict[str, Affine]:
    """Old loop variable -> new one when the domain [n, c, s..] becomes [n, s.., c]."""
    m = {"i1": Affine.var(f"i{rank - 1}")}
    m.update({f"i{d}": Affine.var(f"i{d - 1}") for d in range(2, rank)})
    return m


def _renamed(k: Kernel) -> Kernel:
    """Kernel `k` iterating over its outputs' channels-last domain (its loads not yet moved)."""
    rank = len(k.ops[0].type.shape)
    m = renaming(rank)
    ops = tuple(dataclasses.replace(op, type=to_last(op.type), body=substitute(op.body, m)) for op in k.ops)
    binds = tuple(tuple((m[v].terms[0][0] if v in m else v, a.substitute(m)) for v, a in b) for b in k.binds)
    order = {f"i{d}": d for d in range(rank)}
    binds = tuple(tuple(sorted(b, key=lambda va: (va[0][0] != "i", order.get(va[0], 0), va[0]))) for b in binds)
    return k.replace(ops=ops, binds=binds)


def pixels_as_rows(op: Compute, weights: Mapping[str, Weight]) -> Compute:
    """A 1x1 convolution's product written channels-last, y[n, p, o] = sum_c w[o, c]·x[n, p, c],
    with its factors swapped (x first): the same sums, but the GEMM's m is now the pixel and its n
    the output channel, the stored tensor's contiguous axis. Left as it is, m would be the channel
    and every epilogue element (the store, a residual's load) a lone 2-byte access 256+ bytes from
    its neighbour in the warp; swapped, the epilogue moves two adjacent channels at a time (the
    GEMM families' paired epilogue)."""
    g = contraction(op)
    if g is None or g.a.buffer not in weights or not g.m or g.m != op.domain_vars[-1]:
        return op
    a, b = op.body.args   # type: ignore[union-attr]
    return dataclasses.replace(op, body=dataclasses.replace(op.body, args=(b, a)))


def _why_not_renamed(k: Kernel, plan: Plan) -> str | None:
    interface = set(plan.outputs) | {s.output for s in plan.state} | {v.name for v in plan.inputs}
    shape = k.ops[0].type.shape
    if k.family not in FAMILIES:
        return f"its writer is a {k.family} kernel"
    if any(not isinstance(op, Compute) or op.type.shape != shape for op in k.ops) or len(shape) < 3:
        return "its writer's ops do not share one [n, c, spatial..] domain"
    if k.family == "gemm" and len(k.ops[0].reduce) != 1:
        return "its writer is no plain matrix product"
    bad = [s for s in k.stores if s in interface]
    if bad:
        return f"its writer also stores {bad[0]}, a graph output (ONNX's layout)"
    return None


def _why_not_views(root: str, plan: Plan, base) -> str | None:
    t = plan.types()[root]
    for v in plan.views:
        if base(v.out) == root and v.out in plan.outputs:
            return f"its view {v.out} is a graph output (ONNX's layout)"
        if base(v.out) == root:
            s = v.type.shape
            if len(s) < 3 or s[:2] != t.shape[:2] or math.prod(s[2:]) != math.prod(t.shape[2:]):
                return f"view {v.out} {list(s)} reshapes more than its spatial axes"
    return None


def _padded(t: TensorType) -> TensorType:
    """A channels-last type with its channels padded to whole 16-byte runs."""
    c = -(-t.shape[-1] // CHANNEL_RUN) * CHANNEL_RUN
    return dataclasses.replace(t, shape=t.shape[:-1] + (c,))


def _why_not_readers(root: str, plan: Plan, base) -> str | None:
    """Attention and scatter kernels take their operands in the layouts their schedules were
    written for (TMA boxes, scattered rows): a tensor they read keeps ONNX's."""
    for k in plan.kernels:
        if k.family in ("attention", "scatter") and any(base(ld.buffer) == root for op in k.ops for ld in loads(op.body)):
            return f"{k.name}, a {k.family} kernel, reads it"
    return None


def _copy_kernel(x: str, t: TensorType, name: str) -> Kernel:
    """A pointwise kernel writing input x[n, c, s..] as name[n, s.., c'] (c' >= c: zeros past c)."""
    rank = len(t.shape)
    idx = (Affine.var("i0"), Affine.var(f"i{rank - 1}")) + tuple(Affine.var(f"i{d - 1}") for d in range(2, rank))
    out = _padded(to_last(t))
    pad = out.shape[-1] != t.shape[1]
    op = Compute(name, out, "map", (), Load(x, idx, 0.0 if pad else None, (1,) if pad else ()), ())
    return Kernel("", "pointwise", (op,), (tuple((v, Affine.var(v)) for v in op.domain_vars),), (name,),
                  properties(op), (INPUT_RULE,))


HOPPER_UNITS = ("wgmma", "taps", "pool", "band")   # the convolution units that read NHWC (codegen/conv_wgmma.py, conv_taps.py, conv_pool.py, conv_band.py)
STEM_UNIT = "stem"   # reads its image in either layout and stores channels-last (codegen/conv_stem.py)


def _pinned_stems(plan: Plan, pin: Mapping[str, object], inputs: list[str]) -> dict[str, str]:
    """The graph inputs of `inputs` that a convolution pinned to unit stem (`--pin unit=stem`, or
    `NODE:unit=stem` for a node it covers) reads: kept NCHW, since that unit takes its image as it is and the
    channels-last copy would pad C·KH·KW past what it takes."""
    from aicfc.passes.plan_schedules import node_pins
    every, by_node = node_pins(pin)
    out = {}
    for k in plan.kernels:
        units = [every.get("unit")] + [by_node.get(n, {}).get("unit") for n in k.origins]
        if k.family == "conv" and STEM_UNIT in [str(u) for u in units if u is not None]:
            for ld in (ld for op in k.ops for ld in loads(op.body) if ld.buffer in inputs):
                what = "/".join(k.origins) or k.name
                out[ld.buffer] = f"the convolution {what} is pinned to unit {STEM_UNIT}, which reads it as it is"
    return out


def channels_last(plan: Plan, pin: Mapping[str, object] | None = None, hw: Profile | None = None) -> Plan:
    """`pin` (--pin): with unit=wgmma, taps or pool every input copy is made whatever its cost (the user
    asked for a Hopper unit, which reads NHWC); with unit=stem (plan-wide or on a convolution's node) the
    inputs that convolution reads stay NCHW and the rest is as without the pin; with another unit nothing
    changes. `hw`: the profile plan_schedules will plan with (`--profile`), so the layout is weighed by the
    same predictions (None: the target's own)."""
    unit = (pin or {}).get("unit", "wgmma")
    if plan.target != TARGET or plan.precision not in ("fp16", "bf16") or unit not in HOPPER_UNITS + (STEM_UNIT,):
        return plan   # a --pin of another unit keeps ONNX's layout: the layout is chosen for the Hopper engine
    first = _relabel(plan, {}, {})
    copied = [r.target for r in first.rewrites[len(plan.rewrites):] if r.rule == INPUT_RULE and r.applied]
    from aicfc.passes.plan_schedules import fastest
    from aicfc.planner.hardware import load_profile, plan_gap_us
    hw = hw or load_profile(plan.target)
    if not copied or (unit in HOPPER_UNITS and "unit" in (pin or {})):
        return _orient(first, hw)

    def best(p: Plan, ks: list[Kernel]) -> float:
        return sum(fastest(k, p, hw) for k in ks)
    refused, notes = _pinned_stems(plan, pin or {}, copied), {}
    for x in copied:
        if x in refused:
            continue
        copy = f"{x}.nhwc"
        readers = [k for k in first.kernels if any(ld.buffer == copy for op in k.ops for ld in loads(op.body))]
        writer = [k for k in first.kernels if copy in k.stores]
        without = _relabel(plan, {x: ""}, {})
        origins = {k.origins for k in readers}
        before = [k for k in without.kernels if k.origins in origins]
        # the copy is one more kernel of the plan: its gap too ([Note: launch overhead and the plan gap])
        t_copy = best(first, writer) + len(writer) * plan_gap_us(hw)
        t_with, t_without = best(first, readers), best(without, before)
        numbers = (f"predicted {t_with:.2f} us for its convolutions channels-last + {t_copy:.2f} us for the copy "
                   f"against {t_without:.2f} us reading it NCHW")
        if t_with + t_copy < t_without:
            notes[x] = "; " + numbers
        else:
            refused[x] = f"the copy does not pay for itself: {numbers}"
    return _orient(_relabel(plan, refused, notes), hw)


def _orient(plan: Plan, hw) -> Plan:
    """ROWS_RULE on every GEMM that stores a channels-last tensor: the orientation the planner
    predicts faster (ties to pixels as rows), recorded with both figures."""
    from aicfc.passes.plan_schedules import fastest
    weights = {w.name: w for w in plan.weights}
    done = {r.target for r in plan.rewrites if r.rule == RULE and r.applied}

    def best(k: Kernel) -> float:
        return fastest(k, plan, hw)
    kernels, records = [], []
    for k in plan.kernels:
        op = k.ops[0]
        rows = pixels_as_rows(op, weights) if k.family == "gemm" and RULE in k.rewrites else op
        if rows is op or not set(k.stores) <= done:
            kernels.append(k)
            continue
        swapped = k.replace(ops=(rows,) + k.ops[1:])
        t_rows, t_cols = best(swapped), best(k)
        numbers = f"predicted {t_rows:.2f} us with the pixels as rows against {t_cols:.2f} us with the channels"
        applied = t_rows <= t_cols
        records.append(Rewrite(ROWS_RULE, op.out, applied, numbers if applied else f"kept: {numbers}"))
        kernels.append(swapped.replace(rewrites=swapped.rewrites + (ROWS_RULE,)) if applied else k)
    if not records:
        return plan
    return plan.replace(kernels=tuple(kernels), rewrites=plan.rewrites + tuple(records))


def _relabel(plan: Plan, refused: Mapping[str, str], notes: Mapping[str, str]) -> Plan:
    """The plan with the conv chain channels-last; graph inputs in `refused` are not copied (the
    reason recorded), `notes` end the records of those that are."""
    weights = {w.name: w for w in plan.weights}
    types = plan.types()
    base = view_base(plan.views)
    convs = {k.name: ops for k in plan.kernels if not isinstance(ops := conv_operands(k, weights), str)}
    inputs = {v.name for v in plan.inputs}
    kernel = {k.name: k for k in plan.kernels}
    filter_readers: dict[str, int] = {}
    for k in plan.kernels:
        for w in {ld.buffer for op in k.ops for ld in loads(op.body)} & set(weights):
            filter_readers[w] = filter_readers.get(w, 0) + 1
    aliased = {v.source for v in plan.views}
    padded: dict[str, int] = {}       # kernel -> its channel count padded to whole 16-byte runs
    for kn, (a, b, rc) in list(convs.items()):
        c = kernel[kn].ops[0].extents()[rc]
        if c % CHANNEL_RUN == 0:
            continue
        if a.buffer in inputs and filter_readers[b.buffer] == 1 and b.buffer not in aliased:
            padded[kn] = -(-c // CHANNEL_RUN) * CHANNEL_RUN
        else:
            del convs[kn]   # a tensor written by a kernel is not padded (only an input's copy is)
    if not convs:
        return plan
    writer = {op.out: k for k in plan.kernels for op in k.ops}
    records: list[Rewrite] = []
    wanted: dict[str, str] = {}       # root -> why it should be channels-last
    for k in plan.kernels:
        if k.name in convs:
            what = f"convolution {'/'.join(k.origins) or k.name}"
            wanted.setdefault(base(convs[k.name][0].buffer), f"the image of {what}")
            for s in k.stores:
                wanted.setdefault(s, f"the output of {what}")
    roots: set[str] = set()
    copies: dict[str, str] = {}       # graph input -> its channels-last copy

    def image_like(name: str) -> bool:
        """A rank-4 tensor; or a rank-3 [n, c, h·w] one that a view splits back into an image or
        that a 1x1 convolution's GEMM writes (its axis 1 is the output channel of a constant
        [c', c] weight: `conv_as_matmul`), unlike a token sequence [n, s, d]."""
        shape = types[name].shape
        if len(shape) == 4:
            return True
        if len(shape) != 3:
            return False
        if any(base(v.out) == name and len(v.type.shape) == 4 and v.type.shape[:2] == shape[:2] for v in plan.views):
            return True
        w = writer.get(name)
        return w is not None and w.family == "gemm" and any(
            ld.buffer in weights and ld.index and ld.index[0] == Affine.var("i1") for ld in loads(w.ops[0].body))

    queue, decided = list(wanted.items()), set()
    while queue:
        name, why = queue.pop(0)
        if name in decided:
            continue
        decided.add(name)
        if name in inputs and name in refused:
            records.append(Rewrite(INPUT_RULE, name, False, f"{why}; kept NCHW: {refused[name]}"))
            continue
        if name in inputs:
            copy = f"{name}.nhwc"
            copies[name] = copy
            shape = _padded(to_last(types[name]))
            nbytes = types[name].nbytes * (1 + shape.numel / types[name].numel)
            pad = f" (channels zero-padded to {shape.shape[-1]})" if shape.shape != to_last(types[name]).shape else ""
            records.append(Rewrite(INPUT_RULE, name, True, f"{why}: one copy kernel to {list(shape.shape)}{pad}"
                                   f", {int(nbytes)} bytes read and written{notes.get(name, '')}", -int(nbytes)))
            continue
        if name not in writer:
            continue
        why_not = _why_not_renamed(writer[name], plan)
        for other in writer[name].outs:
            why_not = why_not or _why_not_views(other, plan, base) or _why_not_readers(other, plan, base)
        if why_not:
            records.append(Rewrite(RULE, name, False, f"{why}; kept NCHW: {why_not}"))
            continue
        new = set(writer[name].outs) - roots
        roots |= new
        decided |= new
        records.append(Rewrite(RULE, name, True, f"{why}; its writer {writer[name].name} stores it as "
                               f"{list(to_last(types[name]).shape)}: no copy, 0 bytes added", 0))
        # what the readers of a channels-last tensor write goes channels-last too, and what its writer reads,
        # where they can (no copy either)
        # (images only: a rank-4 tensor, or a rank-3 one a view splits back into one; a token
        # sequence [n, s, d] read from an image stays as it is)
        for k in plan.kernels:
            if k.family in FAMILIES and any(base(ld.buffer) in new for op in k.ops for ld in loads(op.body)):
                queue += [(st, f"written by {k.name}, which reads {name} channels-last") for st in k.stores
                          if st not in decided and image_like(st)]
        w = writer[name]
        queue += [(r, f"read by {w.name}, which writes {name} channels-last")
                  for r in dict.fromkeys(base(ld.buffer) for op in w.ops for ld in loads(op.body))
                  if r not in decided and r not in weights and r not in inputs and r not in w.outs and image_like(r)]
    # every view of a relabelled root moves with it
    moved_names = roots | {v.out for v in plan.views if base(v.out) in roots}
    renamed = {writer[r].name for r in roots}
    # convolutions whose image is now channels-last (or read from a copy): their filters move
    ready = {kn for kn, (a, _, _) in convs.items() if base(a.buffer) in roots or a.buffer in copies}
    filters = {convs[kn][1].buffer for kn in ready}
    pad_to = {convs[kn][1].buffer: padded[kn] for kn in ready if kn in padded}
    for w in sorted(filters):
        if w in aliased:
            records.append(Rewrite(WEIGHT_RULE, w, False, "a view reads the filter in ONNX's layout"))
            filters.discard(w)
            continue
        shape = to_last(weights[w].type).shape
        pad = ""
        if w in pad_to:
            shape = shape[:-1] + (pad_to[w],)
            pad = f", {pad_to[w] - weights[w].type.shape[1]} zero channels added (16-byte runs of the image)"
        records.append(Rewrite(WEIGHT_RULE, w, True, f"stored as {list(shape)} at compile time "
                               f"(k = (kh, kw, c) contiguous: the TMA's B operand){pad}", 0))
    moved_names |= filters

    def mover(redirect: bool):
        def load(ld: Load) -> Load:
            if redirect and ld.buffer in copies:
                return moved(dataclasses.replace(ld, buffer=copies[ld.buffer]))
            return moved(ld) if ld.buffer in moved_names else ld
        return load

    kernels: list[Kernel] = []
    for k in plan.kernels:
        reads = {ld.buffer for op in k.ops for ld in loads(op.body)}
        redirect = k.name in ready
        kernels += [_copy_kernel(x, types[x], copies[x]) for x in copies if x in reads and redirect]
        nk = _renamed(k) if k.name in renamed else k
        ops = tuple(dataclasses.replace(op, body=map_loads(op.body, mover(redirect))) for op in nk.ops)
        if k.name in padded and redirect:
            # the zero channels of the image meet the zero channels of the filter: the sum is unchanged
            rc = int(convs[k.name][2][1:])
            ops = (dataclasses.replace(ops[0], reduce=ops[0].reduce[:rc] + (padded[k.name],) + ops[0].reduce[rc + 1:]),
                   ) + ops[1:]
        touched = k.name in renamed or bool(reads & moved_names) or (redirect and bool(reads & set(copies)))
        kernels.append(nk.replace(ops=ops, rewrites=nk.rewrites + ((RULE,) if touched else ())))
    # a copy is written once, before the first convolution that reads it
    seen: set[str] = set()
    unique = []
    for k in kernels:
        if k.family == "pointwise" and k.ops[0].out in copies.values():
            if k.ops[0].out in seen:
                continue
            seen.add(k.ops[0].out)
        unique.append(k)
    kernels = [k.replace(name=f"k{i}") for i, k in enumerate(unique)]
    views = tuple(dataclasses.replace(v, type=to_last(v.type)) if v.out in moved_names else v for v in plan.views)
    new_weights = []
    for w in plan.weights:
        if w.name in filters:
            # moved as raw elements of their storage size (bf16 has no numpy type of its own)
            arr = np.moveaxis(w.raw(), 1, -1)
            if w.name in pad_to:
                arr = np.pad(arr, [(0, 0)] * (arr.ndim - 1) + [(0, pad_to[w.name] - arr.shape[-1])])
            arr = np.ascontiguousarray(arr)
            w = Weight(w.name, dataclasses.replace(w.type, shape=tuple(arr.shape)), arr.tobytes())
        new_weights.append(w)
    return plan.replace(kernels=tuple(kernels), views=views, weights=tuple(new_weights),
                        rewrites=plan.rewrites + tuple(records))
