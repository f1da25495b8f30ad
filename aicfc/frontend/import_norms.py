"""Import of the normalization ops of current exports (issue 18), as compositions the
compiler already lowers to one row pass:

    RMSNormalization(x, s)                 the High IR op of that name (`ir/ops_norms.py`)
    SimplifiedLayerNormalization(x, s)     onnxruntime's name for it (domain '' in its graphs)
    SkipLayerNormalization(x, k, g, b, c)  h = x + k (+ c); LayerNormalization(h, g, b)   (com.microsoft)
    SkipSimplifiedLayerNormalization       h = x + k (+ c); RMSNormalization(h, g)       (com.microsoft)
    InstanceNormalization(x[N,C,..], s, b) LayerNormalization of the [N, C, L] view (scale 1), · s[c] + b[c]
    GroupNormalization(x, s, b) {G}        LayerNormalization of the [N, G, C/G·L] view (scale 1), then
                                           · s + b per group (opset 18: in the row pass) or per channel
                                           (opset 21: a map over x's shape, as torch's opset-18 export
                                           states GroupNorm with InstanceNormalization)

The residual sum before a norm is what `form_kernels` computes and stores inside the norm's
row pass (rule "map + row pass => stored prologue"); the per-channel affine map after a
LayerNormalization of a view is fused into its row pass where the access is affine. Optional
statistics outputs (mean, inverse standard deviation) are spelled out as the ONNX function of
LayerNormalization defines them (`stats_steps`), computed apart from Y's row pass.
"""
from __future__ import annotations

import math

import numpy as np

from aicfc.errors import AicfError
from aicfc.frontend.import_rewrites import constant
from aicfc.ir.types import TensorType, Weight

Step = tuple[str, list[str], str, dict]
# onnxruntime's contrib ops, by the domain its graphs put them in.
MICROSOFT = {"SkipLayerNormalization", "SkipSimplifiedLayerNormalization"}
ORT_IN_ONNX_DOMAIN = {"SimplifiedLayerNormalization"}   # unknown to the onnx checker
REWRITTEN = {"InstanceNormalization", "GroupNormalization"} | MICROSOFT | ORT_IN_ONNX_DOMAIN
# onnxruntime's default epsilon of the Skip norms (contrib_defs: kDefaultSkipLayerNormEpsilon).
SKIP_EPSILON = 1e-12


def _stash(op: str, at: dict, origin: str) -> None:
    stash = int(at.get("stash_type", 1))
    if stash != 1:
        raise AicfError(f"node {origin!r}: {op} with stash_type {stash} is not supported; statistics are "
                        "computed in float32 (stash_type 1)")


def _axis(axis: int, rank: int, origin: str, op: str) -> int:
    if not -rank <= axis < rank:
        raise AicfError(f"node {origin!r}: {op} axis {axis} out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def stats_steps(x: str, t: TensorType, axis: int, eps: float, rms: bool, mean_out: str, inv_out: str,
                origin: str, weights: dict[str, Weight], types: dict[str, TensorType]) -> list[Step]:
    """The Mean and InvStdDev outputs of a norm of `x` (type `t`) over the axes from `axis` (shape: x's with
    those axes set to 1), as ReduceMean/Sub/Mul/Add/Sqrt/Reciprocal over an [outer, inner] view,
    as the ONNX function of LayerNormalization defines them; for an RMS norm the mean is never
    subtracted (1/sqrt(mean(x²) + ε)). They are computed a second time rather than taken from
    Y's row pass, which keeps them in registers."""
    if t.dtype != "f32":
        raise AicfError(f"node {origin!r}: the mean/inverse-std-dev outputs of a norm of a {t.dtype} input are "
                        "not supported (ONNX makes them float32); only of float32 inputs")
    shape, tmp = t.shape, f"{origin}.stats"
    outer, inner = math.prod(shape[:axis]), math.prod(shape[axis:])
    stat = tuple(shape[:axis]) + (1,) * (len(shape) - axis)
    row_mean = {"axes": (1,), "keepdims": 1}
    steps: list[Step] = [("Reshape", [x], f"{tmp}.x", {"shape": (outer, inner)})]
    d = f"{tmp}.x"
    if not rms:
        steps.append(("ReduceMean", [f"{tmp}.x"], f"{tmp}.mean", row_mean))
        if mean_out:
            steps.append(("Reshape", [f"{tmp}.mean"], mean_out, {"shape": stat}))
        if inv_out:
            steps.append(("Sub", [f"{tmp}.x", f"{tmp}.mean"], f"{tmp}.d", {}))
            d = f"{tmp}.d"
    if inv_out:
        constant(weights, types, f"{tmp}.eps", np.array(eps, t.np_dtype))
        steps += [("Mul", [d, d], f"{tmp}.d2", {}),
                  ("ReduceMean", [f"{tmp}.d2"], f"{tmp}.var", row_mean),
                  ("Add", [f"{tmp}.var", f"{tmp}.eps"], f"{tmp}.vare", {}),
                  ("Sqrt", [f"{tmp}.vare"], f"{tmp}.sd", {}),
                  ("Reciprocal", [f"{tmp}.sd"], f"{tmp}.inv", {}),
                  ("Reshape", [f"{tmp}.inv"], inv_out, {"shape": stat})]
    return steps


