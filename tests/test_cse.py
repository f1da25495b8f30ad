"""cse: duplicate nodes and constants merge; outputs keep their names; results unchanged."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from aicfc.frontend.onnx_import import import_model
from aicfc.ir.high import evaluate_graph
from aicfc.passes.cse import cse
from tests import onnx_builders as B


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w1"), numpy_helper.from_array(w.copy(), "w2"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w1"], ["a"]), n("MatMul", ["x", "w2"], ["b"]),   # same weight bytes
             n("Relu", ["a"], ["ra"]), n("Relu", ["b"], ["rb"]),                 # same after merging
             n("Add", ["ra", "rb"], ["s"]), n("Mul", ["s", "two"], ["y"]),
             n("Relu", ["a"], ["y2"])]                                            # a duplicate output
    g = helper.make_graph(nodes, "cse", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8]),
                           helper.make_tensor_value_info("y2", TensorProto.FLOAT, [4, 8])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_duplicates_merge_and_results_are_unchanged():
    model = _model()
    g = import_model(model)
    out = cse(g)
    assert [w.name for w in out.weights] == ["w1", "two"]
    assert [n.output for n in out.nodes] == ["a", "ra", "s", "y", "y2"]   # y2 is an output: kept
    assert next(n for n in out.nodes if n.output == "s").inputs == ("ra", "ra")
    inputs = B.random_inputs(model, seed=5)
    ref = B.run_onnxruntime(model, inputs)
    got = evaluate_graph(out, inputs)
    for name in ref:
        assert np.allclose(got[name], ref[name], rtol=1e-5, atol=1e-6)


def test_nothing_to_merge_returns_the_same_graph():
    g = import_model(B.OP_CASES[0][1]())
    assert cse(g) is g
