"""Import rules of the spatial ops of U-Nets and audio front ends: ConvTranspose and Resize.

ConvTranspose never becomes a graph op of its own. Along each spatial axis (stride s,
dilation d, kernel K, pads pb/pe, output_padding op) it is, exactly, a stride-1 Conv of the
input with s-1 zeros inserted after every element, padded by (K-1)·d - pb before and
(K-1)·d - pe + op - (s-1) after (a negative pad crops), with the filter flipped along every
spatial axis and its two channel axes swapped within each group:

    ConvTranspose(x, W[C, M/g, k..]) = Conv(Pad(Reshape(Pad(Reshape(x, [N, C, H, 1, W, 1]),
                                            s-1 zeros after each unit axis), [N, C, H·s, W·s]), borders),
                                         flip(W viewed [g, C/g, M/g, k..] → [M, C/g, k..]), dilation d)

so it runs as the `conv` family's implicit GEMM (tensor cores at fp16) over the zero-inserted
image, 1-D, 2-D or 3-D alike. Cost, stated honestly: the GEMM multiplies the inserted zeros
too, s^D times the useful multiply-adds (4x for a 2-D stride-2 U-Net up-convolution), and the
padded, zero-inserted image is stored once (s^D times the input); the cost model sees exactly
this Conv, so its predicted time counts that work. A constant filter is flipped at import; a
run-time one (ONNX allows it) through Reshape/Transpose/Slice nodes.

Resize keeps its node with static attributes (`aicfc.ir.resize` says how it lowers): the
scales or sizes (with axes and keep_aspect_ratio_policy) resolved into the output shape and the
per-axis scale of the coordinate transform. tf_crop_and_resize, antialias and run-time scales
or sizes are refused by name.
"""
from __future__ import annotations

import math

import numpy as np

from aicfc.errors import AicfError
from aicfc.frontend.import_rewrites import constant
from aicfc.ir.resize import COORDINATE_MODES, MODES, NEAREST_MODES, axis_tables
from aicfc.ir.types import TensorType, Weight

Step = tuple[str, list[str], str, dict]
REWRITTEN = {"ConvTranspose", "Upsample"}
# The Conv written for a ConvTranspose carries attribute rule=CONV_TRANSPOSE_RULE (`lower` records
# the rewrite with this reason; canonicalize.CANON_REASONS holds it).
CONV_TRANSPOSE_RULE = "ConvTranspose => Conv(zero-inserted input, flipped filter)"
CONV_TRANSPOSE_REASON = ("each output of a transposed convolution sums the inputs whose taps reach it: a stride-1 "
                         "convolution of the input with s-1 zeros inserted after each element, padded by "
                         "(k-1)·d - pad, with the filter flipped and its channel axes swapped per group; the "
                         "implicit GEMM also multiplies the inserted zeros (s^D times the useful multiply-adds)")
# A Resize output is one map summing a term per combination of taps (4^3 for a 3-D cubic).
MAX_TERMS = 64


def _text(at: dict, key: str, default: str) -> str:
    v = at.get(key, default)
    return v.decode() if isinstance(v, bytes) else str(v)


def _ints(at: dict, key: str, default: list[int]) -> list[int]:
    return [int(v) for v in at[key]] if key in at else list(default)


