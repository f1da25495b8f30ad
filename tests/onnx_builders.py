"""Build ONNX models for tests, in memory and on disk.

Every model here is opset 17 with `IR_VERSION` 8, which onnxruntime 1.16 and later accept.

- `single_op_model` builds a one-node graph; `OP_CASES` lists (case_id, builder) pairs that
  cover every op in `SUPPORTED_OPS` at several shapes, odd ones included (7×100×257, 1×1, 3×5,
  33×65). A builder takes no arguments and returns a fresh `onnx.ModelProto`.
- `random_inputs` and `run_onnxruntime` give the reference run.
- `unsupported_op_model`, `symbolic_dim_model`, `external_data_outside_model` and
  `write_garbage` build the bad inputs that the error-handling tests feed the CLIs.

Inputs that must avoid a value range (the divisor of `Div`) are initializers, so
`random_inputs` never needs per-case adjustment: it draws standard normal float32 for every
graph input that is not an initializer.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8

# The ops the compiler supports; `OP_CASES` covers exactly this set (a test asserts it).
SUPPORTED_OPS: frozenset[str] = frozenset({
    "MatMul", "Gemm", "Add", "Sub", "Mul", "Div", "Relu", "Sigmoid", "Tanh", "Erf",
    "Softmax", "Transpose", "Reshape", "Identity", "Constant",
    # norms and memory-bound ops (`_norm_cases`)
    "LayerNormalization", "ReduceMean", "ReduceSum", "ReduceMax", "Pow", "Sqrt", "Exp", "Reciprocal", "Cast",
})

Shape = tuple[int, ...]
ModelBuilder = Callable[[], onnx.ModelProto]


# ---------------------------------------------------------------------------------------------
# Core helpers


def make_model(graph: onnx.GraphProto) -> onnx.ModelProto:
    """Wrap a graph as an opset-17, IR-version-8 model."""
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="aicf-tests",
    )


def single_op_model(
    op_type: str,
    input_shapes: list[Shape | None],
    attrs: dict | None = None,
    initializers: dict[str, np.ndarray] | None = None,
    output_shape: Shape | None = None,
) -> onnx.ModelProto:
    """One node of `op_type` with inputs `in0..in{N-1}` and output `out`.

    `input_shapes[i]` is the shape of float32 input `in{i}`. An initializer named `in{i}` feeds
    that input instead of a graph input (its `input_shapes` entry may then be None; if given it
    must match). Initializers with any other name are appended as further node inputs, in
    insertion order, e.g. `single_op_model("Reshape", [(3, 5)], initializers={"shape": ...})`.
    When `output_shape` is None, ONNX shape inference fills the output type; otherwise the
    output is float32 of `output_shape`.
    """
    initializers = dict(initializers or {})
    node_inputs: list[str] = []
    graph_inputs: list[onnx.ValueInfoProto] = []
    for i, shape in enumerate(input_shapes):
        name = f"in{i}"
        node_inputs.append(name)
        if name in initializers:
            actual = tuple(initializers[name].shape)
            if shape is not None and tuple(shape) != actual:
                raise ValueError(f"{name}: input_shapes says {tuple(shape)}, initializer has {actual}")
            continue
        if shape is None:
            raise ValueError(f"{name}: shape is None but no initializer named {name!r}")
        graph_inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
    node_inputs += [name for name in initializers if name not in node_inputs]

    node = helper.make_node(op_type, node_inputs, ["out"], name=f"{op_type.lower()}_0", **(attrs or {}))
    tensors = [numpy_helper.from_array(np.asarray(a), name) for name, a in initializers.items()]

    if output_shape is not None:
        out = helper.make_tensor_value_info("out", TensorProto.FLOAT, list(output_shape))
        return make_model(helper.make_graph([node], f"single_{op_type}", graph_inputs, [out], tensors))

    untyped = make_model(helper.make_graph(
        [node], f"single_{op_type}", graph_inputs, [onnx.ValueInfoProto(name="out")], tensors))
    inferred = onnx.shape_inference.infer_shapes(untyped, strict_mode=True)
    out = onnx.ValueInfoProto()
    out.CopyFrom(inferred.graph.output[0])
    if not out.type.HasField("tensor_type"):
        raise ValueError(f"shape inference could not type the output of {op_type}")
    return make_model(helper.make_graph([node], f"single_{op_type}", graph_inputs, [out], tensors))


def save(model: onnx.ModelProto, path: str | os.PathLike) -> Path:
    """Write `model` to `path` (creating parent folders) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _as_model(model_or_path: onnx.ModelProto | str | os.PathLike) -> onnx.ModelProto:
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path
    return onnx.load(str(model_or_path))


