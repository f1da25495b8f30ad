"""ONNX → High IR.

Loading is defensive: the file is parsed without external data first, every external-data
location is checked to stay inside the model's folder, and only then is the data read. The
checker runs before any work. Symbolic dimensions must be given with `--shape`; the error
names the input and the dimension. `find_unsupported` lists every op the compiler cannot take,
all at once, so `aicfc check` can print the whole list.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from aicfc.errors import AicfError
from aicfc.ir.high import Graph, Node, make_attrs, verify_graph
from aicfc.ir.ops import OPS, OpTypeError
from aicfc.ir.types import NUMPY_TO_IR, TensorType, Value, Weight

MAX_MODEL_BYTES = 2 << 30  # protobuf's own limit for a single message
# ONNX ops handled at import rather than kept as graph ops.
IMPORT_ONLY = {"Constant"}
# Inputs the importer turns into static attributes (they must be constants): only the first
# `CONSTANT_INPUTS[op]` inputs stay graph inputs.
CONSTANT_INPUTS = {"Reshape": 1, "Pow": 1, "ReduceMean": 1, "ReduceSum": 1, "ReduceMax": 1}
# Integer exponents a Pow may have (lowered to products and a reciprocal), besides ±0.5 (sqrt).
POW_INTEGER_RANGE = range(-4, 5)


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    p = Path(path)
    if not p.is_file():
        raise AicfError(f"{p}: no such model file; pass the path of an .onnx file")
    size = p.stat().st_size
    if size == 0 or size > MAX_MODEL_BYTES:
        raise AicfError(f"{p}: {size} bytes is not a plausible ONNX model (empty or over 2 GiB)")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as e:  # protobuf raises DecodeError, and others on garbage
        raise AicfError(f"{p}: not a readable ONNX model ({type(e).__name__}); export it again") from None
    if not model.graph.node and not model.graph.output:
        raise AicfError(f"{p}: not an ONNX model (no graph in it); export it again")
    _load_external_data(model, p.parent.resolve())
    try:
        onnx.checker.check_model(model)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise AicfError(f"{p}: the ONNX checker rejects the model: {first}") from None
    return model


def _load_external_data(model: onnx.ModelProto, folder: Path) -> None:
    tensors = list(model.graph.initializer)
    tensors += [a.t for n in model.graph.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR]
    for t in tensors:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        where = (folder / info.get("location", "")).resolve()
        if folder not in where.parents:
            raise AicfError(f"initializer {t.name!r} points to external data {info.get('location')!r} "
                            "outside the model's folder; move the data next to the model")
        if not where.is_file():
            raise AicfError(f"initializer {t.name!r}: external data file {where.name!r} is missing")
        length = int(info.get("length", 0) or 0)
        offset = int(info.get("offset", 0) or 0)
        if offset + length > where.stat().st_size:
            raise AicfError(f"initializer {t.name!r}: external data {where.name!r} is shorter than it claims")
    try:
        onnx.external_data_helper.load_external_data_for_model(model, str(folder))
    except Exception as e:
        raise AicfError(f"could not read the model's external data: {e}") from None


def find_unsupported(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(node name, op type) for every node the compiler cannot take."""
    out = []
    for i, n in enumerate(model.graph.node):
        if n.domain not in ("", "ai.onnx") or (n.op_type not in OPS and n.op_type not in IMPORT_ONLY):
            op = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
            out.append((n.name or f"{n.op_type}_{i}", op))
        elif n.op_type == "LayerNormalization" and any(n.output[1:]):
            out.append((n.name or f"{n.op_type}_{i}", "LayerNormalization with its Mean/InvStdDev outputs "
                        "(only Y is supported)"))
    return out


def parse_shape_overrides(specs: tuple[str, ...] | list[str]) -> dict[str, tuple[int, ...]]:
    """`name=2x64` → {"name": (2, 64)}."""
    out: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, sep, dims = spec.rpartition("=")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x")) if dims else ()
        except ValueError:
            shape = ()
        if not sep or not name or not shape or any(d <= 0 for d in shape):
            raise AicfError(f"--shape {spec!r}: expected NAME=DxDx... with positive dims, e.g. x=2x64")
        out[name] = shape
    return out


