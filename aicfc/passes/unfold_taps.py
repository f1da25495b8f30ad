"""unfold_taps: Decision IR → Decision IR; a thin-channel convolution of a graph input (the
stem) reads an input copy whose pixels hold its filter's columns, where that is cheaper.

After `channels_last`, the ResNet stem (3 channels, 7x7, stride 2) reads its input's copy
X'[n, h, w, 8] (the channels padded to one 16-byte run) and sums over k = (kh, kw, c) = 392. Its
k-blocks of 64 are 8 taps of 16 bytes a pixel: the gatherers copy 16-byte runs and the TMA's
im2col mode one 16-byte row a tap, so either moves an eighth of what a k-block of 128-byte rows
would per copy, and the convolution runs at a tenth of the tensor cores' rate (ResNet-50 B32 on
an H200: 169 us, 13.6% of its roofline; benchmarks/results/profile_resnet50_b32_session10_h200.txt).

The rewrite: let the copy hold, for every output column ow, the filter's KW columns side by side,

    U[n, h, ow, s, c] = X[n, c, h, sw·ow + dw·s - pw]      (zero outside X, for c >= C, s >= KW)

with S·Cp = 64 (S = 8 slots of Cp = 8 channels), viewed as U4[n, h, ow, 64]. Then

    y[n, oh, ow, o] = sum over kh, j < 64 of U4[n, sh·oh + dh·kh - ph, ow, j] · W'[o, kh, 0, j]
    W'[o, kh, 0, s·Cp + c] = W[o, kh, s, c]   (zero for s >= KW: 0·x adds nothing)

is the same sum (each (kh, kw, c) term once; the added ones are products with zero weights, and
U reads inside X or zero), a KH x 1 convolution over 64 channels: one 128-byte row a pixel and
tap, which the TMA's im2col mode reads a whole k-block at a time. The copy writes OW·S·Cp elements
a row where the padded copy wrote W·Cp (4x at stride 2 with 8 slots), so this is a cost decision:
the planner's best predicted times of (copy, convolution) both ways; both figures go in the
record (RULE), and `explain` shows them.

Measured (ResNet-50 B32, fp16, H200, both plans in one session: benchmarks/results/
conv_profile_r32{,_fold}_session11_h200.txt): the copy 9.85 -> 33.4 us (3.4 TB/s), the stem
168.3 -> 91.1 us (13.7% -> 50.5% of its roofline; predicted 93.6), the whole plan 1240.7 ->
1180.5 us; onnxruntime's output matched both (max rel err 6.0e-4 / 6.9e-4).

[Note: row phases]
At stride sh > 1 along h (and no dilation there) the copy may hold R = sh image rows too, of the
source's own C channels rather than the padded Cp, where R·S·C' = 64 with S >= KW slots and C' >= C:

    U[n, hh, ow, c, r, s] = X[n, c, R·hh + r - ph, sw·ow + dw·s - pw]     (hh < OH + KQ - 1, KQ = ceil(KH / R))
    y[n, oh, ow, o] = sum over kq, j < 64 of U4[n, oh + kq, ow, j] · W'[o, kq, 0, j]
    W'[o, kq, 0, (c·R + r)·S + s] = W[o, R·kq + r, s, c]     (zero past KH, KW and C)

since kh = R·kq + r reads row sh·oh + kh - ph = R·(oh + kq) + r - ph. The ResNet stem (C = 3, 7x7,
stride 2): R = 2, S = 8, C' = 4, so a pixel's 64 elements hold 42 of the filter's 147 terms where the
columns alone held 21: KQ = 4 k-blocks a tile instead of 7, and the copy has OH + 3 = 115 rows of
the image's 224 (half the bytes). Both variants are planned; the faster predicted one is taken and
the other's figure recorded. `--pin unfold=2` takes it wherever it applies (`unfold=1`: the columns
alone). Measured: benchmarks/results/stem_rows_session22_h200.txt. The channels are the outermost of a
pixel's three indices (since session 87; (r, c, s) before), so the padding channels C..C'-1 are the
row's last (C' - C)·R·S elements: 16 of the stem's 64, one whole k16 step of zeros that a consumer
computing U itself skips ([Note: the stem gathers its input] in codegen/conv_pool.py).

Eligible: a `conv` kernel whose image is the channels-last copy of a graph input made by
`channels_last` (INPUT_RULE) and read by nothing else, whose filter it alone reads, with a
per-tap channel run Cp (the padded channel count) and KW taps along w that fit 64 elements
(KW·Cp <= 64, Cp dividing 64), and whose image index is [n, sh·oh + dh·kh - ph, sw·ow + dw·kw -
pw, c] (a 2-D convolution, channels innermost). Preconditions: after channels_last, before
relayout_weights and plan_schedules. `--pin unfold=0` / `unfold=1` overrides the cost (both
figures are still recorded; `unfold=2` also takes the rows where [Note: row phases] applies); plan_schedules
drops the key.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Affine, Compute, Load, Rewrite, View, loads, map_loads
from aicfc.ir.properties import implicit_gemm, properties
from aicfc.ir.types import TensorType, Weight

if TYPE_CHECKING:
    from aicfc.planner.hardware import Profile

PIN = "unfold"     # --pin unfold=0 keeps the padded copy, unfold=1 unfolds the columns wherever eligible, unfold=2 the rows too
RULE = "conv(x'[n, h, w, c]) => conv(u[n, h, ow, (kw, c)]) (a thin-channel stem's filter columns unfolded into its copy)"
ROW = 64          # elements of a 128-byte row of fp16/bf16: one im2col copy a pixel and tap
TARGET = "sm_90"


@dataclasses.dataclass(frozen=True)
class Rows:
    """The height index sh·oh + dh·kh - ph of an eligible convolution's image ([Note: row phases])."""
    stride: int                 # sh
    dilation: int               # dh
    pad: int                    # ph
    taps: int                   # KH
    out: int                    # OH
    tap_var: str                # kh
    out_var: str                # oh