def random_inputs(model: onnx.ModelProto | str | os.PathLike, seed: int) -> dict[str, np.ndarray]:
    """Standard normal float32 for every graph input that is not an initializer.

    Raises ValueError for a non-float32 input or a symbolic dimension (fix the shape first).
    """
    model = _as_model(model)
    init_names = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(seed)
    inputs: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        if vi.name in init_names:
            continue
        tt = vi.type.tensor_type
        if tt.elem_type != TensorProto.FLOAT:
            raise ValueError(f"input {vi.name!r} is not float32")
        shape: list[int] = []
        for d in tt.shape.dim:
            if not d.HasField("dim_value"):
                raise ValueError(f"input {vi.name!r} has a symbolic dimension {d.dim_param!r}")
            shape.append(d.dim_value)
        inputs[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return inputs


def run_onnxruntime(
    model_or_path: onnx.ModelProto | str | os.PathLike, inputs: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Run the model on onnxruntime's CPU provider; returns {output name: array}."""
    import onnxruntime as ort  # a dev dependency: import only where it is used

    if isinstance(model_or_path, onnx.ModelProto):
        source: bytes | str = model_or_path.SerializeToString()
    else:
        source = str(model_or_path)
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    results = session.run(names, dict(inputs))
    return dict(zip(names, results))


# ---------------------------------------------------------------------------------------------
# OP_CASES

_RNG_SEED = 1234


def _weights(shape: Shape, seed: int, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _divisor(shape: Shape, seed: int) -> np.ndarray:
    """Values in [0.5, 2] with random sign: bounded away from zero."""
    rng = np.random.default_rng(seed)
    magnitude = rng.uniform(0.5, 2.0, size=shape)
    sign = np.where(rng.random(size=shape) < 0.5, -1.0, 1.0)
    return (magnitude * sign).astype(np.float32)


def _dims(shape: Shape) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"


def _matmul_cases() -> list[tuple[str, ModelBuilder]]:
    pairs: list[tuple[str, Shape, Shape]] = [
        ("2d", (3, 5), (5, 7)),
        ("2d", (33, 65), (65, 17)),
        ("2d", (1, 1), (1, 1)),
        ("batched_3d", (4, 33, 65), (4, 65, 17)),
        ("broadcast_batch", (2, 1, 5, 7), (3, 7, 9)),
        ("3d_by_2d", (7, 100, 257), (257, 3)),
        ("1d_2d", (5,), (5, 7)),
        ("2d_1d", (5, 7), (7,)),
    ]
    cases: list[tuple[str, ModelBuilder]] = [
        (f"matmul_{kind}_{_dims(a)}_{_dims(b)}", lambda a=a, b=b: single_op_model("MatMul", [a, b]))
        for kind, a, b in pairs
    ]
    # The common weight form: the right operand is an initializer.
    cases.append((
        "matmul_weight_init_7x100x257_257x33",
        lambda: single_op_model("MatMul", [(7, 100, 257), None],
                                initializers={"in1": _weights((257, 33), _RNG_SEED, 257 ** -0.5)}),
    ))
    return cases


def _gemm_cases() -> list[tuple[str, ModelBuilder]]:
    def gemm(a: Shape, b: Shape, c: Shape | None, attrs: dict | None = None,
             c_init: np.ndarray | None = None, b_init: bool = False) -> ModelBuilder:
        def build() -> onnx.ModelProto:
            inits: dict[str, np.ndarray] = {}
            shapes: list[Shape | None] = [a, b]
            if b_init:
                inits["in1"] = _weights(b, _RNG_SEED + 1, max(b) ** -0.5)
            if c_init is not None:
                inits["in2"] = c_init
                shapes.append(None)
            elif c is not None:
                shapes.append(c)
            return single_op_model("Gemm", shapes, attrs=attrs, initializers=inits)
        return build

    return [
        ("gemm_3x5_5x7_bias_row", gemm((3, 5), (5, 7), (7,))),
        ("gemm_33x65_65x17_bias_1xn", gemm((33, 65), (65, 17), (1, 17))),
        ("gemm_33x65_65x17_bias_full", gemm((33, 65), (65, 17), (33, 17))),
        ("gemm_33x65_65x17_bias_col", gemm((33, 65), (65, 17), (33, 1))),
        ("gemm_transa_5x3_5x7", gemm((5, 3), (5, 7), (7,), {"transA": 1})),
        ("gemm_transb_33x65_17x65", gemm((33, 65), (17, 65), (17,), {"transB": 1})),
        ("gemm_transb_weight_init_4x128_32x128",
         gemm((4, 128), (32, 128), None, {"transB": 1}, c_init=_weights((32,), _RNG_SEED + 2),
              b_init=True)),
        ("gemm_transa_transb_alpha_beta_65x33_17x65",
         gemm((65, 33), (17, 65), (17,), {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0})),
        ("gemm_alpha_beta_3x5_5x7", gemm((3, 5), (5, 7), (3, 7), {"alpha": -1.5, "beta": 0.25})),
        ("gemm_scalar_bias_3x5_5x7",
         gemm((3, 5), (5, 7), None, c_init=np.array(0.75, dtype=np.float32))),
        ("gemm_no_bias_33x65_65x17", gemm((33, 65), (65, 17), None)),
        ("gemm_1x1_1x1", gemm((1, 1), (1, 1), (1,))),
    ]


_BINARY_SHAPES: list[tuple[Shape, Shape]] = [
    ((3, 5), (3, 5)),
    ((7, 100, 257), (257,)),
    ((7, 100, 257), (7, 1, 257)),
    ((1, 1), (1, 1)),
    ((33, 65), (33, 1)),
    ((33, 65), ()),
]


def _binary_cases() -> list[tuple[str, ModelBuilder]]:
    cases: list[tuple[str, ModelBuilder]] = []
    for op in ("Add", "Sub", "Mul"):
        for a, b in _BINARY_SHAPES:
            cases.append((f"{op.lower()}_{_dims(a)}_{_dims(b)}",
                          lambda op=op, a=a, b=b: single_op_model(op, [a, b])))
    # Reversed broadcast: the small operand first.
    cases.append(("add_257_7x100x257", lambda: single_op_model("Add", [(257,), (7, 100, 257)])))
    # Div: the divisor is an initializer bounded away from zero, so random inputs stay finite.
    for i, (a, b) in enumerate(_BINARY_SHAPES):
        cases.append((f"div_{_dims(a)}_{_dims(b)}",
                      lambda a=a, b=b, i=i: single_op_model(
                          "Div", [a, None], initializers={"in1": _divisor(b, _RNG_SEED + 10 + i)})))
    return cases


_UNARY_SHAPES: list[Shape] = [(7, 100, 257), (1, 1), (3, 5), (33, 65)]


def _unary_cases() -> list[tuple[str, ModelBuilder]]:
    return [
        (f"{op.lower()}_{_dims(s)}", lambda op=op, s=s: single_op_model(op, [s]))
        for op in ("Relu", "Sigmoid", "Tanh", "Erf", "Identity")
        for s in _UNARY_SHAPES
    ]


def _softmax_cases() -> list[tuple[str, ModelBuilder]]:
    specs: list[tuple[Shape, int]] = [
        ((3, 5), -1),
        ((33, 65), -1),
        ((1, 1), -1),
        ((7, 100, 257), -1),
        ((3, 5, 7), 1),
        ((7, 100, 257), 1),
        ((33, 65), 0),
    ]
    return [
        (f"softmax_axis{'m1' if axis < 0 else axis}_{_dims(s)}",
         lambda s=s, axis=axis: single_op_model("Softmax", [s], attrs={"axis": axis}))
        for s, axis in specs
    ]


def _transpose_cases() -> list[tuple[str, ModelBuilder]]:
    specs: list[tuple[Shape, tuple[int, ...]]] = [
        ((33, 65), (1, 0)),
        ((3, 5), (1, 0)),
        ((1, 1), (1, 0)),
        ((7, 100, 257), (0, 2, 1)),
        ((3, 5, 7), (2, 0, 1)),
        ((7, 100, 257), (2, 0, 1)),
    ]
    return [
        (f"transpose_{''.join(map(str, perm))}_{_dims(s)}",
         lambda s=s, perm=perm: single_op_model("Transpose", [s], attrs={"perm": list(perm)}))
        for s, perm in specs
    ]


def _reshape_cases() -> list[tuple[str, ModelBuilder]]:
    specs: list[tuple[str, Shape, tuple[int, ...]]] = [
        ("keep0_infer", (7, 100, 257), (0, -1)),
        ("flatten", (33, 65), (-1,)),
        ("explicit", (3, 5), (5, 3)),
        ("keep0_infer_mid", (3, 5, 7), (0, -1, 5)),
        ("unsqueeze_like", (1, 1), (1, 1, 1)),
    ]
    return [
        (f"reshape_{name}_{_dims(s)}",
         lambda s=s, target=target: single_op_model(
             "Reshape", [s, None], initializers={"in1": np.array(target, dtype=np.int64)}))
        for name, s, target in specs
    ]


def constant_add_model(input_shape: Shape, constant: np.ndarray) -> onnx.ModelProto:
    """`out = in0 + Constant(value=constant)`: a Constant node feeding Add."""
    nodes = [
        helper.make_node("Constant", [], ["c"], name="constant_0",
                         value=numpy_helper.from_array(constant.astype(np.float32), "c_value")),
        helper.make_node("Add", ["in0", "c"], ["out"], name="add_0"),
    ]
    x = helper.make_tensor_value_info("in0", TensorProto.FLOAT, list(input_shape))
    out_shape = np.broadcast_shapes(tuple(input_shape), constant.shape)
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, list(out_shape))
    return make_model(helper.make_graph(nodes, "constant_add", [x], [out]))


def _constant_cases() -> list[tuple[str, ModelBuilder]]:
    return [
        ("constant_add_3x5_5", lambda: constant_add_model((3, 5), _weights((5,), _RNG_SEED + 20))),
        ("constant_add_7x100x257_257",
         lambda: constant_add_model((7, 100, 257), _weights((257,), _RNG_SEED + 21))),
        ("constant_add_1x1_scalar",
         lambda: constant_add_model((1, 1), np.array(3.0, dtype=np.float32))),
    ]


def _norm_cases() -> list[tuple[str, ModelBuilder]]:
    """The normalization ops alone, and the norms as torch exports them (builders below)."""
    def reduce(op: str, shape: Shape, axis: int, keepdims: int) -> ModelBuilder:
        if op == "ReduceSum":   # axes as an input since opset 13
            return lambda: single_op_model(op, [shape, None], {"keepdims": keepdims},
                                           initializers={"in1": np.array([axis], dtype=np.int64)})
        return lambda: single_op_model(op, [shape], {"axes": [axis], "keepdims": keepdims})
    cases: list[tuple[str, ModelBuilder]] = [
        (f"{op.lower()}_axis{'m1' if axis < 0 else axis}_keep{keep}_{_dims(s)}", reduce(op, s, axis, keep))
        for op in ("ReduceMean", "ReduceSum", "ReduceMax")
        for s, axis, keep in (((7, 100, 257), -1, 1), ((7, 100, 257), 1, 0), ((33, 65), 0, 1), ((3, 5), -1, 0))]
    cases += [
        ("layernorm_axism1_7x100x257", lambda: layer_norm_model((7, 100, 257))),
        ("layernorm_nobias_33x65", lambda: layer_norm_model((33, 65), bias=False, eps=1e-12)),
        ("layernorm_decomposed_7x100x257", lambda: decomposed_layer_norm_model((7, 100, 257))),
        ("rmsnorm_7x100x257", lambda: rms_norm_model((7, 100, 257))),
        ("rmsnorm_reciprocal_33x65", lambda: rms_norm_model((33, 65), reciprocal=True)),
        ("exp_3x5", lambda: single_op_model("Exp", [(3, 5)])),
        ("exp_33x65", lambda: single_op_model("Exp", [(33, 65)])),
        ("reciprocal_3x5", lambda: unary_chain_model((3, 5), [("Reciprocal", {})])),
        ("sqrt_of_square_plus_one_33x65", lambda: unary_chain_model((33, 65), [("Pow", {"exponent": 2.0}),
                                                                              ("AddOne", {}), ("Sqrt", {})])),
        ("pow_3_7x100x257", lambda: unary_chain_model((7, 100, 257), [("Pow", {"exponent": 3.0})])),
        ("pow_half_of_square_plus_one_3x5", lambda: unary_chain_model((3, 5), [("Pow", {"exponent": 2.0}), ("AddOne", {}),
                                                                               ("Pow", {"exponent": 0.5})])),
        ("pow_m1_33x65", lambda: unary_chain_model((33, 65), [("Pow", {"exponent": -1.0})])),
        ("cast_float_3x5", lambda: single_op_model("Cast", [(3, 5)], {"to": TensorProto.FLOAT})),
    ]
    return cases


OP_CASES: list[tuple[str, ModelBuilder]] = [
    *_matmul_cases(),
    *_gemm_cases(),
    *_binary_cases(),
    *_unary_cases(),
    *_softmax_cases(),
    *_transpose_cases(),
    *_reshape_cases(),
    *_constant_cases(),
    *_norm_cases(),
]


# ---------------------------------------------------------------------------------------------
# Bad models


def unsupported_op_model() -> onnx.ModelProto:
    """Valid ONNX with two unsupported ops (`EyeLike` node `eyelike_0`, `NonMaxSuppression` node
    `nms_0`) beside one supported op (`Relu` node `relu_0`). (Hardmax was the first until session 91
    supported it.)"""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu_0"),
        helper.make_node("EyeLike", ["r"], ["hard"], name="eyelike_0"),
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_boxes"], ["selected"],
                         name="nms_0"),
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 10]),
        helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 6, 4]),
        helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 1, 6]),
    ]
    outputs = [
        helper.make_tensor_value_info("hard", TensorProto.FLOAT, [4, 10]),
        helper.make_tensor_value_info("selected", TensorProto.INT64, ["num_selected", 3]),
    ]
    inits = [
        numpy_helper.from_array(np.array([2], dtype=np.int64), "max_boxes"),
    ]
    return make_model(helper.make_graph(nodes, "unsupported_ops", inputs, outputs, inits))