def _input_type(vi: onnx.ValueInfoProto, overrides: dict[str, tuple[int, ...]]) -> TensorType:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        raise AicfError(f"input {vi.name!r} is not a tensor; only tensor inputs are supported")
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type) if tt.elem_type else None
    if np_dtype != np.float32:
        raise AicfError(f"input {vi.name!r} has dtype {np_dtype}; this version compiles float32 models only")
    if vi.name in overrides:
        shape = overrides[vi.name]
        if tt.HasField("shape") and len(tt.shape.dim) != len(shape):
            raise AicfError(f"--shape {vi.name}: model says rank {len(tt.shape.dim)}, got rank {len(shape)}")
        for d, n in zip(tt.shape.dim, shape):
            if d.HasField("dim_value") and d.dim_value != n:
                raise AicfError(f"--shape {vi.name}: dimension is fixed to {d.dim_value} by the model, got {n}")
        return TensorType("f32", shape)
    if not tt.HasField("shape"):
        raise AicfError(f"input {vi.name!r} has no shape; give one with --shape {vi.name}=2x64")
    dims = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value") or d.dim_value <= 0:
            label = d.dim_param or "?"
            raise AicfError(f"input {vi.name!r} has symbolic dimension {label!r}; "
                            f"give a static shape with --shape {vi.name}=" + "x".join(
                                str(x.dim_value) if x.HasField("dim_value") else "N" for x in tt.shape.dim))
        dims.append(d.dim_value)
    return TensorType("f32", tuple(dims))


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _weight(name: str, array: np.ndarray) -> Weight:
    array = np.asarray(array)
    if array.dtype == np.float64:
        array = array.astype(np.float32)
    if array.dtype.newbyteorder("=") not in NUMPY_TO_IR:
        raise AicfError(f"constant {name!r} has unsupported dtype {array.dtype}")
    return Weight.of(name, array)


def import_model(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]] | None = None,
                 name: str = "model") -> Graph:
    """Build the High IR graph. Raises AicfError listing every unsupported op."""
    shapes = dict(shapes or {})
    bad = find_unsupported(model)
    if bad:
        listed = ", ".join(f"{op} ({node})" for node, op in bad)
        raise AicfError(f"{len(bad)} unsupported op(s): {listed}; run `aicfc check` for the list")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    g = model.graph
    weights: dict[str, Weight] = {t.name: _weight(t.name, numpy_helper.to_array(t)) for t in g.initializer}
    names = [vi.name for vi in g.input if vi.name not in weights]
    unknown = set(shapes) - set(names)
    if unknown:
        raise AicfError(f"--shape names {sorted(unknown)} are not inputs of the model (inputs: {names})")
    inputs = [Value(vi.name, _input_type(vi, shapes)) for vi in g.input if vi.name not in weights]
    types = {v.name: v.type for v in inputs} | {w.name: w.type for w in weights.values()}
    nodes: list[Node] = []
    for i, n in enumerate(g.node):
        origin = n.name or f"{n.op_type}_{i}"
        at = _attrs(n)
        if n.op_type == "Constant":
            if "value" not in at:
                raise AicfError(f"Constant node {origin!r}: only the 'value' form is supported")
            weights[n.output[0]] = _weight(n.output[0], numpy_helper.to_array(at["value"]))
            types[n.output[0]] = weights[n.output[0]].type
            continue
        args = [x for x in n.input if x]
        for x in args:
            if x not in types:
                raise AicfError(f"node {origin!r} ({n.op_type}) uses {x!r}, which nothing defines")
        attrs = _normalize_attrs(n.op_type, at, args, types, weights, opset, origin)
        if n.op_type in CONSTANT_INPUTS:
            args = args[:CONSTANT_INPUTS[n.op_type]]
        try:
            out_type = OPS[n.op_type].infer([types[x] for x in args], attrs)
        except OpTypeError as e:
            raise AicfError(f"node {origin!r} ({n.op_type}): {e}") from None
        nodes.append(Node(n.op_type, tuple(args), n.output[0], out_type, make_attrs(attrs), origin))
        types[n.output[0]] = out_type
    outputs = tuple(o.name for o in g.output)
    for o in outputs:
        if o not in types:
            raise AicfError(f"graph output {o!r} is not produced by any node")
    used = {x for n in nodes for x in n.inputs} | set(outputs)
    graph = Graph(name, tuple(inputs), tuple(w for k, w in weights.items() if k in used),
                  tuple(nodes), outputs)
    verify_graph(graph)
    return graph


