"""Real torch exports of a GroupNorm U-Net resnet block (tests/fixtures/unet, written by
make_unet.py with torch 2.14): dynamo at opset 18 (GroupNorm as Reshape, InstanceNormalization
with unit scale over [N, groups, elements], Reshape, Mul, Add) and opset 21 (GroupNormalization
with per-channel scale and bias), TorchScript at opset 17 (as opset 18's dynamo); random
parameters. Each is 8 kernels: every GroupNorm one row pass, its per-channel affine map and the
SiLU after it one element-wise kernel (the last norm, one group per channel, has both in its row
pass), two 3x3 convolutions, the 1x1 shortcut as a GEMM with the residual add in its epilogue.

CPU: every stage's IR against onnxruntime on fresh random inputs (fp32 1e-5 of the output's
max), the fp16 plan through the interpreter (2e-3: fp16-rounded weights), compiled at fp32 and
fp16. GPU (`-m gpu`): against onnxruntime, fp32 1e-4, fp16 1e-2 of the output's max.
"""
from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

import aicfc
from tests import onnx_builders as B
from tests.conftest import run_payload
from tests.test_pipeline import evaluate_ir, evaluate_plan, rel_err, stages

UNET = Path(__file__).resolve().parent / "fixtures" / "unet"
MODELS = sorted(p.stem for p in UNET.glob("*.onnx"))
KERNELS = ["row_reduce", "pointwise", "conv", "row_reduce", "pointwise", "conv", "gemm", "row_reduce"]


def load(stem: str) -> onnx.ModelProto:
    return onnx.load(str(UNET / f"{stem}.onnx"))


def feeds(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + int.from_bytes(os.urandom(2), "little"))
    (x,) = model.graph.input
    return {x.name: rng.standard_normal([d.dim_value for d in x.type.tensor_type.shape.dim]).astype(np.float32)}


def test_fixtures_present_with_their_norm_ops():
    assert MODELS == ["unet_block_dynamo_op18", "unet_block_dynamo_op21", "unet_block_ts_op17"]
    ops = {stem: Counter(n.op_type for n in load(stem).graph.node) for stem in MODELS}
    assert ops["unet_block_dynamo_op18"]["InstanceNormalization"] == 3
    assert ops["unet_block_ts_op17"]["InstanceNormalization"] == 3
    assert ops["unet_block_dynamo_op21"]["GroupNormalization"] == 3


@pytest.mark.parametrize("stem", MODELS)
def test_interpreter_matches_onnxruntime(stem):
    model = load(stem)
    inputs = feeds(model, 0)
    ref = B.run_onnxruntime(model, inputs)["y"]
    s = stages(model)
    for name, ir in s.items():
        assert rel_err(evaluate_ir(ir, inputs)["y"], ref) <= 1e-5, name
    assert [k.family for k in s["plan_memory"].kernels] == KERNELS
    got16 = evaluate_plan(stages(model, "fp16")["plan_memory"], inputs)["y"]
    assert rel_err(got16, ref) <= 2e-3


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("stem", MODELS)
def test_compiles(stem, precision):
    payload = aicfc.compile(load(stem), precision=precision)
    assert [k["family"] for k in payload["kernels"]] == KERNELS
    assert all(k["registers"] is not None for k in payload["kernels"])    # built by nvcc
    assert payload["precision"] == precision


@pytest.mark.gpu
@pytest.mark.parametrize("precision,tol", [("fp32", 1e-4), ("fp16", 1e-2)])
@pytest.mark.parametrize("stem", MODELS)
def test_gpu_matches_onnxruntime(stem, precision, tol, gpu_device):
    model = load(stem)
    inputs = feeds(model, 1)
    ref = B.run_onnxruntime(model, inputs)["y"].astype(np.float64)
    got = run_payload(aicfc.compile(model, target=gpu_device.arch, precision=precision), inputs, gpu_device)["y"]
    assert rel_err(got, ref) <= tol
