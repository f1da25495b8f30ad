"""The `wgmma` unit of the attention family: Hopper warpgroup MMA (templates/attention_wgmma.cu.j2).

CPU: where the space offers it (sm_90, fp16/bf16, head dimensions multiples of 64) and the
reason recorded where it does not; the cost model ranks it ahead of `mma` at the benchmark
shapes on sm_90 and the planner never sees it on sm_80; modules holding it build for sm_90a
(others keep plain sm_90), without spills, for every tile the planner accepts at D = 64 / 128.

GPU (`-m gpu`, an sm_90 device): the unit pinned, fresh random inputs, arena poisoned, against
float64 numpy with the tolerances of tests/test_attention.py (fp16 and bf16: 1e-2).
"""
from __future__ import annotations

import pytest

import aicfc
from aicfc.codegen import attention
from aicfc.codegen.module import render_module
from aicfc.codegen.nvcc import effective_arch
from aicfc.errors import AicfError
from aicfc.frontend.onnx_import import import_model
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.passes.plan_schedules import rank
from aicfc.planner.cost import blocks_per_sm, estimate_registers
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B
from tests.test_attention import _check

MARK = "// aicf: needs sm_90a"


def plan_of(model, precision: str = "fp16", target: str = "sm_90", pin: dict | None = None):
    opts = Options(target, load_profile(target), precision, tuple(sorted((pin or {}).items())))
    return run_pipeline(import_model(model), opts).plan


def the_kernel(plan):
    (k,) = [k for k in plan.kernels if k.family == "attention"]
    return k


def units(plan) -> set[str]:
    k = the_kernel(plan)
    return {p["unit"] for p in attention.space(k, plan)}


def pinned_plan(model, precision: str, pin: dict):
    """The plan with `pin`, or None where the planner rejects every tile matching it."""
    try:
        return plan_of(model, precision, pin=pin)
    except AicfError as e:
        assert "matches --pin" in str(e)
        return None


def wgmma_declined(plan) -> str | None:
    k = the_kernel(plan)
    return next((why for p, why in attention.declined(k, plan) if p["unit"] == "wgmma"), None)


# ---------------------------------------------------------------- where the space offers it


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("d", [64, 128, 192, 256])
def test_space_has_wgmma_on_sm90(d, precision):
    plan = plan_of(B.attention_model(2, 3, 45, d), precision)
    assert "wgmma" in units(plan) and wgmma_declined(plan) is None
    for p in attention.space(the_kernel(plan), plan):
        if p["unit"] == "wgmma":
            assert p["BM"] == 64 * p["NWG"] and p["dtype"] == attention.MMA_TYPE[precision]
            assert attention.threads(p) == 128 * p["NWG"]


@pytest.mark.parametrize("target,precision,d,reason", [
    ("sm_80", "fp16", 64, "--target sm_80: warpgroup MMA (wgmma) exists on sm_90 only"),
    ("sm_89", "bf16", 128, "--target sm_89: warpgroup MMA (wgmma) exists on sm_90 only"),
    ("sm_90", "fp16", 40, "head dimensions 40/40 are not multiples of 64 (one 128-byte swizzled row)"),
    ("sm_90", "fp16", 96, "head dimensions 96/96 are not multiples of 64 (one 128-byte swizzled row)"),
    ("sm_90", "fp32", 64, "--precision fp32: tensor-core attention needs fp16/bf16; the SIMT kernel runs in fp32"),
    ("sm_90", "tf32", 128, "--precision tf32: tensor-core attention needs fp16/bf16; the SIMT kernel runs in fp32"),
])
def test_declined_with_reason(target, precision, d, reason):
    plan = plan_of(B.attention_model(2, 3, 45, d), precision, target)
    assert "wgmma" not in units(plan)
    assert wgmma_declined(plan) == reason
    # the planner keeps the reason among the rejected candidates
    rejected = [c.rejected_because for c in the_kernel(plan).schedule.candidates if c.rejected_because]
    assert reason in rejected


def test_mma_stays_where_wgmma_declines():
    plan = plan_of(B.attention_model(1, 2, 130, 96), "fp16")
    assert the_kernel(plan).schedule.param["unit"] == "mma"


# ---------------------------------------------------------------- the cost model picks it


PICK_SHAPES = [(4, 16, 2048, 128, False), (4, 16, 2048, 128, True), (8, 12, 512, 64, False)]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("b,h,s,d,causal", PICK_SHAPES, ids=[f"{b}x{h}x{s}x{d}{'c' if c else ''}" for b, h, s, d, c in PICK_SHAPES])
def test_planner_picks_wgmma_on_sm90(b, h, s, d, causal, precision):
    plan = plan_of(B.attention_model(b, h, s, d, causal=causal), precision)
    k = the_kernel(plan)
    best = k.schedule.param
    assert best["unit"] == "wgmma" and best["causal"] == int(causal)
    ranked, _ = rank(k, plan, load_profile("sm_90"))
    fastest = {}
    for r in ranked:
        fastest.setdefault(r.params["unit"], r.time_us)
    assert fastest["wgmma"] < fastest["mma"] < fastest["simt"]


