"""The Hopper GEMM's consumers copy an epilogue's residual into their output staging under the
tile's k-blocks (RS = 1, [Note: residual through the staging] in aicfc/codegen/gemm_wgmma.py)."""
from __future__ import annotations

import pytest

import aicfc
from aicfc.errors import AicfError
from aicfc.planner import cost_wgmma
from tests import onnx_builders as B
from tests.test_conv_wgmma import _gpu_check
from tests.test_epilogue_prefetch import _kernel_source, _matmul_residual, _prefetches

COPY_IN = "residual through the staging"


def _only_kernel(model, pin):
    payload = aicfc.compile(model, target="sm_90", precision="fp16", pin=pin, check_registers=False)
    (kern,) = payload["kernels"]
    return kern, _kernel_source(payload["modules"][kern["module"]]["source"], kern["symbol"])


def test_copy_in_replaces_the_epilogue_loads_and_the_prefetch():
    """With RS = 1 the residual is copied in by cp.async at the tile's start and the epilogue reads its
    pairs from the staging, not global memory; the producer requests nothing into L2."""
    kern, src = _only_kernel(_matmul_residual(300, 64, 264), {"unit": "wgmma", "RS": 1})
    assert kern["params"]["RS"] == 1 and kern["params"]["OUT"] == 2 and kern["params"]["TS"] == 0
    assert COPY_IN in src and "cp.async.cg.shared.global" in src and "cp.async.wait_all" in src
    assert "__ldg(reinterpret_cast<const __half2*>" not in src
    assert not _prefetches(src, kern["symbol"])
    kern0, src0 = _only_kernel(_matmul_residual(300, 64, 264), {"unit": "wgmma", "RS": 0})
    assert COPY_IN not in src0 and "__ldg(reinterpret_cast<const __half2*>" in src0


@pytest.mark.parametrize("pin", [{"TS": 1}, {"SPLITK": 2}, {"OUT": 0}], ids=["tma_store", "split", "registers"])
def test_copy_in_needs_an_unsplit_staged_epilogue(pin):
    """No RS = 1 candidate stores through the TMA (its staging is the TMA's swizzled boxes), splits k
    (most splits never run the epilogue) or stores from registers (there is no staging)."""
    with pytest.raises(AicfError, match="no feasible gemm candidate matches"):
        _only_kernel(_matmul_residual(64, 1024, 256), {"unit": "wgmma", "RS": 1, **pin})


def test_no_copy_in_without_a_residual():
    """A bias row is not output-sized: such a GEMM has no RS key. A pin of it would leave the GEMM alone
    (with unit=wgmma beside it, that pin too: a pin restricts the kernels whose space has all its keys),
    so it is refused in one line; unit=wgmma alone runs the GEMM on the engine without a copy-in."""
    import numpy as np
    import onnx
    from onnx import helper
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", onnx.TensorProto.FLOAT, (64, 256), rng.standard_normal((64, 256)).ravel())
    bias = helper.make_tensor("b", onnx.TensorProto.FLOAT, (256,), rng.standard_normal(256))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["y"])]
    graph = helper.make_graph(nodes, "matmul_bias", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, (300, 64))],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, (300, 256))], [w, bias])
    from aicfc.errors import AicfError
    with pytest.raises(AicfError, match="no kernel's schedule has these keys together"):
        _only_kernel(B.make_model(graph), {"unit": "wgmma", "RS": 1})
    kern, src = _only_kernel(B.make_model(graph), {"unit": "wgmma"})
    assert "RS" not in kern["params"] and COPY_IN not in src


def test_copy_in_moves_the_residual_term_to_the_k_blocks():
    """The residual's bytes leave the epilogue term (they join the tile's k-blocks)."""
    payload = aicfc.compile(_matmul_residual(6272, 256, 1024), target="sm_90", precision="fp16",
                            pin={"unit": "wgmma", "PP": 1, "BN": 128, "MI": 1, "STAGES": 4, "CLUSTER": 1, "RS": 0},
                            check_registers=False)
    (k0,) = payload["kernels"]
    payload = aicfc.compile(_matmul_residual(6272, 256, 1024), target="sm_90", precision="fp16",
                            pin={"unit": "wgmma", "PP": 1, "BN": 128, "MI": 1, "STAGES": 4, "CLUSTER": 1, "RS": 1},
                            check_registers=False)
    (k1,) = payload["kernels"]
    assert k0["params"]["OUT"] == k1["params"]["OUT"] == 2
    t0, t1 = k0["predicted"], k1["predicted"]
    assert t1["t_epilogue_us"] < t0["t_epilogue_us"]
    assert cost_wgmma.__doc__ and "RS = 1" in cost_wgmma.__doc__


@pytest.mark.gpu
@pytest.mark.parametrize("shape,pin", [((300, 64, 264), {"PP": 1}), ((300, 64, 264), {"PP": 0, "CLUSTER": 2}),
                                       ((300, 64, 264), {"NWG": 1, "BN": 256}), ((200, 1024, 136), {"PP": 1}),
                                       ((200, 1024, 136), {"PP": 0, "NWG": 2, "MI": 2})],
                         ids=["pp", "cluster", "wide", "long_k_pp", "long_k_coop"])
def test_gpu_matmul_residual_copy_in(shape, pin, gpu_device):
    """Edge tiles (rows past M, the last tile column cut at N), one and sixteen k-blocks, ping-pong and
    cooperative warpgroups, against float64."""
    payload = _gpu_check(_matmul_residual(*shape), "fp16", gpu_device, {"unit": "wgmma", "RS": 1, **pin})
    assert [k["params"]["RS"] for k in payload["kernels"]] == [1]


@pytest.mark.gpu
@pytest.mark.parametrize("pin", [{"RS": 1}, {"RS": 1, "PP": 0}], ids=["pp", "coop"])
def test_gpu_resnet_stage_copy_in(pin, gpu_device):
    """Two ResNet bottlenecks whose residual GEMMs copy their residual in, against onnxruntime at fp16
    (the projection kept apart, so that the first block's GEMM has the residual: test_epilogue_prefetch)."""
    model = B.resnet_stage_model((4, 64, 28, 28), mid=64, out=256, stride=1)
    payload = _gpu_check(model, "fp16", gpu_device, {"unit": "wgmma", "projection": "0", **pin}, ref="onnxruntime")
    assert any(COPY_IN in m["source"] for m in payload["modules"])