def symbolic_dim_model() -> onnx.ModelProto:
    """`out = Relu(x @ W)` with `x: float32["batch", 64]`, W an initializer [64, 32].

    Compiles only once the batch is fixed, e.g. `--shape x=2x64`.
    """
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="matmul_0"),
        helper.make_node("Relu", ["h"], ["out"], name="relu_0"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 32])
    w = numpy_helper.from_array(_weights((64, 32), _RNG_SEED + 30, 64 ** -0.5), "w")
    return make_model(helper.make_graph(nodes, "symbolic_batch", [x], [out], [w]))


def external_data_outside_model(tmpdir: str | os.PathLike) -> Path:
    """Write a model whose initializer `w` points at external data `../secret.bin`.

    Layout: `tmpdir/model/model.onnx` and `tmpdir/secret.bin`, so the reference escapes the
    model's folder yet stays inside `tmpdir`, and the file really exists (a loader that follows
    it would succeed, so only an explicit containment check refuses it). Returns the model path.
    The model is serialized directly: `onnx.save` would try to resolve the external data.
    """
    tmpdir = Path(tmpdir)
    model_dir = tmpdir / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    w = _weights((64, 32), _RNG_SEED + 40)
    (tmpdir / "secret.bin").write_bytes(w.tobytes())

    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=list(w.shape))
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "../secret.bin"), ("offset", "0"), ("length", str(w.nbytes))):
        entry = tensor.external_data.add()
        entry.key = key
        entry.value = value

    nodes = [helper.make_node("MatMul", ["x", "w"], ["out"], name="matmul_0")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, 32])
    model = make_model(helper.make_graph(nodes, "external_outside", [x], [out], [tensor]))
    path = model_dir / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


GARBAGE_KINDS = ("text", "truncated", "empty")


