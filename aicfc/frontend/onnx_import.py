"""ONNX → High IR.

Loading is defensive: the file is parsed without external data first, and every external-data
location is checked to stay inside the model's folder and every offset and length to lie inside
its file; the bytes are then read only when a pass needs them (`_load_external_data`). The
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
from aicfc.frontend.onnx_elementwise import ELEMENTWISE_ATTR_OPS, elementwise_attrs
from aicfc.frontend import import_norms, import_onehot, import_rewrites, spatial
from aicfc.ir.high import Graph, Node, make_attrs, verify_graph
from aicfc.ir.ops import COMPARISONS, FLOATS, FOLD_ONLY, OPS, RUNTIME_DTYPES, OpTypeError
from aicf_run.weights import FileSlice
from aicfc.ir.types import NUMPY_TO_IR, TensorType, Value, Weight

MAX_MODEL_BYTES = 2 << 30  # protobuf's own limit for a single message
# ONNX ops handled at import rather than kept as graph ops.
IMPORT_ONLY = {"Constant"}
# Inputs the importer turns into static attributes (they must be constants): only the first
# `CONSTANT_INPUTS[op]` inputs stay graph inputs.
CONSTANT_INPUTS = {"Reshape": 1, "Pow": 1, "ReduceMean": 1, "ReduceSum": 1, "ReduceMax": 1}
CONSTANT_INPUTS.update({"Clip": 1, "Dropout": 1})   # convolutional ops (`_window_attrs`)
CONSTANT_INPUTS["Trilu"] = 1   # its k (frontend/onnx_elementwise.py)
# Ops whose outputs after the first are refused (training statistics, masks, argmax indices).
FIRST_OUTPUT_ONLY = {"BatchNormalization": "its running statistics", "Dropout": "its mask",
                     "MaxPool": "its Indices"}
# Data and shape ops (issue 6): their shape-like inputs become attributes too; Split becomes
# one Slice per output; Shape/ConstantOfShape/Range are folded (`ops.FOLD_ONLY`); Concat is folded
# on integer constants (shape arithmetic) and otherwise a graph node (lowered as one guarded map).
CONSTANT_INPUTS.update({"Unsqueeze": 1, "Squeeze": 1, "Expand": 1, "Slice": 1})
IMPORT_ONLY = IMPORT_ONLY | {"Split"}
# Model input dtypes: floats, and integer/bool tensors (token ids, attention masks).
INPUT_DTYPES = ("f32", "f16", "f64", "i64", "i32", "bool")
# Integer exponents a Pow may have (lowered to products and a reciprocal), besides ±0.5 (sqrt).
POW_INTEGER_RANGE = range(-4, 5)


def load_model(path: str | os.PathLike, data: bytes | None = None) -> onnx.ModelProto:
    """The checked model at `path` (`data`: the file's bytes, when the caller has read them)."""
    p = Path(path)
    if not p.is_file():
        raise AicfError(f"{p}: no such model file; pass the path of an .onnx file")
    size = p.stat().st_size
    if size == 0 or size > MAX_MODEL_BYTES:
        raise AicfError(f"{p}: {size} bytes is not a plausible ONNX model (empty or over 2 GiB)")
    try:
        model = (onnx.load_model_from_string(data) if data is not None
                 else onnx.load(str(p), load_external_data=False))
    except Exception as e:  # protobuf raises DecodeError, and others on garbage
        raise AicfError(f"{p}: not a readable ONNX model ({type(e).__name__}); export it again") from None
    if not model.graph.node and not model.graph.output:
        raise AicfError(f"{p}: not an ONNX model (no graph in it); export it again")
    _load_external_data(model, p.parent.resolve())
    # Given the path, the checker reads the file itself instead of having the whole model
    # serialized back to bytes (seconds for a BERT-sized model).
    check_model(model, str(p), str(p))
    return model


def check_model(model: onnx.ModelProto, label: str, path: str | None = None) -> None:
    """The ONNX checker on `model` (or on its file at `path`), onnxruntime's onnx-domain ops
    moved aside (`_as_checkable`); its first complaint as one AicfError line."""
    try:
        onnx.checker.check_model(_as_checkable(model) if _ort_onnx_domain_nodes(model) else path or model)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise AicfError(f"{label}: the ONNX checker rejects the model: {first}") from None


def _ort_onnx_domain_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node
            if n.domain in ("", "ai.onnx") and n.op_type in import_norms.ORT_IN_ONNX_DOMAIN]


def _as_checkable(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the model with onnxruntime's ops of the onnx domain (SimplifiedLayerNormalization,
    which its transformer optimizer writes with domain '') moved to com.microsoft, so that the
    checker, which knows no such onnx op, checks everything else instead of refusing the model."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for n in _ort_onnx_domain_nodes(copy):
        n.domain = "com.microsoft"
    if not any(o.domain == "com.microsoft" for o in copy.opset_import):
        copy.opset_import.add(domain="com.microsoft", version=1)
    return copy