@pytest.mark.parametrize("b,h,s,d,causal", PICK_SHAPES[:2], ids=["4x16x2048x128", "4x16x2048x128c"])
def test_planner_overlap_ranks_first(b, h, s, d, causal):
    """The ping-pong schedule (OVERLAP = 2: each warpgroup's softmax under the other's products)
    ranks first; softmax under its own P·V (OVERLAP = 1) is predicted no slower than the serial
    schedule, which leaves it all exposed."""
    plan = plan_of(B.attention_model(b, h, s, d, causal=causal), "fp16")
    k = the_kernel(plan)
    assert k.schedule.param["OVERLAP"] == 2 and k.schedule.param["NWG"] == 2
    ranked, _ = rank(k, plan, load_profile("sm_90"))
    time = {(r.params["NWG"], r.params["BN"], r.params["STAGES"], r.params["OVERLAP"]): r.estimate.terms["t_compute_us"]
            for r in ranked if r.params["unit"] == "wgmma"}
    assert time[(2, 128, 3, 2)] < time[(2, 128, 3, 1)] < time[(2, 128, 2, 0)]


@pytest.mark.parametrize("target", ["sm_80", "sm_86", "sm_89"])
def test_other_targets_keep_mma(target):
    k = the_kernel(plan_of(B.attention_model(4, 16, 2048, 128), "fp16", target))
    assert k.schedule.param["unit"] == "mma"


def test_register_estimate_rejects_spilling_tiles():
    """NWG = 3 (384 threads, at most 168 registers each), BN = 128: ptxas (CUDA 13) fits D = 64,
    and D = 128 serially but not with OVERLAP (its P stays live too) nor with a mask to read;
    the estimate separates them the same way."""
    hw = load_profile("sm_90")
    for d, overlap, mask, fits in ((64, 0, False, True), (64, 1, False, True), (128, 0, False, True),
                                   (128, 1, False, False), (128, 0, True, False), (64, 1, True, False)):
        k = the_kernel(plan_of(B.attention_model(1, 2, 512, d, mask_input=mask), "fp16"))
        p = {"unit": "wgmma", "dtype": "f16", "BM": 192, "BN": 128, "NWG": 3, "STAGES": 2, "OVERLAP": overlap,
             "causal": 0}
        regs = estimate_registers(k, p)
        assert (blocks_per_sm(384, attention.smem_bytes(k, p), regs, hw)[0] >= 1) == fits, (d, overlap, mask, regs)


# ---------------------------------------------------------------- nvcc: sm_90a, no spills


def test_effective_arch():
    assert effective_arch(f"int x;\n{MARK}\nint y;", "sm_90") == "sm_90a"
    assert effective_arch("int x;\n// aicf: needs nothing\n", "sm_90") == "sm_90"
    assert effective_arch(f"{MARK}\n", "sm_80") == "sm_80"   # never another architecture's variant


def test_only_wgmma_modules_carry_the_mark():
    wg = render_module(plan_of(B.attention_model(1, 2, 130, 64), "fp16", pin={"unit": "wgmma"}))
    mma = render_module(plan_of(B.attention_model(1, 2, 130, 64), "fp16", pin={"unit": "mma"}))
    assert MARK in wg.splitlines() and MARK not in mma


TILES = [{"NWG": n, "BN": bn, "OVERLAP": ov, "STAGES": st} for n in (1, 2, 3) for bn in (64, 128)
         for ov, st in ((0, 2), (1, 2), (1, 3), (2, 3))]   # OVERLAP = 2 (ping-pong): NWG = 2 only
BUILD_SHAPES = [(1, 2, 130, 64, False, False, "fp16"), (2, 3, 45, 128, True, False, "bf16"),
                (2, 2, 300, 128, False, True, "fp16")]


@pytest.mark.parametrize("b,h,s,d,causal,mask,precision", BUILD_SHAPES,
                         ids=[f"b{b}h{h}s{s}d{d}{'c' if c else ''}{'m' if m else ''}-{p}"
                              for b, h, s, d, c, m, p in BUILD_SHAPES])
def test_every_accepted_tile_builds_without_spills(b, h, s, d, causal, mask, precision):
    """Every tile the planner accepts compiles for sm_90a with no local memory: the pinned plans' schedules
    rendered into one module (count_registers, as the planner's register check builds them)."""
    from aicfc.codegen.module import count_registers
    model = B.attention_model(b, h, s, d, causal=causal, mask_input=mask)
    plans = [pinned_plan(model, precision, {"unit": "wgmma", **tile}) for tile in TILES]
    accepted = [the_kernel(p).schedule.param for p in plans if p is not None]   # None: rejected (registers, smem)
    assert len(accepted) >= 8
    plan = next(p for p in plans if p is not None)
    (found,) = count_registers(plan, [(the_kernel(plan), accepted)])
    bad = [(p, regs, spill) for p, (regs, spill) in zip(accepted, found) if spill or not 0 < regs <= 255]
    assert not bad, f"{len(bad)} of {len(accepted)} spill: {bad[:3]}"