def write_garbage(path: str | os.PathLike, kind: str) -> Path:
    """Write a corrupt "model" file and return its path.

    kind: "text" (a line of prose: not protobuf), "truncated" (the first half of a valid
    model's bytes, cut inside the graph), "empty" (zero bytes; note protobuf parses this as an
    empty ModelProto, so only validation catches it).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "text":
        path.write_text("not an onnx model, just some text\n")
    elif kind == "truncated":
        model = single_op_model("MatMul", [(4, 64), None],
                                initializers={"in1": _weights((64, 128), _RNG_SEED + 50)})
        data = model.SerializeToString()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    else:
        raise ValueError(f"unknown garbage kind {kind!r}; expected one of {GARBAGE_KINDS}")
    return path


# ---------------------------------------------------------------------------------------------
# Attention (streaming-attention rule and family)


def causal_mask(s: int, fill: float = -1e4) -> np.ndarray:
    """The additive causal mask torch exports as a constant: 0 on and below the diagonal."""
    return np.triu(np.full((s, s), fill, dtype=np.float32), k=1)


def attention_model(b: int, h: int, s: int, d: int, causal: bool = False, mask_input: bool = False,
                    probs_output: bool = False, scores_output: bool = False, sk: int | None = None,
                    alibi: bool = False) -> onnx.ModelProto:
    """softmax(q @ kᵀ · d^-½ (+ mask)) @ v on inputs q [B,H,S,D], k and v [B,H,Sk,D].

    As torch.onnx exports scaled_dot_product_attention: MatMul(q, Transpose(k)) → Mul scale →
    Add mask → Softmax(-1) → MatMul v. `causal`: the mask is a constant [S,S] initializer;
    `mask_input`: an additive mask input `mask` [B,1,1,Sk] (padding form). `probs_output` /
    `scores_output` also expose the probabilities / raw scores (the rule must decline).
    `alibi`: ALiBi's additive bias slope_h · (j - i), computed by graph ops on constant positions
    (Sub of a column and a row of positions, Mul by the per-head slopes 2^(-8(h+1)/H)).
    """
    sk = s if sk is None else sk
    n = helper.make_node
    nodes = [n("Transpose", ["k"], ["k_t"], name="k_transpose", perm=[0, 1, 3, 2]),
             n("MatMul", ["q", "k_t"], ["scores_raw"], name="scores_matmul"),
             n("Mul", ["scores_raw", "scale"], ["scores"], name="scale_mul")]
    inits = {"scale": np.array(1.0 / np.sqrt(d), dtype=np.float32)}
    inputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, [b, h, s, d]),
              helper.make_tensor_value_info("k", TensorProto.FLOAT, [b, h, sk, d]),
              helper.make_tensor_value_info("v", TensorProto.FLOAT, [b, h, sk, d])]
    logits = "scores"
    if causal:
        inits["causal_mask"] = causal_mask(s)
        nodes.append(n("Add", ["scores", "causal_mask"], ["masked"], name="mask_add"))
        logits = "masked"
    elif mask_input:
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, [b, 1, 1, sk]))
        nodes.append(n("Add", ["scores", "mask"], ["masked"], name="mask_add"))
        logits = "masked"
    if alibi:
        inits["pos_col"] = np.arange(sk, dtype=np.float32)[None, :]
        inits["pos_row"] = np.arange(s, dtype=np.float32)[:, None]
        inits["slopes"] = (2.0 ** (-8.0 * np.arange(1, h + 1) / h)).astype(np.float32).reshape(1, h, 1, 1)
        nodes += [n("Sub", ["pos_col", "pos_row"], ["rel"], name="alibi_rel"),
                  n("Mul", ["slopes", "rel"], ["alibi"], name="alibi_mul"),
                  n("Add", [logits, "alibi"], ["biased"], name="alibi_add")]
        logits = "biased"
    nodes += [n("Softmax", [logits], ["probs"], name="softmax", axis=-1),
              n("MatMul", ["probs", "v"], ["y"], name="pv_matmul")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, h, s, d])]
    if probs_output:
        outputs.append(helper.make_tensor_value_info("probs", TensorProto.FLOAT, [b, h, s, sk]))
    if scores_output:
        nodes.append(n("Relu", ["scores_raw"], ["scores_relu"], name="scores_relu"))
        outputs.append(helper.make_tensor_value_info("scores_relu", TensorProto.FLOAT, [b, h, s, sk]))
    g = helper.make_graph(nodes, "attention", inputs, outputs,
                          [numpy_helper.from_array(a, name) for name, a in inits.items()])
    return make_model(g)


def bert_attention_model(b: int, s: int, h: int, d: int, seed: int = 0, mask: bool = True) -> onnx.ModelProto:
    """BERT self-attention as torch.onnx exports it, x [B,S,H·D] → y [B,S,H·D].

    q/k/v = x Wq/k/v + b; Reshape [B,S,H,D]; q, v: Transpose [0,2,1,3]; k: Transpose [0,2,3,1];
    scores = q @ kᵀ, Div √D, Add the extended mask (1 - attention_mask)·-10000 [B,1,1,S];
    Softmax(-1); @ v; Transpose [0,2,1,3]; Reshape [B,S,H·D].
    """
    hd = h * d
    rng = np.random.default_rng(seed)
    n = helper.make_node
    inits: dict[str, np.ndarray] = {
        "shape4": np.array([b, s, h, d], dtype=np.int64), "shape3": np.array([b, s, hd], dtype=np.int64),
        "sqrt_d": np.array(np.sqrt(d), dtype=np.float32), "one": np.array(1.0, dtype=np.float32),
        "neg_big": np.array(-10000.0, dtype=np.float32)}
    nodes = []
    for name, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        inits[f"W{name}"] = (rng.standard_normal((hd, hd)) / np.sqrt(hd)).astype(np.float32)
        inits[f"b{name}"] = (rng.standard_normal(hd) * 0.1).astype(np.float32)
        nodes += [n("MatMul", ["x", f"W{name}"], [f"{name}_mm"], name=f"{name}_matmul"),
                  n("Add", [f"{name}_mm", f"b{name}"], [f"{name}_lin"], name=f"{name}_bias"),
                  n("Reshape", [f"{name}_lin", "shape4"], [f"{name}_4d"], name=f"{name}_reshape"),
                  n("Transpose", [f"{name}_4d"], [f"{name}_heads"], name=f"{name}_transpose", perm=perm)]
    nodes += [n("MatMul", ["q_heads", "k_heads"], ["scores_raw"], name="scores_matmul"),
              n("Div", ["scores_raw", "sqrt_d"], ["scores"], name="scores_div")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, s, hd])]
    logits = "scores"
    if mask:
        inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.FLOAT, [b, 1, 1, s]))
        nodes += [n("Sub", ["one", "attention_mask"], ["inv_mask"], name="mask_sub"),
                  n("Mul", ["inv_mask", "neg_big"], ["ext_mask"], name="mask_mul"),
                  n("Add", ["scores", "ext_mask"], ["masked"], name="mask_add")]
        logits = "masked"
    nodes += [n("Softmax", [logits], ["probs"], name="softmax", axis=-1),
              n("MatMul", ["probs", "v_heads"], ["ctx"], name="pv_matmul"),
              n("Transpose", ["ctx"], ["ctx_t"], name="ctx_transpose", perm=[0, 2, 1, 3]),
              n("Reshape", ["ctx_t", "shape3"], ["y"], name="ctx_reshape")]
    g = helper.make_graph(nodes, "bert_attention", inputs,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, s, hd])],
                          [numpy_helper.from_array(a, name) for name, a in inits.items()])
    return make_model(g)


# ---------------------------------------------------------------------------------------------
# Norms and memory-bound chains (row passes and pointwise at bandwidth)


def _graph_model(nodes: list[onnx.NodeProto], name: str, inputs: dict[str, Shape],
                 outputs: dict[str, Shape], inits: dict[str, np.ndarray], opset: int = OPSET) -> onnx.ModelProto:
    g = helper.make_graph(nodes, name,
                          [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v)) for k, v in inputs.items()],
                          [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v)) for k, v in outputs.items()],
                          [numpy_helper.from_array(np.asarray(a), k) for k, a in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION,
                             producer_name="aicf-tests")


def _scalar(value: float) -> np.ndarray:
    return np.array(value, dtype=np.float32)


def unary_chain_model(shape: Shape, ops: list[tuple[str, dict]]) -> onnx.ModelProto:
    """in0 → op → op → ... → out. ("Pow", {"exponent": e}) takes e as a constant input;
    ("AddOne", {}) is an Add of the constant 1 (keeps a following Sqrt or Pow 0.5 real)."""
    nodes, inits, x = [], {}, "in0"
    for i, (op, attrs) in enumerate(ops):
        y = "out" if i == len(ops) - 1 else f"t{i}"
        if op == "Pow":
            inits[f"e{i}"] = _scalar(attrs["exponent"])
            nodes.append(helper.make_node("Pow", [x, f"e{i}"], [y], name=f"pow_{i}"))
        elif op == "AddOne":
            inits[f"one{i}"] = _scalar(1.0)
            nodes.append(helper.make_node("Add", [x, f"one{i}"], [y], name=f"add_one_{i}"))
        else:
            nodes.append(helper.make_node(op, [x], [y], name=f"{op.lower()}_{i}", **attrs))
        x = y
    return _graph_model(nodes, "unary_chain", {"in0": shape}, {"out": shape}, inits)


def _norm_params(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return ((1 + 0.1 * rng.standard_normal(n)).astype(np.float32), (0.1 * rng.standard_normal(n)).astype(np.float32))


def layer_norm_model(shape: Shape, axis: int = -1, eps: float = 1e-5, bias: bool = True, seed: int = 0,
                     mean_output: bool = False) -> onnx.ModelProto:
    """`out = LayerNormalization(in0, scale, bias)` (opset 17) over the axes from `axis` on.
    `mean_output` also asks for the optional Mean output, as a graph output."""
    inner = tuple(shape[axis:])
    g, b = _norm_params(int(np.prod(inner)), seed)
    inits = {"scale": g.reshape(inner)}
    if bias:
        inits["bias"] = b.reshape(inner)
    outs = ["out", "mean"] if mean_output else ["out"]
    node = helper.make_node("LayerNormalization", ["in0", *inits], outs, name="layernorm_0", axis=axis, epsilon=eps)
    stat = tuple(shape[: axis % len(shape)]) + (1,) * len(inner)
    return _graph_model([node], "layer_norm", {"in0": shape},
                        {"out": shape, **({"mean": stat} if mean_output else {})}, inits)


def decomposed_layer_norm_model(shape: Shape, eps: float = 1e-5, seed: int = 0, opset: int = OPSET,
                                axis: int = -1, mean_output: bool = False) -> onnx.ModelProto:
    """LayerNorm as torch's exporter emitted it before opset 17: ReduceMean, Sub, Pow 2,
    ReduceMean, Add ε, Sqrt, Div, Mul scale, Add bias. Opset 18 gives ReduceMean its axes as a
    constant input. `axis` may name a non-last axis (a norm over a strided row)."""
    n = helper.make_node
    g, b = _norm_params(shape[axis], seed)
    pshape = [1] * len(shape)
    pshape[axis] = shape[axis]
    inits = {"two": _scalar(2.0), "eps": _scalar(eps), "w": g.reshape(pshape), "b": b.reshape(pshape)}
    reduce_kw: dict = {"keepdims": 1}
    if opset >= 18:
        inits["axes"] = np.array([axis], dtype=np.int64)
        ax = ["axes"]
    else:
        reduce_kw["axes"] = [axis]
        ax = []
    nodes = [n("ReduceMean", ["in0", *ax], ["mean"], name="ln_mean", **reduce_kw),
             n("Sub", ["in0", "mean"], ["d"], name="ln_sub"),
             n("Pow", ["d", "two"], ["d2"], name="ln_pow"),
             n("ReduceMean", ["d2", *ax], ["var"], name="ln_var", **reduce_kw),
             n("Add", ["var", "eps"], ["ve"], name="ln_add_eps"),
             n("Sqrt", ["ve"], ["std"], name="ln_sqrt"),
             n("Div", ["d", "std"], ["xn"], name="ln_div"),
             n("Mul", ["xn", "w"], ["xw"], name="ln_mul"),
             n("Add", ["xw", "b"], ["out"], name="ln_add")]
    stat = list(shape)
    stat[axis] = 1
    outs = {"out": shape, **({"mean": tuple(stat)} if mean_output else {})}
    return _graph_model(nodes, "decomposed_layer_norm", {"in0": shape}, outs, inits, opset)


def rms_norm_model(shape: Shape, eps: float = 1e-6, seed: int = 0, reciprocal: bool = False) -> onnx.ModelProto:
    """RMSNorm as torch exports `x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w`:
    Pow 2, ReduceMean, Add ε, Sqrt, then Div(1, ·) (rsqrt) or Reciprocal, Mul x, Mul w."""
    n = helper.make_node
    g, _ = _norm_params(shape[-1], seed)
    inits = {"two": _scalar(2.0), "eps": _scalar(eps), "one": _scalar(1.0), "w": g}
    inv = [n("Reciprocal", ["std"], ["inv"], name="rms_reciprocal")] if reciprocal else \
        [n("Div", ["one", "std"], ["inv"], name="rms_rsqrt")]
    if reciprocal:
        del inits["one"]
    nodes = [n("Pow", ["in0", "two"], ["sq"], name="rms_pow"),
             n("ReduceMean", ["sq"], ["ms"], name="rms_mean", axes=[-1], keepdims=1),
             n("Add", ["ms", "eps"], ["ms_eps"], name="rms_add_eps"),
             n("Sqrt", ["ms_eps"], ["std"], name="rms_sqrt"),
             *inv,
             n("Mul", ["in0", "inv"], ["xn"], name="rms_mul"),
             n("Mul", ["w", "xn"], ["out"], name="rms_weight")]
    return _graph_model(nodes, "rms_norm", {"in0": shape}, {"out": shape}, inits)


def residual_layer_norm_model(shape: Shape, eps: float = 1e-5, seed: int = 0,
                              h_output: bool = False) -> onnx.ModelProto:
    """A pre-LN residual: h = in0 + in1; out = LayerNorm(h); next = h + Relu(out). The residual
    sum h has a consumer besides the norm (the next residual), so it is stored once, by the
    row pass that normalizes it. `h_output`: h is a graph output instead of `next`."""
    n = helper.make_node
    g, b = _norm_params(shape[-1], seed)
    nodes = [n("Add", ["in0", "in1"], ["h"], name="residual_add"),
             n("LayerNormalization", ["h", "scale", "bias"], ["out"], name="layernorm_0", axis=-1, epsilon=eps)]
    if h_output:
        outs = {"out": shape, "h": shape}
    else:
        nodes += [n("Relu", ["out"], ["act"], name="relu_0"), n("Add", ["h", "act"], ["next"], name="residual_next")]
        outs = {"out": shape, "next": shape}
    return _graph_model(nodes, "residual_layer_norm", {"in0": shape, "in1": shape}, outs,
                        {"scale": g, "bias": b})


def decomposed_softmax_model(shape: Shape, max_output: bool = True) -> onnx.ModelProto:
    """softmax(in0) over the last axis as ReduceMax, Sub, Exp, ReduceSum, Div; `max_output`
    also makes the row maximum a graph output."""
    n = helper.make_node
    nodes = [n("ReduceMax", ["in0"], ["mx"], name="sm_max", axes=[-1], keepdims=1),
             n("Sub", ["in0", "mx"], ["z"], name="sm_sub"),
             n("Exp", ["z"], ["e"], name="sm_exp"),
             n("ReduceSum", ["e", "axes"], ["s"], name="sm_sum", keepdims=1),
             n("Div", ["e", "s"], ["out"], name="sm_div")]
    stat = tuple(shape[:-1]) + (1,)
    return _graph_model(nodes, "decomposed_softmax", {"in0": shape},
                        {"out": shape, **({"mx": stat} if max_output else {})},
                        {"axes": np.array([-1], dtype=np.int64)})


def third_moment_model(shape: Shape) -> onnx.ModelProto:
    """out = (x - mean) · mean((x - mean)³): the third central moment has no merge of partial
    states the row pass knows, so the online (one streaming pass) schedule must decline."""
    n = helper.make_node
    nodes = [n("ReduceMean", ["in0"], ["mean"], name="m_mean", axes=[-1], keepdims=1),
             n("Sub", ["in0", "mean"], ["d"], name="m_sub"),
             n("Pow", ["d", "three"], ["d3"], name="m_pow"),
             n("ReduceMean", ["d3"], ["m3"], name="m_m3", axes=[-1], keepdims=1),
             n("Mul", ["d", "m3"], ["out"], name="m_mul")]
    return _graph_model(nodes, "third_moment", {"in0": shape}, {"out": shape}, {"three": _scalar(3.0)})


def gelu_bias_model(shape: Shape, seed: int = 0) -> onnx.ModelProto:
    """u = in0 + b; out = u · (erf(u / √2) + 1) · 0.5: erf-GELU with its bias as torch exports it."""
    n = helper.make_node
    b = (0.1 * np.random.default_rng(seed).standard_normal(shape[-1])).astype(np.float32)
    nodes = [n("Add", ["in0", "b"], ["u"], name="bias_add"),
             n("Div", ["u", "sqrt2"], ["ud"], name="gelu_div"),
             n("Erf", ["ud"], ["ue"], name="gelu_erf"),
             n("Add", ["ue", "one"], ["ua"], name="gelu_add"),
             n("Mul", ["u", "ua"], ["um"], name="gelu_mul"),
             n("Mul", ["um", "half"], ["out"], name="gelu_half")]
    return _graph_model(nodes, "gelu_bias", {"in0": shape}, {"out": shape},
                        {"b": b, "sqrt2": _scalar(np.sqrt(2.0)), "one": _scalar(1.0), "half": _scalar(0.5)})



# ---------------------------------------------------------------------------------------------
# Convolutional ops (tests/test_conv.py): Conv, BatchNormalization, pools, LRN, Clip, Dropout, Sum

CNN_OPS: frozenset[str] = frozenset({"Conv", "BatchNormalization", "MaxPool", "AveragePool", "GlobalAveragePool",
                                     "LRN", "Clip", "Dropout", "Sum"})
SUPPORTED_OPS = SUPPORTED_OPS | CNN_OPS


def conv_model(x: Shape, w: Shape, bias: bool = True, seed: int = 0, bn: bool = False, act: str | None = None,
               follow: int | str = 0, **attrs) -> onnx.ModelProto:
    """in0 → Conv(w, b) [→ BatchNormalization] [→ Relu | Clip(0, 6)] [→ Conv 1x1 to `follow` channels, or a
    3x3 stride-1 MaxPool where `follow` is "pool", or a 3x3 stride-2 MaxPool and a 1x1 Conv to w[0] channels
    where it is "pool_s2"] → out.
    Weights are scaled by 1/sqrt(fan-in) so outputs stay O(1); `attrs` go to the first Conv (strides,
    pads, group, ...). With `follow`, the first convolution's output is inside the graph (the layout
    pass may keep it channels-last)."""
    rng = np.random.default_rng(seed)
    inits = {"w": (rng.standard_normal(w) / math.sqrt(math.prod(w[1:]))).astype(np.float32)}
    ins = ["in0", "w"]
    if bias:
        inits["b"] = (0.1 * rng.standard_normal(w[0])).astype(np.float32)
        ins.append("b")
    y = "out" if not (bn or act) else "c"
    nodes = [helper.make_node("Conv", ins, [y], name="conv_0", **attrs)]
    if bn:
        inits.update({"scale": (1 + 0.1 * rng.standard_normal(w[0])).astype(np.float32),
                      "shift": (0.1 * rng.standard_normal(w[0])).astype(np.float32),
                      "mean": (0.1 * rng.standard_normal(w[0])).astype(np.float32),
                      "var": rng.uniform(0.5, 1.5, w[0]).astype(np.float32)})
        nodes.append(helper.make_node("BatchNormalization", [y, "scale", "shift", "mean", "var"],
                                      ["n" if act else "out"], name="bn_0", epsilon=1e-5))
        y = "n"
    if act == "relu":
        nodes.append(helper.make_node("Relu", [y], ["out"], name="relu_0"))
    elif act == "relu6":
        inits.update({"lo": _scalar(0.0), "hi": _scalar(6.0)})
        nodes.append(helper.make_node("Clip", [y, "lo", "hi"], ["out"], name="clip_0"))
    if follow:
        last = nodes[-1]
        last.output[0] = "mid"
        if follow == "pool":
            nodes.append(helper.make_node("MaxPool", ["mid"], ["out"], name="pool_1", kernel_shape=[3, 3],
                                          pads=[1, 1, 1, 1]))
        elif follow == "pool_s2":
            inits["w2"] = (rng.standard_normal((w[0], w[0], 1, 1)) / math.sqrt(w[0])).astype(np.float32)
            nodes.append(helper.make_node("MaxPool", ["mid"], ["pooled"], name="pool_1", kernel_shape=[3, 3],
                                          strides=[2, 2], pads=[1, 1, 1, 1]))
            nodes.append(helper.make_node("Conv", ["pooled", "w2"], ["out"], name="conv_1"))
        else:
            inits["w2"] = (rng.standard_normal((follow, w[0], 1, 1)) / math.sqrt(w[0])).astype(np.float32)
            nodes.append(helper.make_node("Conv", ["mid", "w2"], ["out"], name="conv_1"))
    model = _graph_model(nodes, "conv", {"in0": x}, {}, inits)
    return _infer_output(model)


def _infer_output(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model (built with no outputs) with output `out`, typed by ONNX shape inference."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    model.graph.output.append(next(v for v in inferred.graph.value_info if v.name == "out"))
    return model


def window_model(op: str, x: Shape, **attrs) -> onnx.ModelProto:
    """in0 → op → out for a single-input window op (pools, LRN)."""
    return _infer_output(_graph_model([helper.make_node(op, ["in0"], ["out"], name=f"{op.lower()}_0", **attrs)],
                                      op.lower(), {"in0": x}, {}, {}))


def batch_norm_model(x: Shape, seed: int = 0) -> onnx.ModelProto:
    """A BatchNormalization with no Conv before it (a per-channel affine map)."""
    rng = np.random.default_rng(seed)
    c = x[1]
    inits = {"scale": (1 + 0.1 * rng.standard_normal(c)).astype(np.float32),
             "shift": (0.1 * rng.standard_normal(c)).astype(np.float32),
             "mean": (0.1 * rng.standard_normal(c)).astype(np.float32),
             "var": rng.uniform(0.5, 1.5, c).astype(np.float32)}
    node = helper.make_node("BatchNormalization", ["in0", "scale", "shift", "mean", "var"], ["out"], name="bn_0")
    return _graph_model([node], "bn", {"in0": x}, {"out": x}, inits)


def cnn_block_model(seed: int = 0) -> onnx.ModelProto:
    """A small CNN with every op kind: conv+BN+relu, max pool, a two-branch block joined by Sum,
    dropout, LRN, average pools, global average pool, and a classifier Gemm with softmax."""
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) / math.sqrt(math.prod(shape[1:]))).astype(np.float32)
    inits = {"w1": w(8, 3, 3, 3), "b1": np.zeros(8, np.float32), "s1": np.ones(8, np.float32) * 1.1,
             "t1": np.full(8, 0.1, np.float32), "m1": np.full(8, 0.05, np.float32), "v1": np.full(8, 0.9, np.float32),
             "w2": w(8, 8, 3, 3), "w3": w(8, 1, 3, 3), "w4": w(8, 8, 1, 1), "fc": w(10, 8), "fb": np.zeros(10, np.float32)}
    nodes = [
        helper.make_node("Conv", ["in0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "s1", "t1", "m1", "v1"], ["n1"]),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["p1", "w3"], ["c3"], pads=[1, 1, 1, 1], group=8),
        helper.make_node("Conv", ["p1", "w4"], ["c4"]),
        helper.make_node("Sum", ["c2", "c3", "c4"], ["s"]),
        helper.make_node("Relu", ["s"], ["r2"]),
        helper.make_node("Dropout", ["r2"], ["d"]),
        helper.make_node("LRN", ["d"], ["l"], size=3),
        helper.make_node("AveragePool", ["l"], ["a"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["a"], ["g"]),
        helper.make_node("Reshape", ["g", "shape"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fb"], ["z"], transB=1),
        helper.make_node("Softmax", ["z"], ["out"], axis=1),
    ]
    inits["shape"] = np.array([2, 8], np.int64)
    for i, node in enumerate(nodes):
        node.name = f"{node.op_type.lower()}_{i}"
    return _graph_model(nodes, "cnn_block", {"in0": (2, 3, 15, 15)}, {"out": (2, 10)}, inits)


def resnet_stage_model(x: Shape = (2, 64, 16, 16), mid: int = 32, out: int = 128, stride: int = 2, seed: int = 0,
                       stem: bool = False) -> onnx.ModelProto:
    """ResNet-50-style: [a 7x7 stride-2 stem with BN, ReLU and a 3x3 max pool, on a 3-channel
    input of x's spatial size] then a bottleneck with a strided 1x1 downsample projection
    (1x1 → 3x3 stride `stride` → 1x1, each with BN; the projection added; ReLU), then an identity
    bottleneck (1x1 → 3x3 → 1x1 + x, ReLU). BN statistics random, weights scaled by 1/sqrt(fan-in)."""
    rng = np.random.default_rng(seed)
    inits: dict[str, np.ndarray] = {}
    nodes: list[onnx.NodeProto] = []

    def conv_bn(src: str, name: str, cin: int, cout: int, k: int, s: int, relu: bool) -> str:
        inits[f"{name}.w"] = (rng.standard_normal((cout, cin, k, k)) / math.sqrt(cin * k * k)).astype(np.float32)
        inits[f"{name}.s"] = (1 + 0.1 * rng.standard_normal(cout)).astype(np.float32)
        inits[f"{name}.b"] = (0.1 * rng.standard_normal(cout)).astype(np.float32)
        inits[f"{name}.m"] = (0.1 * rng.standard_normal(cout)).astype(np.float32)
        inits[f"{name}.v"] = rng.uniform(0.5, 1.5, cout).astype(np.float32)
        nodes.append(helper.make_node("Conv", [src, f"{name}.w"], [f"{name}.c"], name=name, strides=[s, s],
                                      pads=[k // 2] * 4))
        nodes.append(helper.make_node("BatchNormalization", [f"{name}.c"] + [f"{name}.{t}" for t in "sbmv"],
                                      [f"{name}.n"], name=f"{name}.bn"))
        if not relu:
            return f"{name}.n"
        nodes.append(helper.make_node("Relu", [f"{name}.n"], [f"{name}.r"], name=f"{name}.relu"))
        return f"{name}.r"

    cin = x[1]
    src = "in0"
    if stem:
        src = conv_bn(src, "stem", 3, cin, 7, 2, True)
        nodes.append(helper.make_node("MaxPool", [src], ["pool"], name="pool", kernel_shape=[3, 3], strides=[2, 2],
                                      pads=[1, 1, 1, 1]))
        src = "pool"
    a = conv_bn(src, "b1.c1", cin, mid, 1, 1, True)
    a = conv_bn(a, "b1.c2", mid, mid, 3, stride, True)
    a = conv_bn(a, "b1.c3", mid, out, 1, 1, False)
    d = conv_bn(src, "b1.down", cin, out, 1, stride, False)
    nodes.append(helper.make_node("Add", [a, d], ["b1.sum"], name="b1.add"))
    nodes.append(helper.make_node("Relu", ["b1.sum"], ["b1.out"], name="b1.relu"))
    a = conv_bn("b1.out", "b2.c1", out, mid, 1, 1, True)
    a = conv_bn(a, "b2.c2", mid, mid, 3, 1, True)
    a = conv_bn(a, "b2.c3", mid, out, 1, 1, False)
    nodes.append(helper.make_node("Add", [a, "b1.out"], ["b2.sum"], name="b2.add"))
    nodes.append(helper.make_node("Relu", ["b2.sum"], ["out"], name="b2.relu"))
    shape = (x[0], 3) + tuple(4 * d for d in x[2:]) if stem else x
    return _infer_output(_graph_model(nodes, "resnet_stage", {"in0": shape}, {}, inits))


def _cnn_cases() -> list[tuple[str, ModelBuilder]]:
    return [
        ("conv_3x3_pad1_bias_1x3x9x9", lambda: conv_model((1, 3, 9, 9), (8, 3, 3, 3), pads=[1, 1, 1, 1])),
        ("conv_3x3_s2_pad1_2x4x11x11", lambda: conv_model((2, 4, 11, 11), (6, 4, 3, 3), bias=False, strides=[2, 2],
                                                          pads=[1, 1, 1, 1])),
        ("conv_1x1_1x16x7x7", lambda: conv_model((1, 16, 7, 7), (8, 16, 1, 1))),
        ("conv_dilated_1x3x10x10", lambda: conv_model((1, 3, 10, 10), (4, 3, 3, 3), dilations=[2, 2], pads=[2, 2, 2, 2])),
        ("conv_groups2_1x4x8x8", lambda: conv_model((1, 4, 8, 8), (6, 2, 3, 3), group=2, pads=[1, 1, 1, 1])),
        ("conv_depthwise_s2_1x6x9x9", lambda: conv_model((1, 6, 9, 9), (6, 1, 3, 3), group=6, strides=[2, 2],
                                                         pads=[1, 1, 1, 1])),
        ("conv_same_upper_k4s2_1x3x9x9", lambda: conv_model((1, 3, 9, 9), (5, 3, 4, 4), strides=[2, 2],
                                                            auto_pad="SAME_UPPER")),
        ("conv_valid_5x3_1x2x9x8", lambda: conv_model((1, 2, 9, 8), (3, 2, 5, 3), auto_pad="VALID")),
        ("conv_bn_relu_1x3x8x8", lambda: conv_model((1, 3, 8, 8), (4, 3, 3, 3), bn=True, act="relu", pads=[1, 1, 1, 1])),
        ("conv_relu6_1x3x7x7", lambda: conv_model((1, 3, 7, 7), (4, 3, 3, 3), act="relu6", pads=[0, 1, 2, 1])),
        ("batchnorm_2x5x4x3", lambda: batch_norm_model((2, 5, 4, 3))),
        ("maxpool_3x3_s2_pad1_1x3x9x9", lambda: window_model("MaxPool", (1, 3, 9, 9), kernel_shape=[3, 3],
                                                             strides=[2, 2], pads=[1, 1, 1, 1])),
        ("maxpool_ceil_dilated_1x2x10x10", lambda: window_model("MaxPool", (1, 2, 10, 10), kernel_shape=[2, 2],
                                                                strides=[2, 2], dilations=[2, 2], ceil_mode=1)),
        ("avgpool_exclude_pad_1x3x7x7", lambda: window_model("AveragePool", (1, 3, 7, 7), kernel_shape=[3, 3],
                                                             pads=[1, 1, 1, 1])),
        ("avgpool_include_pad_ceil_1x2x8x8", lambda: window_model("AveragePool", (1, 2, 8, 8), kernel_shape=[3, 3],
                                                                  strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1,
                                                                  count_include_pad=1)),
        ("globalavgpool_2x8x7x7", lambda: window_model("GlobalAveragePool", (2, 8, 7, 7))),
        ("lrn_5_1x10x5x5", lambda: window_model("LRN", (1, 10, 5, 5), size=5, alpha=1e-2, beta=0.75, bias=1.0)),
        ("cnn_block", cnn_block_model),
    ]


OP_CASES += _cnn_cases()


# ---------------------------------------------------------------------------------------------
# Data and shape ops (issue 6): shape arithmetic folded at compile time, views, accesses, masks.

DATA_OPS = frozenset({"Shape", "ConstantOfShape", "Range", "Concat", "Gather", "Unsqueeze", "Squeeze", "Flatten",
                      "Expand", "Slice", "Split", "Where", "Equal", "Neg", "Log", "Max", "Min"})
SUPPORTED_OPS = SUPPORTED_OPS | DATA_OPS


def _ints(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def shape_arith_model(shape: Shape) -> onnx.ModelProto:
    """torch's dynamic reshape: x.view(x.size(0), -1) through Shape/Gather/Unsqueeze/Concat, a
    mask from Range/Equal/Where and an Expand to ConstantOfShape's shape: all folded."""
    nodes = [
        helper.make_node("Shape", ["in0"], ["s"], name="shape_0"),
        helper.make_node("Gather", ["s", "zero"], ["b"], name="gather_0", axis=0),
        helper.make_node("Unsqueeze", ["b", "axes0"], ["b1"], name="unsqueeze_0"),
        helper.make_node("Concat", ["b1", "minus1"], ["target"], name="concat_0", axis=0),
        helper.make_node("Reshape", ["in0", "target"], ["flat"], name="reshape_0"),
        helper.make_node("Range", ["zero", "count", "one"], ["r"], name="range_0"),
        helper.make_node("Equal", ["r", "zero"], ["first"], name="equal_0"),
        helper.make_node("ConstantOfShape", ["rows"], ["fill"], name="cos_0",
                         value=numpy_helper.from_array(np.array([-2.0], np.float32))),
        helper.make_node("Where", ["first", "fill", "flat"], ["masked"], name="where_0"),
        helper.make_node("Neg", ["masked"], ["out"], name="neg_0"),
    ]
    total = int(np.prod(shape[1:]))
    inits = {"zero": np.array(0, np.int64), "axes0": _ints([0]), "minus1": _ints([-1]), "one": np.array(1, np.int64),
             "count": np.array(total, np.int64), "rows": _ints([shape[0], total])}
    return _graph_model(nodes, "shape_arith", {"in0": shape}, {"out": (shape[0], total)}, inits)


def data_ops_model(shape: Shape) -> onnx.ModelProto:
    """Slice (negative step), Split, Unsqueeze/Squeeze/Flatten, Expand, constant-index Gather, Max/Min, Log."""
    a, b, c = shape
    nodes = [
        helper.make_node("Slice", ["in0", "st", "en", "ax", "sp"], ["sl"], name="slice_0"),
        helper.make_node("Split", ["sl", "halves"], ["p", "q"], name="split_0", axis=2),
        helper.make_node("Max", ["p", "q"], ["mx"], name="max_0"),
        helper.make_node("Min", ["p", "q", "mx"], ["mn"], name="min_0"),
        helper.make_node("Unsqueeze", ["mn", "axes0"], ["u"], name="unsqueeze_0"),
        helper.make_node("Squeeze", ["u", "axes0"], ["sq"], name="squeeze_0"),
        helper.make_node("Gather", ["sq", "rows"], ["g"], name="gather_0", axis=1),
        helper.make_node("Expand", ["g", "big"], ["e"], name="expand_0"),
        helper.make_node("Mul", ["e", "e"], ["e2"], name="mul_0"),
        helper.make_node("Add", ["e2", "one"], ["e3"], name="add_0"),
        helper.make_node("Log", ["e3"], ["lg"], name="log_0"),
        helper.make_node("Flatten", ["lg"], ["out"], name="flatten_0", axis=2),
    ]
    half = (c - 1) // 2
    rows = list(range(0, b, 2))
    inits = {"st": _ints([-1]), "en": _ints([0]), "ax": _ints([2]), "sp": _ints([-1]), "halves": _ints([half, half]),
             "axes0": _ints([0]), "rows": _ints(rows), "big": _ints([2, a, len(rows), half]),
             "one": np.array(1.0, np.float32)}
    return _graph_model(nodes, "data_ops", {"in0": shape}, {"out": (2 * a, len(rows) * half)}, inits)


def _data_cases() -> list[tuple[str, ModelBuilder]]:
    return [
        ("shape_arith_3x5x7", lambda: shape_arith_model((3, 5, 7))),
        ("shape_arith_7x100x257", lambda: shape_arith_model((7, 100, 257))),
        ("data_ops_3x5x9", lambda: data_ops_model((3, 5, 9))),
        ("data_ops_7x100x257", lambda: data_ops_model((7, 100, 257))),
    ]


OP_CASES += _data_cases()


def inverted_residual_model(x: Shape, expand: int = 4, stride: int = 1, kernel: int = 3, act: str = "relu6",
                            seed: int = 0, stem: bool = True) -> onnx.ModelProto:
    """[a 3x3 stem conv →] MobileNetV2's block: 1x1 expand → act → depthwise kxk (stride) → act →
    1x1 project, and the residual add where the stride is 1. `act`: relu6 (Clip 0..6) or silu
    (x·sigmoid(x), EfficientNet). The stem is what makes a real network channels-last at fp16 on
    sm_90 (the Hopper implicit GEMM's layout), so the block's depthwise reads the channel innermost."""
    rng = np.random.default_rng(seed)
    c = x[1]
    hidden = c * expand

    def w(*shape):
        return (rng.standard_normal(shape) / math.sqrt(math.prod(shape[1:]))).astype(np.float32)
    inits = {"we": w(hidden, c, 1, 1), "be": (0.1 * rng.standard_normal(hidden)).astype(np.float32),
             "wd": w(hidden, 1, kernel, kernel), "bd": (0.1 * rng.standard_normal(hidden)).astype(np.float32),
             "wp": w(c, hidden, 1, 1), "bp": (0.1 * rng.standard_normal(c)).astype(np.float32),
             "lo": _scalar(0.0), "hi": _scalar(6.0), "ws": w(c, c, 3, 3)}

    def activation(src: str, dst: str) -> list[onnx.NodeProto]:
        if act == "relu6":
            return [helper.make_node("Clip", [src, "lo", "hi"], [dst])]
        return [helper.make_node("Sigmoid", [src], [dst + "_s"]), helper.make_node("Mul", [src, dst + "_s"], [dst])]
    pad = kernel // 2
    src = "in0"
    nodes = []
    if stem:
        nodes, src = [helper.make_node("Conv", ["in0", "ws"], ["s"], pads=[1, 1, 1, 1])], "s"
    nodes += [helper.make_node("Conv", [src, "we", "be"], ["e"])] + activation("e", "ea") + [
        helper.make_node("Conv", ["ea", "wd", "bd"], ["d"], group=hidden, strides=[stride, stride],
                         pads=[pad, pad, pad, pad], kernel_shape=[kernel, kernel])] + activation("d", "da") + [
        helper.make_node("Conv", ["da", "wp", "bp"], ["p" if stride == 1 else "out"])]
    if stride == 1:
        nodes.append(helper.make_node("Add", ["p", src], ["out"]))
    return _infer_output(_graph_model(nodes, "inverted_residual", {"in0": x}, {}, inits))
