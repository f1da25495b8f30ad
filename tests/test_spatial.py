"""Issue 18's spatial ops: Conv and pools over 1-D and 3-D inputs, ConvTranspose, Resize.

Each model here runs through every pass with the interpreters against onnxruntime (CPU, fresh
random inputs, 1e-4 of the output's max at fp32), is checked for the kernel families it forms,
is built by nvcc at fp32 and fp16, and (`gpu`) runs on the GPU against the High IR interpreter
in float64 (fp32 1e-4, fp16 1e-2 of the output's max, as tests/test_conv.py). Variants the
compiler does not take are refused at import with one line naming them.
"""
from __future__ import annotations

import math
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from aicfc.errors import AicfError
from aicfc.frontend.onnx_import import import_model
from tests import onnx_builders as B
from tests.test_pipeline import evaluate_ir, rel_err, stages

OPSET = 18
GPU_RTOL = {"fp32": 1e-4, "fp16": 1e-2}


def model(nodes: list[onnx.NodeProto], x: tuple[int, ...], inits: dict[str, np.ndarray],
          opset: int = OPSET) -> onnx.ModelProto:
    """in0 → nodes → out, the output typed by ONNX shape inference."""
    g = helper.make_graph(nodes, "spatial", [helper.make_tensor_value_info("in0", TensorProto.FLOAT, list(x))], [],
                          [numpy_helper.from_array(np.asarray(a), k) for k, a in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=B.IR_VERSION)
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    m.graph.output.append(next(v for v in inferred.graph.value_info if v.name == "out"))
    return m


def _w(rng, *shape) -> np.ndarray:
    return (rng.standard_normal(shape) / math.sqrt(math.prod(shape[1:]))).astype(np.float32)


def conv_t(x: tuple[int, ...], w: tuple[int, ...], bias: bool = True, seed: int = 0, **attrs) -> onnx.ModelProto:
    """in0 → ConvTranspose(w[, b]) → out; w is [C, M/group, k..]."""
    rng = np.random.default_rng(seed)
    inits = {"w": _w(rng, *w)}
    if bias:
        inits["b"] = (0.1 * rng.standard_normal(w[1] * attrs.get("group", 1))).astype(np.float32)
    return model([helper.make_node("ConvTranspose", ["in0", *inits], ["out"], name="convT_0", **attrs)], x, inits)


def resize(x: tuple[int, ...], scales=None, sizes=None, **attrs) -> onnx.ModelProto:
    inits = {"roi": np.zeros(0, np.float32)}
    ins = ["in0", "roi"]
    if scales is not None:
        inits["scales"] = np.asarray(scales, np.float32)
        ins.append("scales")
    else:
        inits["sizes"] = np.asarray(sizes, np.int64)
        ins += ["", "sizes"]
    return model([helper.make_node("Resize", ins, ["out"], name="resize_0", **attrs)], x, inits)


def resize10(x: tuple[int, ...], scales, mode: str) -> onnx.ModelProto:
    """Resize before opset 11: inputs X and scales; asymmetric coordinates, nearest rounds down."""
    inits = {"scales": np.asarray(scales, np.float32)}
    return model([helper.make_node("Resize", ["in0", "scales"], ["out"], name="resize_0", mode=mode)], x, inits, 10)


def window(op: str, x: tuple[int, ...], opset: int = OPSET, **attrs) -> onnx.ModelProto:
    return model([helper.make_node(op, ["in0"], ["out"], name=f"{op.lower()}_0", **attrs)], x, {}, opset)


def conv1d_stack() -> onnx.ModelProto:
    """Whisper's front end as a plain graph: Conv1d k3 p1, GELU (erf), Conv1d k3 s2 p1, GELU."""
    rng = np.random.default_rng(3)
    inits = {"w1": _w(rng, 16, 8, 3), "b1": np.zeros(16, np.float32) + 0.1, "w2": _w(rng, 16, 16, 3),
             "b2": (0.1 * rng.standard_normal(16)).astype(np.float32), "half": np.float32(0.5),
             "one": np.float32(1.0), "rs2": np.float32(1 / math.sqrt(2))}
    nodes = []
    for k, (src, w, b, stride) in enumerate((("in0", "w1", "b1", 1), ("g0", "w2", "b2", 2))):
        out = "out" if k == 1 else f"g{k}"
        nodes += [helper.make_node("Conv", [src, w, b], [f"c{k}"], kernel_shape=[3], pads=[1, 1], strides=[stride]),
                  helper.make_node("Mul", [f"c{k}", "rs2"], [f"s{k}"]), helper.make_node("Erf", [f"s{k}"], [f"e{k}"]),
                  helper.make_node("Add", [f"e{k}", "one"], [f"a{k}"]),
                  helper.make_node("Mul", [f"c{k}", f"a{k}"], [f"m{k}"]),
                  helper.make_node("Mul", [f"m{k}", "half"], [out])]
    return model(nodes, (2, 8, 30), inits)


CASES = {
    "conv1d_k3_p1": lambda: B.conv_model((2, 8, 30), (16, 8, 3), pads=[1, 1]),
    "conv1d_k3_s2_relu": lambda: B.conv_model((2, 8, 31), (16, 8, 3), strides=[2], pads=[1, 1], act="relu"),
    "conv1d_groups_dilated": lambda: B.conv_model((1, 4, 20), (6, 2, 3), group=2, dilations=[2]),
    "conv1d_depthwise": lambda: B.conv_model((1, 6, 20), (6, 1, 5), group=6, pads=[2, 2]),
    "conv1d_pointwise": lambda: B.conv_model((1, 6, 20), (5, 6, 1)),
    "conv1d_stack_gelu": conv1d_stack,
    "conv3d_p1": lambda: B.conv_model((1, 4, 6, 7, 5), (6, 4, 3, 3, 3), pads=[1] * 6),
    "conv3d_depthwise": lambda: B.conv_model((1, 4, 6, 7, 5), (4, 1, 3, 3, 3), group=4, pads=[1] * 6),
    "conv3d_groups_s2_bn": lambda: B.conv_model((1, 4, 6, 7, 5), (6, 2, 3, 1, 3), group=2, strides=[2, 1, 1],
                                                bn=True, act="relu"),
    "maxpool1d_s2_p1": lambda: window("MaxPool", (2, 3, 17), kernel_shape=[3], strides=[2], pads=[1, 1]),
    "maxpool1d_s2": lambda: window("MaxPool", (2, 3, 17), kernel_shape=[3], strides=[2]),
    "avgpool1d_ceil": lambda: window("AveragePool", (2, 3, 17), kernel_shape=[4], strides=[3], ceil_mode=1),
    "maxpool3d": lambda: window("MaxPool", (1, 3, 8, 9, 7), kernel_shape=[2, 2, 2], strides=[2, 2, 2]),
    "avgpool3d_pads": lambda: window("AveragePool", (2, 3, 7, 8, 9), kernel_shape=[3, 2, 3], strides=[2, 1, 2],
                                     pads=[1, 0, 1, 1, 1, 0]),
    "avgpool2d_dilated": lambda: window("AveragePool", (1, 3, 11, 10), 19, kernel_shape=[3, 3], dilations=[2, 2],
                                        pads=[1, 1, 1, 1]),   # dilations since opset 19
    "globalavgpool1d": lambda: window("GlobalAveragePool", (2, 3, 17)),
    "globalavgpool3d": lambda: window("GlobalAveragePool", (2, 3, 4, 5, 6)),
    "convT2d_k2_s2": lambda: conv_t((1, 16, 5, 6), (16, 8, 2, 2), strides=[2, 2]),
    "convT2d_k3_s2_p1_op1": lambda: conv_t((2, 4, 5, 5), (4, 6, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1],
                                           output_padding=[1, 1]),
    "convT2d_k4_s2_p1_groups": lambda: conv_t((1, 6, 4, 5), (6, 2, 4, 4), strides=[2, 2], pads=[1, 1, 1, 1],
                                              group=3),
    "convT2d_dilated_s1": lambda: conv_t((1, 3, 6, 6), (3, 4, 3, 3), dilations=[2, 2], bias=False),
    "convT2d_big_pads": lambda: conv_t((1, 3, 6, 6), (3, 4, 3, 3), strides=[3, 2], pads=[3, 2, 1, 3]),
    "convT1d_k4_s2_p1": lambda: conv_t((2, 8, 11), (8, 4, 4), strides=[2], pads=[1, 1]),
    "convT3d_k2_s2": lambda: conv_t((1, 4, 3, 4, 2), (4, 3, 2, 2, 2), strides=[2, 2, 2]),
    "resize_nearest_asym_floor_x2": lambda: resize((1, 3, 5, 6), scales=[1, 1, 2, 2], mode="nearest",
                                                   coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    "resize_nearest_half_pixel_sizes": lambda: resize((1, 3, 5, 6), sizes=[1, 3, 8, 9], mode="nearest"),
    "resize_nearest_align_corners": lambda: resize((2, 2, 4, 5), sizes=[2, 2, 7, 3], mode="nearest",
                                                   coordinate_transformation_mode="align_corners",
                                                   nearest_mode="round_prefer_ceil"),
    "resize_bilinear_half_pixel_x2": lambda: resize((1, 3, 5, 6), scales=[1, 1, 2, 2], mode="linear"),
    "resize_bilinear_align_corners": lambda: resize((1, 3, 5, 6), sizes=[1, 3, 9, 13], mode="linear",
                                                    coordinate_transformation_mode="align_corners"),
    "resize_bilinear_pytorch_half_pixel_down": lambda: resize((1, 2, 9, 8), sizes=[1, 2, 4, 1], mode="linear",
                                                              coordinate_transformation_mode="pytorch_half_pixel"),
    "resize_cubic_x2": lambda: resize((1, 2, 5, 6), scales=[1, 1, 2, 1.5], mode="cubic"),
    "resize_linear_1d": lambda: resize((2, 3, 7), scales=[1, 1, 2.5], mode="linear"),
    "resize_opset10_nearest": lambda: resize10((1, 2, 3, 5), [1, 1, 2, 1.5], "nearest"),
    "resize_opset10_linear": lambda: resize10((1, 2, 3, 5), [1, 1, 2, 3], "linear"),
    "resize_nearest_3d": lambda: resize((1, 2, 3, 4, 5), scales=[1, 1, 2, 2, 2], mode="nearest",
                                        coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
}
FAMILIES = {
    "conv1d_k3_p1": ["conv"], "conv1d_stack_gelu": ["conv", "conv"], "conv3d_p1": ["conv"],
    "conv3d_depthwise": ["window"], "maxpool3d": ["window"], "convT2d_k2_s2": ["pointwise", "conv"],
    "convT2d_dilated_s1": ["conv"], "resize_bilinear_half_pixel_x2": ["pointwise"],
    "resize_nearest_3d": ["pointwise"], "resize_cubic_x2": ["pointwise"], "conv1d_pointwise": ["gemm"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_stage_matches_onnxruntime(case):
    m = CASES[case]()
    inputs = B.random_inputs(m, seed=sum(map(ord, case)))
    ref = B.run_onnxruntime(m, inputs)
    for name, ir in stages(m).items():
        got = evaluate_ir(ir, inputs)
        for out, r in ref.items():
            err = rel_err(got[out], r)
            assert err <= 1e-4, f"{case} after {name}: {out} rel err {err:.2e}"


@pytest.mark.parametrize("case", sorted(FAMILIES))
def test_families(case):
    plan = stages(CASES[case]())["plan_memory"]
    assert [k.family for k in plan.kernels] == FAMILIES[case]


def test_conv_transpose_is_a_conv_of_the_zero_inserted_input():
    """One zero-insertion map and one implicit GEMM; the filter is flipped at compile time."""
    graph = import_model(CASES["convT2d_k3_s2_p1_op1"]())
    assert [n.op for n in graph.nodes] == ["Reshape", "Pad", "Reshape", "Pad", "Conv"]
    conv = graph.nodes[-1]
    assert dict(conv.attr)["strides"] == (1, 1) and conv.type.shape == (2, 6, 10, 10)
    flipped = next(w for w in graph.weights if w.name == conv.inputs[1]).array()
    original = numpy_helper.to_array(CASES["convT2d_k3_s2_p1_op1"]().graph.initializer[0])
    assert np.array_equal(flipped, original.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1])
    from aicfc.frontend.spatial import CONV_TRANSPOSE_RULE
    rewrites = stages(CASES["convT2d_k3_s2_p1_op1"]())["lower"].rewrites
    assert any(r.rule == CONV_TRANSPOSE_RULE and r.applied for r in rewrites)


def test_resize_reads_through_index_tables():
    """Nearest: one indirect read per output; bilinear: four, weighted; one kernel each."""
    for case, reads in (("resize_nearest_asym_floor_x2", 1), ("resize_bilinear_half_pixel_x2", 4),
                        ("resize_cubic_x2", 16)):
        lowered = stages(CASES[case]())["lower"]
        (op,) = lowered.ops
        from aicfc.ir.lowered import indirect_dims, loads
        assert sum(1 for ld in loads(op.body) if ld.buffer == "in0" and indirect_dims(ld)) == reads, case


def test_resize_tables_match_the_reference_formulas():
    """The tap tables against the specification's formulas, written out independently."""
    from aicfc.ir.resize import taps
    at = {"mode": "linear", "coordinate_transformation_mode": "half_pixel", "nearest_mode": "round_prefer_floor",
          "cubic_coeff_a": -0.75, "exclude_outside": 0}
    idx, wt = taps(5, 10, 2.0, at)
    for o in range(10):
        x = min(max((o + 0.5) / 2 - 0.5, 0), 4)
        lo = int(np.floor(x))
        dense = np.zeros(5)
        dense[lo] += 1 - (x - lo)
        dense[min(lo + 1, 4)] += x - lo
        got = np.zeros(5)
        np.add.at(got, idx[o], wt[o])
        assert np.allclose(got, dense), o
    idx, wt = taps(4, 9, 9 / 4, dict(at, mode="nearest", coordinate_transformation_mode="asymmetric",
                                     nearest_mode="floor"))
    assert idx[:, 0].tolist() == [int(np.floor(o / 2.25)) for o in range(9)] and np.all(wt == 1)


@pytest.mark.parametrize("build,message", [
    (lambda: resize((1, 1, 4, 4), scales=[1, 1, 2, 2], mode="linear",
                    coordinate_transformation_mode="tf_crop_and_resize"), "tf_crop_and_resize"),
    (lambda: resize((1, 1, 4, 4), scales=[1, 1, 0.5, 0.5], mode="linear", antialias=1), "antialias"),
    (lambda: resize((1, 1, 4, 4), scales=[1, 1, 2, 2], mode="area"), "mode 'area'"),
    (lambda: resize((1, 2, 3, 4, 5), scales=[1, 2, 2, 2, 2], mode="cubic"), "256 inputs per output"),
    (lambda: window("MaxPool", (1, 1, 2, 3, 4, 5), kernel_shape=[2, 2, 2, 2]), "rank-6"),
    (lambda: B.conv_model((1, 2, 3, 3, 3, 3), (2, 2, 1, 1, 1, 1)), "rank-6"),
    (lambda: conv_t((1, 2, 3, 3, 3, 3), (2, 2, 1, 1, 1, 1)), "rank-6"),
])
def test_refused_variants_are_named(build, message):
    with pytest.raises(AicfError, match=message) as e:
        import_model(build())
    assert "\n" not in str(e.value)


def test_run_time_resize_scales_are_refused():
    m = resize((1, 1, 4, 4), scales=[1, 1, 2, 2])
    m.graph.initializer.pop()   # scales becomes a graph input
    m.graph.input.append(helper.make_tensor_value_info("scales", TensorProto.FLOAT, [4]))
    with pytest.raises(AicfError, match="scales is computed at run time"):
        import_model(m)


# ---------------------------------------------------------------- nvcc

BUILD_CASES = ["conv1d_stack_gelu", "conv3d_groups_s2_bn", "avgpool3d_pads", "maxpool1d_s2", "convT2d_k4_s2_p1_groups",
               "convT1d_k4_s2_p1", "resize_bilinear_align_corners", "resize_cubic_x2", "resize_nearest_3d"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_nvcc_builds(precision, tmp_path, monkeypatch):
    """Every kernel of the cases above compiles for sm_90 (one module per case)."""
    from aicfc.codegen.module import render_module
    from aicfc.codegen.nvcc import build
    monkeypatch.setenv("AICF_CACHE_DIR", str(tmp_path))
    for case in BUILD_CASES:
        plan = stages(CASES[case](), precision)["plan_memory"]
        built = build(render_module(plan), "sm_90")
        assert set(built.registers) == {k.name for k in plan.kernels}, case


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_gpu_matches_float64(case, precision, gpu_device):
    import aicfc
    from aicfc.ir.high import evaluate_graph
    from tests.conftest import run_payload
    m = CASES[case]()
    payload = aicfc.compile(m, target=gpu_device.arch, precision=precision)
    graph = import_model(m)
    rng = np.random.default_rng(11)
    inputs = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs}
    ref = evaluate_graph(graph, inputs, dtype=np.float64)
    got = run_payload(payload, inputs, gpu_device)
    for name, r in ref.items():
        err = rel_err(got[name], r)
        assert err <= GPU_RTOL[precision], f"{case} {precision}: {name} rel err {err:.2e}"


@pytest.mark.parametrize("case", ["resize_bilinear_align_corners", "resize_cubic_x2", "convT2d_k4_s2_p1_groups",
                                  "conv3d_groups_s2_bn", "avgpool3d_pads"])
def test_ir_text_parses_back(case):
    from aicfc.ir.high import parse_graph
    from aicfc.ir.lowered import parse_program
    st = stages(CASES[case]())
    graph, lowered = st["import"], st["lower"]
    assert parse_graph(str(graph), {w.name: w.data for w in graph.weights}) == graph
    assert parse_program(str(lowered), {w.name: w.data for w in lowered.weights}) == lowered