def conv_transpose(origin: str, at: dict, args: list[str], types: dict[str, TensorType],
                   weights: dict[str, Weight], out: str) -> list[Step]:
    x, w = args[0], args[1]
    xs, ws = types[x].shape, types[w].shape
    nd = len(xs) - 2
    if not 1 <= nd <= 3 or len(ws) != len(xs):
        raise AicfError(f"node {origin!r}: ConvTranspose of a rank-{len(xs)} input with a rank-{len(ws)} filter; "
                        "1-D, 2-D and 3-D inputs with a filter of the same rank are supported")
    g = int(at.get("group", 1))
    c, mg = xs[1], ws[1]
    if g < 1 or c % g or ws[0] != c:
        raise AicfError(f"node {origin!r}: ConvTranspose filter {list(ws)} does not fit input {list(xs)} "
                        f"with group {g}")
    ks = _ints(at, "kernel_shape", ws[2:])
    if ks != list(ws[2:]):
        raise AicfError(f"node {origin!r}: ConvTranspose kernel_shape {ks} differs from the filter's {list(ws[2:])}")
    ss, ds = _ints(at, "strides", [1] * nd), _ints(at, "dilations", [1] * nd)
    ops = _ints(at, "output_padding", [0] * nd)
    if len(ss) != nd or len(ds) != nd or len(ops) != nd or min(ss + ds) < 1 or min(ops) < 0:
        raise AicfError(f"node {origin!r}: ConvTranspose strides {ss}, dilations {ds}, output_padding {ops} "
                        f"need {nd} positive (non-negative) entries")
    span = [(k - 1) * d + 1 for k, d in zip(ks, ds)]
    full = [s * (n - 1) + p + e for s, n, p, e in zip(ss, xs[2:], ops, span)]
    auto = _text(at, "auto_pad", "NOTSET")
    if auto not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise AicfError(f"node {origin!r}: ConvTranspose auto_pad {auto!r} is not one of NOTSET, SAME_UPPER, "
                        "SAME_LOWER, VALID")
    shape = _ints(at, "output_shape", [])
    if len(shape) == nd + 2:
        shape = shape[2:]
    if not shape and auto in ("SAME_UPPER", "SAME_LOWER"):
        shape = [n * s for n, s in zip(xs[2:], ss)]
    if shape:   # the pads follow from the output shape (ONNX: output_shape wins over pads)
        if len(shape) != nd:
            raise AicfError(f"node {origin!r}: ConvTranspose output_shape {shape} for {nd} spatial axes")
        total = [f - o for f, o in zip(full, shape)]
        if auto == "SAME_UPPER":
            pads = [t // 2 for t in total] + [t - t // 2 for t in total]
        else:
            pads = [t - t // 2 for t in total] + [t // 2 for t in total]
    elif auto == "VALID":
        pads = [0] * (2 * nd)
    else:
        pads = _ints(at, "pads", [0] * (2 * nd))
    if len(pads) != 2 * nd:
        raise AicfError(f"node {origin!r}: ConvTranspose pads {pads} do not have {2 * nd} entries")
    if any(f - pads[a] - pads[a + nd] < 1 for a, f in enumerate(full)):
        raise AicfError(f"node {origin!r}: ConvTranspose pads {pads} leave an empty output")
    steps: list[Step] = []
    n, cur, cur_shape = xs[0], x, tuple(xs)

    def add(op: str, attrs: dict, new_shape: tuple[int, ...], extra: tuple[str, ...] = ()) -> None:
        nonlocal cur, cur_shape
        name = f"{origin}.convT{len(steps)}"
        steps.append((op, [cur, *extra], name, attrs))
        cur, cur_shape = name, tuple(new_shape)

    if any(s > 1 for s in ss):   # zero insertion: a unit axis after each strided one, padded by s-1
        spread = (n, c) + tuple(d for v, s in zip(xs[2:], ss) for d in ((v, 1) if s > 1 else (v,)))
        add("Reshape", {"shape": spread}, spread)
        rank = len(spread)
        grow = [0] * (2 * rank)
        axis = 2
        for s in ss:
            if s > 1:
                grow[axis + 1 + rank] = s - 1
                axis += 2
            else:
                axis += 1
        wide = tuple(d + grow[a + rank] for a, d in enumerate(spread))
        add("Pad", {"pads": tuple(grow), "value": 0.0}, wide)
        inserted = (n, c) + tuple(v * s for v, s in zip(xs[2:], ss))
        add("Reshape", {"shape": inserted}, inserted)
    borders = [(k - 1) * d - pads[a] for a, (k, d) in enumerate(zip(ks, ds))]
    borders += [(k - 1) * d - pads[a + nd] + ops[a] - (s - 1) for a, (k, d, s) in enumerate(zip(ks, ds, ss))]
    if any(borders):
        padded = (n, c) + tuple(v + borders[a] + borders[a + nd] for a, v in enumerate(cur_shape[2:]))
        add("Pad", {"pads": (0, 0) + tuple(borders[:nd]) + (0, 0) + tuple(borders[nd:]), "value": 0.0}, padded)
    filt = _filter(origin, w, ws, g, weights, types, steps)
    conv = {"kernel_shape": tuple(ks), "strides": (1,) * nd, "dilations": tuple(ds), "pads": (0,) * (2 * nd),
            "group": g, "rule": CONV_TRANSPOSE_RULE}
    steps.append(("Conv", [cur, filt] + args[2:3], out, conv))
    return steps


def _filter(origin: str, w: str, ws: tuple[int, ...], g: int, weights: dict[str, Weight],
            types: dict[str, TensorType], steps: list[Step]) -> str:
    """W [C, M/g, k..] as a Conv filter [M, C/g, k..], flipped along every spatial axis."""
    c, mg, ks = ws[0], ws[1], tuple(ws[2:])
    cg = c // g
    nd = len(ks)
    name = f"{origin}.convT_filter"
    if w in weights:
        a = weights[w].array().reshape((g, cg, mg) + ks).swapaxes(1, 2).reshape((g * mg, cg) + ks)
        a = np.ascontiguousarray(a[(slice(None), slice(None)) + (slice(None, None, -1),) * nd])
        return constant(weights, types, name, a)
    grouped = (g, cg, mg) + ks
    flat = (g * mg, cg) + ks
    chain = [("Reshape", {"shape": grouped}), ("Transpose", {"perm": (0, 2, 1) + tuple(range(3, 3 + nd))}),
             ("Reshape", {"shape": flat}),
             ("Slice", {"starts": (0, 0) + tuple(k - 1 for k in ks), "steps": (1, 1) + (-1,) * nd, "shape": flat})]
    cur = w
    for k, (op, attrs) in enumerate(chain):
        out = f"{name}{k}"
        steps.append((op, [cur], out, attrs))
        cur = out
    return cur


def resize_attrs(at: dict, args: list[str], types: dict[str, TensorType], weights: dict[str, Weight],
                 opset: int, origin: str) -> dict:
    """`args` positional (an empty name for an absent input): X, roi, scales, sizes (X, scales
    before opset 11)."""
    shape = types[args[0]].shape
    rank = len(shape)
    mode = _text(at, "mode", "nearest")
    if opset < 11:
        coord, nearest, scale_in, size_in = "asymmetric", "floor", (args[1] if len(args) > 1 else ""), ""
    else:
        coord = _text(at, "coordinate_transformation_mode", "half_pixel")
        nearest = _text(at, "nearest_mode", "round_prefer_floor")
        scale_in = args[2] if len(args) > 2 else ""
        size_in = args[3] if len(args) > 3 else ""
    if mode not in MODES:
        raise AicfError(f"node {origin!r}: Resize mode {mode!r} is not one of {', '.join(MODES)}")
    if coord not in COORDINATE_MODES:
        raise AicfError(f"node {origin!r}: Resize coordinate_transformation_mode {coord!r} is not supported; "
                        f"{', '.join(COORDINATE_MODES)} are")
    if nearest not in NEAREST_MODES:
        raise AicfError(f"node {origin!r}: Resize nearest_mode {nearest!r} is not one of {', '.join(NEAREST_MODES)}")
    if int(at.get("antialias", 0)):
        raise AicfError(f"node {origin!r}: Resize with antialias=1 is not supported")
    axes = [int(a) for a in at.get("axes", range(rank))]
    axes = [a + rank if a < 0 else a for a in axes]
    if sorted(set(axes)) != sorted(axes) or any(not 0 <= a < rank for a in axes):
        raise AicfError(f"node {origin!r}: Resize axes {list(at.get('axes'))} are not distinct axes of rank {rank}")

    def constant(name: str, what: str) -> np.ndarray:
        if name not in weights:
            raise AicfError(f"node {origin!r}: Resize {what} is computed at run time; only a constant is supported")
        return weights[name].array().reshape(-1)
    scales_given = constant(scale_in, "scales").astype(np.float64) if scale_in else np.zeros(0)
    sizes_given = constant(size_in, "sizes").astype(np.int64) if size_in else np.zeros(0, np.int64)
    if (scales_given.size > 0) == (sizes_given.size > 0):
        raise AicfError(f"node {origin!r}: Resize needs exactly one of scales and sizes")
    scales, out = [1.0] * rank, list(shape)
    if scales_given.size:
        if scales_given.size != len(axes) or np.any(scales_given <= 0):
            raise AicfError(f"node {origin!r}: Resize scales {scales_given.tolist()} for axes {axes}: one positive "
                            "scale per axis")
        for a, s in zip(axes, scales_given):
            scales[a], out[a] = float(s), int(np.floor(shape[a] * float(s)))
    else:
        if sizes_given.size != len(axes) or np.any(sizes_given <= 0):
            raise AicfError(f"node {origin!r}: Resize sizes {sizes_given.tolist()} for axes {axes}: one positive "
                            "size per axis")
        policy = _text(at, "keep_aspect_ratio_policy", "stretch")
        ratios = [int(m) / shape[a] for a, m in zip(axes, sizes_given)]
        if policy == "stretch":
            for a, m, r in zip(axes, sizes_given, ratios):
                scales[a], out[a] = r, int(m)
        elif policy in ("not_larger", "not_smaller"):
            common = min(ratios) if policy == "not_larger" else max(ratios)
            for a in axes:
                scales[a], out[a] = common, int(common * shape[a] + 0.5)
        else:
            raise AicfError(f"node {origin!r}: Resize keep_aspect_ratio_policy {policy!r} is not one of stretch, "
                            "not_larger, not_smaller")
    if any(m < 1 for m in out):
        raise AicfError(f"node {origin!r}: Resize to {out} gives an empty tensor")
    attrs = {"mode": mode, "coordinate_transformation_mode": coord, "nearest_mode": nearest,
            "cubic_coeff_a": float(at.get("cubic_coeff_a", -0.75)), "exclude_outside": int(at.get("exclude_outside", 0)),
            "scales": tuple(scales), "shape": tuple(out)}
    terms = math.prod(idx.shape[1] for idx, _ in axis_tables(shape, attrs).values())
    if terms > MAX_TERMS:
        raise AicfError(f"node {origin!r}: Resize {mode} over {len(axis_tables(shape, attrs))} axes reads {terms} "
                        f"inputs per output; at most {MAX_TERMS} are supported")
    return attrs


def upsample(origin: str, at: dict, args: list[str], types: dict[str, TensorType], weights: dict[str, Weight],
             out: str) -> list[Step]:
    """Upsample (opsets 7-9, deprecated since 10) is Resize as opset 10 defines it: asymmetric coordinates,
    nearest rounding down; its scales an input (opset 9) or an attribute (opset 7), constant either way."""
    if "scales" in at:
        args = [args[0], constant(weights, types, f"{origin}.scales", np.asarray(at["scales"], dtype=np.float32))]
    if len(args) < 2:
        raise AicfError(f"node {origin!r}: Upsample without scales; give them as the second input or the attribute")
    return [("Resize", args[:1], out, resize_attrs({"mode": at.get("mode", b"nearest")}, args[:2], types, weights,
                                                   9, origin))]


def expand(op: str, origin: str, at: dict, args: list[str], types: dict[str, TensorType],
           weights: dict[str, Weight], out: str) -> list[Step] | None:
    if op == "ConvTranspose":
        return conv_transpose(origin, at, args, types, weights, out)
    if op == "Upsample":
        return upsample(origin, at, args, types, weights, out)
    return None