@dataclasses.dataclass(frozen=True)
class Stem:
    """An eligible convolution: its kernel, the copy kernel it reads, and the geometry."""
    conv: Kernel
    copy: Kernel
    source: str                 # the graph input the copy reads (NCHW)
    filt: str                   # the filter, [O, KH, KW, Cp]
    cp: int                     # channels a tap (padded)
    kw: int                     # filter columns
    stride: int                 # along w
    dilation: int
    pad: int                    # along w (the index's constant, negated)
    out_w: int                  # OW
    kw_var: str
    c_var: str
    channels: int = 0           # the source's own channels (C <= cp)
    rows: Rows | None = None    # where the height index is sh·oh + dh·kh - ph


def _find(k: Kernel, plan: Plan, copies: dict[str, Kernel], readers: dict[str, int]) -> Stem | str:
    if k.family != "conv":
        return "not a convolution"
    g = implicit_gemm(k.ops[0])
    if g is None:
        return "not an implicit GEMM"
    weights = {w.name for w in plan.weights}
    a, b = (g.a, g.b) if g.b.buffer in weights else (g.b, g.a)
    if a.buffer not in copies or b.buffer not in weights:
        return "its image is not a graph input's channels-last copy"
    if readers.get(a.buffer, 0) != 1 or readers.get(b.buffer, 0) != 1:
        return "the copy or the filter has other readers"
    if any(v.source in (a.buffer, b.buffer) for v in plan.views):
        return "a view aliases the copy or the filter"
    copy = copies[a.buffer]
    src = copy.ops[0].body
    if not isinstance(src, Load) or len(src.index) != 4:
        return "the copy is not a plain 4-D move"
    ext = k.ops[0].extents()
    if len(a.index) != 4 or any(not isinstance(x, Affine) for x in a.index):
        return "not a 2-D convolution"
    _, ih, iw, ic = a.index
    if len(ic.terms) != 1 or ic.const or ic.terms[0][1] != 1:
        return "the channel index is not one variable"
    c = ic.terms[0][0]
    cp = ext[c]
    taps = [(v, s) for v, s in iw.terms if v in k.ops[0].reduce_vars]
    outs = [(v, s) for v, s in iw.terms if v in k.ops[0].domain_vars]
    if len(taps) != 1 or len(outs) != 1 or len(iw.terms) != 2:
        return "the width index is not stride·ow + dilation·kw - pad"
    (kwv, dw), (owv, sw) = taps[0], outs[0]
    kw = ext[kwv]
    if ROW % cp or kw * cp > ROW or kw < 2:
        return f"{kw} filter columns of {cp} channels do not fit one {ROW}-element row"
    if any(kwv in dict(x.terms) for x in (a.index[0], ih)):
        return "the filter column indexes another axis"
    bi = b.index
    if len(bi) != 4 or bi[2] != Affine.var(kwv) or bi[3] != Affine.var(c):
        return "the filter is not [o, kh, kw, c] at plain variables"
    rows = None
    khs = [(v, x) for v, x in ih.terms if v in k.ops[0].reduce_vars]
    ohs = [(v, x) for v, x in ih.terms if v in k.ops[0].domain_vars]
    if len(khs) == 1 and len(ohs) == 1 and len(ih.terms) == 2 and bi[1] == Affine.var(khs[0][0]):
        (khv, dh), (ohv, sh) = khs[0], ohs[0]
        rows = Rows(sh, dh, -ih.const, ext[khv], ext[ohv], khv, ohv)
    return Stem(k, copy, src.buffer, b.buffer, cp, kw, sw, dw, -iw.const, ext[owv], kwv, c,
                plan.types()[src.buffer].shape[1], rows)


