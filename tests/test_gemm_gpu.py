"""On the GPU: the gemm family in every precision, against a float64 reference.

Each case is compiled with `pin` forcing the arithmetic unit (and for some, the tile), so the
tensor-core path is exercised on odd shapes the cost model would give to SIMT. Layouts cover
k-contiguous and m/n-contiguous operands (ldmatrix and ldmatrix.trans), 16-byte, narrower and
synchronous loads (K not a multiple of the vector), batches and broadcasts, and epilogues.
Tolerance on max|y - ref| / max|ref|: fp32 1e-5, tf32 1e-3, fp16 and bf16 1e-2.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import aicfc
from aicfc.frontend.onnx_import import import_model
from aicfc.ir.high import evaluate_graph
from tests.conftest import run_payload
from tests.test_pipeline import rel_err

pytestmark = pytest.mark.gpu
RTOL = {"fp32": 1e-5, "tf32": 1e-3, "fp16": 1e-2, "bf16": 1e-2}


def _model(nodes, inputs, output_shape, inits) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "gemm_case",
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)],
                          [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def matmul(m, k, n, rng):
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [m, k])], [m, n],
                  {"w": rng.standard_normal((k, n)).astype(np.float32)})


def gemm_transb_bias_relu(m, k, n, rng):
    return _model([helper.make_node("Gemm", ["x", "w", "b"], ["g"], transB=1), helper.make_node("Relu", ["g"], ["y"])],
                  [("x", [m, k])], [m, n], {"w": rng.standard_normal((n, k)).astype(np.float32),
                                            "b": rng.standard_normal(n).astype(np.float32)})


def broadcast_batch(m, k, n, rng):
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [2, 3, m, k])], [2, 3, m, n],
                  {"w": rng.standard_normal((k, n)).astype(np.float32)})


def two_inputs_batched(m, k, n, rng):
    return _model([helper.make_node("MatMul", ["x", "z"], ["y"])], [("x", [3, m, k]), ("z", [3, k, n])],
                  [3, m, n], {})


def a_transposed(m, k, n, rng):
    return _model([helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]), helper.make_node("MatMul", ["xt", "w"], ["y"])],
                  [("x", [k, m])], [m, n], {"w": rng.standard_normal((k, n)).astype(np.float32)})


def b_transposed_input(m, k, n, rng):
    return _model([helper.make_node("Transpose", ["z"], ["zt"], perm=[1, 0]), helper.make_node("MatMul", ["x", "zt"], ["y"])],
                  [("x", [m, k]), ("z", [n, k])], [m, n], {})


SHAPES = [(64, 64, 64), (77, 129, 65), (33, 35, 17), (5, 40, 24), (128, 768, 768)]
CASES = [(matmul, s) for s in SHAPES] + [
    (f, s) for f in (gemm_transb_bias_relu, broadcast_batch, two_inputs_batched, a_transposed, b_transposed_input)
    for s in ((77, 129, 65), (128, 256, 192))]
MMA = ("tf32", "fp16", "bf16")


def _check(model, precision, pin, device, seed):
    payload = aicfc.compile(model, target=device.arch, precision=precision, pin=pin)
    kernels = [k for k in payload["kernels"] if k["family"] == "gemm"]
    assert kernels and all(k["params"]["unit"] == pin["unit"] for k in kernels)
    rng = np.random.default_rng(seed)
    graph = import_model(model, None)
    inputs = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs}
    ref = evaluate_graph(graph, inputs, dtype=np.float64)["y"]
    got = run_payload(payload, inputs, device)["y"]
    assert got.dtype == np.float32
    err = rel_err(got, ref)
    assert err <= RTOL[precision], f"{precision} {pin}: rel err {err:.2e}"
    return err


@pytest.mark.parametrize("precision", MMA)
@pytest.mark.parametrize("build,shape", CASES, ids=[f"{f.__name__}-{'x'.join(map(str, s))}" for f, s in CASES])
def test_mma_gemm(build, shape, precision, gpu_device):
    model = build(*shape, np.random.default_rng(sum(shape)))
    _check(model, precision, {"unit": "mma"}, gpu_device, seed=sum(shape) + 1)


TILES = [{"BM": 32, "BN": 32, "WM": 1, "WN": 2, "STAGES": 2}, {"BM": 64, "BN": 128, "WM": 2, "WN": 2, "STAGES": 4},
         {"BM": 128, "BN": 64, "WM": 4, "WN": 1, "STAGES": 3}, {"BM": 256, "BN": 128, "WM": 4, "WN": 2, "STAGES": 3}]


@pytest.mark.parametrize("precision", MMA)
@pytest.mark.parametrize("tile", TILES, ids=lambda t: "BM{BM}BN{BN}W{WM}x{WN}S{STAGES}".format(**t))
def test_mma_tiles(tile, precision, gpu_device):
    for build in (matmul, a_transposed):
        model = build(300, 200, 260, np.random.default_rng(5))
        _check(model, precision, {"unit": "mma", **tile}, gpu_device, seed=6)


# SIMT tiles: vector widths 1, 2 and 4 on both operands, a tile fetched by fewer threads than it
# has elements per K step (ragged prefetch), one warp, 1024 threads.
SIMT_TILES = [{"BM": 16, "BN": 16, "BK": 8, "TM": 1, "TN": 1}, {"BM": 16, "BN": 64, "BK": 8, "TM": 1, "TN": 2},
              {"BM": 32, "BN": 64, "BK": 8, "TM": 2, "TN": 4}, {"BM": 64, "BN": 32, "BK": 16, "TM": 8, "TN": 2},
              {"BM": 128, "BN": 128, "BK": 8, "TM": 8, "TN": 8}, {"BM": 128, "BN": 64, "BK": 16, "TM": 8, "TN": 4},
              {"BM": 32, "BN": 32, "BK": 32, "TM": 1, "TN": 1}, {"BM": 32, "BN": 32, "BK": 8, "TM": 4, "TN": 8}]


@pytest.mark.parametrize("tile", SIMT_TILES, ids=lambda t: "BM{BM}BN{BN}BK{BK}T{TM}x{TN}".format(**t))
def test_simt_tiles(tile, gpu_device):
    for build in (matmul, a_transposed, b_transposed_input, gemm_transb_bias_relu, two_inputs_batched):
        model = build(77, 129, 65, np.random.default_rng(7))
        _check(model, "fp32", {"unit": "simt", **tile}, gpu_device, seed=8)


@pytest.mark.parametrize("shape", [(77, 129, 65), (128, 768, 768)])
def test_fp32_stays_exact(shape, gpu_device):
    model = matmul(*shape, np.random.default_rng(9))
    _check(model, "fp32", {"unit": "simt"}, gpu_device, seed=10)


SPLITS = [(matmul, (128, 3072, 768)), (gemm_transb_bias_relu, (64, 1000, 96)), (two_inputs_batched, (96, 512, 80))]


@pytest.mark.parametrize("precision", ("fp16", "bf16", "tf32"))
@pytest.mark.parametrize("splits", (2, 3, 4))
@pytest.mark.parametrize("build,shape", SPLITS, ids=[f.__name__ for f, _ in SPLITS])
def test_split_k(build, shape, splits, precision, gpu_device):
    """Split-k: partial tiles, the last split reduces; the tickets are zero again afterwards,
    so a second run on the same executor gives the same result."""
    from aicf_run.bundle import Bundle
    from aicf_run.executor import Executor
    model = build(*shape, np.random.default_rng(splits))
    pin = {"unit": "mma", "BM": 32, "BN": 32, "WM": 1, "WN": 2, "SPLITK": splits}
    payload = aicfc.compile(model, target=gpu_device.arch, precision=precision, pin=pin)
    assert any(b["name"].endswith(".tickets") for b in payload["buffers"])
    graph = import_model(model, None)
    rng = np.random.default_rng(splits + 1)
    inputs = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs}
    ref = evaluate_graph(graph, inputs, dtype=np.float64)["y"]
    ex = Executor(Bundle.from_payload(payload), gpu_device)
    try:
        ex.poison()
        first = ex.run(inputs)["y"]
        second = ex.run(inputs)["y"]
    finally:
        ex.close()
    assert rel_err(first, ref) <= RTOL[precision]
    assert np.array_equal(first, second)
