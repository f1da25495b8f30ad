"""Two ways the Hopper convolution engine reaches the late and the thin layers:
passes/unfold_taps.py (a thin-channel input's filter columns unfolded into its copy) and
split-k in codegen/conv_wgmma.py (a tile's k-blocks shared among CTAs).

CPU: the rewrite is chosen by cost with both predictions recorded, `--pin unfold=0/1/2` overrides
it, and the interpreter computes the same outputs before and after it; ineligible convolutions
are left alone. Split-k is offered only where the tiles leave SMs idle, its scratch is sized
per tile, and its CUDA builds without spills. GPU (`gpu`): both against numpy float64 on fresh
random inputs; tolerances on max|y - ref| / max|ref|: fp16 1e-2, bf16 2e-2.
"""
from __future__ import annotations

import math
import shutil

import numpy as np
import pytest

from aicfc.codegen import conv_wgmma
from aicfc.codegen.scratch import scratch
from aicfc.passes.unfold_taps import RULE
from tests import onnx_builders as B
from tests.test_conv_wgmma import GPU_RTOL, _gpu_check, _records, _stages
from tests.test_pipeline import evaluate_ir, rel_err

STEMS = [
    # (input, filter, attributes): the ResNet stem; a dilated 5x5 at stride 1; 4 channels, 3x3; 16 channels, 3x3
    ("7x7_s2_c3", (2, 3, 32, 32), (64, 3, 7, 7), dict(strides=[2, 2], pads=[3, 3, 3, 3])),
    ("5x5_d2_c3", (2, 3, 20, 18), (16, 3, 5, 5), dict(dilations=[2, 2], pads=[4, 4, 4, 4])),
    ("3x3_c4_asym", (3, 4, 13, 9), (24, 4, 3, 3), dict(pads=[0, 1, 1, 0])),
    ("3x3_s2_c16", (2, 16, 15, 15), (40, 16, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1])),
]


def _model(case, act="relu"):
    _, x, w, attrs = case
    return B.conv_model(x, w, bn=act is not None, act=act, **attrs)


