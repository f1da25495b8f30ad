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


def rel_err(y: np.ndarray, ref: np.ndarray, scale: float | None = None) -> float:
    """The largest error over `scale` (default: ref's largest magnitude)."""
    assert y.shape == ref.shape
    assert np.isfinite(y).all() and np.isfinite(ref).all()
    return float(np.abs(y.astype(np.float64) - ref).max() / max(np.abs(ref).max() if scale is None else scale, 1e-30))


def stages(model, precision: str = "fp32", pin: dict | None = None) -> dict:
    """Every stage's IR by stage name ("import" first)."""
    opts = Options("sm_90", load_profile("sm_90"), precision, tuple(sorted((pin or {}).items())))
    ir = import_model(model)
    out = {"import": ir}
    for stage in PIPELINE:
        ir = stage.run(ir, opts)
        out[stage.name] = ir
    return out


def evaluate_plan(plan, inputs: dict) -> dict:
    """The plan's computes in launch order (float32; integer inputs keep their type), with the
    views of inputs, weights and stored tensors as they become available."""
    env = {v.name: np.asarray(inputs[v.name], np.float32 if v.type.np_dtype.kind == "f" else v.type.np_dtype)
           for v in plan.inputs}
    env.update({w.name: w.array() for w in plan.weights})

    def settle() -> None:
        for v in plan.views:
            if v.source in env and v.out not in env:
                env[v.out] = env[v.source].reshape(v.type.shape)
    settle()
    for k in plan.kernels:
        # an inlined producer first (passes/join_concat.py), a joined GEMM after the kernel's own (passes/join_reduce.py)
        evaluate_ops(tuple(i.op for i in k.inlined) + k.ops + k.joined_ops, env, np.float32)
        settle()
    return {o: env[o] for o in plan.outputs}


def evaluate_ir(ir, inputs: dict) -> dict:
    """The outputs of any IR level (High, Lowered, Decision) on `inputs`, by its interpreter."""
    if isinstance(ir, Graph):
        return evaluate_graph(ir, inputs)
    if isinstance(ir, Program):
        return evaluate_program(ir, inputs)
    return evaluate_plan(ir, inputs)


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
        got = evaluate_ir(ir, inputs)
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