def _outputs(n, count: int) -> list[str]:
    return (list(n.output) + [""] * count)[:count]


def _rms(n, at: dict, args: list[str], types: dict[str, TensorType], weights: dict[str, Weight],
         origin: str) -> list[Step]:
    """RMSNormalization (Y only) and SimplifiedLayerNormalization (Y, inv_std_var)."""
    _stash(n.op_type, at, origin)
    shape = types[args[0]].shape
    if len(args) != 2:
        raise AicfError(f"node {origin!r}: {n.op_type} needs X and scale, got {len(args)} inputs")
    attrs = {"axis": _axis(int(at.get("axis", -1)), len(shape), origin, n.op_type),
             "epsilon": float(at.get("epsilon", 1e-5))}
    y, inv = _outputs(n, 2)
    steps: list[Step] = [("RMSNormalization", args, y, attrs)] if y else []
    if inv:
        steps += stats_steps(args[0], types[args[0]], attrs["axis"], attrs["epsilon"], True, "", inv,
                             origin, weights, types)
    return steps


def _skip(n, at: dict, args: list[str], types: dict[str, TensorType], weights: dict[str, Weight],
          origin: str) -> list[Step]:
    """input + skip (+ bias), then the norm over the last axis; the sum is the fourth output."""
    rms = n.op_type == "SkipSimplifiedLayerNormalization"
    ins = (list(n.input) + [""] * 5)[:5]
    x, skip, gamma = ins[:3]
    beta, bias = ("", ins[3]) if rms else (ins[3], ins[4])
    if not (x and skip and gamma):
        raise AicfError(f"node {origin!r}: {n.op_type} needs input, skip and gamma")
    shape = types[x].shape
    try:
        wide = tuple(np.broadcast_shapes(shape, types[skip].shape))
    except ValueError:
        wide = ()
    if wide != shape:
        raise AicfError(f"node {origin!r}: {n.op_type} skip {list(types[skip].shape)} does not broadcast to "
                        f"the input {list(shape)}")
    y, mean, inv, total = _outputs(n, 4)
    if rms and mean:
        raise AicfError(f"node {origin!r}: the mean output of SkipSimplifiedLayerNormalization is not "
                        "supported (an RMS norm has no mean; onnxruntime leaves it unset)")
    eps = float(at.get("epsilon", SKIP_EPSILON))
    h = total or f"{origin}.sum"
    steps: list[Step] = [("Add", [x, skip], f"{origin}.sum0" if bias else h, {})]
    if bias:
        steps.append(("Add", [f"{origin}.sum0", bias], h, {}))
    axis = len(shape) - 1
    if y:
        if rms:
            steps.append(("RMSNormalization", [h, gamma], y, {"axis": axis, "epsilon": eps}))
        else:
            steps.append(("LayerNormalization", [h, gamma] + ([beta] if beta else []), y,
                          {"axis": axis, "epsilon": eps}))
    if mean or inv:
        steps += stats_steps(h, types[x], axis, eps, rms, mean, inv, origin, weights, types)
    return steps


