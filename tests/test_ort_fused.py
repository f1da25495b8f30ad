"""Graphs after onnxruntime's transformer optimizer (tests/fixtures/ort_fused, written by
make_ort_fused.py from the committed BERT and Llama exports): its SkipLayerNormalization,
SimplifiedLayerNormalization and SkipSimplifiedLayerNormalization nodes, with the residual sum
(input_skip_bias_sum) feeding the next layer. Each must match onnxruntime through every stage's
IR and plan to exactly as many kernels as the export it was made from (the residual add stored
by the norm's row pass either way).

GPU (`-m gpu`): against onnxruntime, fp32 1e-4, fp16 1e-2 of the output's max.
"""
from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

import aicfc
from aicfc.frontend.onnx_import import load_model
from aicfc.ir.properties import ONLINE
from tests import onnx_builders as B
from tests.conftest import run_payload
from tests.fixtures.make_ort_fused import CASES
from tests.test_pipeline import evaluate_ir, rel_err, stages

FUSED = Path(__file__).resolve().parent / "fixtures" / "ort_fused"
SOURCES = {stem: source for stem, source, _ in CASES}
NORMS = {"bert_ts_b1_skipln": {("com.microsoft", "SkipLayerNormalization"): 4},
         "llama_s16_skipsln": {("", "SimplifiedLayerNormalization"): 1,
                               ("com.microsoft", "SkipSimplifiedLayerNormalization"): 4}}


def load(stem: str) -> onnx.ModelProto:
    return load_model(FUSED / f"{stem}.onnx")   # through the checker, as `aicfc compile` does


def feeds(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + int.from_bytes(os.urandom(2), "little"))
    (x,) = model.graph.input
    return {x.name: rng.integers(0, 64, [d.dim_value for d in x.type.tensor_type.shape.dim]).astype(np.int64)}


@pytest.mark.parametrize("stem", sorted(NORMS))
def test_matches_onnxruntime_with_the_kernels_of_its_source(stem):
    model = load(stem)
    ops = Counter((n.domain, n.op_type) for n in model.graph.node)
    assert {k: ops[k] for k in NORMS[stem]} == NORMS[stem]
    inputs = feeds(model, 0)
    ref = B.run_onnxruntime(model, inputs)["y"]
    s = stages(model)
    for name, ir in s.items():
        assert rel_err(evaluate_ir(ir, inputs)["y"], ref) <= 1e-5, name
    plan = s["plan_memory"]
    source = stages(load_model(SOURCES[stem]))["plan_memory"]
    assert [k.family for k in plan.kernels] == [k.family for k in source.kernels]
    rows = [k for k in plan.kernels if k.family == "row_reduce"]
    assert len(rows) == 5 and all(ONLINE in k.properties for k in rows)


@pytest.mark.gpu
@pytest.mark.parametrize("precision,tol", [("fp32", 1e-4), ("fp16", 1e-2)])
@pytest.mark.parametrize("stem", sorted(NORMS))
def test_gpu_matches_onnxruntime(stem, precision, tol, gpu_device):
    model = load(stem)
    inputs = feeds(model, 1)
    ref = B.run_onnxruntime(model, inputs)["y"].astype(np.float64)
    got = run_payload(aicfc.compile(model, target=gpu_device.arch, precision=precision), inputs, gpu_device)["y"]
    assert rel_err(got, ref) <= tol


def test_compile_takes_the_fused_model_as_a_proto_and_refuses_a_broken_one_in_one_line():
    """aicfc.compile(ModelProto) checks as a path does: onnxruntime's onnx-domain ops moved aside
    for the checker (the H200 machine's onnx refused it before), its complaint an AicfError."""
    from aicfc.errors import AicfError
    model = load("llama_s16_skipsln")
    assert aicfc.compile(model, precision="fp32", check_registers=False)["kernels"]
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    broken.graph.node[0].input[0] = "no_such_tensor"
    with pytest.raises(AicfError, match="the ONNX checker rejects the model") as e:
        aicfc.compile(broken)
    assert "\n" not in str(e.value)
