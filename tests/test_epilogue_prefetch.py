"""The Hopper GEMM's producer requests an epilogue's residual tile rows into L2
([Note: epilogue prefetch] in aicfc/codegen/gemm_wgmma.py)."""
from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import helper

import aicfc
from tests import onnx_builders as B
from tests.test_conv_wgmma import _gpu_check

PREFETCH = "aicf_wgg_prefetch_l2(p"


def _sources(model, pin):
    payload = aicfc.compile(model, target="sm_90", precision="fp16", pin=pin, check_registers=False)
    return payload, {k["name"]: payload["modules"][k["module"]]["source"] for k in payload["kernels"]}



def _kernel_source(source: str, symbol: str) -> str:
    """The text of kernel `symbol`'s definition in its module (up to the next kernel's)."""
    start = re.search(rf"__global__ void[^{{;]*?\b{symbol}\(", source).start()
    end = source.find("__global__ void", start + 1)
    return source[start:end if end > 0 else len(source)]


def _prefetches(source: str, symbol: str) -> bool:
    """Whether the kernel's producer requests rows of one of its parameters (p0, p1, ...)."""
    return re.search(r"aicf_wgg_prefetch_l2\(p\d+ ", _kernel_source(source, symbol)) is not None


def test_residual_gemms_prefetch_and_others_do_not():
    """In a ResNet stage at fp16 the first block's last 1x1 adds the projection's product, stored
    channels-last like its own output, with K = 64: its producer requests those rows. The 1x1s with a
    BatchNorm bias alone and the convolutions request nothing, and neither does the second block's
    last 1x1: it writes the model's NCHW output (a GEMM of channels by pixels) and reads the
    channels-last residual across its rows, not along them. (The projection kept apart: merged with the
    last 1x1, passes/concat_projections.py, there is no residual to request.)"""
    model = B.resnet_stage_model((4, 64, 28, 28), mid=64, out=256, stride=1)
    payload, sources = _sources(model, {"unit": "wgmma", "RS": 0, "projection": 0})
    prefetching = {k["name"] for k in payload["kernels"] if _prefetches(sources[k["name"]], k["symbol"])}
    adds = {k["name"]: k for k in payload["kernels"] if k["family"] == "gemm" and "b1.add" in k["onnx_nodes"]}
    (first,) = adds
    assert prefetching == {first}, prefetching


def _matmul_residual(m: int, k: int, n: int):
    """y = x @ w + r: a GEMM whose epilogue adds a row-major input of the output's shape."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", onnx.TensorProto.FLOAT, (k, n), (rng.standard_normal((k, n)) / np.sqrt(k)).ravel())
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "r"], ["y"])]
    graph = helper.make_graph(nodes, "matmul_residual",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, (m, k)),
                               helper.make_tensor_value_info("r", onnx.TensorProto.FLOAT, (m, n))],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, (m, n))], [w])
    return B.make_model(graph)


@pytest.mark.parametrize("k,pin,want", [(64, {}, True), (1024, {"SPLITK": 1}, False), (1024, {"SPLITK": 2}, False)],
                         ids=["one_k_block", "sixteen", "split"])
def test_only_unsplit_tiles_of_one_k_block_prefetch(k, pin, want):
    """Tiles of one k-block request their residual rows; longer ones measured slower with the
    requests (they queue with the k-blocks' copies in the TMA unit), and under split-k most splits
    never run the epilogue. The requests need no tensor map."""
    payload, sources = _sources(_matmul_residual(64, k, 256), {"unit": "wgmma", "RS": 0, **pin})
    (kern,) = payload["kernels"]
    assert _prefetches(sources[kern["name"]], kern["symbol"]) is want
    assert len(kern["tensor_maps"]) == 2 + kern["params"].get("TS", 0)


@pytest.mark.gpu
@pytest.mark.parametrize("pin", [{"PP": 1}, {"PP": 0, "CLUSTER": 2}, {"PP": 0, "TS": 1}, {"OUT": 0}],
                         ids=["pp", "cluster", "tma_store", "register_stores"])
def test_gpu_residual_epilogues_with_prefetch(pin, gpu_device):
    """Bottlenecks whose residual GEMMs prefetch, against onnxruntime at fp16, on each epilogue path (the
    projection kept apart: merged, the first block's residual GEMM would be the concatenation's GEMM, and
    the second block's stores the graph's NCHW output, its residual read across rows)."""
    model = B.resnet_stage_model((4, 64, 28, 28), mid=64, out=256, stride=1)
    payload = _gpu_check(model, "fp16", gpu_device, {"unit": "wgmma", "RS": 0, "projection": "0", **pin},
                         ref="onnxruntime")
    assert any(PREFETCH in m["source"] for m in payload["modules"])


@pytest.mark.gpu
@pytest.mark.parametrize("pin", [{"PP": 1}, {"PP": 0, "CLUSTER": 2}, {"NWG": 1, "BN": 256}],
                         ids=["pp", "cluster", "wide"])
def test_gpu_matmul_residual_edges(pin, gpu_device):
    """Edge tiles: rows past M get no request, the last tile column's run is cut at N."""
    model = _matmul_residual(300, 64, 264)
    payload = _gpu_check(model, "fp16", gpu_device, {"unit": "wgmma", "RS": 0, **pin})
    assert any(PREFETCH in m["source"] for m in payload["modules"])
