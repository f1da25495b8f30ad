"""The Hopper engine of the gemm family (`unit=wgmma`): legality, space, tensor maps, and on the
GPU the numbers against a float64 reference.

Tolerance on max|y - ref| / max|ref|: tf32 1e-3, fp16 and bf16 1e-2. Shapes cover edges in M,
N and K (TMA zero-fills past them), M = 1, K-major and MN-major operands (wgmma's transpose
bit), batches with and without a broadcast operand, an epilogue, and every tile family point.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest

import aicfc
from aicfc.codegen import gemm, gemm_wgmma
from aicfc.codegen.tma import tensor_maps
from aicfc.errors import AicfError
from aicfc.frontend.onnx_import import import_model
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.passes.relayout_weights import RULE
from aicfc.planner.hardware import load_profile
from tests.test_gemm_gpu import (_check, a_transposed, b_transposed_input, broadcast_batch, gemm_transb_bias_relu,
                                 matmul, two_inputs_batched)


def _plan(model, precision="fp16", target="sm_90", pin=None):
    graph = import_model(model, None)
    return run_pipeline(graph, Options(target, load_profile(target), precision, pin=tuple((pin or {}).items()))).plan


def _gemm_kernel(plan):
    return next(k for k in plan.kernels if k.family == "gemm")


def test_space_only_on_sm90_and_tensor_core_policies():
    model = matmul(128, 256, 192, np.random.default_rng(0))
    for target, precision, expect in (("sm_90", "fp16", True), ("sm_80", "fp16", False), ("sm_90", "fp32", False)):
        plan = _plan(model, precision, target)
        k = _gemm_kernel(plan)
        units = {p["unit"] for p in gemm.space(k, plan)}
        assert ("wgmma" in units) == expect, (target, precision, units)


def test_misaligned_strides_are_declined_with_the_reason():
    plan = _plan(matmul(7, 100, 257, np.random.default_rng(0)))
    k = _gemm_kernel(plan)
    reasons = dict((p["unit"], why) for p, why in gemm.declined(k, plan))
    assert "wgmma" in reasons and "multiple of 16" in reasons["wgmma"]
    assert all(p["unit"] != "wgmma" for p in gemm.space(k, plan))
    with pytest.raises(AicfError, match="--pin"):
        _plan(matmul(7, 100, 257, np.random.default_rng(0)), pin={"unit": "wgmma"})


def test_tf32_needs_k_major_operands():
    """An activation read N-major keeps tf32 off wgmma; a weight is re-laid out K-major instead."""
    plan = _plan(two_inputs_batched(128, 256, 192, np.random.default_rng(0)), "tf32")
    reasons = dict((p["unit"], why) for p, why in gemm.declined(_gemm_kernel(plan), plan))
    assert "K-major" in reasons["wgmma"]
    for build in (matmul, gemm_transb_bias_relu):
        plan = _plan(build(128, 256, 192, np.random.default_rng(0)), "tf32", pin={"unit": "wgmma"})
        k = _gemm_kernel(plan)
        assert k.schedule.param["unit"] == "wgmma" and RULE in k.rewrites
        w = next(w for w in plan.weights if w.type.shape == (192, 256))
        assert any(r.rule == RULE and r.applied for r in plan.rewrites) and w.type.dtype == "f32"


@pytest.mark.parametrize("precision", ("tf32", "bf16", "fp16"))
def test_relayout_keeps_the_function(precision):
    """The interpreter gives the same numbers before and after the weight's relayout (N = 77 is no
    16-byte stride in 16 bits, so those policies re-lay it out too)."""
    from tests.test_pipeline import evaluate_plan as run_plan
    model = matmul(6, 40, 77 if precision != "tf32" else 24, np.random.default_rng(1))
    x = np.random.default_rng(2).standard_normal((6, 40)).astype(np.float32)
    before = _plan(model, precision, target="sm_80")
    after = _plan(model, precision)
    assert any(r.rule == RULE for r in after.rewrites) and not any(r.rule == RULE for r in before.rewrites)
    np.testing.assert_allclose(run_plan(after, {"x": x})["y"], run_plan(before, {"x": x})["y"], rtol=1e-6)


def test_space_respects_accumulators_and_shared_memory():
    plan = _plan(matmul(4096, 4096, 4096, np.random.default_rng(0)))
    hw = load_profile("sm_90")
    pts = gemm_wgmma.space(_gemm_kernel(plan), plan, "f16", hw.sm_count, hw.smem_per_block_optin)
    assert pts and all(p["MI"] * p["BN"] // 2 <= gemm_wgmma.MAX_ACC for p in pts)
    assert all(gemm_wgmma.smem_bytes(p) + gemm_wgmma.static_smem(p) <= hw.smem_per_block_optin for p in pts)
    assert {p["BM"] for p in pts} == {64, 128, 192, 256} and all(p["CTAS"] == hw.sm_count for p in pts)


def test_tensor_maps_follow_the_operand_layouts():
    plan = _plan(matmul(300, 256, 192, np.random.default_rng(0)), pin={"unit": "wgmma", "BN": 128, "MI": 1, "NWG": 2, "PP": 0})
    k = _gemm_kernel(plan)
    a, b = tensor_maps(k, None, plan.types())
    # A [300, 256] K-major: dims (k, m), one box of 64 k x 128 rows; B [256, 192] N-major: (n, k), boxes 64 x 64
    assert (a.dims, a.strides, a.box, a.swizzle, a.dtype) == ((256, 300), (512,), (64, 128), 128, "f16")
    assert (b.dims, b.strides, b.box) == ((192, 256), (384,), (64, 64))
    assert a.problems() is None and b.problems() is None


def test_batched_operands_get_one_dimension_per_batch_variable():
    plan = _plan(broadcast_batch(64, 128, 64, np.random.default_rng(0)), pin={"unit": "wgmma"})
    a, b = tensor_maps(_gemm_kernel(plan), None, plan.types())
    assert len(a.dims) == 4 and len(b.dims) == 2     # x [2, 3, m, k]; w broadcast over the batch


def test_the_template_builds_for_sm90a():
    """nvcc (no GPU needed) accepts every (NWG, MI, BN) point with both operand layouts."""
    model = b_transposed_input(128, 256, 192, np.random.default_rng(0))
    payload = aicfc.compile(model, target="sm_90", precision="bf16", pin={"unit": "wgmma"})
    k = payload["kernels"][0]
    assert k["params"]["unit"] == "wgmma" and k["registers"] and k["smem_bytes"] > 0


# ------------------------------------------------------------------ on the GPU

SHAPES = [(64, 64, 64), (128, 768, 768), (77, 136, 72), (1, 4096, 1024), (300, 520, 392)]
LAYOUTS = [(f, s) for f in (gemm_transb_bias_relu, broadcast_batch, two_inputs_batched, a_transposed, b_transposed_input)
           for s in ((72, 136, 88), (128, 256, 192))]   # TMA: every stride a multiple of 16 bytes
TILES = [{"NWG": nwg, "PP": pp, "MI": mi, "BN": bn} for nwg, pp in ((1, 0), (2, 0), (2, 1)) for mi in (1, 2)
         for bn in (64, 128, 192, 256) if mi * bn <= 256] + [{"NWG": 3, "PP": 0, "MI": 1, "BN": bn} for bn in (64, 128)]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ("fp16", "bf16"))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_wgmma_matmul(shape, precision, gpu_device):
    model = matmul(*shape, np.random.default_rng(sum(shape)))
    _check(model, precision, {"unit": "wgmma"}, gpu_device, seed=sum(shape) + 1)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ("fp16", "bf16"))
@pytest.mark.parametrize("build,shape", LAYOUTS, ids=[f"{f.__name__}-{'x'.join(map(str, s))}" for f, s in LAYOUTS])
def test_wgmma_layouts(build, shape, precision, gpu_device):
    model = build(*shape, np.random.default_rng(sum(shape)))
    _check(model, precision, {"unit": "wgmma"}, gpu_device, seed=sum(shape) + 2)


@pytest.mark.gpu
@pytest.mark.parametrize("build,shape", [(gemm_transb_bias_relu, (77, 136, 72)), (gemm_transb_bias_relu, (256, 512, 384)),
                                         (b_transposed_input, (128, 256, 192))],
                         ids=["transb-77x136x72", "transb-256x512x384", "b_transposed-128x256x192"])
def test_wgmma_tf32(build, shape, gpu_device):
    _check(build(*shape, np.random.default_rng(7)), "tf32", {"unit": "wgmma"}, gpu_device, seed=8)


@pytest.mark.gpu
@pytest.mark.parametrize("stages", (2, 3))
@pytest.mark.parametrize("tile", TILES, ids=lambda t: "NWG{NWG}PP{PP}MI{MI}BN{BN}".format(**t))
def test_wgmma_tiles(tile, stages, gpu_device):
    """Every point of the family on a shape with edges in M and N and several tiles per block."""
    model = matmul(700, 512, 1000, np.random.default_rng(3))
    _check(model, "fp16", {"unit": "wgmma", "STAGES": stages, **tile}, gpu_device, seed=4)


def test_three_warpgroups_space():
    """[Note: three warpgroups]: NWG = 3 candidates are cooperative tiles of one m64 block a warpgroup
    (BM = 192) at most 128 wide, unsplit and unclustered, 512 threads, the consumers given 152 registers by setmaxnreg (the
    producer's 40 and 3·128·152 within an SM's 64K); a 6272 x 256 GEMM (ResNet-50 B32's stage 3)
    fills 132 SMs with them exactly (33 x 4 tiles of 192 x 64)."""
    plan = _plan(matmul(6272, 1024, 256, np.random.default_rng(0)))
    k = _gemm_kernel(plan)
    hw = load_profile("sm_90")
    pts = [p for p in gemm_wgmma.space(k, plan, "f16", hw.sm_count, hw.smem_per_block_optin) if p["NWG"] == 3]
    assert pts and all(p["BM"] == 192 and p["MI"] == 1 and not p["PP"] and p["BN"] <= 128 for p in pts)
    assert all(p["SPLITK"] == 1 and p["CLUSTER"] == 1 and not p["STREAM"] and not p["TS"] for p in pts)
    assert all(gemm_wgmma.threads(p) == 512 for p in pts)
    assert gemm_wgmma.tiles(k, {**pts[0], "BN": 64})[2] == 132
    assert gemm_wgmma.consumer_regs(3, gemm_wgmma.PRODUCER_REGS, gemm_wgmma.CONSUMER_REGS) == 152
    assert gemm_wgmma.consumer_regs(2, gemm_wgmma.PRODUCER_REGS, gemm_wgmma.CONSUMER_REGS) == gemm_wgmma.CONSUMER_REGS


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("bn", (64, 128))
def test_three_warpgroups_build_without_spills(bn, tmp_path, monkeypatch):
    """ptxas fits a 192-row tile's three consumer warpgroups in the 128 registers 512 threads may have
    at launch, with no local memory; the consumers raise theirs to 152."""
    from aicfc.codegen.module import render_module
    from aicfc.codegen.nvcc import build
    monkeypatch.setenv("AICF_CACHE_DIR", str(tmp_path))
    plan = _plan(matmul(700, 512, 1000, np.random.default_rng(3)), pin={"unit": "wgmma", "NWG": 3, "BN": bn})
    k = _gemm_kernel(plan)
    assert k.schedule.param["NWG"] == 3 and k.schedule.block[0] == 512
    source = render_module(plan)
    assert "setmaxnreg.inc.sync.aligned.u32 152" in source and "__launch_bounds__(512, 1)" in source
    built = build(source, "sm_90")
    assert built.spills.get(k.name, 0) == 0, built.spills


def test_split_k_space_only_where_tiles_cannot_fill_the_gpu():
    plan = _plan(matmul(128, 3072, 768, np.random.default_rng(0)))
    hw = load_profile("sm_90")
    pts = gemm_wgmma.space(_gemm_kernel(plan), plan, "f16", hw.sm_count, hw.smem_per_block_optin)
    assert any(p["SPLITK"] > 1 for p in pts)
    big = _plan(matmul(4096, 1024, 4096, np.random.default_rng(0)))
    assert all(p["SPLITK"] == 1 for p in gemm_wgmma.space(_gemm_kernel(big), big, "f16", hw.sm_count,
                                                          hw.smem_per_block_optin))
    payload = aicfc.compile(matmul(128, 3072, 768, np.random.default_rng(0)), target="sm_90", precision="fp16",
                            pin={"unit": "wgmma", "SPLITK": 3})
    assert payload["kernels"][0]["params"]["SPLITK"] == 3


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ("fp16", "tf32"))
@pytest.mark.parametrize("splits", (2, 3, 4))
@pytest.mark.parametrize("build,shape", [(gemm_transb_bias_relu, (128, 3072, 768)), (gemm_transb_bias_relu, (77, 1000, 72))],
                         ids=["128x3072x768", "77x1000x72"])
def test_wgmma_split_k(build, shape, splits, precision, gpu_device):
    """Split-k on two sets of fresh inputs, each compiled and run anew."""
    model = build(*shape, np.random.default_rng(5))
    for seed in (6, 7):
        _check(model, precision, {"unit": "wgmma", "SPLITK": splits, "PP": seed % 2}, gpu_device, seed=seed)


def test_split_cluster_candidates():
    """[Note: k-splits as a cluster]: a split candidate of 2 or 4 splits, not ping-pong, has a CL = 1
    twin of one CTA a work unit whose ring holds the tile in fp32; it needs no scratch, and its
    kernel is compiled with the splits as its cluster."""
    from aicfc.codegen.scratch import scratch
    plan = _plan(matmul(128, 3072, 768, np.random.default_rng(0)))
    k = _gemm_kernel(plan)
    hw = load_profile("sm_90")
    pts = gemm_wgmma.space(k, plan, "f16", hw.sm_count, hw.smem_per_block_optin)
    cl = [p for p in pts if p.get("CL")]
    assert cl and {p["SPLITK"] for p in cl} <= set(gemm_wgmma.CL_SPLITS)
    for p in cl:
        tiles = gemm_wgmma.tiles(k, p)[2]
        assert not p["PP"] and not p["STREAM"] and p["CTAS"] == tiles * p["SPLITK"] <= gemm_wgmma.cl_ctas(p["SPLITK"], 132)
        assert p["STAGES"] * gemm_wgmma.stage_bytes(p) >= 4 * p["BM"] * p["BN"]
        assert scratch(k, p) == []
    assert all("CL" not in p for p in pts if p["SPLITK"] == 1)
    assert all(p["CL"] == 0 for p in pts if p["SPLITK"] == 3)
    payload = aicfc.compile(matmul(128, 3072, 768, np.random.default_rng(0)), target="sm_90", precision="fp16",
                            pin={"unit": "wgmma", "SPLITK": 2, "CL": 1})
    kern = payload["kernels"][0]
    assert kern["params"]["CL"] == 1 and not any(str(b.get("name", "")).endswith(".partials") for b in payload["buffers"])
    source = next(m["source"] for m in payload["modules"] if kern["name"] in m["source"])
    assert "__cluster_dims__(2, 1, 1)" in source and "ld.shared::cluster.v4.f32" in source


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ("fp16", "tf32"))
@pytest.mark.parametrize("splits,nwg", [(2, 1), (2, 2), (4, 2)], ids=["2x1wg", "2x2wg", "4x2wg"])
@pytest.mark.parametrize("shape", [(128, 3072, 768), (200, 1000, 1024)], ids=["128x3072x768", "200x1000x1024"])
def test_wgmma_split_cluster(shape, splits, nwg, precision, gpu_device):
    """k-splits as a cluster (CL = 1) on fresh inputs against float64, and bit for bit what the same
    tile computes with its splits through scratch (CL = 0): the same sum in the same order."""
    from aicf_run.bundle import Bundle
    from aicf_run.executor import Executor
    model = gemm_transb_bias_relu(*shape, np.random.default_rng(11))
    pin = {"unit": "wgmma", "SPLITK": splits, "NWG": nwg, "PP": 0, "CL": 1}
    _check(model, precision, pin, gpu_device, seed=12)
    got = {}
    for cl in (1, 0):
        payload = aicfc.compile(model, target="sm_90", precision=precision, pin={**pin, "CL": cl})
        p = next(k for k in payload["kernels"] if k["family"] == "gemm")["params"]
        if cl:
            tile = {key: p[key] for key in ("BM", "BN", "MI", "STAGES", "OUT")}
            pin.update(tile)
        rng = np.random.default_rng(13)
        inputs = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in import_model(model, None).inputs}
        ex = Executor(Bundle.from_payload(payload), gpu_device)
        try:
            got[cl] = ex.run(inputs)["y"]
        finally:
            ex.close()
    assert np.array_equal(got[0], got[1])


def test_output_staging_needs_16_byte_rows_and_is_a_choice():
    """Staging (OUT = the stored itemsize) needs rows of 16-byte chunks (N % 8 for fp16); where it is
    possible, register stores (OUT = 0) are candidates too, and 16-bit outputs pay them half sectors."""
    model = gemm_transb_bias_relu(64, 136, 80, np.random.default_rng(0))
    assert _gemm_kernel(_plan(model, pin={"unit": "wgmma"})).schedule.param["OUT"] == 2
    assert _gemm_kernel(_plan(model, pin={"unit": "wgmma", "OUT": 0})).schedule.param["OUT"] == 0
    plan = _plan(gemm_transb_bias_relu(64, 136, 77, np.random.default_rng(0)), pin={"unit": "wgmma"})
    assert _gemm_kernel(plan).schedule.param["OUT"] == 0
    with pytest.raises(AicfError):
        _plan(gemm_transb_bias_relu(64, 136, 77, np.random.default_rng(0)), pin={"unit": "wgmma", "OUT": 2})


def test_tf32_square_takes_the_wide_tile_with_register_stores():
    """A staged fp32 128x256 tile does not fit beside the ring; unstaged it is the cheapest (H200:
    128x192 staged measured 0.79 of cuBLAS at 4096^3, wave quantization 0.89 and L2-bound)."""
    plan = _plan(matmul(4096, 4096, 4096, np.random.default_rng(0)), "tf32")
    p = _gemm_kernel(plan).schedule.param
    assert (p["unit"], p["BM"], p["BN"], p["OUT"]) == ("wgmma", 128, 256, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("pp", (0, 1))
@pytest.mark.parametrize("precision", ("fp16", "bf16", "tf32"))
def test_wgmma_unstaged_output(precision, pp, gpu_device):
    """N = 77: no 16-byte chunks, so the epilogue stores from registers (edges in every dimension)."""
    _check(gemm_transb_bias_relu(200, 136, 77, np.random.default_rng(9)), precision,
           {"unit": "wgmma", "OUT": 0, "PP": pp}, gpu_device, seed=10)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ("fp16", "tf32"))
def test_wgmma_register_stores_where_staging_was_possible(precision, gpu_device):
    """N = 264: 16-byte rows, stored from registers by choice (partial tiles in M and N)."""
    _check(gemm_transb_bias_relu(200, 136, 264, np.random.default_rng(11)), precision,
           {"unit": "wgmma", "OUT": 0, "BN": 256}, gpu_device, seed=12)


# ------------------------------------------------------------------ TMA stores (TS = 1)

def test_tma_store_is_a_choice_where_the_output_is_staged():
    """TS = 1 candidates exist beside the staged stores where the output can be staged, and the kernel then
    takes a third tensor map: the output's, boxes of one 128-byte row by a warpgroup's rows."""
    plan = _plan(matmul(300, 256, 192, np.random.default_rng(0)), pin={"unit": "wgmma", "TS": 1, "MI": 2, "BN": 128})
    k = _gemm_kernel(plan)
    assert k.schedule.param["TS"] == 1 and k.schedule.param["OUT"] == 2
    maps = tensor_maps(k, None, plan.types())
    assert len(maps) == 3
    out = maps[2]
    assert out.buffer == k.stores[0] and out.dims == (192, 300) and out.strides == (384,)
    assert out.box == (64, 128) and out.swizzle == 128
    with pytest.raises(AicfError, match="--pin"):   # N = 77: no 16-byte rows, so nothing to stage or store by TMA
        _plan(gemm_transb_bias_relu(64, 136, 77, np.random.default_rng(0)), pin={"unit": "wgmma", "TS": 1})


def test_tma_store_map_has_one_dimension_per_batch_variable():
    plan = _plan(two_inputs_batched(72, 136, 88, np.random.default_rng(0)), pin={"unit": "wgmma", "TS": 1})
    k = _gemm_kernel(plan)
    out = tensor_maps(k, None, plan.types())[2]
    assert len(out.dims) == 3 and out.dims[:2] == (88, 72) and out.problems() is None


def test_tma_store_template_builds():
    payload = aicfc.compile(matmul(256, 512, 384, np.random.default_rng(0)), target="sm_90", precision="fp16",
                            pin={"unit": "wgmma", "TS": 1})
    k = payload["kernels"][0]
    assert k["params"]["TS"] == 1 and len(k["tensor_maps"]) == 3


TMA_STORE = [({"NWG": 2, "PP": 0, "MI": 1, "BN": 192}, "fp16"), ({"NWG": 2, "PP": 0, "MI": 1, "BN": 256}, "bf16"),
             ({"NWG": 1, "PP": 0, "MI": 2, "BN": 64}, "bf16"), ({"NWG": 2, "PP": 0, "MI": 1, "BN": 128}, "tf32"),
             ({"NWG": 2, "PP": 0, "MI": 1, "BN": 192, "CLUSTER": 2}, "fp16")]


def test_tma_store_is_not_offered_with_ping_pong():
    """Ping-pong tiles with TMA stores measured about a third slower than staged (ResNet-50's 1x1 GEMMs,
    profile_resnet50_b32_session7_h100.txt): the space has no such point."""
    plan = _plan(matmul(700, 512, 1000, np.random.default_rng(0)))
    space = gemm_wgmma.space(_gemm_kernel(plan), plan, "f16", 132, 232448)
    assert any(p["TS"] for p in space) and not any(p["TS"] and p["PP"] for p in space)


@pytest.mark.gpu
@pytest.mark.parametrize("tile,precision", TMA_STORE, ids=lambda v: "-".join(f"{a}{b}" for a, b in v.items())
                         if isinstance(v, dict) else v)
def test_wgmma_tma_store(tile, precision, gpu_device):
    """The output written by TMA stores: edges in M and N (the TMA clips them), several tiles per block
    (a warpgroup's next tile waits for its last store to have read the staging), and a bias + ReLU."""
    _check(gemm_transb_bias_relu(700, 512, 1000, np.random.default_rng(21)), precision,
           {"unit": "wgmma", "TS": 1, **tile}, gpu_device, seed=22)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ("fp16", "bf16"))
@pytest.mark.parametrize("build,shape", LAYOUTS, ids=[f"{f.__name__}-{'x'.join(map(str, s))}" for f, s in LAYOUTS])
def test_wgmma_tma_store_layouts(build, shape, precision, gpu_device):
    _check(build(*shape, np.random.default_rng(sum(shape))), precision, {"unit": "wgmma", "TS": 1}, gpu_device,
           seed=sum(shape) + 3)


@pytest.mark.gpu
@pytest.mark.parametrize("splits", (2, 4))
def test_wgmma_tma_store_split_k(splits, gpu_device):
    _check(gemm_transb_bias_relu(128, 3072, 768, np.random.default_rng(23)), "fp16",
           {"unit": "wgmma", "TS": 1, "SPLITK": splits}, gpu_device, seed=24)


# ------------------------------------------------------------------ maps in constant memory

def test_maps_live_in_constant_memory_without_fences():
    """[Note: TMA maps in constant memory]: the kernel declares its maps' constant array, reads them there
    unfenced, and the bundle names the array for aicf_run."""
    payload = aicfc.compile(matmul(256, 512, 384, np.random.default_rng(0)), target="sm_90", precision="fp16",
                            pin={"unit": "wgmma", "TS": 1})
    k = payload["kernels"][0]
    source = payload["modules"][k["module"]]["source"]
    assert k["maps_symbol"] == "k0_tmaps" and len(k["tensor_maps"]) == 3
    assert "__constant__ AicfTmap k0_tmaps[3];" in source and "fence.proxy.tensormap" not in source


def test_maps_past_the_constant_budget_stay_in_global_memory_fenced(monkeypatch):
    from aicfc.codegen import tma
    monkeypatch.setattr(tma, "CONST_BUDGET", 0)
    payload = aicfc.compile(matmul(256, 512, 384, np.random.default_rng(0)), target="sm_90", precision="fp16",
                            pin={"unit": "wgmma"})
    k = payload["kernels"][0]
    source = payload["modules"][k["module"]]["source"]
    assert "maps_symbol" not in k and "__constant__ AicfTmap" not in source
    assert source.count("fence.proxy.tensormap::generic.acquire") == 2


def test_constant_budget_is_taken_in_launch_order(monkeypatch):
    from aicfc.codegen import tma
    monkeypatch.setattr(tma, "CONST_BUDGET", 256)   # one kernel's two maps
    plan = _plan(two_inputs_batched(72, 136, 88, np.random.default_rng(0)), pin={"unit": "wgmma", "TS": 0})
    two = plan.replace(kernels=plan.kernels + tuple(k.replace(name=k.name + "b") for k in plan.kernels))
    names = [k.name for k in two.kernels if tensor_maps(k, None, two.types())]
    assert tma.constant_maps(two) == frozenset(names[:1])


@pytest.mark.gpu
@pytest.mark.parametrize("ts", (0, 1))
def test_wgmma_maps_in_global_memory(ts, gpu_device, monkeypatch):
    """The fenced maps in global memory (past the constant budget) still run, staged and TMA-stored."""
    from aicfc.codegen import tma
    monkeypatch.setattr(tma, "CONST_BUDGET", 0)
    _check(gemm_transb_bias_relu(700, 512, 1000, np.random.default_rng(25)), "fp16",
           {"unit": "wgmma", "TS": ts, "BN": 128}, gpu_device, seed=26)


# ---------------------------------------------------------------- stream-k (STREAM = 1)


@pytest.mark.parametrize("tiles,kt,ctas", [(98, 36, 132), (52, 72, 132), (196, 18, 132), (7, 5, 8), (130, 3, 132)])
def test_stream_k_shares_cover_every_k_block_once(tiles, kt, ctas):
    """Block c's share is [floor(c·T / C), floor((c + 1)·T / C)); `stream_share` inverts it, and
    `stream_parts` is the most blocks a tile is cut among (its scratch slots)."""
    total = tiles * kt
    begin = [c * total // ctas for c in range(ctas + 1)]
    owner = [next(c for c in range(ctas) if begin[c] <= q < begin[c + 1]) for q in range(total)]
    assert all(gemm_wgmma.stream_share(q, total, ctas) == owner[q] for q in range(total))
    parts = max(len({owner[q] for q in range(t * kt, (t + 1) * kt)}) for t in range(tiles))
    assert gemm_wgmma.stream_parts(tiles, kt, ctas) == parts


def test_stream_k_offered_where_the_last_wave_is_short():
    plan = _plan(matmul(1568, 2048, 512, np.random.default_rng(0)))   # ResNet-50 B32's stage-4 1x1: 100 tiles
    hw = load_profile("sm_90")
    pts = gemm_wgmma.space(_gemm_kernel(plan), plan, "f16", hw.sm_count, hw.smem_per_block_optin)
    stream = [p for p in pts if p["STREAM"]]
    assert stream and all(p["CTAS"] == hw.sm_count and p["SPLITK"] == 1 and p["CLUSTER"] == 1 for p in stream)
    from aicfc.codegen.scratch import scratch
    # by default the planner does not run it (measured slower everywhere: plan_schedules.OPT_IN) and explain says so
    k = _gemm_kernel(_plan(matmul(1568, 2048, 512, np.random.default_rng(0))))
    assert k.schedule.param["STREAM"] == 0
    assert any("--pin STREAM=1" in c.rejected_because for c in k.schedule.candidates)
    k = _gemm_kernel(_plan(matmul(1568, 2048, 512, np.random.default_rng(0)), pin={"unit": "wgmma", "STREAM": 1}))
    p = k.schedule.param
    assert p["STREAM"] == 1
    parts = gemm_wgmma.stream_parts(gemm_wgmma.tiles(k, p)[2], 2048 // p["BK"], p["CTAS"])
    partials, tickets = scratch(k)
    assert partials.type.shape == (gemm_wgmma.tiles(k, p)[2] * parts * p["BM"] * p["BN"],)
    assert tickets.type.shape == (gemm_wgmma.tiles(k, p)[2],) and tickets.zeroed


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ("fp16", "tf32"))
@pytest.mark.parametrize("pp", (0, 1))
@pytest.mark.parametrize("shape", [(1568, 2048, 512), (77, 1000, 72), (700, 512, 1000)], ids=["r50_s4", "small", "edges"])
def test_wgmma_stream_k(shape, pp, precision, gpu_device):
    """Stream-k on two sets of fresh inputs, each compiled and run anew: tiles cut among blocks at
    any k-block, partials added by the block holding the tile's tail, edges in M and N."""
    model = gemm_transb_bias_relu(*shape, np.random.default_rng(8))
    for seed in (9, 10):
        try:
            _check(model, precision, {"unit": "wgmma", "STREAM": 1, "PP": pp}, gpu_device, seed=seed)
        except AicfError as e:
            if "no feasible" in str(e):
                pytest.skip(str(e))
            raise


@pytest.mark.parametrize("pin", [{"SPLITK": 1}, {"SPLITK": 2, "CL": 0}], ids=["tiles", "split"])
def test_explain_adds_up_the_k_blocks(pin):
    """`explain`'s formula for a Hopper GEMM: the k-blocks as charged (the TMA's round trip over STAGES - 1 among
    the rates) plus the epilogues, the split's reduce, fill and launch add up to the prediction."""
    from aicfc.explain import _formula
    plan = _plan(matmul(512, 1024, 768, np.random.default_rng(3)),
                 pin=dict(pin, unit="wgmma", PP=0, STREAM=0, CLUSTER=1, TS=0))
    t = dict(_gemm_kernel(plan).schedule.predicted)
    text = _formula(t)
    assert f"k-blocks {t['t_kblocks_us']:.2f} = max(tensor" in text and "TMA latency" in text
    assert ("split reduce" in text) == (pin["SPLITK"] > 1)
    tiles = t["t_kblocks_us"] + t["t_epilogue_us"] + t["t_reduce_us"]
    assert tiles > t["t_dram_us"]
    assert t["time_us"] == pytest.approx(t["launch_us"] + t["t_pipeline_us"] + tiles, abs=1e-6)
