"""Import-time rewrites and attribute rules of the issue-18 data ops.

Tile, DepthToSpace, SpaceToDepth and Einsum never become graph ops of their own: each is the
composition of ops the compiler already lowers and fuses, so the importer writes that
composition and the later passes fold the views and transposes into the readers' accesses:

    Tile(x[a, b], repeats [r, s])   = Reshape [r·a, s·b] (Expand [r, a, s, b] (Reshape [1, a, 1, b] x))
    DepthToSpace(x, b) (DCR)        = Reshape (Transpose [0,3,4,1,5,2] (Reshape [N, b, b, C/b², H, W] x))
    Einsum("bij,bjk->bik", a, b)    = MatMul over [batch.., M, K] @ [batch.., K, N] views of the
                                      operands (Transposes grouping the letters), then a view and a
                                      Transpose into the output's letter order.

Each function returns the (op, inputs, output, attributes) tuples `_expand_node` returns, with
attributes already normalized; intermediate names start with the node's origin.
"""
from __future__ import annotations

import math
import string

import numpy as np

from aicfc.errors import AicfError
from aicfc.ir.types import TensorType, Weight

Step = tuple[str, list[str], str, dict]
REWRITTEN = {"Tile", "DepthToSpace", "SpaceToDepth", "Einsum", "LpNormalization", "GlobalLpPool"}
REDUCES = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceSumSquare", "ReduceL1",
           "ReduceLogSum", "ReduceLogSumExp")


class _Chain:
    """Builds a chain of steps from one tensor; `finish` names the last output the node's."""

    def __init__(self, origin: str, tag: str, x: str, shape: tuple[int, ...]) -> None:
        self.origin, self.tag, self.cur, self.shape = origin, tag, x, tuple(shape)
        self.steps: list[Step] = []

    def add(self, op: str, attrs: dict, shape: tuple[int, ...], extra: tuple[str, ...] = ()) -> None:
        out = f"{self.origin}.{self.tag}{len(self.steps)}"
        self.steps.append((op, [self.cur, *extra], out, attrs))
        self.cur, self.shape = out, tuple(shape)

    def reshape(self, shape: tuple[int, ...]) -> None:
        if tuple(shape) != self.shape:
            self.add("Reshape", {"shape": tuple(shape)}, shape)

    def transpose(self, perm: list[int]) -> None:
        if list(perm) != list(range(len(perm))):
            self.add("Transpose", {"perm": tuple(perm)}, tuple(self.shape[p] for p in perm))

    def finish(self, out: str) -> list[Step]:
        if not self.steps:
            return [("Identity", [self.cur], out, {})]
        op, ins, _, attrs = self.steps[-1]
        return self.steps[:-1] + [(op, ins, out, attrs)]


def tile(origin: str, x: str, shape: tuple[int, ...], repeats: list[int], out: str) -> list[Step]:
    if len(repeats) != len(shape) or any(r < 1 for r in repeats):
        raise AicfError(f"node {origin!r}: Tile repeats {repeats} for rank {len(shape)}: one positive repeat "
                        "per dimension is supported (zero gives an empty tensor)")
    c = _Chain(origin, "tile", x, shape)
    spread = tuple(d for n, r in zip(shape, repeats) for d in ((1, n) if r > 1 else (n,)))
    wide = tuple(d for n, r in zip(shape, repeats) for d in ((r, n) if r > 1 else (n,)))
    c.reshape(spread)
    if wide != spread:
        c.add("Expand", {"shape": wide}, wide)
    c.reshape(tuple(n * r for n, r in zip(shape, repeats)))
    return c.finish(out)


