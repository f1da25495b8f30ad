"""join_concat: Decision IR → Decision IR; a channel concatenation read only as the A operand of a
Hopper GEMM is not a kernel: the GEMM loads each input's k-blocks from that input (rule RULE).

[Note: a concatenation read by k-blocks]
concat_projections (passes/concat_projections.py) makes a bottleneck block's last 1x1 and its
projection shortcut one GEMM over the two inputs' channels concatenated, and the Concat became a
pointwise kernel that copies both inputs into one buffer (ResNet-50 B32's four: 19.9, 14.3, 6.2 and
3.8 us of an H100's 876 us plan, session 83's profile). The GEMM reads that buffer K-major, one
64-channel k-block a TMA box at a time, so every k-block lies in one input when each input's
channels start and end on a k-block (multiples of BK): the producer then loads k-block kb from
input j's own tensor map at k = kb·BK - c_j, the box lands in the same stage as before and the
consumers see the same tile. Nothing is copied; the GEMM reads the same bytes.

An input read at the result's own pixel gets a tiled map like the GEMM's A (`tma_a` for the first,
`tma_a2`, ... after). A strided projection's input (stages 2-4: x[n, 2·oh, 2·ow, c], read through a
split view of the block's output) is not one tiled walk of the GEMM's flattened pixels, but it is
the TMA's im2col walk of a 1x1 filter with element strides (sh, sw): an im2col map of the image
(`_subsample` finds N, H, W and the strides in the load's flat offset), box BM pixels x 64 channels,
the tile's first pixel (n, sh·oh, sw·ow) computed from m0 as the convolutions' producer does. That
needs the images taken as rows (FLAT = 1) and one A box a tile.

Legal where the Concat kernel is one map of guarded loads along the last axis (`parts`), its result
is read by nothing but that GEMM's A operand (directly or through reshapes that keep the channel
axis innermost) and is no graph output, the GEMM runs on the `wgmma` unit with a TMA-loaded, K-major
A (`gemm_wgmma.operands`), every c_j and C_j is a multiple of BK, and the first input is read at the
result's pixel. Declined, with the reason: an input read transposed (a graph's NCHW input, a B1
plan's channels-first images) or at any other index.

Cost: the Concat kernel's predicted time and its bytes (recorded as bytes_saved); the GEMM's own
prediction does not change (same boxes, same bytes). pipeline.decide_projections weighs a merged
projection without the copy where `joins_by_prediction` says this pass will take it. `--pin
concat=0` keeps the Concat kernel, for an A/B. Measured (session 84, an H100,
benchmarks/results/join_concat_session84_h100.txt, 7 alternating rounds, outputs bit-identical):
ResNet-50 B32's plan 827.4 us against 868.0 with the four Concats kept (1.049x); the joined GEMMs
as fast as before (the stage-2 one 21.8 us against 22.4, stage 3 17.1 / 16.6, stage 4 15.4 / 15.4),
so the strided k-blocks through im2col cost nothing measurable.

    kernel k5 pointwise { %y.cat = map add(load(%h, [i0, i1, i2, i3], fill=-0.0, guard=[3]),
                                           load(%x, [i0, i1, i2, i3-64], fill=-0.0)); store %y.cat }
    kernel k6 gemm { %y.mm = sum[128] mul(load(%y.x, [i0, i1, r0]), load(%w, [i2, r0])) ... }
  becomes
    kernel k6 gemm { same ops; inlined ["y.x"] "..." %y.cat = map add(...) }     (k5 gone)
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from aicfc.codegen.tma import IM2COL_MAX_STRIDE
from aicfc.errors import AicfError
from aicfc.ir.decision import Inlined, Kernel, Plan, Schedule
from aicfc.ir.lowered import Affine, Call, Compute, Load, Rewrite, loads, view_base
from aicfc.ir.types import TensorType

RULE = "Concat read only as a wgmma GEMM's A operand => the GEMM loads each input's k-blocks from that input"
PIN = "concat"   # --pin concat=0: the Concat stays a kernel of its own


def _terms(e) -> list | None:
    """The loads a tree of adds sums, or None where it is anything else."""
    if isinstance(e, Load):
        return [e]
    if isinstance(e, Call) and e.fn == "add":
        out = []
        for a in e.args:
            t = _terms(a)
            if t is None:
                return None
            out += t
        return out
    return None


@dataclass(frozen=True)
class Part:
    """One input of a channel concatenation: channels [c0, c0 + width) of the result, read from `buffer`
    at the result's own pixel (`stride` None), or (`stride` (sh, sw)) from a channels-last image of
    `image` = (N, H, W, C) in `buffer` at pixel (n, sh·oh, sw·ow): a strided 1x1 projection's subsample."""

    buffer: str
    c0: int
    width: int
    stride: tuple[int, int] | None = None
    image: tuple[int, int, int, int] | None = None


