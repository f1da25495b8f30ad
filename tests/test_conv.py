"""Convolutional ops: guarded loads in the Lowered IR, the conv (implicit GEMM) and window
families, BatchNormalization folding, golden IR text for Conv+BN+Relu, nvcc builds, the onnx
package's light models under `aicfc check`, and GPU runs against a float64 reference.

Every op case also runs through every pass with the interpreters in tests/test_pipeline.py
(`onnx_builders._cnn_cases` are part of OP_CASES). GPU tolerances on max|y - ref| / max|ref|:
fp32 1e-4, fp16 1e-2.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from aicfc.errors import AicfError
from aicfc.frontend.onnx_import import find_unsupported, import_model
from aicfc.ir.decision import parse_plan
from aicfc.ir.lowered import Affine, Compute, Load, Program, parse_program, verify_program
from aicfc.ir.types import TensorType, Value
from aicfc.passes.pipeline import PIPELINE, Options
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B
from tests.conftest import check_golden
from tests.test_pipeline import rel_err

GOLDEN = Path(__file__).parent / "golden"
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
GPU_RTOL = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 2e-2}   # bf16: 8 bits of mantissa, as test_conv_wgmma


def _compile(model: onnx.ModelProto, precision: str = "fp32", until: str | None = None):
    ir = import_model(model)
    opts = Options("sm_90", load_profile("sm_90"), precision=precision)
    for stage in PIPELINE:
        if stage.name == until:
            break
        ir = stage.run(ir, opts)
    return ir


# ---------------------------------------------------------------- guarded loads


def _padded_program(fill: float | None) -> Program:
    x = Value("x", TensorType("f32", (1, 1, 4, 4)))
    ld = Load("x", (Affine.var("i0"), Affine.var("i1"), Affine.of({"i2": 1, "r0": 1}, -1),
                    Affine.of({"i3": 1, "r1": 1}, -1)), fill)
    op = Compute("y", TensorType("f32", (1, 1, 4, 4)), "max", (3, 3), ld, ("pool",))
    return Program("p", (x,), (), (op,), ("y",))


def test_guarded_load_prints_parses_and_verifies():
    p = _padded_program(-float("inf"))
    verify_program(p)
    text = str(p)
    assert "fill=-inf" in text and "i2+r0+-1" in text
    assert parse_program(text, {}) == p
    assert p.ops[0].body.guarded_dims == (2, 3)


def test_unguarded_padding_is_rejected():
    with pytest.raises(AicfError, match="dim 2 ranges -1..4"):
        verify_program(_padded_program(None))


def test_guarded_plain_variable_must_stay_inside():
    p = _padded_program(0.0)
    bad = Load("x", (Affine.var("i0"), Affine.var("r0"), Affine.var("i2"), Affine.var("i3")), 0.0)
    p = p.replace(ops=(Compute("y", p.ops[0].type, "sum", (3,), bad, ()),))
    with pytest.raises(AicfError, match="dim 1 ranges 0..2"):
        verify_program(p)


def test_interpreter_reads_fill_outside():
    from aicfc.ir.interp import evaluate_program
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    y = evaluate_program(_padded_program(-float("inf")), {"x": x})["y"]
    ref = np.array([[max(x[0, 0, max(i - 1, 0):i + 2, max(j - 1, 0):j + 2].ravel()) for j in range(4)] for i in range(4)])
    assert np.array_equal(y[0, 0], ref)


# ---------------------------------------------------------------- kernels formed


def test_conv_bn_relu_is_one_conv_kernel():
    plan = _compile(B.conv_model((1, 3, 8, 8), (4, 3, 3, 3), bn=True, act="relu", pads=[1, 1, 1, 1]))
    (k,) = plan.kernels
    assert k.family == "conv" and "tile_compatible_compute" in k.properties
    assert k.rewrites == ("contraction + map => gemm epilogue",)
    rules = {r.rule for r in plan.rewrites if r.applied}
    assert "Conv + BatchNormalization => Conv with folded weights" in rules
    assert not any(w.name in ("scale", "mean", "var") for w in plan.weights)


@pytest.mark.parametrize("build,family", [
    (lambda: B.conv_model((1, 6, 9, 9), (6, 1, 3, 3), group=6, pads=[1, 1, 1, 1]), "window"),
    (lambda: B.window_model("MaxPool", (1, 3, 9, 9), kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), "window"),
    (lambda: B.window_model("GlobalAveragePool", (2, 8, 7, 7)), "row_reduce"),
    (lambda: B.batch_norm_model((2, 5, 4, 3)), "pointwise"),
    (lambda: B.conv_model((1, 4, 8, 8), (6, 2, 3, 3), group=2, pads=[1, 1, 1, 1]), "conv"),
])
def test_families(build, family):
    assert [k.family for k in _compile(build()).kernels] == [family]


def test_fp16_offers_tensor_cores():
    # On sm_90 the input is copied channels-last and the Hopper engine's implicit GEMM wins by cost
    # (tests/test_conv_wgmma.py); mma.sync is offered beside it, and is what sm_80 gets.
    from aicfc.codegen import conv
    plan = _compile(B.conv_model((2, 32, 14, 14), (64, 32, 3, 3), pads=[1, 1, 1, 1]), "fp16")
    (k,) = [k for k in plan.kernels if k.family == "conv"]
    assert {"mma", "wgmma"} <= {p["unit"] for p in conv.space(k, plan)} and k.schedule.param["unit"] == "wgmma"
    ir = import_model(B.conv_model((2, 32, 14, 14), (64, 32, 3, 3), pads=[1, 1, 1, 1]))
    opts = Options("sm_80", load_profile("sm_80"), precision="fp16")
    for stage in PIPELINE:
        ir = stage.run(ir, opts)
    (k,) = ir.kernels
    units = {dict(c.params).get("unit") for c in k.schedule.candidates} | {k.schedule.param["unit"]}
    assert "mma" in units and k.schedule.param["unit"] == "mma"


def test_golden_conv_bn_relu():
    ir = _compile(B.conv_model((1, 3, 6, 6), (4, 3, 3, 3), bn=True, act="relu", strides=[2, 2], pads=[1, 1, 1, 1]),
                  until="apply_precision")
    lowered = _compile(B.conv_model((1, 3, 6, 6), (4, 3, 3, 3), bn=True, act="relu", strides=[2, 2],
                                    pads=[1, 1, 1, 1]), until="form_kernels")
    for name, text in (("conv_bn_relu_lowered.txt", str(lowered)), ("conv_bn_relu_kernels.txt", str(ir))):
        check_golden(name, text)
    weights = {w.name: w.data for w in lowered.weights}
    assert parse_program(str(lowered), weights) == lowered
    assert parse_plan(str(ir), weights) == ir


# ---------------------------------------------------------------- nvcc


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_nvcc_builds_for_sm90(precision, tmp_path, monkeypatch):
    from aicfc.codegen.module import render_module
    from aicfc.codegen.nvcc import build
    monkeypatch.setenv("AICF_CACHE_DIR", str(tmp_path))
    plan = _compile(B.cnn_block_model(), precision)
    families = {k.family for k in plan.kernels}
    assert {"conv", "window"} <= families
    built = build(render_module(plan), "sm_90")
    assert set(built.registers) == {k.name for k in plan.kernels}


# ---------------------------------------------------------------- the onnx package's light models


LIGHT_MODELS = sorted(p.name for p in LIGHT.glob("light_*.onnx")) if LIGHT.is_dir() else []
# The five light models with a Concat of run-time tensors: tests/test_concat.py.


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_passes_check(name):
    assert find_unsupported(onnx.load(str(LIGHT / name))) == []


@pytest.mark.parametrize("name", ["light_bvlc_alexnet.onnx", "light_zfnet512.onnx"])
def test_light_model_compiles(name):
    if name not in LIGHT_MODELS:
        pytest.skip(f"{name} is not in this onnx package")
    plan = _compile(onnx.load(str(LIGHT / name)))
    assert sum(k.family == "conv" for k in plan.kernels) == 5


def test_depthwise_weight_is_stored_channel_last_for_vector_taps():
    """[Note: a depthwise weight, channel last]: in an inverted residual block the depthwise
    convolution reads a channels-last image, its weight is stored [1, 3, 3, C], and the window
    takes 8 fp16 channels a thread, its bias and activation on each (the interpreters run every
    stage against onnxruntime in test_spatial/test_pipeline; here, the decision)."""
    from aicfc.passes.relayout_weights import WINDOW_RULE
    plan = _compile(B.inverted_residual_model((2, 16, 10, 10)), "fp16")
    (k,) = [k for k in plan.kernels if k.family == "window"]
    assert WINDOW_RULE in k.rewrites and k.schedule.param.get("vec") == 8, (k.rewrites, k.schedule.param)
    assert any(r.rule == WINDOW_RULE and r.applied and "[1, 3, 3, 64]" in r.reason for r in plan.rewrites)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("spec", [dict(x=(2, 16, 10, 10)), dict(x=(1, 8, 9, 9), kernel=5, act="silu"),
                                  dict(x=(2, 6, 9, 9), expand=3)], ids=["relu6", "silu_k5", "c18"])
def test_vector_depthwise_windows_build_without_spills(spec):
    """Every schedule of the vector depthwise window (8 or 2 channels a thread, with its
    epilogue) compiles for sm_90a with no local memory (ptxas -v)."""
    from aicfc.codegen import window
    from aicfc.codegen.module import count_registers
    plan = _compile(B.inverted_residual_model(**spec), "fp16")
    (k,) = [k for k in plan.kernels if k.family == "window"]
    space = [p for p in window.space(k, plan) if not p.get("TILE")]
    assert all(p.get("vec", 1) > 1 for p in space) and {p["PX"] for p in space} == set(window.run_lengths(k))
    (found,) = count_registers(plan, [(k, space)])
    assert all(not spill and 0 < regs <= (64 if p["PX"] == 1 else 255) for p, (regs, spill) in zip(space, found)), found


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("spec", [dict(x=(2, 16, 12, 12)), dict(x=(1, 8, 8, 8), kernel=5, act="silu"),
                                  dict(x=(2, 16, 12, 12), stride=2)], ids=["relu6", "silu_k5", "s2"])
def test_window_tiles_build_without_spills(spec):
    """[Note: window tiles]: every tile schedule of the depthwise window compiles for sm_90a with no
    local memory; its boxes fit the static shared memory."""
    from aicfc.codegen import window, window_tile
    from aicfc.codegen.module import count_registers
    plan = _compile(B.inverted_residual_model(**spec), "fp16")
    (k,) = [k for k in plan.kernels if k.family == "window"]
    space = [p for p in window.space(k, plan) if p.get("TILE")]
    assert space and all(p["SMEM"] <= window_tile.SMEM_LIMIT for p in space)
    (found,) = count_registers(plan, [(k, space[::3])])
    assert all(not spill and 0 < regs <= 255 for regs, spill in found), found


def test_window_tiles_need_channels_last_vectors():
    """A window over an NCHW image (fp32: no channels-last rewrite) is declined with the reason."""
    from aicfc.codegen import window
    plan = _compile(B.inverted_residual_model((2, 16, 12, 12)), "fp32")
    (k,) = [k for k in plan.kernels if k.family == "window"]
    assert not [p for p in window.space(k, plan) if p.get("TILE")]
    assert [why for p, why in window.declined(k, plan) if p.get("TILE")] or window.vector_width(k, plan.types()) == 1


@pytest.mark.parametrize("spec,px,image,weight", [(dict(x=(2, 16, 12, 12)), 4, 3 * 6, 9),
                                                  (dict(x=(2, 16, 12, 12), stride=2), 2, 3 * 5, 9),
                                                  (dict(x=(1, 8, 8, 8), kernel=5, act="silu"), 4, 5 * 8, 25),
                                                  (dict(x=(2, 16, 12, 12)), 1, 9, 9)])
def test_window_runs_load_each_element_once(spec, px, image, weight):
    """[Note: window runs]: a thread's PX outputs along the column read a row of KW taps as PX + KW - 1
    columns at stride 1 ((PX - 1)·2 + KW at stride 2), the filter's taps once for the run; the cost
    model counts fewer instructions an output for it."""
    from aicfc.codegen import window
    from aicfc.planner.cost import _window_vector_instructions
    plan = _compile(B.inverted_residual_model(**spec), "fp16")
    (k,) = [k for k in plan.kernels if k.family == "window"]
    kk = window.without_unit_taps(k)
    distinct = {at for _, ats in window.run_loads(kk, px) for at in ats.values()}
    by_buffer = {}
    for ld in distinct:
        by_buffer[ld.buffer] = by_buffer.get(ld.buffer, 0) + 1
    assert sorted(by_buffer.values()) == sorted([image, weight]), by_buffer
    if px > 1:
        one = _window_vector_instructions(k, {"vec": 8, "PX": 1}, plan.types())
        assert _window_vector_instructions(k, {"vec": 8, "PX": px}, plan.types()) < px * one


# ---------------------------------------------------------------- GPU


GPU_CONVS = [
    ("1x1", dict(x=(2, 64, 14, 14), w=(32, 64, 1, 1))),
    ("3x3_s1_pad1", dict(x=(2, 32, 17, 17), w=(48, 32, 3, 3), pads=[1, 1, 1, 1])),
    ("3x3_s2_pad1", dict(x=(1, 24, 15, 15), w=(40, 24, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1])),
    ("7x7_s2_pad3", dict(x=(1, 3, 33, 33), w=(16, 3, 7, 7), strides=[2, 2], pads=[3, 3, 3, 3])),
    ("dilated", dict(x=(1, 16, 13, 13), w=(16, 16, 3, 3), dilations=[2, 2], pads=[2, 2, 2, 2])),
    ("groups4", dict(x=(1, 32, 9, 9), w=(32, 8, 3, 3), group=4, pads=[1, 1, 1, 1])),
    ("depthwise", dict(x=(2, 24, 11, 11), w=(24, 1, 3, 3), group=24, strides=[2, 2], pads=[1, 1, 1, 1])),
    ("odd_same_upper", dict(x=(3, 5, 11, 7), w=(7, 5, 4, 3), strides=[2, 1], auto_pad="SAME_UPPER")),
]
GPU_POOLS = [
    ("maxpool", lambda: B.window_model("MaxPool", (2, 16, 17, 17), kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("maxpool_ceil", lambda: B.window_model("MaxPool", (1, 8, 10, 10), kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ("avgpool", lambda: B.window_model("AveragePool", (1, 8, 9, 9), kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
    ("globalavgpool", lambda: B.window_model("GlobalAveragePool", (2, 64, 7, 7))),
    ("lrn", lambda: B.window_model("LRN", (1, 16, 9, 9), size=5, alpha=1e-2, beta=0.75, bias=1.0)),
    ("cnn_block", B.cnn_block_model),
]


def _gpu_check(model, precision, device, pin=None):
    import aicfc
    from tests.conftest import run_payload
    from aicfc.ir.high import evaluate_graph
    payload = aicfc.compile(model, target=device.arch, precision=precision, pin=pin or {})
    graph = import_model(model, None)
    rng = np.random.default_rng(7)
    inputs = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs}
    ref = evaluate_graph(graph, inputs, dtype=np.float64)
    got = run_payload(payload, inputs, device)
    for name, r in ref.items():
        err = rel_err(got[name], r)
        assert err <= GPU_RTOL[precision], f"{precision} {pin}: {name} rel err {err:.2e}"
    return payload


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("act", [None, "relu"])
@pytest.mark.parametrize("case", GPU_CONVS, ids=[c for c, _ in GPU_CONVS])
def test_gpu_conv(case, act, precision, gpu_device):
    _, spec = case
    spec = dict(spec)
    model = B.conv_model(spec.pop("x"), spec.pop("w"), bn=act is not None, act=act, **spec)
    _gpu_check(model, precision, gpu_device)


@pytest.mark.gpu
@pytest.mark.parametrize("unit", ["simt", "mma"])
def test_gpu_conv_pinned_units(unit, gpu_device):
    """Both the SIMT and the tensor-core implicit GEMM, on odd sizes and a padded stride-2 conv."""
    model = B.conv_model((2, 19, 13, 11), (37, 19, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1], act="relu")
    payload = _gpu_check(model, "fp16", gpu_device, {"unit": unit})
    assert [k["params"]["unit"] for k in payload["kernels"] if k["family"] == "conv"] == [unit]


INVERTED = [("s1_relu6", dict(x=(2, 16, 10, 10))), ("s2_relu6", dict(x=(3, 24, 13, 11), stride=2)),
            ("s1_silu_k5", dict(x=(1, 8, 9, 9), kernel=5, act="silu")), ("s2_silu_odd", dict(x=(2, 12, 7, 9), stride=2, act="silu")),
            ("s1_c18", dict(x=(2, 6, 9, 9), expand=3))]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("case", INVERTED, ids=[c for c, _ in INVERTED])
def test_gpu_inverted_residual(case, precision, gpu_device):
    """MobileNetV2 / EfficientNet blocks: the depthwise convolution as a vector window over the
    channels-last image with its weight channel-last, bias and activation in the epilogue."""
    _gpu_check(B.inverted_residual_model(**case[1]), precision, gpu_device)


RUNS = [("s1_relu6", dict(x=(2, 16, 12, 12)), (2, 4)), ("s2_relu6", dict(x=(3, 24, 12, 16), stride=2), (2,)),
        ("s1_silu_k5", dict(x=(1, 8, 8, 8), kernel=5, act="silu"), (2, 4)),
        ("s2_silu_k5", dict(x=(2, 12, 8, 16), stride=2, kernel=5, act="silu"), (2, 4)),
        ("s1_c18", dict(x=(2, 6, 12, 12), expand=3), (2, 4))]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("case", RUNS, ids=[c for c, _, _ in RUNS])
def test_gpu_inverted_residual_runs(case, precision, gpu_device):
    """The depthwise window with PX outputs a thread along the column ([Note: window runs]): each pinned
    run length matches float64, padding on every side, the residual block's epilogue included (16-bit
    precisions: the image is channels-last, the window on vectors, there; at fp32 it is not)."""
    for px in case[2]:
        payload = _gpu_check(B.inverted_residual_model(**case[1]), precision, gpu_device, {"PX": px})
        assert [k["params"]["PX"] for k in payload["kernels"] if k["family"] == "window"] == [px]


TILE_PINS = [{"TILE": 1, "PX": 1}, {"TILE": 1, "PX": 2}, {"TILE": 1, "PX": 4},
             {"TILE": 1, "PX": 2, "TH": 8, "TW": 8}]   # the last: tiles past the 12x12 outputs' edges


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("case", RUNS, ids=[c for c, _, _ in RUNS])
def test_gpu_inverted_residual_tiles(case, precision, gpu_device):
    """The depthwise window in tiles ([Note: window tiles]): boxes in shared memory with the padding
    as zeros, runs along the row, partial tiles at the edges; every schedule offered under each pin
    is one the planner may pick."""
    from aicfc.codegen import window
    from tests.onnx_builders import inverted_residual_model
    model = inverted_residual_model(**case[1])
    plan = _compile(model, precision)
    (k,) = [k for k in plan.kernels if k.family == "window"]
    offered = [p for p in window.space(k, plan) if p.get("TILE")]
    for pin in TILE_PINS:
        if not any(all(p.get(key) == v for key, v in pin.items()) for p in offered):
            continue
        # pinned on the depthwise node alone (a plan-wide TH or TW would restrict the convolutions' spaces too)
        payload = _gpu_check(model, precision, gpu_device, {f"{k.origins[0]}:{key}": v for key, v in pin.items()})
        (got,) = [k["params"] for k in payload["kernels"] if k["family"] == "window"]
        assert all(got[key] == v for key, v in pin.items()), got


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("case", GPU_POOLS, ids=[c for c, _ in GPU_POOLS])
def test_gpu_pools(case, precision, gpu_device):
    _gpu_check(case[1](), precision, gpu_device)