def depth_space(op: str, origin: str, x: str, shape: tuple[int, ...], at: dict, out: str) -> list[Step]:
    """The ONNX definitions, which are exactly a reshape, a transpose and a reshape."""
    b = int(at.get("blocksize", 0))
    mode = at.get("mode", b"DCR")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if len(shape) != 4 or b < 1 or mode not in ("DCR", "CRD"):
        raise AicfError(f"node {origin!r}: {op} of a rank-{len(shape)} input, blocksize {b}, mode {mode!r}: "
                        "a 4-D input, a positive blocksize and mode DCR or CRD are supported")
    n, ch, h, w = shape
    c = _Chain(origin, "d2s" if op == "DepthToSpace" else "s2d", x, shape)
    if op == "DepthToSpace":
        if ch % (b * b):
            raise AicfError(f"node {origin!r}: DepthToSpace of {ch} channels by blocksize {b}: not divisible by {b * b}")
        if mode == "DCR":
            c.reshape((n, b, b, ch // (b * b), h, w))
            c.transpose([0, 3, 4, 1, 5, 2])
        else:
            c.reshape((n, ch // (b * b), b, b, h, w))
            c.transpose([0, 1, 4, 2, 5, 3])
        c.reshape((n, ch // (b * b), h * b, w * b))
    else:
        if h % b or w % b:
            raise AicfError(f"node {origin!r}: SpaceToDepth of {h}x{w} by blocksize {b}: not divisible")
        c.reshape((n, ch, h // b, b, w // b, b))
        c.transpose([0, 3, 5, 1, 2, 4] if mode == "DCR" else [0, 1, 3, 5, 2, 4])
        c.reshape((n, ch * b * b, h // b, w // b))
    return c.finish(out)


# ---------------------------------------------------------------- Einsum

def _parse_einsum(origin: str, equation: str, shapes: list[tuple[int, ...]]) -> tuple[list[str], str]:
    """Operand and output letter strings with any ellipsis replaced by fresh capital letters
    (right-aligned, the same letters in every operand), the output made explicit."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise AicfError(f"node {origin!r}: Einsum equation {equation!r} names {len(terms)} operands, "
                        f"the node has {len(shapes)}")
    fresh = [ch for ch in string.ascii_uppercase if ch not in eq]
    ell_rank = 0
    for term, shape in zip(terms, shapes):
        if "..." in term:
            ell_rank = max(ell_rank, len(shape) - len(term.replace("...", "")))
    ell = "".join(fresh[:ell_rank])
    out_terms = []
    for term, shape in zip(terms, shapes):
        if "..." in term:
            k = len(shape) - len(term.replace("...", ""))
            term = term.replace("...", ell[ell_rank - k:] if k else "")
        if not term.isalpha() and term or len(term) != len(shape):
            raise AicfError(f"node {origin!r}: Einsum term {term!r} of equation {equation!r} does not fit an "
                            f"operand of rank {len(shape)}")
        out_terms.append(term)
    if arrow:
        out = rhs.replace("...", ell)
    else:   # implicit output: the ellipsis, then the letters used once, sorted
        letters = "".join(out_terms)
        out = ell + "".join(sorted(ch for ch in set(letters) if letters.count(ch) == 1 and ch not in ell))
    for term in out_terms + [out]:
        if len(set(term)) != len(term):
            raise AicfError(f"node {origin!r}: Einsum equation {equation!r} repeats a letter inside one term "
                            f"({term!r}: a diagonal); only contractions, sums and transposes are supported")
    if set(out) - set("".join(out_terms)):
        raise AicfError(f"node {origin!r}: Einsum equation {equation!r}: output letters not in any operand")
    return out_terms, out


def _reduce_letters(c: _Chain, term: str, keep: str) -> str:
    """Sum `c` over the letters of `term` not in `keep`: moved last, merged into one axis,
    ReduceSum'ed; returns the remaining letters in order."""
    gone = [ch for ch in term if ch not in keep]
    if not gone:
        return term
    kept = [ch for ch in term if ch in keep]
    c.transpose([term.index(ch) for ch in kept + gone])
    sizes = tuple(c.shape)
    c.reshape(sizes[:len(kept)] + (math.prod(sizes[len(kept):]),))
    c.add("ReduceSum", {"axes": (len(kept),), "keepdims": 0}, sizes[:len(kept)])
    return "".join(kept)


def einsum(origin: str, equation: str, args: list[str], types: dict[str, TensorType], out: str) -> list[Step]:
    shapes = [types[a].shape for a in args]
    if len(args) not in (1, 2):
        raise AicfError(f"node {origin!r}: Einsum of {len(args)} operands ({equation!r}); one or two are supported")
    terms, result = _parse_einsum(origin, equation, shapes)
    size: dict[str, int] = {}
    for term, shape in zip(terms, shapes):
        for ch, n in zip(term, shape):
            if ch in size and size[ch] != n and 1 not in (size[ch], n):
                raise AicfError(f"node {origin!r}: Einsum letter {ch!r} has extents {size[ch]} and {n}")
            size[ch] = max(size.get(ch, 1), n)
    if len(args) == 1:
        c = _Chain(origin, "einsum", args[0], shapes[0])
        left = _reduce_letters(c, terms[0], result)
        c.transpose([left.index(ch) for ch in result])
        return c.finish(out)
    a, b = (_Chain(origin, f"einsum{k}_", x, s) for k, (x, s) in enumerate(zip(args, shapes)))
    ta = _reduce_letters(a, terms[0], terms[1] + result)
    tb = _reduce_letters(b, terms[1], terms[0] + result)
    batch = [ch for ch in result if ch in ta and ch in tb]
    inner = [ch for ch in ta if ch in tb and ch not in result]
    free_a = [ch for ch in ta if ch not in tb]
    free_b = [ch for ch in tb if ch not in ta]
    a.transpose([ta.index(ch) for ch in batch + free_a + inner])
    b.transpose([tb.index(ch) for ch in batch + inner + free_b])
    sa, sb = a.shape, b.shape
    nb = len(batch)
    a.reshape(sa[:nb] + (math.prod(sa[nb:nb + len(free_a)]), math.prod(sa[nb + len(free_a):])))
    b.reshape(sb[:nb] + (math.prod(sb[nb:nb + len(inner)]), math.prod(sb[nb + len(inner):])))
    c = _Chain(origin, "einsum", a.cur, a.shape)
    c.steps = a.steps + b.steps
    batch_shape = tuple(max(x, y) for x, y in zip(sa[:nb], sb[:nb]))
    m, n = a.shape[-2], b.shape[-1]
    c.add("MatMul", {}, batch_shape + (m, n), (b.cur,))
    got = batch + free_a + free_b
    c.reshape(batch_shape + tuple(size[ch] for ch in free_a + free_b))
    c.transpose([got.index(ch) for ch in result])
    return c.finish(out)


# ---------------------------------------------------------------- attributes of the table's new ops

def _const(name: str, weights: dict[str, Weight], origin: str, what: str) -> np.ndarray:
    if name not in weights:
        raise AicfError(f"node {origin!r}: {what} is computed at run time; only a constant is supported")
    return weights[name].array()


def _const_ints(name: str, weights: dict[str, Weight], origin: str, what: str) -> list[int]:
    """A constant int64 input (ONNX's type for pads, axes; the checker does not look) as ints."""
    values = _const(name, weights, origin, what)
    if not np.issubdtype(values.dtype, np.integer):
        raise AicfError(f"node {origin!r}: {what} must be an integer tensor, not {values.dtype}")
    return [int(v) for v in values.reshape(-1)]


def _one_int(name: str, weights: dict[str, Weight], origin: str, what: str) -> int:
    values = _const_ints(name, weights, origin, what)
    if len(values) != 1:
        raise AicfError(f"node {origin!r}: {what} must hold one value, not {len(values)}")
    return values[0]


def constant(weights: dict[str, Weight], types: dict[str, TensorType], name: str, value: np.ndarray) -> str:
    """`value` as the weight `name` (its type recorded too): a constant a rewrite's steps read."""
    weights[name] = Weight.of(name, value)
    types[name] = weights[name].type
    return name


def axis_of(axis: int, rank: int, origin: str, op: str) -> int:
    """`axis` of a rank-`rank` tensor, a negative one counted from the end; out of range refused by name."""
    if not -rank <= axis < rank:
        raise AicfError(f"node {origin!r}: {op} axis {axis} out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def data_attrs(op: str, at: dict, args: list[str], types: dict[str, TensorType],
               weights: dict[str, Weight], origin: str) -> dict:
    """Pad, CumSum, ArgMax/ArgMin, TopK: constant inputs resolved into attributes; the variants
    the lowering cannot state are refused here, by name."""
    shape = types[args[0]].shape
    rank = len(shape)
    if op == "Pad":
        mode = at.get("mode", b"constant")
        mode = mode.decode() if isinstance(mode, bytes) else str(mode)
        if mode != "constant":
            raise AicfError(f"node {origin!r}: Pad mode {mode!r} is not supported; only mode 'constant' is")
        if len(args) > 1 and args[1]:
            pads = _const_ints(args[1], weights, origin, "the pads of Pad")
        else:
            pads = [int(p) for p in at.get("pads", ())]
        value = at.get("value", 0.0)
        if len(args) > 2 and args[2]:
            value = _const(args[2], weights, origin, "the constant_value of Pad").reshape(-1)
            value = value[0] if value.size else 0.0
        if len(args) > 3 and args[3]:
            axes = [axis_of(a, rank, origin, op) for a in _const_ints(args[3], weights, origin, "the axes of Pad")]
        else:
            axes = list(range(rank))
        if len(pads) != 2 * len(axes):
            raise AicfError(f"node {origin!r}: Pad has {len(pads)} pads for {len(axes)} axes")
        full = [0] * (2 * rank)
        for k, a in enumerate(axes):
            full[a], full[a + rank] = pads[k], pads[k + len(axes)]
        return {"pads": tuple(full), "value": float(value)}
    if op == "CumSum":
        axis = _one_int(args[1], weights, origin, "the axis of CumSum") if len(args) > 1 else 0
        return {"axis": axis_of(axis, rank, origin, op), "exclusive": int(at.get("exclusive", 0)),
                "reverse": int(at.get("reverse", 0))}
    if op in ("ArgMax", "ArgMin"):
        return {"axis": axis_of(int(at.get("axis", 0)), rank, origin, op), "keepdims": int(at.get("keepdims", 1)),
                "select_last_index": int(at.get("select_last_index", 0))}
    if op == "TopK":
        if len(args) > 1:
            k = _one_int(args[1], weights, origin, "the k of TopK")
        else:
            k = int(at.get("k", 0))
        axis = axis_of(int(at.get("axis", -1)), rank, origin, op)
        if not 1 <= k <= shape[axis]:
            raise AicfError(f"node {origin!r}: TopK k={k} of an axis of {shape[axis]}; 1..{shape[axis]} is supported")
        return {"k": k, "axis": axis, "largest": int(at.get("largest", 1))}
    raise AssertionError(op)


def lp_norm(op: str, origin: str, x: str, types: dict[str, TensorType], weights: dict[str, Weight], at: dict,
            out: str) -> list[Step]:
    """LpNormalization: x over its L1 or L2 norm along `axis` (ReduceL1/L2 kept, then Div by the norm held at
    least the smallest normal float32, so that a zero norm gives 0 where x is all 0, as ONNX's reference does;
    no epsilon otherwise). GlobalLpPool: the L1 or L2 norm over the spatial axes, merged into one (a Reshape, the
    reduction, a Reshape). Other p refused."""
    p = int(at.get("p", 2))
    if p not in (1, 2):
        raise AicfError(f"node {origin!r}: {op} with p={p} is not supported; p=1 and p=2 are")
    reduce = "ReduceL1" if p == 1 else "ReduceL2"
    shape = types[x].shape
    rank = len(shape)
    if op == "LpNormalization":
        axis = axis_of(int(at.get("axis", -1)), rank, origin, op)
        norm = f"{origin}.norm"
        tiny = constant(weights, types, f"{origin}.tiny", np.asarray(np.finfo(np.float32).tiny, dtype=types[x].np_dtype))
        return [(reduce, [x], norm, {"axes": (axis,), "keepdims": 1}), ("Max", [norm, tiny], f"{norm}.held", {}),
                ("Div", [x, f"{norm}.held"], out, {})]
    if rank < 3:
        raise AicfError(f"node {origin!r}: GlobalLpPool needs a spatial input, got rank {rank}")
    rows = f"{origin}.rows"
    return [("Reshape", [x], rows, {"shape": tuple(shape[:2]) + (math.prod(shape[2:]),)}),
            (reduce, [rows], f"{origin}.norm", {"axes": (2,), "keepdims": 1}),
            ("Reshape", [f"{origin}.norm"], out, {"shape": tuple(shape[:2]) + (1,) * (rank - 2)})]


def expand(n, at: dict, args: list[str], types: dict[str, TensorType], weights: dict[str, Weight],
           origin: str) -> list[Step] | None:
    """The steps of a rewritten op, or of TopK (one node per output); None for any other op."""
    op = n.op_type
    if op == "Tile":
        repeats = _const_ints(args[1], weights, origin, "the repeats of Tile")
        return tile(origin, args[0], types[args[0]].shape, repeats, n.output[0])
    if op in ("DepthToSpace", "SpaceToDepth"):
        return depth_space(op, origin, args[0], types[args[0]].shape, at, n.output[0])
    if op == "Einsum":
        eq = at.get("equation", b"")
        return einsum(origin, eq.decode() if isinstance(eq, bytes) else str(eq), args, types, n.output[0])
    if op in ("LpNormalization", "GlobalLpPool"):
        return lp_norm(op, origin, args[0], types, weights, at, n.output[0])
    if op == "TopK":
        attrs = data_attrs(op, at, args, types, weights, origin)
        outs = [(part, o) for part, o in zip(("values", "indices"), n.output) if o]
        return [("TopK", args[:1], o, {**attrs, "part": part}) for part, o in outs]
    return None