def parts(op: Compute, types, base=lambda name: name) -> list[Part] | str:
    """The inputs of `op` in channel order when it is a channel concatenation along its last axis (the
    module docstring), else why not. `base`: a view's source (a subsample is read through a split view)."""
    terms = _terms(op.body)
    if op.combiner != "map" or op.reduce or not terms or len(terms) < 2:
        return "not a map summing loads"
    rank, out = len(op.type.shape), []
    for ld in terms:
        if ld.fill is None or ld.fill != 0.0:
            return f"{ld.buffer!r} is not read as a concatenation's input (guarded, zero fill)"
        shape = types[ld.buffer].shape
        lead = len(ld.index) == rank and all(
            isinstance(a, Affine) and a == Affine.var(f"i{d}") for d, a in enumerate(ld.index[:-1]))
        last = ld.index[-1]
        if lead and shape[:-1] == op.type.shape[:-1] and isinstance(last, Affine) and dict(last.terms) == {f"i{rank - 1}": 1}:
            out.append(Part(ld.buffer, -last.const, shape[-1]))
            continue
        got = _subsample(ld, op.type.shape, types, base)
        if isinstance(got, str):
            return got
        if got.stride == (1, 1) and got.image[1:3] == op.type.shape[1:3]:
            got = Part(got.buffer, got.c0, got.width)   # every pixel of its image, in order: a plain read (of its bytes)
        out.append(got)
    out.sort(key=lambda t: t.c0)
    at = 0
    for part in out:
        if part.c0 != at:
            return "the inputs do not tile the channels"
        at += part.width
    return out if at == op.type.shape[-1] else "the inputs do not tile the channels"