def row_phases(st: Stem) -> int:
    """R > 1 where the copy can also hold R consecutive image rows a pixel ([Note: row phases]):
    the height index is sh·oh + kh - ph with sh = R > 1, and R rows of the filter's columns of the
    source's channels fit one row (`_slots`); else 1."""
    if st.rows is None:
        return 1
    sh = st.rows.stride
    return sh if sh > 1 and st.rows.dilation == 1 and _slots(st, sh) is not None else 1


def _slots(st: Stem, r: int) -> tuple[int, int] | None:
    """(slots S >= KW, channels C' >= C) with r·S·C' = ROW, the fewest channels first; None if none."""
    for ch in (d for d in range(1, ROW + 1) if ROW % d == 0 and d >= st.channels):
        if ROW % (r * ch) == 0 and ROW // (r * ch) >= st.kw:
            return ROW // (r * ch), ch
    return None


def _rewritten(plan: Plan, st: Stem, r: int = 1) -> Plan:
    """The plan with `st`'s copy and convolution unfolded (see the module note); with r > 1 the copy
    also holds r image rows a pixel ([Note: row phases])."""
    types = plan.types()
    n, _, h, _ = types[st.source].shape
    slots, ch = _slots(st, r) if r > 1 else (ROW // st.cp, st.cp)
    taps = -(-st.rows.taps // r) if r > 1 else 0   # KQ: the rows' taps a pixel's r rows leave
    name = f"{st.source}.unfold"
    v = [Affine.var(f"i{d}") for d in range(6)]
    if r == 1:
        ut = TensorType(types[st.source].dtype, (n, h, st.out_w, slots, ch))
        col = Affine.of({"i2": st.stride, "i3": st.dilation}, -st.pad)
        index = (v[0], v[4], v[1], col)
        rows_out = h
    else:
        rows_out = st.rows.out + taps - 1
        # slots innermost: a thread's vector is a run of the source's columns (channels innermost, as for
        # r = 1, measured 64.3 us against 33 for the columns' copy at B32: each thread read 3 lone values)
        # the channels outermost: the padding channels' elements last in the row, a whole k16 step for the stem
        ut = TensorType(types[st.source].dtype, (n, rows_out, st.out_w, ch, r, slots))
        index = (v[0], v[3], Affine.of({"i1": r, "i4": 1}, -st.rows.pad),
                 Affine.of({"i2": st.stride, "i5": st.dilation}, -st.pad))
    op = Compute(name, ut, "map", (), Load(st.source, index, 0.0, (1,)), ())
    copy = Kernel("", "pointwise", (op,), (tuple((x, Affine.var(x)) for x in op.domain_vars),), (name,),
                  properties(op), st.copy.rewrites + (RULE,))
    view = View(f"{name}.rows", TensorType(ut.dtype, (n, rows_out, st.out_w, ROW)), name)
    conv = st.conv.ops[0]
    pos = {x: i for i, x in enumerate(conv.reduce_vars)}

    def load(ld: Load) -> Load:
        if ld.buffer == st.copy.ops[0].out:
            row = ld.index[1] if r == 1 else Affine.of({st.rows.out_var: 1, st.rows.tap_var: 1})
            return dataclasses.replace(ld, buffer=view.out, index=(ld.index[0], row, Affine.var(
                next(x for x, _ in ld.index[2].terms if x in conv.domain_vars)), ld.index[3]))
        return ld
    reduce = list(conv.reduce)
    reduce[pos[st.c_var]], reduce[pos[st.kw_var]] = ROW, 1
    if r > 1:
        reduce[pos[st.rows.tap_var]] = taps
    new = dataclasses.replace(conv, body=map_loads(conv.body, load), reduce=tuple(reduce))
    kernel = st.conv.replace(ops=(new,) + st.conv.ops[1:], rewrites=st.conv.rewrites + (RULE,))
    weights = []
    for wt in plan.weights:
        if wt.name == st.filt:
            arr = wt.raw()
            if r == 1:
                arr = np.pad(arr, [(0, 0), (0, 0), (0, slots - st.kw), (0, 0)])
                arr = np.ascontiguousarray(arr.reshape(arr.shape[0], arr.shape[1], 1, ROW))
            else:   # W'[o, kq, (c, p, s)] = W[o, r·kq + p, s, c]: zero past KH, KW and the source's channels
                o, kh = arr.shape[:2]
                out = np.zeros((o, taps, ch, r, slots), arr.dtype)
                full = np.zeros((o, taps * r, st.channels, st.kw), arr.dtype)
                full[:, :kh] = arr[:, :, :, :st.channels].transpose(0, 1, 3, 2)
                out[:, :, :st.channels, :, :st.kw] = full.reshape(o, taps, r, st.channels, st.kw).transpose(0, 1, 3, 2, 4)
                arr = np.ascontiguousarray(out.reshape(o, taps, 1, ROW))
            wt = Weight(wt.name, dataclasses.replace(wt.type, shape=tuple(arr.shape)), arr.tobytes())
        weights.append(wt)
    kernels = []
    for k in plan.kernels:
        if k is st.copy:
            kernels.append(copy.replace(name=k.name))
        elif k is st.conv:
            kernels.append(kernel)
        else:
            kernels.append(k)
    return plan.replace(kernels=tuple(kernels), weights=tuple(weights), views=plan.views + (view,))


def unfold_taps(plan: Plan, pin: dict | None = None, hw: Profile | None = None) -> Plan:
    """`hw`: the profile plan_schedules will plan with (`--profile`; None: the target's own)."""
    if plan.target != TARGET or plan.precision not in ("fp16", "bf16"):
        return plan
    forced = (pin or {}).get(PIN)
    if forced is not None and str(forced) not in ("0", "1", "2"):
        from aicfc.errors import AicfError
        raise AicfError(f"--pin {PIN}={forced}: expected {PIN}=0 (keep the padded copy), {PIN}=1 (unfold the "
                        f"filter's columns) or {PIN}=2 (and the rows of a strided one where it can)")
    from aicfc.passes.channels_last import INPUT_RULE
    inputs = {v.name for v in plan.inputs}
    copies = {k.ops[0].out: k for k in plan.kernels if k.family == "pointwise" and INPUT_RULE in k.rewrites
              and isinstance(k.ops[0].body, Load) and k.ops[0].body.buffer in inputs}
    if not copies:
        return plan
    readers: dict[str, int] = {}
    for k in plan.kernels:
        for b in {ld.buffer for op in k.ops for ld in loads(op.body)}:
            readers[b] = readers.get(b, 0) + 1
    from aicfc.passes.plan_schedules import fastest
    from aicfc.planner.hardware import load_profile
    hw = hw or load_profile(plan.target)

    def best(p: Plan, k: Kernel) -> float:
        return fastest(k, p, hw)
    records = []
    for k in plan.kernels:
        reads = {ld.buffer for op in k.ops for ld in loads(op.body)}
        if not reads & set(copies):
            continue
        st = _find(k, plan, copies, readers)
        if isinstance(st, str):
            source = next(copies[b].ops[0].body.buffer for b in sorted(reads & set(copies)))
            records.append(Rewrite(RULE, source, False, f"convolution {k.name}: {st}"))
            continue
        t_old = best(plan, st.copy) + best(plan, st.conv)
        variants = {}   # rows a pixel -> (plan, predicted us)
        for r in sorted({1, row_phases(st)}):
            new = _rewritten(plan, st, r)
            nk = {x.name: x for x in new.kernels}
            variants[r] = (new, best(new, nk[st.copy.name]) + best(new, nk[st.conv.name]))
        r_best = min(variants, key=lambda r: (variants[r][1], r))
        if forced is not None and str(forced) != "0":
            r_best = max(r for r in variants if r == 1 or str(forced) == "2")
        new, t_new = variants[r_best]
        numbers = (f"predicted {t_new:.2f} us for the unfolded copy and convolution against {t_old:.2f} us "
                   f"for the padded copy and {st.cp}-channel taps"
                   + "".join(f", {t:.2f} us with {r} image row{'s' if r > 1 else ''} a pixel"
                             for r, (_, t) in sorted(variants.items()) if r != r_best))
        types = new.types()
        grown = types[f"{st.source}.unfold"].nbytes - plan.types()[st.copy.ops[0].out].nbytes
        how = f"; --pin {PIN}={forced}" if forced is not None else ""
        if (t_new < t_old if forced is None else str(forced) != "0"):
            what = (f"{st.kw} filter columns of {st.cp} channels" if r_best == 1 else
                    f"{r_best} image rows of {st.kw} filter columns of {st.channels} channels ([Note: row phases])")
            records.append(Rewrite(RULE, st.source, True, f"{what} in one {ROW}-element row a pixel; {numbers}{how}",
                                   -grown))
            plan = new
        else:
            records.append(Rewrite(RULE, st.source, False, f"kept the padded copy: {numbers}{how}"))
    return plan.replace(rewrites=plan.rewrites + tuple(records)) if records else plan