BENCH_CASES = [(4, 16, 2048, 128, False, "fp16"), (4, 16, 2048, 128, True, "bf16"), (8, 12, 512, 64, False, "fp16"),
               (2, 3, 45, 64, False, "bf16"), (2, 3, 45, 64, True, "fp16")]


@pytest.mark.parametrize("b,h,s,d,causal,precision", BENCH_CASES,
                         ids=[f"b{b}h{h}s{s}d{d}{'c' if c else ''}-{p}" for b, h, s, d, c, p in BENCH_CASES])
def test_compiles_for_sm90a(b, h, s, d, causal, precision):
    payload = aicfc.compile(B.attention_model(b, h, s, d, causal=causal), precision=precision,
                            pin={"unit": "wgmma"}, jobs=1)
    (k,) = payload["kernels"]
    assert k["params"]["unit"] == "wgmma" and k["params"]["causal"] == int(causal)
    assert k["registers"] is not None and k["registers"] <= 255
    assert payload["target"]["arch"] == "sm_90"   # the bundle's GPU; the cubin is its sm_90a variant


# ---------------------------------------------------------------- on the GPU


def _on_sm90(device):
    if device.arch != "sm_90":
        pytest.skip(f"wgmma needs an sm_90 GPU, this one is {device.arch}")


GPU_CASES = [
    # (b, h, s, d, causal, precision)
    (2, 3, 45, 64, False, "fp16"), (2, 3, 45, 64, True, "fp16"), (2, 3, 45, 64, False, "bf16"),
    (1, 2, 130, 128, False, "fp16"), (1, 2, 130, 128, True, "bf16"), (2, 4, 300, 64, True, "fp16"),
    (1, 3, 257, 128, False, "bf16"), (1, 12, 512, 64, False, "fp16"), (1, 2, 1, 64, False, "fp16"),
    (1, 4, 1024, 128, True, "fp16"), (1, 4, 1024, 128, False, "bf16"), (2, 2, 200, 192, True, "fp16"),
    (1, 2, 200, 256, False, "bf16"), (1, 2, 200, 256, True, "fp16"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("b,h,s,d,causal,precision", GPU_CASES,
                         ids=[f"b{b}h{h}s{s}d{d}{'c' if c else ''}-{p}" for b, h, s, d, c, p in GPU_CASES])
def test_gpu_wgmma(b, h, s, d, causal, precision, gpu_device):
    _on_sm90(gpu_device)
    _check(B.attention_model(b, h, s, d, causal=causal), precision, gpu_device, seed=b * s + d, pin={"unit": "wgmma"})


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("tile", TILES, ids=lambda t: "-".join(f"{a}{b}" for a, b in t.items()))
def test_gpu_wgmma_tiles(tile, precision, gpu_device):
    """Every tile at D = 64 and 128, causal and not, over several key tiles and a ragged end."""
    _on_sm90(gpu_device)
    for d in (64, 128):
        for causal in (False, True):
            model = B.attention_model(1, 2, 333, d, causal=causal)
            pin = {"unit": "wgmma", **tile}
            if pinned_plan(model, precision, pin) is None:
                continue   # rejected by the planner at this D
            _check(model, precision, gpu_device, seed=d + causal, pin=pin)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("overlap", [0, 1, 2])
def test_gpu_wgmma_masks_and_cross(overlap, precision, gpu_device):
    _on_sm90(gpu_device)
    pin = {"unit": "wgmma", "OVERLAP": overlap, **({"NWG": 2} if overlap == 2 else {})}
    _check(B.attention_model(2, 3, 45, 64, mask_input=True), precision, gpu_device, seed=11, pin=pin)
    _check(B.attention_model(2, 2, 300, 128, mask_input=True), precision, gpu_device, seed=13, pin=pin)
    _check(B.attention_model(2, 2, 45, 64, sk=130), precision, gpu_device, seed=12, pin=pin)
    _check(B.attention_model(2, 2, 200, 128, sk=77), precision, gpu_device, seed=14, pin=pin)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("overlap", [0, 1])
@pytest.mark.parametrize("mask", [False, True])
def test_gpu_wgmma_bert_head_split(mask, overlap, precision, gpu_device):
    """q, k, v read at offsets of one merged [B, S, 3·H·D] buffer, the output stored permuted.
    Pinned by OVERLAP, a key of the wgmma space only (`unit` would pin the GEMMs too)."""
    _on_sm90(gpu_device)
    _check(B.bert_attention_model(1, 128, 4, 64, seed=6, mask=mask), precision, gpu_device, seed=7,
           pin={"OVERLAP": overlap})
    _check(B.bert_attention_model(2, 77, 2, 128, seed=8, mask=mask), precision, gpu_device, seed=9,
           pin={"OVERLAP": overlap})