def _load_external_data(model: onnx.ModelProto, folder: Path) -> None:
    """Check every external-data reference, then leave the initializers' bytes in their files.

    A reference must name a file inside the model's folder, with an offset and length that lie
    inside it. An initializer keeps its data in the file: its location is rewritten to the
    checked absolute path, and `import_model` makes it a Weight whose bytes are read only when a
    pass needs them (`aicf_run.weights.FileSlice`), so a 4 GB model is never in memory twice. The
    (rare) constant attributes with external data are read here.
    """
    attributes = [a.t for n in model.graph.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR]
    for t in list(model.graph.initializer) + attributes:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        try:
            where = (folder / info.get("location", "")).resolve()
            inside, present = folder in where.parents, where.is_file()
        except (OSError, ValueError) as e:   # a NUL byte, a name too long, a loop of links
            raise AicfError(f"initializer {t.name!r}: external data location {info.get('location', '')[:80]!r} "
                            f"is not a usable path ({type(e).__name__}); export the model again") from None
        if not inside:
            raise AicfError(f"initializer {t.name!r} points to external data {info.get('location')!r} "
                            "outside the model's folder; move the data next to the model")
        if not present:
            raise AicfError(f"initializer {t.name!r}: external data file {where.name!r} is missing")
        length, offset = (_external_int(t.name, info, key) for key in ("length", "offset"))
        size = where.stat().st_size
        if offset + length > size:
            raise AicfError(f"initializer {t.name!r}: external data {where.name!r} is shorter than it claims")
        del t.external_data[:]
        for key, value in (("location", str(where)), ("offset", str(offset)),
                           ("length", str(length if "length" in info else size - offset))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
    try:
        for t in attributes:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                onnx.external_data_helper.load_external_data_for_tensor(t, "/")
    except Exception as e:
        raise AicfError(f"could not read the model's external data: {e}") from None


def _external_slice(t: onnx.TensorProto) -> FileSlice:
    """The checked file range of an external initializer (`_load_external_data` made it absolute).

    A ModelProto that did not come through `load_model` (the Python API) may carry relative
    locations: they are refused rather than resolved against the working folder."""
    info = {e.key: e.value for e in t.external_data}
    location = info.get("location", "")
    if not os.path.isabs(location):
        raise AicfError(f"initializer {t.name!r} keeps its data in {location[:80]!r}, a path relative to a "
                        "folder aicfc was not given; compile the model from its file")
    return FileSlice(location, _external_int(t.name, info, "offset"), _external_int(t.name, info, "length"))


def _initializer(t: onnx.TensorProto) -> Weight:
    """An initializer as a Weight; one in external data stays in its file (see `_external_slice`)."""
    if t.data_location != onnx.TensorProto.EXTERNAL:
        return _weight(t.name, _array(t, "initializer"))
    where = _external_slice(t)
    known = t.data_type in onnx.TensorProto.DataType.values() and t.data_type != onnx.TensorProto.BFLOAT16
    np_dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)) if known and t.data_type else None
    dtype = NUMPY_TO_IR.get(np_dtype) if np_dtype is not None else None
    if any(d < 0 for d in t.dims):
        raise AicfError(f"initializer {t.name!r} is malformed (negative dims {list(t.dims)}); export the model again")
    shape = tuple(int(d) for d in t.dims)
    if dtype is None or dtype == "f64":   # float64 becomes float32 (`_weight`): read it now
        if dtype is None:
            raise AicfError(f"constant {t.name!r} has unsupported dtype {np_dtype or t.data_type}")
        return _weight(t.name, _external_array(t, where, np_dtype, shape))
    wtype = TensorType(dtype, shape)
    if wtype.nbytes != where.nbytes:
        raise AicfError(f"initializer {t.name!r} is malformed (its external data has {where.nbytes} bytes, "
                        f"{dtype}{list(shape)} needs {wtype.nbytes}); export the model again")
    return Weight(t.name, wtype, where)