def _instance_group(n, at: dict, args: list[str], types: dict[str, TensorType], weights: dict[str, Weight],
                    opset: int, origin: str) -> list[Step]:
    """A LayerNormalization (scale 1) of the [N, groups, elements] view, then the affine map."""
    op = n.op_type
    if len(args) != 3:
        raise AicfError(f"node {origin!r}: {op} needs X, scale and bias, got {len(args)} inputs")
    x, scale, bias = args
    shape = types[x].shape
    if len(shape) < 3:
        raise AicfError(f"node {origin!r}: {op} of a rank-{len(shape)} input is not supported; "
                        "inputs are [N, C, D1, ...] (rank 3 or more)")
    batch, ch, spatial = shape[0], shape[1], math.prod(shape[2:])
    eps = float(at.get("epsilon", 1e-5))
    if op == "InstanceNormalization":
        groups, per_channel = ch, True
    else:
        _stash(op, at, origin)
        groups = int(at.get("num_groups", 0))
        if groups < 1 or ch % groups:
            raise AicfError(f"node {origin!r}: GroupNormalization of {ch} channels in num_groups={groups}: "
                            "the groups must divide the channels")
        per_channel = opset >= 21   # opset 18's scale and bias are per group
    want = ch if per_channel else groups
    for name, what in ((scale, "scale"), (bias, "bias")):
        if types[name].shape != (want,):
            raise AicfError(f"node {origin!r}: {op} {what} {list(types[name].shape)}: expected [{want}] "
                            f"({'one per channel' if per_channel else 'one per group (opset 18)'})")
    k = ch // groups
    one = constant(weights, types, f"{origin}.one", np.ones(1, types[x].np_dtype))
    steps: list[Step] = [("Reshape", [x], f"{origin}.rows", {"shape": (batch, groups, k * spatial)}),
                         ("LayerNormalization", [f"{origin}.rows", one], f"{origin}.norm", {"axis": 2, "epsilon": eps})]
    if per_channel and k > 1:
        # The channel of a group's element is not an affine function of the row's index, so the
        # affine map runs over x's own shape, reading the row pass's result as a view of it: a
        # map of its own, into which element-wise consumers (SiLU) fold.
        view, param = shape, (ch,) + (1,) * (len(shape) - 2)
        steps.append(("Reshape", [f"{origin}.norm"], f"{origin}.unrows", {"shape": shape}))
        normed = f"{origin}.unrows"
    else:
        view, param, normed = (batch, groups, k * spatial), (groups, 1), f"{origin}.norm"
    steps += [("Reshape", [scale], f"{origin}.scale", {"shape": param}),
              ("Reshape", [bias], f"{origin}.bias", {"shape": param}),
              ("Mul", [normed, f"{origin}.scale"], f"{origin}.scaled", {}),
              ("Add", [f"{origin}.scaled", f"{origin}.bias"], f"{origin}.affine" if view != shape else n.output[0], {})]
    if view != shape:
        steps.append(("Reshape", [f"{origin}.affine"], n.output[0], {"shape": shape}))
    return steps


def expand(n, at: dict, args: list[str], types: dict[str, TensorType], weights: dict[str, Weight],
           opset: int, origin: str) -> list[Step] | None:
    """The steps of a norm op listed in the module docstring; None for any other op."""
    op = n.op_type
    if op in ("RMSNormalization", "SimplifiedLayerNormalization"):
        return _rms(n, at, args, types, weights, origin)
    if op in MICROSOFT:
        return _skip(n, at, args, types, weights, origin)
    if op in ("InstanceNormalization", "GroupNormalization"):
        return _instance_group(n, at, args, types, weights, opset, origin)
    return None
