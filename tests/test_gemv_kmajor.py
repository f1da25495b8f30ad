"""The gemv over a K-major weight ([Note: the gemv over a K-major weight] in codegen/gemm_gemv.py) and the layout
rule that chooses it (relayout_weights.GEMV_RULE, `--pin kmajor`).

Without a GPU: which weights the rule stores K-major (a one-row gemv predicted faster so; never one of 2-8 rows,
one with a rotary epilogue, or one right after the decode attention), that a bundle of a prefill and a decode
plan stores them once and K-major in both, that `--pin kmajor=0` keeps [K, N], and that every candidate of the
space compiles without spills. On the GPU: pinned schedules against numpy float64 (fp16/bf16: 1e-2 of the
output's max), with bias and ReLU and a residual, and the same bits on a second run."""
from __future__ import annotations

import numpy as np
import pytest

from aicfc.codegen import gemm, gemm_gemv
from aicfc.driver import compile_plans
from aicfc.passes.relayout_weights import GEMV_RULE
from tests.test_gemv import _run_against_numpy, rows_model
from tests.test_row_scale import decode_shapes, decoder
from tests.test_state import plan_of


def _gemm(plan):
    (k,) = [k for k in plan.kernels if k.family == "gemm"]
    return k


def test_a_one_row_projection_reads_its_weight_k_major():
    plan = plan_of(rows_model(1, 5632, 2048, np.random.default_rng(0), residual=True), {}, "fp16")
    k = _gemm(plan)
    assert GEMV_RULE in k.rewrites and k.schedule.param["unit"] == "gemv" and k.schedule.param["KM"] == 1
    assert plan.types()[gemm.dims(k)[0].b.buffer].shape == (2048, 5632)
    assert any(r.rule == GEMV_RULE and r.applied and "predicted" in r.reason for r in plan.rewrites)
    off = plan_of(rows_model(1, 5632, 2048, np.random.default_rng(0), residual=True), {}, "fp16", {"kmajor": "0"})
    assert GEMV_RULE not in _gemm(off).rewrites and not _gemm(off).schedule.param.get("KM")


def test_a_bad_kmajor_pin_is_one_line():
    from aicfc.errors import AicfError
    with pytest.raises(AicfError, match="no weight named 'nope'"):
        plan_of(rows_model(1, 256, 256, np.random.default_rng(0)), {}, "fp16", {"kmajor": "nope"})


@pytest.mark.parametrize("rows", [2, 8])
def test_more_rows_keep_the_weight_k_by_n(rows):
    plan = plan_of(rows_model(rows, 5632, 2048, np.random.default_rng(0)), {}, "fp16")
    assert GEMV_RULE not in _gemm(plan).rewrites and not _gemm(plan).schedule.param.get("KM")


def test_the_decode_step_keeps_the_rotary_and_the_filled_projections_k_by_n():
    plan = plan_of(decoder(), decode_shapes(1), "fp16")
    for i, k in enumerate(plan.kernels):
        if k.family != "gemm":
            continue
        km = GEMV_RULE in k.rewrites
        if gemm.rotary(k) is not None or plan.kernels[i - 1].family == "attention":
            assert not km, k.name
        assert bool(k.schedule.param.get("KM")) == km


def test_a_bundle_stores_the_k_major_weights_once():
    """A prefill plan (512 rows, wgmma/mma read either layout) and a decode plan (one row) over one copy: the
    weights the decode plan reads K-major are K-major in both, so every weight is stored once."""
    model = rows_model(1, 5632, 2048, np.random.default_rng(0), residual=True)
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "s"
    model.graph.input[1].type.tensor_type.shape.dim[1].dim_param = "s"
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_param = "s"
    payload = compile_plans(model, [["x=1x64x5632", "x2=1x64x2048"], ["x=1x1x5632", "x2=1x1x2048"]],
                            check_registers=False, precision="fp16")
    assert len(payload["weights"]) == 1 and all(len(p["weights"]) == 1 for p in payload["plans"])
    rules = [[r for kk in p["kernels"] for r in kk["rewrites"]] for p in payload["plans"]]
    assert all(GEMV_RULE in r for r in rules)


def test_a_plan_that_needs_the_weight_k_by_n_keeps_it_so_in_every_plan():
    """A one-row plan chooses K-major first; a two-row plan of the same bundle (tensor-core steps) declines it, so
    the weight stays [K, N] and the one-row plan is compiled again: one copy, no plan K-major."""
    model = rows_model(1, 5632, 2048, np.random.default_rng(0), residual=True)
    for vi in (*model.graph.input, *model.graph.output):
        vi.type.tensor_type.shape.dim[0].dim_param = "b"
    payload = compile_plans(model, [["x=2x1x5632", "x2=2x1x2048"], ["x=1x1x5632", "x2=1x1x2048"]],
                            check_registers=False, precision="fp16")
    assert [len(w["data"]) for w in payload["weights"]].count(5632 * 2048 * 2) == 1   # (the two-row plan has a small constant too)
    for plan in payload["plans"]:
        assert not any(GEMV_RULE in r for kk in plan["kernels"] for r in kk["rewrites"])
    assert any(d.get("rule") == GEMV_RULE and not d["applied"] for d in payload["plans"][0]["decisions"])


def test_every_k_major_candidate_builds_without_spills():
    from aicfc.codegen.module import count_registers
    plan = plan_of(rows_model(1, 2000, 1032, np.random.default_rng(2), bias=True), {}, "fp16")
    k = _gemm(plan)
    space = [p for p in gemm.space(k, plan) if p.get("KM")]
    assert space and all(p["SPLITK"] == 1 and p["BM"] == 1 for p in space)
    (found,) = count_registers(plan, [(k, space)])
    bad = [(p, regs, spill) for p, (regs, spill) in zip(space, found) if spill or not 0 < regs <= 255]
    assert not bad, f"{len(bad)} of {len(space)} spill: {bad[:3]}"


KM_PINS = [{"BN": 2, "WARPS": 4, "KS": 2, "U": 2}, {"BN": 16, "WARPS": 4, "KS": 2, "U": 4}, {"BN": 8, "WARPS": 8, "KS": 1, "U": 4},
           {"BN": 64, "WARPS": 8, "KS": 8, "U": 2}, {"BN": 4, "WARPS": 8, "KS": 8, "U": 4}]
# (K, N, bias, residual): N not a multiple of BN, K not a multiple of a part's step
KM_CASES = [(2048, 3072, False, False), (5632, 2056, True, True), (1000, 264, True, False), (2000, 1030, False, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("pin", KM_PINS, ids=lambda p: "BN{BN}W{WARPS}KS{KS}U{U}".format(**p))
@pytest.mark.parametrize("case", KM_CASES, ids=lambda c: "K{}N{}{}{}".format(c[0], c[1], "-bias" if c[2] else "", "-res" if c[3] else ""))
def test_k_major_gemv_matches_numpy(case, pin, precision, gpu_device):
    k, n, bias, residual = case
    if not any(all(p[x] == v for x, v in pin.items()) for p in gemm_gemv.km_space(n, k, True)):
        pytest.skip("outside the space")
    model = rows_model(1, k, n, np.random.default_rng(k + n), bias, residual)
    _run_against_numpy(model, {"KM": 1, "kmajor": "w", **pin}, precision, gpu_device, GEMV_RULE)