def _subsample(ld: Load, out: tuple[int, ...], types, base) -> Part | str:
    """`ld` as a strided subsample of a channels-last image (Part.stride), or why not: its flat offset
    n·S + oh·R + ow·sw·C + c - c0 over the bytes of `base(ld.buffer)` (N images of C channels a pixel,
    its last dimension), for some image width W and row stride sh with R = sh·W·C (sh = sw first: any
    such factoring reads the same elements) that keeps the walk inside the image."""
    from aicfc.codegen.cexpr import flat_offset
    why = f"{ld.buffer!r} is read at an index that is neither the result's pixel nor a strided subsample of an image"
    src = types[base(ld.buffer)]
    if len(out) != 4 or any(not isinstance(a, Affine) for a in ld.index) or src.nbytes != types[ld.buffer].nbytes:
        return why
    off = flat_offset(ld.index, types[ld.buffer])
    coeff, c0, c = dict(off.terms), -off.const, src.shape[-1]
    if out[0] == 1 and "i0" not in coeff:
        coeff["i0"] = src.numel   # one image: its variable indexes nothing
    if set(coeff) != {"i0", "i1", "i2", "i3"} or coeff["i3"] != 1 or c0 < 0 or coeff["i2"] % c or coeff["i0"] % c:
        return why
    sw, row, pixels = coeff["i2"] // c, coeff["i1"], coeff["i0"] // c
    n = src.numel // coeff["i0"]
    if n != out[0] or not 1 <= sw <= IM2COL_MAX_STRIDE:
        return why
    for sh in dict.fromkeys((sw, *range(1, IM2COL_MAX_STRIDE + 1))):
        if row % (sh * c) or pixels % (row // (sh * c)):
            continue
        w = row // (sh * c)
        h = pixels // w
        if (out[1] - 1) * sh < h and (out[2] - 1) * sw < w:
            return Part(base(ld.buffer), c0, c, (sh, sw), (n, h, w, c))
    return why


def why_not(op: Compute, gemm: Kernel, plan: Plan, names: set[str] | frozenset[str]) -> str | None:
    """Why `gemm` (at its schedule's parameters) cannot read the concatenation `op` by k-blocks, where `names` are
    `op`'s result and its views; None when it can."""
    from aicfc.codegen import gemm as gemm_codegen
    from aicfc.codegen.gemm_wgmma import operands, subsample_map
    types = plan.types()
    got = parts(op, types, view_base(plan.views))
    if isinstance(got, str):
        return got
    if gemm.family != "gemm" or gemm.schedule is None or gemm.schedule.param.get("unit") != "wgmma":
        return f"its reader {gemm.name} is not a Hopper (wgmma) GEMM"
    p = gemm.schedule.param
    c = gemm_codegen.dims(gemm)[0]
    if c.a.buffer not in names:
        return f"{gemm.name} reads it other than as its A operand"
    if sum(ld.buffer in names for op2 in gemm.ops for ld in loads(op2.body)) != 1:
        return f"{gemm.name} reads it more than once"
    t = types[c.a.buffer]
    if t.shape[-1] != op.type.shape[-1] or c.a.index[-1] != Affine.var("r0"):
        return "the GEMM does not read its channels as k, innermost"
    a = operands(gemm, p, types)[0]
    if isinstance(a, str) or not a.k_major:
        return f"{gemm.name}'s A is not a K-major TMA operand"
    if any(part.c0 % p["BK"] or part.width % p["BK"] for part in got):
        return f"an input's channels do not start and end on a k-block of {p['BK']}"
    if got[0].stride is not None:
        return "its first input is a strided subsample (the kernel's first map is a tiled one)"
    if any(part.stride for part in got) and (not p.get("FLAT") or a.boxes != 1 or len(t.shape) != 3):
        return (f"{gemm.name} does not take the images as rows of one box a tile (FLAT = 1), which a subsample's "
                f"im2col walk needs")
    for part in got:
        why = part.stride and subsample_map(part, op.type.shape, p["dtype"], a.box[1], types).problems()
        if why:
            return f"the im2col map of {part.buffer!r}: {why}"
    return None


def _at(gemm: Kernel, params) -> Kernel:
    """`gemm` as if scheduled at `params` (another candidate's): what `why_not` reads of a schedule."""
    return gemm.replace(schedule=Schedule(tuple(sorted(dict(params).items())), (1, 1, 1), (1, 1, 1), 0, None, ()))


def keeps(gemm: Kernel, params, plan: Plan) -> bool:
    """Whether the joined `gemm` may run at `params` (another candidate's: `aicfc tune` renders them), its inlined
    concatenations still read by k-blocks."""
    return all(why_not(i.op, _at(gemm, params), plan, i.names) is None for i in gemm.inlined)


def _direct(e, out: tuple[int, ...], types, base):
    """`e` with each subsample read through a split view read from its image's buffer instead, at the same
    elements (the GEMM's codegen then finds the image and the strides in the load itself)."""
    if isinstance(e, Call):
        return Call(e.fn, tuple(_direct(a, out, types, base) for a in e.args))
    if isinstance(e, Load) and base(e.buffer) != e.buffer:
        part = _subsample(e, out, types, base)
        src = types[base(e.buffer)].shape
        if isinstance(part, Part) and len(src) in (3, 4):
            (sh, sw), (_, _, w, _) = part.stride, part.image
            pix = ((Affine.of({"i1": sh * w, "i2": sw}),) if len(src) == 3
                   else (Affine.of({"i1": sh}), Affine.of({"i2": sw})))
            ld = Load(part.buffer, (Affine.var("i0"),) + pix + (Affine.of({"i3": 1}, -part.c0),), e.fill)
            return dataclasses.replace(ld, guard=tuple(d for d in e.guard if d not in ld.computed_dims))
    return e


def joined_parts(gemm: Kernel, types) -> list[tuple[Part, TensorType | None]]:
    """[(input, the A view's type with its channels)] of a GEMM that reads a joined concatenation
    (`gemm.inlined`): a plain input as the GEMM sees it, its rows those of the A view (None for a
    strided subsample, read through an im2col map of its image)."""
    from aicfc.codegen import gemm as gemm_codegen
    c = gemm_codegen.dims(gemm)[0]
    t = types[c.a.buffer]
    joined = next(i for i in gemm.inlined if c.a.buffer in i.names)
    return [(part, None if part.stride else TensorType(t.dtype, t.shape[:-1] + (part.width,)))
            for part in parts(joined.op, types)]


def _concatenation(k: Kernel) -> bool:
    """Whether `k` is a Concat kernel: one map storing its result, a sum of two or more guarded loads."""
    terms = _terms(k.ops[0].body) if k.family == "pointwise" and len(k.ops) == 1 else None
    return bool(terms) and len(terms) >= 2 and all(ld.fill is not None for ld in terms) and k.stores == (k.ops[0].out,)


def _site(cat: Kernel, kernels, plan: Plan) -> tuple[str | None, set[str], int | None]:
    """(why the Concat kernel `cat` cannot be joined whatever its reader's schedule, or None; its result and
    that result's views; the index in `kernels` of its one reader, where it has one)."""
    base = view_base(plan.views)
    y = cat.ops[0].out
    names = {y, *(v.out for v in plan.views if base(v.out) == y)}
    readers = [j for j, k in enumerate(kernels) if k is not None and k is not cat
               and any(ld.buffer in names for op in k.ops for ld in loads(op.body))]
    if any(base(o) == y for o in plan.outputs):
        return "it is a graph output", names, None
    if len(readers) != 1:
        return f"{len(readers)} kernels read it", names, None
    return None, names, readers[0]


def joins_by_prediction(cat: Kernel, plan: Plan, hw) -> bool:
    """Whether this pass will take the Concat kernel `cat` into its reader, judged before the schedules are
    chosen (pipeline.decide_projections weighs a merged projection so): the reader's best-ranked candidate
    is a wgmma tile that meets `why_not`'s terms."""
    from aicfc.passes.plan_schedules import rank
    if not _concatenation(cat):
        return False
    why, names, j = _site(cat, plan.kernels, plan)
    ranked = rank(plan.kernels[j], plan, hw)[0] if why is None else []
    return bool(ranked) and why_not(cat.ops[0], _at(plan.kernels[j], ranked[0].params), plan, names) is None


def join_concat(plan: Plan, pin: dict | None = None) -> Plan:
    forced = (pin or {}).get(PIN)
    if forced not in (None, "0", "1", 0, 1):
        raise AicfError(f"--pin {PIN}={forced}: expected {PIN}=0 (the Concat a kernel of its own) or {PIN}=1 "
                        f"(joined into its GEMM where legal, the default)")
    base = view_base(plan.views)
    types = plan.types()
    kernels: list[Kernel | None] = list(plan.kernels)
    records: list[Rewrite] = []
    for i, cat in enumerate(plan.kernels):
        if not _concatenation(cat):
            continue
        y = cat.ops[0].out
        why, names, j = _site(cat, kernels, plan)
        if str(forced) == "0":
            why = f"--pin {PIN}=0"
        elif why is None:
            why = why_not(cat.ops[0], kernels[j], plan, names)
        if why is not None:
            records.append(Rewrite(RULE, y, False, why))
            continue
        g = kernels[j]
        got = parts(cat.ops[0], types, base)
        listed = ", ".join(f"{q.buffer} subsampled {q.stride[0]}x{q.stride[1]}" if q.stride else q.buffer for q in got)
        reason = (f"kernel {cat.name} (the Concat of {listed}) joined into {g.name}: its producer "
                  f"loads each input's k-blocks from that input, so the {types[y].nbytes / 1e6:.1f} MB concatenation is "
                  f"neither written nor read back (predicted {cat.schedule.time_us:.2f} us saved)")
        op = dataclasses.replace(cat.ops[0], body=_direct(cat.ops[0].body, cat.ops[0].type.shape, types, base))
        kernels[j] = g.replace(inlined=g.inlined + (Inlined(op, tuple(sorted(names - {y})), reason),),
                               rewrites=tuple(dict.fromkeys(g.rewrites + (RULE,))))
        kernels[i] = None
        records.append(Rewrite(RULE, y, True, reason, 2 * types[y].nbytes))
    if not records:
        return plan
    return plan.replace(kernels=tuple(k for k in kernels if k is not None), rewrites=plan.rewrites + tuple(records))
