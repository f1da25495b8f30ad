"""Every op case and example through every pass, checked against onnxruntime with the interpreters."""
from __future__ import annotations

import numpy as np
import pytest

from aicfc.frontend.onnx_import import import_model
from aicfc.ir.high import Graph, evaluate_graph
from aicfc.ir.interp import evaluate_ops, evaluate_program
from aicfc.ir.lowered import Program
from aicfc.passes.pipeline import PIPELINE, Options
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B

FP32_RTOL = 1e-4   # max|y - ref| / max|ref|, float32 evaluation against onnxruntime


def example_models():
    import examples.build_examples as ex
    return [(f"example_{name}", build) for name, build in ex.BUILDERS.items()]


def rel_err(y: np.ndarray, ref: np.ndarray) -> float:
    assert y.shape == ref.shape
    assert np.isfinite(y).all() and np.isfinite(ref).all()
    return float(np.abs(y.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30))


def evaluate_plan(plan, inputs):
    env = {v.name: np.asarray(inputs[v.name], np.float32) for v in plan.inputs}
    env.update({w.name: w.array() for w in plan.weights})
    views = {v.source: v for v in plan.views}
    for name in list(env):   # views of inputs and weights (a global pool's rows)
        while name in views:
            env[views[name].out] = env[name].reshape(views[name].type.shape)
            name = views[name].out
    for k in plan.kernels:
        evaluate_ops(k.ops, env, np.float32)
        for s in k.stores:
            while s in views:
                env[views[s].out] = env[s].reshape(views[s].type.shape)
                s = views[s].out
    for name in list(env):
        while name in views:
            env[views[name].out] = env[name].reshape(views[name].type.shape)
            name = views[name].out
    return {o: env[o] for o in plan.outputs}


CASES = B.OP_CASES + example_models()


@pytest.mark.parametrize("case_id,build", CASES, ids=[c for c, _ in CASES])
def test_every_stage_matches_onnxruntime(case_id, build):
    model = build()
    inputs = B.random_inputs(model, seed=hash(case_id) % 1000)
    ref = B.run_onnxruntime(model, inputs)
    ir = import_model(model)
    opts = Options("sm_90", load_profile("sm_90"))
    for stage in [None] + list(PIPELINE):
        if stage is not None:
            ir = stage.run(ir, opts)
        if isinstance(ir, Graph):
            got = evaluate_graph(ir, inputs)
        elif isinstance(ir, Program):
            got = evaluate_program(ir, inputs)
        else:
            got = evaluate_plan(ir, inputs)
        for name, r in ref.items():
            err = rel_err(got[name], r)
            assert err <= FP32_RTOL, f"after {stage.name if stage else 'import'}: {name} rel err {err:.2e}"


def test_softmax_is_one_kernel():
    model = B.single_op_model("Softmax", [(7, 100, 257)], {"axis": 1})
    ir = import_model(model)
    opts = Options("sm_90", load_profile("sm_90"))
    for stage in PIPELINE:
        ir = stage.run(ir, opts)
    assert [k.family for k in ir.kernels] == ["row_reduce"]
    assert ir.kernels[0].stores == ("out",)


def test_examples_kernel_counts(tmp_path):
    import examples.build_examples as ex
    counts = {}
    for name, build in ex.BUILDERS.items():
        ir = import_model(build())
        opts = Options("sm_90", load_profile("sm_90"))
        for stage in PIPELINE:
            ir = stage.run(ir, opts)
        counts[name] = [k.family for k in ir.kernels]
    # MLP: two GEMMs with bias+activation epilogues. Block: 4 GEMMs (q, k, v merged into one,
    # out-projection + residual, FFN1 + GELU, FFN2 + residual + tanh) and one streaming attention
    # (scores, scaled softmax and p@v, reading q, k, v as slices of the merged result; the K
    # transpose folded into the access). Without fusion it is 21 nodes.
    assert counts["mlp"] == ["gemm", "gemm"]
    assert counts["block"].count("gemm") == 4 and counts["block"].count("attention") == 1
    assert len(counts["block"]) == 5
