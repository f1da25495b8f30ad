"""FLAT = 1 on the Hopper engine: a batched GEMM whose images lie one after the other in every
tensor it touches runs them as more rows of one GEMM ([Note: images as rows] in
codegen/gemm_wgmma.py; `gemm.flat_var`, `gemm.shape`).

CPU: where it is legal (and where not: a table broadcast over the images), that it is offered
only where it leaves fewer tiles, what the rendered kernel indexes, that the cost model takes it
for a ResNet stage at 14x14 and that the kernel builds. GPU (`gpu`): the merged kernels against
numpy float64 (fp16: max|y - ref| / max|ref| <= 1e-2) over the engine's variants (ping-pong,
cooperative, TMA stores, clusters, split-k), and a ResNet stage against onnxruntime.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import helper

import aicfc
from aicfc.codegen import FAMILIES, gemm, gemm_wgmma
from aicfc.errors import AicfError
from aicfc.frontend.onnx_import import import_model
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B
from tests.test_gemm_gpu import _check, _model, broadcast_batch


def residual_matmul(b, s, k, n, rng):
    """y = relu(x[b, s, k] @ w + r[b, s, n]): the residual steps the images as x and y do."""
    return _model([helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "r"], ["q"]),
                   helper.make_node("Relu", ["q"], ["y"])], [("x", [b, s, k]), ("r", [b, s, n])], [b, s, n],
                  {"w": (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)})


def table_matmul(b, s, k, n, rng):
    """y = x[b, s, k] @ w + t[s, n]: the table is read at the same rows by every image."""
    return _model([helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "t"], ["y"])],
                  [("x", [b, s, k])], [b, s, n], {"w": rng.standard_normal((k, n)).astype(np.float32),
                                                  "t": rng.standard_normal((s, n)).astype(np.float32)})


def _plan(model, pin=None):
    graph = import_model(model, None)
    return run_pipeline(graph, Options("sm_90", load_profile("sm_90"), "fp16", pin=tuple((pin or {}).items()))).plan


def _gemm(plan):
    return next(k for k in plan.kernels if k.family == "gemm")


def test_flat_var_where_every_access_steps_images_by_rows():
    plan = _plan(residual_matmul(4, 100, 64, 96, np.random.default_rng(0)))
    k = _gemm(plan)
    b = gemm.flat_var(k, plan.types())
    assert b is not None and b == k.ops[0].domain_vars[0]
    assert gemm.flat_merged(k) == b
    c, m, n, kk, batch = gemm.shape(k, {"FLAT": 1})
    assert (m, n, kk, batch) == (400, 96, 64, [])
    # two broadcast batch variables: only the one just outside m joins it
    plan = _plan(broadcast_batch(50, 64, 96, np.random.default_rng(0)))
    k = _gemm(plan)
    assert gemm.flat_var(k, plan.types()) == k.ops[0].domain_vars[1]
    assert gemm.shape(k, {"FLAT": 1})[1:] == (150, 96, 64, [(k.ops[0].domain_vars[0], 2)])


def test_flat_var_refuses_a_table_broadcast_over_the_images():
    plan = _plan(table_matmul(4, 100, 64, 96, np.random.default_rng(0)))
    k = _gemm(plan)
    assert len(k.ops) == 2 and gemm.flat_var(k, plan.types()) is None
    assert all("FLAT" not in p for p in gemm.space(k, plan))


def test_flat_offered_only_where_it_leaves_fewer_tiles():
    """S = 256 fills whole tiles of 64, 128 and 256 rows: nothing to gain, so no FLAT = 1 candidate of
    those (192-row tiles leave a short one: [Note: three warpgroups]). S = 100 leaves short tile rows in
    every image: where FLAT = 1 leaves fewer tiles, it is offered, and FLAT is a key of
    every candidate (so --pin FLAT=0 is an A/B)."""
    for s, offered in ((256, {192}), (100, {64, 192, 256})):   # 4 images of 100 rows fill 4 tiles of 128 either way
        plan = _plan(residual_matmul(4, s, 64, 96, np.random.default_rng(0)))
        k = _gemm(plan)
        cands = [p for p in gemm.space(k, plan) if p["unit"] == "wgmma"]
        assert cands and all("FLAT" in p for p in cands)
        flat = [p for p in cands if p["FLAT"]]
        assert {p["BM"] for p in flat} == offered, s
        for p in flat:
            assert gemm_wgmma.tiles(k, p)[2] < gemm_wgmma.tiles(k, dict(p, FLAT=0))[2]


def test_flat_kernel_indexes_rows_across_images():
    """The rendered kernel is one GEMM of 400 rows: A's tensor map is rank 2 (k, rows), the guards
    test the rows against 400, and the image variable indexes nothing."""
    plan = _plan(residual_matmul(4, 100, 64, 96, np.random.default_rng(0)), pin={"unit": "wgmma", "FLAT": 1})
    k = _gemm(plan)
    p = k.schedule.param
    assert p["FLAT"] == 1
    a, _ = gemm_wgmma.operands(k, p, plan.types())
    assert a.rank == 2 and a.dims[1][:2] == (k.ops[0].domain_vars[1], 400)
    src = FAMILIES["gemm"].render_kernel(k, p, plan.types(), k.name)
    assert "[400 x 64]" in src and "gm < 400" in src and "gm < 100" not in src
    assert "i0" not in src.split("extern \"C\"")[1]
    # one GEMM, headed as one, and no offset term of the merged index (held at zero) left in it
    assert ": GEMM [400 x 64]" in src and "batched GEMM" not in src
    assert re.search(r"\* 0\b", src) is None


def test_resnet_stage_at_14x14_takes_images_as_rows_by_cost():
    """14x14 images are 196 rows: short 128-row tiles in every image. At B32 (where the stage runs on the
    Hopper engine channels-last) the cost model runs a 1x1 GEMM as one GEMM of 32·196 rows (fewer,
    full tiles) and `explain` shows FLAT=1."""
    plan = _plan(B.resnet_stage_model((32, 256, 14, 14), mid=64, out=256, stride=1))
    flats = [k.schedule.param.get("FLAT") for k in plan.kernels if k.family == "gemm"
             and k.schedule.param.get("unit") == "wgmma"]
    assert flats and 1 in flats, flats


def test_flat_kernel_builds(tmp_path):
    """nvcc builds the merged kernels (residual staging, TMA stores, clusters) for sm_90a."""
    model = residual_matmul(4, 100, 64, 96, np.random.default_rng(0))
    for pin in ({"PP": 1}, {"PP": 0, "TS": 1}, {"CLUSTER": 2}):
        payload = aicfc.compile(model, target="sm_90", precision="fp16", pin=dict(pin, unit="wgmma", FLAT=1))
        ks = [k for k in payload["kernels"] if k["family"] == "gemm"]
        assert ks and all(k["params"]["FLAT"] == 1 for k in ks), pin


def test_a_pin_only_a_plan_without_batches_lacks_is_refused_there_alone():
    """--pin FLAT=0 restricts the B4 plan's GEMM; a bundle of B4 and B1 plans takes it (the B1 plan has no
    FLAT key), a B1 bundle alone refuses it in one line: it would change nothing."""
    from aicfc.driver import compile_plans
    model = residual_matmul("batch", 100, 64, 96, np.random.default_rng(0))
    sets = [[f"x={b}x100x64", f"r={b}x100x96"] for b in (4, 1)]
    payload = compile_plans(model, sets, target="sm_90", precision="fp16", pin={"FLAT": "0"}, check_registers=False)
    flats = [k["params"].get("FLAT") for p in payload["plans"] for k in p["kernels"] if k["family"] == "gemm"]
    assert flats == [0, None], flats
    with pytest.raises(AicfError, match=r"--pin FLAT=0: no kernel's schedule has the key 'FLAT'"):
        compile_plans(model, sets[1:], target="sm_90", precision="fp16", pin={"FLAT": "0"}, check_registers=False)


PINS = [{"PP": 1}, {"PP": 0, "NWG": 2}, {"PP": 0, "TS": 1}, {"CLUSTER": 2}, {"SPLITK": 2}, {"RS": 0}, {"OUT": 0}]


@pytest.mark.gpu
@pytest.mark.parametrize("pin", PINS, ids=["pp", "coop", "tma_store", "cluster", "splitk", "rs0", "regs"])
def test_gpu_flat_residual_matmul(pin, gpu_device):
    model = residual_matmul(4, 100, 256, 96, np.random.default_rng(3))
    try:
        _check(model, "fp16", dict(pin, unit="wgmma", FLAT=1), gpu_device, seed=5)
    except AicfError as e:
        assert "no feasible gemm candidate matches --pin" in str(e)
        pytest.skip(str(e))


@pytest.mark.gpu
@pytest.mark.parametrize("flat", [0, 1])
def test_gpu_flat_broadcast_batch(flat, gpu_device):
    _check(broadcast_batch(50, 64, 96, np.random.default_rng(4)), "fp16", {"unit": "wgmma", "FLAT": flat},
           gpu_device, seed=6)


@pytest.mark.gpu
@pytest.mark.parametrize("pin", [{}, {"FLAT": 0}], ids=["by_cost", "flat0"])
def test_gpu_resnet_stage_14x14(pin, gpu_device):
    from tests.test_conv_wgmma import _gpu_check
    _gpu_check(B.resnet_stage_model((32, 256, 14, 14), mid=64, out=256, stride=1, seed=2), "fp16", gpu_device, pin,
               ref="onnxruntime")