def _normalize_attrs(op: str, at: dict, args: list[str], types: dict[str, TensorType],
                     weights: dict[str, Weight], opset: int, origin: str) -> dict:
    """Resolve defaults, negative axes and constant shape inputs into static attributes."""
    rank = len(types[args[0]].shape)
    if op == "Softmax":
        axis = at.get("axis", -1 if opset >= 13 else 1)
        axis = axis + rank if axis < 0 else axis
        if opset < 13 and axis != rank - 1:
            raise AicfError(f"node {origin!r}: Softmax before opset 13 with axis {axis} of rank {rank} "
                            "(flattening semantics) is not supported; re-export with opset >= 13")
        return {"axis": axis}
    if op == "Transpose":
        return {"perm": tuple(at.get("perm", range(rank - 1, -1, -1)))}
    if op == "Gemm":
        return {"alpha": float(at.get("alpha", 1.0)), "beta": float(at.get("beta", 1.0)),
                "transA": int(at.get("transA", 0)), "transB": int(at.get("transB", 0))}
    if op == "Reshape":
        if len(args) != 2 or args[1] not in weights:
            raise AicfError(f"node {origin!r}: Reshape with a computed shape is not supported; "
                            "the shape input must be a constant")
        target = [int(d) for d in weights[args[1]].array().reshape(-1)]
        src = types[args[0]].shape
        if not at.get("allowzero", 0):
            target = [src[i] if d == 0 else d for i, d in enumerate(target)]
        if target.count(-1) > 1:
            raise AicfError(f"node {origin!r}: Reshape shape {target} has more than one -1")
        if -1 in target:
            known = math.prod(d for d in target if d != -1)
            target[target.index(-1)] = math.prod(src) // known if known else 0
        return {"shape": tuple(target)}
    if op == "Pow":
        return {"exponent": _pow_exponent(args, types, weights, origin)}
    if op == "Cast":
        if at.get("to") != onnx.TensorProto.FLOAT or types[args[0]].dtype != "f32":
            raise AicfError(f"node {origin!r}: only a Cast of float32 to float32 is supported "
                            f"(to={onnx.helper.tensor_dtype_to_np_dtype(at['to']) if at.get('to') else '?'})")
        return {"to": "f32"}
    if op in ("ReduceMean", "ReduceSum", "ReduceMax"):
        return _reduce_attrs(op, at, args, types, weights, origin)
    if op == "LayerNormalization":
        axis = at.get("axis", -1)
        return {"axis": axis + rank if axis < 0 else axis, "epsilon": float(at.get("epsilon", 1e-5))}
    return {}


def _constant(name: str, weights: dict[str, Weight], origin: str, what: str) -> np.ndarray:
    if name not in weights:
        raise AicfError(f"node {origin!r}: {what} is computed at run time; only a constant is supported")
    return weights[name].array()


def _pow_exponent(args: list[str], types: dict[str, TensorType], weights: dict[str, Weight], origin: str) -> float:
    """Pow's exponent as a float: a one-element constant that `lower` can state with products,
    a reciprocal or a square root (integers -4..4 and ±0.5); anything else is refused here."""
    if len(args) != 2:
        raise AicfError(f"node {origin!r}: Pow needs an exponent input")
    e = _constant(args[1], weights, origin, "the exponent of Pow")
    if e.size != 1:
        raise AicfError(f"node {origin!r}: Pow with an exponent tensor of shape {list(e.shape)} is not supported; "
                        "only a single constant exponent")
    value = float(e.reshape(-1)[0])
    if not (value in (0.5, -0.5) or (value.is_integer() and int(value) in POW_INTEGER_RANGE)):
        raise AicfError(f"node {origin!r}: Pow with exponent {value:g} is not supported; "
                        f"exponents {POW_INTEGER_RANGE.start}..{POW_INTEGER_RANGE.stop - 1} and ±0.5 are")
    return value


def _reduce_attrs(op: str, at: dict, args: list[str], types: dict[str, TensorType],
                  weights: dict[str, Weight], origin: str) -> dict:
    """Axes from the attribute (ReduceMean/ReduceMax before opset 18, ReduceSum before 13) or the
    constant second input (after), resolved and sorted; no axes means every axis unless
    noop_with_empty_axes. At most one reduced axis may have more than one element: the row
    families reduce along one variable."""
    shape = types[args[0]].shape
    rank = len(shape)
    if len(args) >= 2:
        axes = [int(a) for a in _constant(args[1], weights, origin, f"the axes of {op}").reshape(-1)]
    else:
        axes = [int(a) for a in at.get("axes", [])]
    if not axes and not at.get("noop_with_empty_axes", 0):
        axes = list(range(rank))
    resolved = sorted({a + rank if a < 0 else a for a in axes})
    if any(not 0 <= a < rank for a in resolved):
        raise AicfError(f"node {origin!r}: {op} axes {axes} out of range for rank {rank}")
    wide = [a for a in resolved if shape[a] > 1]
    if len(wide) > 1:
        raise AicfError(f"node {origin!r}: {op} over {len(wide)} axes with more than one element "
                        f"(axes {wide} of shape {list(shape)}) is not supported; reduce one axis at a time")
    return {"axes": tuple(resolved), "keepdims": int(at.get("keepdims", 1))}