@pytest.mark.parametrize("case", STEMS, ids=[c[0] for c in STEMS])
def test_unfolded_stem_is_an_identity(case):
    """Forced (unfold=1), the copy holds U[n, h, ow, 64 / Cp slots, Cp channels] viewed as 64 channels,
    the convolution is KH x 1 over them, the filter [O, KH, 1, 64]; the interpreter's outputs are
    those of the plan before any layout decision and of onnxruntime."""
    model = _model(case)
    st = _stages(model, pin={"unit": "wgmma", "unfold": "1"})
    plan = st["plan_memory"]
    (r,) = _records(plan, RULE)
    assert r.applied and "predicted" in r.reason and "--pin unfold=1" in r.reason
    copy, k = plan.kernels[:2]
    n, c, h, w = case[1]
    cp = -(-c // 8) * 8      # the padded copy's channels: whole 16-byte runs
    o, _, kh, kw = case[2]
    _, pl, _, pr = case[3].get("pads", [0] * 4)
    ow = (w + pl + pr - case[3].get("dilations", [1, 1])[1] * (kw - 1) - 1) // case[3].get("strides", [1, 1])[1] + 1
    assert copy.family == "pointwise" and copy.ops[0].type.shape == (n, h, ow, 64 // cp, cp)
    assert k.family == "conv" and k.ops[0].reduce == (64, kh, 1) and k.schedule.param["unit"] == "wgmma"
    from aicfc.ir.properties import implicit_gemm
    assert plan.types()[implicit_gemm(k.ops[0]).b.buffer].shape == (o, kh, 1, 64)
    inputs = B.random_inputs(model, seed=3)
    before, after = evaluate_ir(st["apply_precision"], inputs), evaluate_ir(plan, inputs)
    assert rel_err(after["out"], before["out"].astype(np.float64)) < 1e-5
    assert rel_err(after["out"], B.run_onnxruntime(model, inputs)["out"]) < 1e-2


@pytest.mark.parametrize("case", STEMS, ids=[c[0] for c in STEMS])
def test_row_phases_are_an_identity(case):
    """unfold=2 ([Note: row phases]): where the stride along h is 2 and two rows of the filter's columns of
    the source's channels fit 64 elements (the 7x7 stride-2 stem: 2 x 8 slots x 4 channels), the copy is
    U[n, OH + KQ - 1, ow, 4, 2, 8] (channels, rows, columns), the convolution KQ x 1 at stride 1 and the filter [O, KQ, 1, 64];
    elsewhere the columns alone, as unfold=1. The interpreter's outputs are the plan's before any
    layout decision."""
    model = _model(case)
    st = _stages(model, pin={"unit": "wgmma", "unfold": "2"})
    plan = st["plan_memory"]
    (r,) = _records(plan, RULE)
    assert r.applied and "--pin unfold=2" in r.reason
    copy, k = plan.kernels[:2]
    n, c, h, w = case[1]
    o, _, kh, kw = case[2]
    stride, pads = case[3].get("strides", [1, 1]), case[3].get("pads", [0] * 4)
    if case[0] == "7x7_s2_c3":
        oh = (h + pads[0] + pads[2] - kh) // stride[0] + 1
        ow = (w + pads[1] + pads[3] - kw) // stride[1] + 1
        taps = -(-kh // 2)
        assert copy.ops[0].type.shape == (n, oh + taps - 1, ow, 4, 2, 8) and "row phases" in r.reason
        assert k.ops[0].reduce == (64, taps, 1)
        from aicfc.ir.properties import implicit_gemm
        assert plan.types()[implicit_gemm(k.ops[0]).b.buffer].shape == (o, taps, 1, 64)
    else:
        assert "row phases" not in r.reason and k.ops[0].reduce == (64, kh, 1)
    inputs = B.random_inputs(model, seed=5)
    before, after = evaluate_ir(st["apply_precision"], inputs), evaluate_ir(plan, inputs)
    assert rel_err(after["out"], before["out"].astype(np.float64)) < 1e-5


def test_stem_takes_row_phases_by_cost():
    """ResNet-50's stem at B32: both unfolded variants planned; two rows a pixel predicts less (half the
    copy's bytes, 4 k-blocks a tile instead of 7), and the record names the other's figure."""
    model = B.conv_model((32, 3, 224, 224), (64, 3, 7, 7), bn=True, act="relu", strides=[2, 2], pads=[3, 3, 3, 3])
    plan = _stages(model)["plan_memory"]
    (r,) = _records(plan, RULE)
    assert r.applied and "row phases" in r.reason and "with 1 image row a pixel" in r.reason
    copy = plan.kernels[0]
    assert copy.ops[0].type.shape == (32, 115, 112, 4, 2, 8)


def test_stem_unfolds_by_cost_and_pins_override():
    """ResNet-50's stem at B32: unfolded by cost, both predictions in the record, the convolution
    then reading 128-byte rows by the TMA's im2col mode; unfold=0 keeps the padded copy."""
    model = B.conv_model((32, 3, 224, 224), (64, 3, 7, 7), bn=True, act="relu", strides=[2, 2], pads=[3, 3, 3, 3])
    plan = _stages(model)["plan_memory"]
    (r,) = _records(plan, RULE)
    assert r.applied and "against" in r.reason and r.bytes_saved < 0
    t_new, t_old = (float(x) for x in r.reason.split("predicted ")[1].replace(" us for the unfolded copy and "
                                                                              "convolution against", "").split()[:2])
    assert t_new < t_old
    k = next(k for k in plan.kernels if k.family == "conv")
    assert k.schedule.param["A"] == "tma"
    kept = _stages(model, pin={"unfold": "0"})["plan_memory"]
    (r0,) = _records(kept, RULE)
    assert not r0.applied and "--pin unfold=0" in r0.reason
    assert next(k for k in kept.kernels if k.family == "conv").ops[0].reduce == (8, 7, 7)


def test_ineligible_convolutions_are_left_alone():
    """64 channels (a tap is already a 128-byte row), an intermediate image, and a bad pin value."""
    wide = _stages(B.conv_model((2, 64, 14, 14), (64, 64, 3, 3), pads=[1, 1, 1, 1]), pin={"unit": "wgmma"})
    (r,) = _records(wide["plan_memory"], RULE)
    assert not r.applied and r.target == "in0" and "3 filter columns of 64 channels do not fit" in r.reason
    stage = _stages(B.resnet_stage_model((2, 64, 28, 28), mid=64, out=256, stride=2))["plan_memory"]
    assert not _records(stage, RULE)
    from aicfc.errors import AicfError
    with pytest.raises(AicfError, match="unfold=0"):
        _stages(_model(STEMS[0]), pin={"unfold": "yes"})


# ---------------------------------------------------------------- split-k

LATE = [
    # ResNet-50 B32's stage-4 3x3 at batch 2 (few tiles, K = 4608) and stage-3's at batch 4
    ("3x3_c512", (2, 512, 7, 7), (512, 512, 3, 3), dict(pads=[1, 1, 1, 1])),
    ("3x3_c256_s2", (4, 256, 14, 14), (256, 256, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1])),
]


@pytest.mark.parametrize("case", LATE, ids=[c[0] for c in LATE])
def test_split_k_offered_where_tiles_leave_sms_idle(case):
    model = _model(case)
    plan = _stages(model, pin={"unit": "wgmma", "SPLITK": 2, "CL": 0})["plan_memory"]   # through scratch
    k = next(k for k in plan.kernels if k.family == "conv")
    p = k.schedule.param
    m, n, kk = conv_wgmma.dims(k)
    tiles = conv_wgmma.tiles(k, p)[2]
    assert p["SPLITK"] == 2 and p["CTAS"] == min(2 * tiles, 132) and tiles < 132
    part, tick = scratch(k)
    assert part.type.shape == (tiles * 2 * p["BM"] * p["BN"],) and tick.type.shape == (tiles,) and tick.zeroed
    terms = dict(k.schedule.predicted)
    assert terms["t_reduce_us"] > 0 and terms["tiles_per_sm"] == math.ceil(2 * tiles / p["CTAS"])
    from aicfc.codegen.module import render_module
    src = render_module(plan)
    assert "unit < " + str(tiles * 2) in src and "atomicAdd" in src
    # a convolution with many tiles is not offered split-k
    big = _stages(B.conv_model((32, 64, 56, 56), (64, 64, 3, 3), pads=[1, 1, 1, 1]), pin={"unit": "wgmma"})
    kb = next(k for k in big["plan_memory"].kernels if k.family == "conv")
    assert conv_wgmma.split_ks(conv_wgmma.tiles(kb, kb.schedule.param)[2], 9, 132) == [1]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("a", ["gather", "tma"])
def test_split_k_builds_without_spills(a, tmp_path, monkeypatch):
    from aicfc.codegen.module import render_module
    from aicfc.codegen.nvcc import build
    monkeypatch.setenv("AICF_CACHE_DIR", str(tmp_path))
    plan = _stages(_model(LATE[0]), pin={"unit": "wgmma", "SPLITK": 4, "A": a})["plan_memory"]
    k = next(k for k in plan.kernels if k.family == "conv")
    built = build(render_module(plan), "sm_90")
    assert built.spills.get(k.name, 0) == 0, built.spills


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("unfold", ["1", "2"])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("case", STEMS, ids=[c[0] for c in STEMS])
def test_gpu_unfolded_stem(case, precision, unfold, gpu_device):
    payload = _gpu_check(_model(case), precision, gpu_device, {"unit": "wgmma", "unfold": unfold})
    (k,) = [k for k in payload["kernels"] if k["family"] == "conv"]
    assert k["params"]["unit"] == "wgmma"


@pytest.mark.gpu
@pytest.mark.parametrize("pin", [{"SPLITK": 2, "A": "tma"}, {"SPLITK": 4, "A": "gather"}, {"SPLITK": 3, "A": "tma", "BN": 64}],
                         ids=["sk2_tma", "sk4_gather", "sk3_tma_bn64"])
@pytest.mark.parametrize("case", LATE, ids=[c[0] for c in LATE])
def test_gpu_conv_split_k(case, pin, gpu_device):
    """Three runs of one executor on fresh inputs each: the last split of a tile resets its ticket,
    so every run after the first (a graph replay's situation) finds them at zero again."""
    import aicfc
    from aicf_run.bundle import Bundle
    from aicf_run.executor import Executor
    from aicfc.frontend.onnx_import import import_model
    from aicfc.ir.high import evaluate_graph
    model = _model(case)
    try:
        payload = aicfc.compile(model, target=gpu_device.arch, precision="fp16", pin=dict(pin, unit="wgmma"))
    except Exception as e:  # noqa: BLE001 - a split outside this convolution's space
        if "no feasible conv candidate matches --pin" in str(e):
            pytest.skip(str(e))
        raise
    (k,) = [k for k in payload["kernels"] if k["family"] == "conv"]
    assert k["params"]["SPLITK"] == pin["SPLITK"]
    graph = import_model(model, None)
    ex = Executor(Bundle.from_payload(payload), gpu_device)
    try:
        ex.poison()
        for seed in range(3):
            rng = np.random.default_rng()
            inputs = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs}
            want = evaluate_graph(graph, inputs, dtype=np.float64)
            got = ex.run(inputs)
            for name, r in want.items():
                assert not np.isnan(got[name]).any(), f"run {seed}: {name}: NaN"
                assert rel_err(got[name], r) <= GPU_RTOL["fp16"], f"run {seed} {pin}: {name}"
    finally:
        ex.close()


def test_rewrites_weigh_by_the_profile_planned_with():
    """unfold_taps (and channels_last, pool_epilogue) decide by the predictions of the profile the
    pipeline plans with (`--profile`), not the target's own: a profile whose launches cost 40 us more
    moves the figures in the stem's record by whole launches."""
    from aicfc.passes.pipeline import PIPELINE, Options
    from aicfc.planner.hardware import Profile, load_profile
    from aicfc.frontend.onnx_import import import_model
    model = B.conv_model((32, 3, 224, 224), (64, 3, 7, 7), bn=True, act="relu", strides=[2, 2], pads=[3, 3, 3, 3])

    def figures(hw) -> tuple[float, float]:
        ir = import_model(model)
        for stage in PIPELINE:
            ir = stage.run(ir, Options("sm_90", hw, "fp16", ()))
            if stage.name == "unfold_taps":
                break
        (r,) = _records(ir, RULE)
        return tuple(float(x) for x in r.reason.split("predicted ")[1].replace(
            " us for the unfolded copy and convolution against", "").split()[:2])
    base = load_profile("sm_90")
    slow = Profile({**base.data, "launch_overhead_us": base.launch_overhead_us + 40.0})
    (new0, old0), (new1, old1) = figures(base), figures(slow)
    assert new1 - new0 >= 40.0 and old1 - old0 >= 40.0