def _external_array(t: onnx.TensorProto, where: FileSlice, np_dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    if math.prod(shape) * np_dtype.itemsize != where.nbytes:
        raise AicfError(f"initializer {t.name!r} is malformed (its external data has {where.nbytes} bytes, "
                        f"{np_dtype}{list(shape)} needs {math.prod(shape) * np_dtype.itemsize}); export the model again")
    return np.frombuffer(where.read(), dtype=np_dtype.newbyteorder("<")).reshape(shape)


def find_unsupported(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(node name, op type) for every node the compiler cannot take."""
    out = []
    for i, n in enumerate(model.graph.node):
        if not _known(n):
            op = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
            out.append((n.name or f"{n.op_type}_{i}", op))
        elif n.op_type in FIRST_OUTPUT_ONLY and set(n.output[1:]) & _consumed(model):
            out.append((n.name or f"{n.op_type}_{i}", f"{n.op_type} with {FIRST_OUTPUT_ONLY[n.op_type]} "
                        "as an output (only the first output is supported)"))
    return out


def _known(n: onnx.NodeProto) -> bool:
    """An op of the onnx domain in the table, or one of onnxruntime's norms in com.microsoft."""
    if n.domain == "com.microsoft":
        return n.op_type in import_norms.MICROSOFT
    return n.domain in ("", "ai.onnx") and (n.op_type in OPS or n.op_type in IMPORT_ONLY) \
        and n.op_type not in import_norms.MICROSOFT


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
    known = tt.elem_type in onnx.TensorProto.DataType.values()
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type) if tt.elem_type and known else None
    dtype = NUMPY_TO_IR.get(np.dtype(np_dtype)) if np_dtype is not None else None
    if dtype not in INPUT_DTYPES or tt.elem_type == onnx.TensorProto.BFLOAT16:
        raise AicfError(f"input {vi.name!r} has dtype {np_dtype}; supported input dtypes are float32, "
                        "float16, float64, int64, int32 and bool")
    if vi.name in overrides:
        shape = overrides[vi.name]
        if tt.HasField("shape") and len(tt.shape.dim) != len(shape):
            raise AicfError(f"--shape {vi.name}: model says rank {len(tt.shape.dim)}, got rank {len(shape)}")
        for d, n in zip(tt.shape.dim, shape):
            if d.HasField("dim_value") and d.dim_value != n:
                raise AicfError(f"--shape {vi.name}: dimension is fixed to {d.dim_value} by the model, got {n}")
        return TensorType(dtype, shape)
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
    return TensorType(dtype, tuple(dims))


def _external_int(name: str, info: dict[str, str], key: str) -> int:
    """The external-data `key` (offset or length) of initializer `name`: a non-negative int."""
    text = info.get(key, "") or "0"
    if not text.isascii() or not text.isdigit():
        raise AicfError(f"initializer {name!r}: external data {key} {text[:40]!r} is not a non-negative "
                        f"integer; export the model again")
    return int(text)


def _attrs(node: onnx.NodeProto) -> dict:
    try:
        return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    except ValueError as e:   # e.g. a reference attribute (ref_attr_name) outside a function
        raise AicfError(f"node {node.name or node.op_type!r}: an attribute cannot be read "
                        f"({' '.join(str(e).split())[:120]}); export the model again") from None


def _array(tensor: onnx.TensorProto, what: str) -> np.ndarray:
    """The tensor's values; a tensor whose data disagrees with its dims or type is refused.

    The ONNX checker does not compare raw_data's length with the dims, nor reject an unknown
    data_type, so numpy_helper raises ValueError or KeyError on such a model.
    """
    try:
        return numpy_helper.to_array(tensor)
    except (ValueError, KeyError, TypeError, OverflowError) as e:
        detail = " ".join(str(e).split())[:120] or type(e).__name__
        raise AicfError(f"{what} {tensor.name!r} is malformed ({detail}); export the model again") from None


def _weight(name: str, array: np.ndarray) -> Weight:
    array = np.asarray(array)
    if array.dtype == np.float64:
        array = array.astype(np.float32)
    if array.dtype.newbyteorder("=") not in NUMPY_TO_IR:
        raise AicfError(f"constant {name!r} has unsupported dtype {array.dtype}")
    w = Weight.of(name, array)
    # Weight.of makes a 0-d array 1-d; a scalar keeps its rank (a Gather of one index drops a dim).
    return Weight(name, TensorType(w.type.dtype, tuple(array.shape)), w.data)


def import_model(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]] | None = None,
                 name: str = "model") -> Graph:
    """Build the High IR graph. Raises AicfError listing every unsupported op."""
    shapes = dict(shapes or {})
    bad = find_unsupported(model)
    if bad:
        listed = ", ".join(f"{op} ({node})" for node, op in bad)
        raise AicfError(f"{len(bad)} unsupported op(s): {listed}; run `aicfc check` for the list")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    newest = onnx.defs.onnx_opset_version()
    if opset > newest:   # its ops' meaning is unknown to us (and to the onnx package we read it with)
        raise AicfError(f"the model declares opset {opset}, newer than opset {newest}, the newest aicfc knows; "
                        f"re-export it with opset {newest} or older")
    g = model.graph
    weights: dict[str, Weight] = {t.name: _initializer(t) for t in g.initializer}
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
            weights[n.output[0]] = _weight(n.output[0], _array(at["value"], "Constant value"))
            types[n.output[0]] = weights[n.output[0]].type
            continue
        args = [x for x in n.input if x]
        for x in args:
            if x not in types:
                raise AicfError(f"node {origin!r} ({n.op_type}) uses {x!r}, which nothing defines")
        for op, ins, out, attrs in _expand_node(n, at, args, types, weights, opset, origin):
            if _fold_at_import(op, ins, out, attrs, types, weights, origin):
                continue
            try:
                out_type = OPS[op].infer([types[x] for x in ins], attrs)
            except OpTypeError as e:
                raise AicfError(f"node {origin!r} ({n.op_type}): {e}") from None
            _check_runtime_dtypes(op, [types[x] for x in ins] + [out_type], origin)
            nodes.append(Node(op, tuple(ins), out, out_type, make_attrs(attrs), origin))
            types[out] = out_type
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
    if op in ("Softmax", "LogSoftmax", "Hardmax"):
        axis = at.get("axis", -1 if opset >= 13 else 1)
        axis = axis + rank if axis < 0 else axis
        # Before opset 13 Softmax normalizes over the flattened dims axis..: the same as over
        # `axis` alone when every later dim has one element (SqueezeNet's [1, 1000, 1, 1]).
        if opset < 13 and any(d != 1 for d in types[args[0]].shape[axis + 1:]):
            raise AicfError(f"node {origin!r}: {op} before opset 13 with axis {axis} of rank {rank} "
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
        target = _ints(args[1], weights, origin, "the shape of Reshape")
        src = types[args[0]].shape
        if not at.get("allowzero", 0):
            if any(d == 0 and i >= len(src) for i, d in enumerate(target)):
                raise AicfError(f"node {origin!r}: Reshape shape {target} copies (0) a dimension past the "
                                f"input's rank {len(src)}")
            target = [src[i] if d == 0 else d for i, d in enumerate(target)]
        elif 0 in target:
            raise AicfError(f"node {origin!r}: Reshape with allowzero=1 to {target} gives an empty tensor; "
                            "empty tensors are not supported")
        if target.count(-1) > 1:
            raise AicfError(f"node {origin!r}: Reshape shape {target} has more than one -1")
        if -1 in target:
            known = math.prod(d for d in target if d != -1)
            target[target.index(-1)] = math.prod(src) // known if known else 0
        return {"shape": tuple(target)}
    if op == "Pow":
        return {"exponent": _pow_exponent(args, types, weights, origin)}
    if op in DATA_OPS:
        return _data_attrs(op, at, args, types, weights, origin)
    if op in import_rewrites.REDUCES:
        return _reduce_attrs(op, at, args, types, weights, origin)
    if op in WINDOW_OPS:
        return _window_attrs(op, at, args, types, weights, origin)
    if op == "Resize":
        return spatial.resize_attrs(at, args, types, weights, opset, origin)
    if op in ("Pad", "CumSum", "ArgMax", "ArgMin"):
        return import_rewrites.data_attrs(op, at, args, types, weights, origin)
    if op == "GatherElements":
        return {"axis": import_rewrites.axis_of(at.get("axis", 0), rank, origin, op)}
    if op == "GatherND":
        return {"batch_dims": int(at.get("batch_dims", 0))}
    if op == "ScatterND":
        reduction = at.get("reduction", b"none")
        reduction = reduction.decode() if isinstance(reduction, bytes) else str(reduction)
        if reduction != "none":
            raise AicfError(f"node {origin!r}: ScatterND with reduction={reduction!r} is not supported; "
                            "only reduction='none' (a plain write)")
        if len(args) != 3 or not types[args[1]].shape:
            raise AicfError(f"node {origin!r}: ScatterND needs data, indices of rank >= 1 and updates")
        return {"axes": tuple(range(types[args[1]].shape[-1]))}
    if op in ELEMENTWISE_ATTR_OPS:
        return elementwise_attrs(op, at, args, types, weights, opset, origin)
    if op == "LayerNormalization":
        # Checked here: the Mean/InvStdDev outputs (`_layer_norm_stats`) size tuples by it.
        return {"axis": import_rewrites.axis_of(at.get("axis", -1), rank, origin, op),
                "epsilon": float(at.get("epsilon", 1e-5))}
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


def _reduce_axes(op: str, at: dict, args: list[str], shape: tuple[int, ...], weights: dict[str, Weight],
                 origin: str) -> list[int]:
    """The reduced axes, resolved and sorted: from the attribute (ReduceMean/ReduceMax before
    opset 18, ReduceSum before 13) or the constant second input (after); no axes means every
    axis unless noop_with_empty_axes."""
    rank = len(shape)
    if len(args) >= 2:
        axes = _ints(args[1], weights, origin, f"the axes of {op}")
    else:
        axes = [int(a) for a in at.get("axes", [])]
    if not axes and not at.get("noop_with_empty_axes", 0):
        axes = list(range(rank))
    resolved = sorted({a + rank if a < 0 else a for a in axes})
    if any(not 0 <= a < rank for a in resolved):
        raise AicfError(f"node {origin!r}: {op} axes {axes} out of range for rank {rank}")
    return resolved


def _reduce_attrs(op: str, at: dict, args: list[str], types: dict[str, TensorType],
                  weights: dict[str, Weight], origin: str) -> dict:
    """Axes (`_reduce_axes`) and keepdims. At most one reduced axis may have more than one
    element: the row families reduce along one variable (`_merged_reduce` has merged a run of
    consecutive ones before)."""
    shape = types[args[0]].shape
    resolved = _reduce_axes(op, at, args, shape, weights, origin)
    wide = [a for a in resolved if shape[a] > 1]
    if len(wide) > 1:   # a run of consecutive axes was merged into one (`_merged_reduce`)
        raise AicfError(f"node {origin!r}: {op} over {len(wide)} axes with more than one element that are not "
                        f"consecutive (axes {wide} of shape {list(shape)}) is not supported; reduce one axis at a time")
    return {"axes": tuple(resolved), "keepdims": int(at.get("keepdims", 1))}


# ---------------------------------------------------------------- convolutional ops

WINDOW_OPS = {"Conv", "MaxPool", "AveragePool", "LRN", "BatchNormalization", "Clip", "Dropout",
              "GlobalAveragePool", "GlobalMaxPool", "Sum"}


def _window_attrs(op: str, at: dict, args: list[str], types: dict[str, TensorType],
                  weights: dict[str, Weight], origin: str) -> dict:
    """Defaults filled in; `auto_pad` resolved into explicit pads (begin.., end.., one of each per
    spatial axis: 1 to 3 of them);
    Clip's bounds (inputs since opset 11, attributes before) as constant attributes."""
    if op == "BatchNormalization":
        if at.get("training_mode", 0):
            raise AicfError(f"node {origin!r}: BatchNormalization in training mode is not supported")
        return {"epsilon": float(at.get("epsilon", 1e-5))}
    if op == "LRN":
        return {"alpha": float(at.get("alpha", 1e-4)), "beta": float(at.get("beta", 0.75)),
                "bias": float(at.get("bias", 1.0)), "size": int(at["size"])}
    if op == "Clip":
        bounds = [float(at.get("min", -np.inf)), float(at.get("max", np.inf))]
        for k, name in enumerate(args[1:3]):
            if name:
                bounds[k] = float(_constant(name, weights, origin, f"the {('min', 'max')[k]} of Clip").reshape(-1)[0])
        return {"min": bounds[0], "max": bounds[1]}
    if op == "Dropout":
        if len(args) > 2 and args[2] and bool(_constant(args[2], weights, origin, "Dropout's training_mode").reshape(-1)[0]):
            raise AicfError(f"node {origin!r}: Dropout in training mode is not supported (inference only)")
        return {}
    if op in ("GlobalAveragePool", "GlobalMaxPool", "Sum"):
        return {}
    x = types[args[0]].shape
    nd = len(x) - 2
    if not 1 <= nd <= 3:
        raise AicfError(f"node {origin!r}: {op} of a rank-{len(x)} input; 1-D, 2-D and 3-D inputs (rank 3 to 5) "
                        "are supported")
    kernel = tuple(int(k) for k in at.get("kernel_shape", types[args[1]].shape[2:] if op == "Conv" else ()))
    if len(kernel) != nd:
        raise AicfError(f"node {origin!r}: {op} of a rank-{len(x)} input needs a {nd}-D kernel_shape, "
                        f"got {list(kernel)}")
    strides = tuple(int(s) for s in at.get("strides", (1,) * nd))
    dilations = tuple(int(d) for d in at.get("dilations", (1,) * nd))
    if len(strides) != nd or len(dilations) != nd:
        raise AicfError(f"node {origin!r}: {op} strides {list(strides)} / dilations {list(dilations)} do not have "
                        f"{nd} entries")
    auto = at.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * (2 * nd)
        for axis in range(nd):
            out = -(-x[2 + axis] // strides[axis])
            total = max(0, (out - 1) * strides[axis] + (kernel[axis] - 1) * dilations[axis] + 1 - x[2 + axis])
            begin = total // 2 if auto == "SAME_UPPER" else total - total // 2
            pads[axis], pads[axis + nd] = begin, total - begin
    elif auto == "VALID":
        pads = [0] * (2 * nd)
    elif auto == "NOTSET":
        pads = [int(p) for p in at.get("pads", (0,) * (2 * nd))]
        if len(pads) != 2 * nd:
            raise AicfError(f"node {origin!r}: {op} pads {pads} do not have {2 * nd} entries")
    else:
        raise AicfError(f"node {origin!r}: {op} auto_pad {auto!r} is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID")
    out = {"kernel_shape": kernel, "strides": strides, "dilations": dilations, "pads": tuple(pads)}
    if op == "Conv":
        out["group"] = int(at.get("group", 1))
    else:
        out["ceil_mode"] = int(at.get("ceil_mode", 0))
    if op == "AveragePool":
        out["count_include_pad"] = int(at.get("count_include_pad", 0))
    if op == "MaxPool" and at.get("storage_order", 0):
        raise AicfError(f"node {origin!r}: MaxPool with storage_order=1 is not supported")
    return out


# ---------------------------------------------------------------- data and shape ops (issue 6)

DATA_OPS = {"Cast", "Unsqueeze", "Squeeze", "Flatten", "Expand", "Slice", "Gather", "Concat", "ConstantOfShape",
            "Shape"}


def _expand_node(n: onnx.NodeProto, at: dict, args: list[str], types: dict[str, TensorType],
                 weights: dict[str, Weight], opset: int, origin: str) -> list[tuple[str, list[str], str, dict]]:
    """(op, inputs, output, attributes) of the graph nodes one ONNX node becomes: itself, or for
    Split one Slice per output, or for a LayerNormalization with its Mean/InvStdDev outputs
    itself plus those statistics spelled out (`_layer_norm_stats`)."""
    if n.op_type == "LayerNormalization" and any(n.output[1:]):
        return _layer_norm_stats(n, at, args, types, weights, opset, origin)
    steps = import_norms.expand(n, at, args, types, weights, opset, origin)
    if steps is not None:
        return steps
    if n.op_type == "Hardmax":
        axis = _normalize_attrs("Hardmax", at, args, types, weights, opset, origin)["axis"]
        return import_onehot.hardmax(origin, args[0], axis, types, weights, n.output[0])
    if n.op_type == "OneHot":
        return import_onehot.one_hot(origin, args, types, weights, at, n.output[0])
    steps = import_rewrites.expand(n, at, args, types, weights, origin)
    if steps is None:
        steps = spatial.expand(n.op_type, origin, at, args, types, weights, n.output[0])
    if steps is not None:
        return steps
    if n.op_type in import_rewrites.REDUCES:
        merged = _merged_reduce(n, at, args, types, weights, origin)
        if merged:
            return merged
    if n.op_type != "Split":
        # Clip's and Slice's optional inputs are told apart by position: they see the empty ones too.
        positional = list(n.input) if n.op_type in ("Clip", "Slice", "Dropout", "Pad", "Resize") else args
        attrs = _normalize_attrs(n.op_type, at, positional, types, weights, opset, origin)
        keep = args[:CONSTANT_INPUTS[n.op_type]] if n.op_type in CONSTANT_INPUTS else args
        return [(n.op_type, keep, n.output[0], attrs)]
    shape = types[args[0]].shape
    axis = import_rewrites.axis_of(at.get("axis", 0), len(shape), origin, "Split")
    outs = list(n.output)
    if len(args) >= 2:
        sizes = _ints(args[1], weights, origin, "the split of Split")
    elif "split" in at:
        sizes = [int(v) for v in at["split"]]
    else:
        parts = int(at.get("num_outputs", len(outs)))
        step = -(-shape[axis] // parts)
        sizes = [min(step, shape[axis] - k * step) for k in range(parts)]
    if len(sizes) != len(outs) or sum(sizes) != shape[axis] or any(s < 0 for s in sizes):
        raise AicfError(f"node {origin!r}: Split sizes {sizes} do not cover dim {axis} ({shape[axis]}) "
                        f"in {len(outs)} outputs")
    if any(s == 0 for s in sizes):
        raise AicfError(f"node {origin!r}: Split with an empty output is not supported (sizes {sizes})")
    nodes, start = [], 0
    for out, size in zip(outs, sizes):
        starts = tuple(start if d == axis else 0 for d in range(len(shape)))
        extent = tuple(size if d == axis else m for d, m in enumerate(shape))
        nodes.append(("Slice", args[:1], out, {"starts": starts, "steps": (1,) * len(shape), "shape": extent}))
        start += size
    return nodes


def _merged_reduce(n: onnx.NodeProto, at: dict, args: list[str], types: dict[str, TensorType],
                   weights: dict[str, Weight], origin: str) -> list[tuple[str, list[str], str, dict]]:
    """A reduction over a run of consecutive axes (torch's global average pool: ReduceMean over
    [2, 3]) as Reshape (merging the run) → the reduction over one axis → Reshape to the result's
    shape; [] when the axes are not such a run of two or more wide axes."""
    shape = types[args[0]].shape
    run = _reduce_axes(n.op_type, at, args, shape, weights, origin)
    if len([a for a in run if shape[a] > 1]) < 2 or run != list(range(run[0], run[-1] + 1)):
        return []
    keep = int(at.get("keepdims", 1))
    lo, hi = run[0], run[-1] + 1
    flat = tuple(shape[:lo]) + (math.prod(shape[lo:hi]),) + tuple(shape[hi:])
    final = tuple(1 if lo <= d < hi else m for d, m in enumerate(shape)) if keep else tuple(shape[:lo] + shape[hi:])
    tmp = f"{origin}.merged"
    return [("Reshape", args[:1], f"{tmp}.x", {"shape": flat}),
            (n.op_type, [f"{tmp}.x"], f"{tmp}.r", {"axes": (lo,), "keepdims": 1}),
            ("Reshape", [f"{tmp}.r"], n.output[0], {"shape": final})]


def _layer_norm_stats(n: onnx.NodeProto, at: dict, args: list[str], types: dict[str, TensorType],
                      weights: dict[str, Weight], opset: int, origin: str) -> list[tuple[str, list[str], str, dict]]:
    """Y as a LayerNormalization node, and its Mean and InvStdDev outputs spelled out
    (`import_norms.stats_steps`)."""
    attrs = _normalize_attrs("LayerNormalization", at, args, types, weights, opset, origin)
    y, mean, inv = (list(n.output) + ["", ""])[:3]
    nodes = [(n.op_type, args, y, attrs)] if y else []
    return nodes + import_norms.stats_steps(args[0], types[args[0]], attrs["axis"], attrs["epsilon"], False,
                                            mean, inv, origin, weights, types)


def _fold_at_import(op: str, ins: list[str], out: str, attrs: dict, types: dict[str, TensorType],
                    weights: dict[str, Weight], origin: str) -> bool:
    """Evaluate now, as a constant, a node of shape arithmetic: a fold-only op (Shape needs only
    its input's static type) or any op on constants that involves an integer or bool tensor.
    Later nodes then see Reshape targets, Expand shapes and masks as constants. Float-only
    constant subgraphs are left to the `fold_constants` pass."""
    if op == "Shape":
        value = np.asarray(types[ins[0]].shape, dtype=np.int64)[attrs["start"]:attrs["end"]]
    elif op == "Size":
        value = np.asarray(math.prod(types[ins[0]].shape), dtype=np.int64)
    elif all(x in weights for x in ins) and (op in FOLD_ONLY or attrs.get("to") in ("i64", "i32", "bool")
                                            or any(types[x].dtype not in FLOATS for x in ins)):
        try:
            value = np.asarray(OPS[op].evaluate([weights[x].array() for x in ins], attrs))
        except Exception as e:  # an evaluation numpy refuses is a bad model
            raise AicfError(f"node {origin!r} ({op}): cannot evaluate its constant inputs: {e}") from None
    elif op in FOLD_ONLY:
        runtime = [x for x in ins if x not in weights]
        raise AicfError(f"node {origin!r}: {op} of run-time tensor(s) {runtime} is not supported; "
                        f"{op} is only evaluated at compile time, on constants")
    else:
        return False
    if value.size == 0:
        raise AicfError(f"node {origin!r}: {op} gives an empty tensor {list(value.shape)}; empty tensors are not supported")
    weights[out] = _weight(out, value)
    types[out] = weights[out].type
    return True


def _check_runtime_dtypes(op: str, ts: list[TensorType], origin: str) -> None:
    """A node left for run time computes in float (Lowered IR): integer and bool tensors only
    where `ops.RUNTIME_DTYPES` allows them (masks, indices), else only as folded constants."""
    allowed = RUNTIME_DTYPES.get(op, ("f32", "f16") + (("bool",) if op == "Equal" else ()))
    if op in ("Gather", "GatherElements", "GatherND", "ScatterND"):
        ts = ts[:1] + ts[2:]   # the indices are integers by the type rule
    if op == "Where":
        ts = ts[1:]            # the condition is bool by the type rule
    if op == "IsNaN" or op in COMPARISONS:
        ts = ts[:-1]           # the result is bool by the type rule
    bad = sorted({t.dtype for t in ts} - set(allowed))
    if bad:
        raise AicfError(f"node {origin!r}: {op} on run-time {'/'.join(bad)} tensors is not supported "
                        f"(it runs on {', '.join(allowed)}; integer shape arithmetic on constants is folded)")


def _ints(name: str, weights: dict[str, Weight], origin: str, what: str) -> list[int]:
    """A constant integer input (axes, sizes, bounds) as ints; ONNX types these int64 and the
    checker does not look, so a float one (NaN has no int) is refused here."""
    values = _constant(name, weights, origin, what)
    if not np.issubdtype(values.dtype, np.integer):
        raise AicfError(f"node {origin!r}: {what} must be an integer tensor, not {values.dtype}")
    return [int(v) for v in values.reshape(-1)]


def _data_attrs(op: str, at: dict, args: list[str], types: dict[str, TensorType],
                weights: dict[str, Weight], origin: str) -> dict:
    shape = types[args[0]].shape if args and args[0] in types else ()
    rank = len(shape)
    if op == "Cast":
        to = at.get("to", 0)
        ir = None
        if to != onnx.TensorProto.BFLOAT16:
            try:
                ir = NUMPY_TO_IR.get(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(to)))
            except Exception:
                ir = None
        if ir not in INPUT_DTYPES:
            name = onnx.TensorProto.DataType.Name(to) if to in onnx.TensorProto.DataType.values() else str(to)
            raise AicfError(f"node {origin!r}: Cast to {name} is not supported; targets are float32, float16, "
                            "float64, int64, int32 and bool")
        return {"to": ir}
    if op == "Unsqueeze":
        axes = _ints(args[1], weights, origin, "the axes of Unsqueeze") if len(args) > 1 else list(at.get("axes", []))
        out_rank = rank + len(axes)
        axes = sorted(import_rewrites.axis_of(a, out_rank, origin, op) for a in axes)
        if len(set(axes)) != len(axes):
            raise AicfError(f"node {origin!r}: Unsqueeze axes {axes} repeat")
        dims = iter(shape)
        return {"shape": tuple(1 if d in axes else next(dims) for d in range(out_rank))}
    if op == "Squeeze":
        axes = _ints(args[1], weights, origin, "the axes of Squeeze") if len(args) > 1 else list(at.get("axes", []))
        axes = [import_rewrites.axis_of(a, rank, origin, op) for a in axes] if axes else [d for d, m in enumerate(shape) if m == 1]
        if any(shape[a] != 1 for a in axes):
            raise AicfError(f"node {origin!r}: Squeeze of axes {axes} of shape {list(shape)}: not all have size 1")
        return {"shape": tuple(m for d, m in enumerate(shape) if d not in axes)}
    if op == "Flatten":
        axis = at.get("axis", 1)
        axis = axis + rank if axis < 0 else axis
        if not 0 <= axis <= rank:
            raise AicfError(f"node {origin!r}: Flatten axis {at.get('axis')} out of range for rank {rank}")
        return {"shape": (math.prod(shape[:axis]), math.prod(shape[axis:]))}
    if op == "Expand":
        target = tuple(_ints(args[1], weights, origin, "the shape of Expand"))
        try:
            return {"shape": tuple(np.broadcast_shapes(shape, target))}
        except ValueError:
            raise AicfError(f"node {origin!r}: Expand of {list(shape)} to {list(target)} is not a broadcast") from None
    if op == "Slice":
        return _slice_attrs(args, shape, weights, origin)
    if op == "Gather":
        axis = import_rewrites.axis_of(at.get("axis", 0), rank, origin, op)
        if args[1] not in weights:
            return {"axis": axis}   # run-time ids: an indirect index ([Note: Indirect index])
        # Constant indices out of range are an error of the model (ONNX), found here rather
        # than clamped at run time, whether the data is constant (folded) or not.
        ids = np.array(_ints(args[1], weights, origin, "the indices of Gather"), dtype=np.int64)
        if ids.size == 0 or ids.min() < -shape[axis] or ids.max() >= shape[axis]:
            raise AicfError(f"node {origin!r}: Gather with constant indices {ids.tolist()[:8]} outside "
                            f"{-shape[axis]}..{shape[axis] - 1} (dim {axis} of {list(shape)})")
        if args[0] in weights:
            return {"axis": axis}   # folded
        # Constant indices into a run-time tensor: in arithmetic progression (a row, a strided
        # selection) they are the affine index start + step·(flat position in the indices);
        # any others are read as an indirect index of the constant ids.
        ids = np.where(ids < 0, ids + shape[axis], ids).astype(np.int64)
        step = int(ids[1] - ids[0]) if ids.size > 1 else 0
        if any(np.diff(ids) != step):
            return {"axis": axis}
        return {"axis": axis, "start": int(ids[0]), "step": step}
    if op == "Concat":
        return {"axis": import_rewrites.axis_of(at["axis"], rank, origin, op)}
    if op == "Shape":
        return {"start": at.get("start", 0), "end": at.get("end", None)}
    if op == "ConstantOfShape":
        value = _array(at["value"], "ConstantOfShape value") if "value" in at else np.zeros(1, np.float32)
        return {"value": value}
    raise AssertionError(op)


def _slice_attrs(args: list[str], shape: tuple[int, ...], weights: dict[str, Weight], origin: str) -> dict:
    """ONNX Slice (opset 10+) resolved per dimension into (start, step, extent): starts and ends
    clamped as the spec says (negative ones count from the end), steps of either sign."""
    rank = len(shape)
    if len(args) < 3:
        raise AicfError(f"node {origin!r}: Slice with starts/ends as attributes (opset < 10) is not supported")
    starts = _ints(args[1], weights, origin, "the starts of Slice")
    ends = _ints(args[2], weights, origin, "the ends of Slice")
    axes = _ints(args[3], weights, origin, "the axes of Slice") if len(args) > 3 and args[3] else list(range(len(starts)))
    steps = _ints(args[4], weights, origin, "the steps of Slice") if len(args) > 4 and args[4] else [1] * len(starts)
    out = {"starts": [0] * rank, "steps": [1] * rank, "shape": list(shape)}
    for s, e, a, k in zip(starts, ends, axes, steps):
        a = import_rewrites.axis_of(a, rank, origin, "Slice")
        n = shape[a]
        if k == 0:
            raise AicfError(f"node {origin!r}: Slice step 0")
        s = s + n if s < 0 else s
        e = e + n if e < 0 else e
        if k > 0:
            s, e = min(max(s, 0), n), min(max(e, 0), n)
            m = max(0, -(-(e - s) // k))
        else:
            s, e = min(max(s, -1), n - 1), min(max(e, -1), n - 1)
            m = max(0, -(-(s - e) // -k))
        if m == 0:
            raise AicfError(f"node {origin!r}: Slice with an empty result (dim {a}) is not supported")
        out["starts"][a], out["steps"][a], out["shape"][a] = s, k, m
    return {k: tuple(v) for k, v in out.items()}


def _consumed(model: onnx.ModelProto) -> set[str]:
    """Names some node reads or the graph outputs (an unread mask output is harmless)."""
    return {x for n in model.graph.node for x in n.input if x} | {o.name for o in model.graph.output}


# ---------------------------------------------------------------- issue 18 data ops
# Tile, DepthToSpace, SpaceToDepth and Einsum are rewritten at import (`import_rewrites`);
# Pad, CumSum, TopK and the new reductions keep only their data input.
IMPORT_ONLY = IMPORT_ONLY | import_rewrites.REWRITTEN | import_onehot.REWRITTEN
# Normalization ops of issue 18 (`import_norms`): RMSNormalization stays a graph op; the others
# are rewritten into it, LayerNormalization, Adds and an affine map.
IMPORT_ONLY = IMPORT_ONLY | import_norms.REWRITTEN
CONSTANT_INPUTS.update({op: 1 for op in ("Pad", "CumSum", "TopK", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceSumSquare",
                                          "ReduceL1", "ReduceLogSum", "ReduceLogSumExp")})

# ---------------------------------------------------------------- issue 18 spatial ops
# ConvTranspose is rewritten at import into a Conv (`frontend/spatial.py`); Resize keeps only X.
IMPORT_ONLY = IMPORT_ONLY | spatial.REWRITTEN
CONSTANT_INPUTS["Resize"] = 1
